"""Compiling before measuring: the warm-up launches every GEMM variant a run can need, and on
the GPU a served stream then compiles, captures and allocates nothing."""

from pathlib import Path

import pytest
import torch
from conftest import HAS_CUDA

from pdmux_triton.gpu.compile_watch import CompileWatch
from pdmux_triton.gpu.decoder import KVCache, Model, Weights
from pdmux_triton.gpu.warmup import compile_prefill_side
from pdmux_triton.kernels.gemm import plan, warm_up_rows
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.models import model_preset

DEV = torch.device("cuda" if HAS_CUDA else "cpu")


def test_warm_up_rows_cover_every_variant_of_the_range():
    budgets, N, K = [20, 52, 132], 6144, 4096
    pairs = warm_up_rows(N, K, torch.bfloat16, DEV, budgets, 4096)
    covered = {plan(m, N, K, torch.bfloat16, DEV, b).variant(K) for m, b in pairs}
    for b in budgets:
        for m in (1, 7, 16, 17, 64, 65, 300, 1024, 1025, 4096):
            assert plan(m, N, K, torch.bfloat16, DEV, b).variant(K) in covered
    assert len(pairs) == len(covered)  # one problem per variant


def test_compile_prefill_side_runs_on_the_tiny_model():
    spec = model_preset("tiny")
    dtype = torch.bfloat16 if HAS_CUDA else torch.float32
    model = Model(Weights.random(spec, DEV, dtype), KVCache(spec, 8, 4, DEV, dtype), max_positions=64)
    before = [c.clone() for c in model.cache.k]
    compile_prefill_side(model, Budget(None), max_rows=9, max_seqs=3, scratch_page=7)
    for layer, old in zip(model.cache.k, before):  # only the scratch page was written
        assert torch.equal(layer[:28], old[:28])


def test_compile_watch_counts_and_chains_the_previous_hook():
    from triton import knobs

    calls = []
    knobs.runtime.jit_post_compile_hook = lambda **kw: calls.append(kw["repr"])
    try:
        with CompileWatch() as watch:
            knobs.runtime.jit_post_compile_hook(key=1, repr="k[...]", fn=None, compile={},
                                                is_manual_warmup=False, already_compiled=False)
        assert watch.count == 1 and watch.compiled == ["k[...]"] and calls == ["k[...]"]
        assert knobs.runtime.jit_post_compile_hook is not watch._hook
    finally:
        knobs.runtime.jit_post_compile_hook = None


@pytest.mark.gpu
def test_a_served_stream_compiles_and_captures_nothing():
    """After the warm-up, a Poisson stream of ShareGPT-like requests (batches of every size
    and length forming in time) is served by every strategy with no compile and no graph
    capture inside the measured run, and every request gets its whole output; and no new
    device allocation but on green contexts, whose levels' streams each keep their own cached
    memory and are visited as the batches form, which differs between the untimed pass and the
    measured one. Under the slo level policy too, which can pick any split as the contexts
    decide."""
    from pdmux_triton.experiments import run
    from pdmux_triton.experiments.settings import RunSettings
    from pdmux_triton.spec.gpus import detect_gpu

    gpu = detect_gpu()
    # (the slo policy's levels are priced with the card's committed calibration)
    calibration = Path(f"bench/results/calibrate-{gpu.name}.json")
    if not calibration.is_file():
        pytest.skip(f"no calibration of the {gpu.name} is committed")
    s = RunSettings(gpu=gpu, model=model_preset("qwen3-8b"), workload="stream",
                    rate=6.0, count=40, seed=5, chunks=(512,), kinds=("grid_cap", "green"),
                    max_running=64, slo_ttft_ms=2000, slo_tpot_ms=25,
                    level_policies=("sglang", "slo"), itl_slo_ms=15.0,
                    calibration=str(calibration))
    out, _, _ = run.run_experiment(s, log=print)
    assert {r["strategy"] for r in out["rows"]} == {
        "prefill_first", "chunked_512", "pdmux_grid_cap", "pdmux_green", "pdmux_slo_grid_cap",
        "pdmux_slo_green"}
    for row in out["rows"]:
        assert row["requests_served"] == 40 and row["requests_lost"] == 0, row["strategy"]
        assert row["compiles_during_measurement"] == 0, (row["strategy"], row["compiled"])
        assert row["captures_during_measurement"] == 0, row["strategy"]
        print(row["strategy"], "device allocations", row["device_allocations_during_measurement"])
        # one prefill stream a kind (every grid-capped level shares it, and the warm-up grows
        # its pool to the longest prompt); a green context's level has its own
        if not row["strategy"].endswith("green"):
            assert row["device_allocations_during_measurement"] == 0, (
                row["strategy"], row.get("device_allocations_by_stream"))
