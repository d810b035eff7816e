"""Tensor parallelism on the cost model: a rank's shard, its collectives, and a simulated TP
server pricing both."""

import json

import pytest

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.parallel import LINKS, Link, TensorParallel, shard
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments.settings import RunSettings
from pdmux_triton.serve.simulated import SimExecutor
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import Request

QWEN = model_preset("qwen3-8b")


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a_rank_holds_its_share_of_weights_cache_and_flops(tp):
    rank = shard(QWEN, tp)
    assert (rank.q_heads, rank.kv_heads, rank.intermediate, rank.vocab) == (
        32 // tp, 8 // tp, 12288 // tp, 151936 // tp)
    assert rank.hidden == QWEN.hidden and rank.layers == QWEN.layers
    assert step_cost.weight_bytes(rank) * tp == step_cost.weight_bytes(QWEN)
    assert rank.kv_bytes_per_token() * tp == QWEN.kv_bytes_per_token()
    assert step_cost.prefill_flops(rank, 1000) * tp == pytest.approx(
        step_cost.prefill_flops(QWEN, 1000))


def test_more_ranks_than_kv_heads_replicate_them():
    rank = shard(QWEN, 16)  # 8 KV heads: one on each rank, each held twice
    assert rank.kv_heads == 1 and rank.q_heads == 2
    assert rank.kv_bytes_per_token() * 8 == QWEN.kv_bytes_per_token()


@pytest.mark.parametrize("tp,message", [
    (3, r"--tp 3: qwen3-8b's query heads \(32\) does not split into 3 equal shards"),
    (0, "tensor parallelism must be a whole number of GPUs >= 1, got 0"),
    (64, r"query heads \(32\) does not split into 64"),
])
def test_a_model_that_does_not_split_says_why(tp, message):
    with pytest.raises(PdmuxError, match=message):
        shard(QWEN, tp)


def test_collectives_follow_the_nccl_tests_bus_bandwidth():
    link = Link("test", busbw_gbps=400.0, latency_us=8.0)
    tp = TensorParallel.of(QWEN, 8, link)
    size = 1e9
    # nccl-tests: busbw = algbw * 2(n-1)/n for an all-reduce, (n-1)/n for an all-gather
    algbw = size / (tp.allreduce_s(size) - 8e-6)
    assert algbw * 2 * 7 / 8 == pytest.approx(400e9)
    assert size / (tp.allgather_s(size) - 8e-6) * 7 / 8 == pytest.approx(400e9)
    assert tp.allreduce_s(0) == pytest.approx(8e-6)  # small ones: the latency
    batch = 32
    assert tp.decode_s(batch) == pytest.approx(
        2 * QWEN.layers * tp.allreduce_s(batch * QWEN.hidden * 2)
        + tp.allgather_s(batch * QWEN.vocab * 2))
    one = TensorParallel.of(QWEN, 1)
    assert one.decode_s(batch) == one.layers_s(8192, 36) == one.logits_s(4) == 0.0


@pytest.mark.parametrize("gbps,latency", [(0.0, 10.0), (float("nan"), 10.0), (450.0, -1.0),
                                          (float("inf"), 10.0)])
def test_a_link_that_is_not_a_link_is_refused(gbps, latency):
    with pytest.raises(PdmuxError, match="must be a finite number > 0"):
        Link("bad", gbps, latency)


def test_a_simulated_rank_prices_its_shard_and_its_collectives():
    gpu, law = gpu_preset("h200"), step_cost.SaturationLaw(4.0, 66)
    prefill = step_cost.PrefillRate.fixed(gpu.bf16_tflops, gpu.sms, 0.5)
    comm = TensorParallel.of(QWEN, 2, LINKS["nvlink4"])
    rank = shard(QWEN, 2)
    reqs = [Request(rid=i, arrival=0.0, prompt=[0] * 100, output_len=4) for i in range(8)]
    for r in reqs:
        r.context = 100
    steps = {}
    for name, model, tp in (("one", QWEN, None), ("rank", rank, comm)):
        x = SimExecutor(gpu, model, law, prefill, comm=tp)
        t0 = x.now()
        x.wait_decode(x.launch_decode(reqs))
        steps[name] = x.now() - t0
    alone = step_cost.decode_step_s(QWEN, law, 800, gpu.sms, False, 8)
    assert steps["one"] == pytest.approx(alone)
    assert steps["rank"] == pytest.approx(step_cost.decode_step_s(rank, law, 800, gpu.sms, False, 8)
                                          + comm.decode_s(8))
    assert steps["rank"] < steps["one"]  # half the bytes outweigh the all-reduces


def test_settings_shard_the_model_and_refuse_a_measured_tp():
    gpu = gpu_preset("h200")
    s = RunSettings(gpu=gpu, model=QWEN, workload="stream", simulate=True, tp=4,
                    link="pcie5", link_gbps=64.0)
    assert s.rank_model == shard(QWEN, 4)
    assert s.comm.link.busbw_gbps == 64.0 and s.comm.link.latency_us == LINKS["pcie5"].latency_us
    assert RunSettings.from_dict(s.as_dict()) == s
    with pytest.raises(PdmuxError, match="--tp 2: this tool measures one GPU"):
        RunSettings(gpu=gpu, model=QWEN, workload="stream", tp=2)
    with pytest.raises(PdmuxError, match="unknown link 'ib'; known: nvlink4, pcie5"):
        RunSettings(gpu=gpu, model=QWEN, workload="stream", simulate=True, tp=2, link="ib")
    with pytest.raises(PdmuxError, match=r"latency \(us\) must be a finite number > 0"):
        RunSettings(gpu=gpu, model=QWEN, workload="stream", simulate=True, tp=2,
                    link_latency_us=0.0)


def test_run_serves_a_tp_server_and_says_so(capsys, tmp_path):
    from pdmux_triton.cli import main

    argv = ["run", "--simulate", "--gpu", "h200", "--workload", "stream", "--rate", "4",
            "--count", "20", "--chunks", "512", "--kinds", "grid_cap"]
    assert main.main([*argv, "--tp", "2", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "qwen3-8b on TP-2 over 2 x h200 (nvlink4 450 GB/s, 10 us)" in text
    out = json.loads((tmp_path / "run-h200.json").read_text())
    assert out["tp"] == 2 and out["inputs"]["tp"] == 2
    assert all(r["requests_served"] == 20 and r["requests_lost"] == 0 for r in out["rows"])
    assert main.main([*argv, "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    by = {r["strategy"]: r for r in one["rows"]}
    for r in out["rows"]:  # half the weights and cache a step: faster, all-reduces and all
        assert r["decode_gpu_p50_ms"] < by[r["strategy"]]["decode_gpu_p50_ms"]


def test_a_rank_pays_its_share_of_what_rows_cost_beyond_bytes():
    from pdmux_triton.cost.parallel import rank_rate

    class Curve:
        def tbps(self, sms, corun):
            return 2.0

        def batch_extra_s(self, sms, corun, batch):
            return 0.008 if batch > 64 else 0.0

    curve = Curve()
    assert rank_rate(curve, 1) is curve
    rank = rank_rate(curve, 4)
    assert rank.tbps(20, True) == 2.0 and rank.batch_extra_s(20, True, 72) == pytest.approx(0.002)
