"""The simulated executor prices work with the same cost model as `estimate`, draws no prompt
ids, and serves long traces in bounded memory."""

import copy
import json
import subprocess
import sys
from unittest import mock
from pathlib import Path

import pytest

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments import estimate
from pdmux_triton.serve import metrics, scheduler
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.serve.simulated import SUSTAINED_WINDOW_S, SimExecutor
from pdmux_triton.spec import traces, traffic
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import prompt_during_decode

QWEN = model_preset("qwen3-8b")
H100 = gpu_preset("h100-sxm")


def executor(s_sat=66.0):
    return SimExecutor(H100, QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, s_sat),
                       step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.5))


@pytest.mark.parametrize("s_sat", [44.0, 66.0, 88.0])
def test_the_estimate_and_the_simulation_agree_on_the_chapters_scenario(s_sat):
    rows = {r.approach: r for r in estimate.estimate(estimate.Scenario(s_sat=(s_sat,)))}
    first = scheduler.run("prefill_first", executor(s_sat), prompt_during_decode(QWEN.vocab))
    s = metrics.summarize(first)
    # the prompt's whole prefill, and the first decode step (every request at 2048 tokens)
    assert s["prefill_ms"] == pytest.approx(rows["prefill_first"].prefill_ms, rel=1e-12)
    assert first.activity.decode_step_s[0] * 1e3 == pytest.approx(rows["decode_only"].itl_ms,
                                                                  rel=1e-12)
    # pd-mux: the step beside the prefill at the level's decode SMs, the prefill on its SMs
    pd = scheduler.run("pdmux", executor(s_sat), prompt_during_decode(QWEN.vocab))
    corun_step = next(t for r, t in zip(_decode_rounds(pd), pd.activity.decode_step_s)
                      if r.level == 5)
    row = rows[f"pdmux_ssat{s_sat:g}"]
    contexts = 32 * 2048 + 32 * 8  # the prompt arrives after 8 decode steps
    assert corun_step == pytest.approx(
        step_cost.decode_step_s(QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, s_sat), contexts,
                                row.decode_sms, corun=True))
    assert row.itl_ms / 1e3 == pytest.approx(
        step_cost.decode_step_s(QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, s_sat), 32 * 2048,
                                row.decode_sms, corun=True), rel=1e-12)


def _decode_rounds(result):
    return [r for r in result.rounds if r.decode_bs > 0]


def test_chunked_steps_match_the_estimates_chunks():
    rows = {r.approach: r for r in estimate.estimate(estimate.Scenario(chunk_sizes=(2048,)))}
    reqs = prompt_during_decode(QWEN.vocab, arrive_after_steps=0)
    result = scheduler.run("chunked", executor(), reqs, chunk=2048)
    chunk_rounds = [r for r in result.rounds if r.prefill.startswith("chunk")]
    assert len(chunk_rounds) == rows["chunked_2048"].steps == 5  # 2016 tokens beside 32 rows
    # the simulated decode batch grows one token a step; the estimate holds it at 2048
    total = sum(r.end - r.start for r in chunk_rounds)
    assert total * 1e3 == pytest.approx(rows["chunked_2048"].prefill_ms, rel=2e-3)


def test_one_executor_serves_run_after_run_each_on_its_own_clock():
    """As the GPU executor serves a warm-up and then the measured run (or repeats of it): a
    second run of the same requests on the same executor gives the same figures."""
    x = executor()
    reqs = traffic.stream(QWEN.vocab, 4.0, 30, traffic.LENGTH_PRESETS["conv"], seed=1)
    first, again = (metrics.summarize(scheduler.run("pdmux", x, copy.deepcopy(reqs)))
                    for _ in range(2))
    assert first["ttft_p50_ms"] > 0 and again == first


def test_overheads_bound_eager_steps_and_add_to_decode_rounds():
    host = step_cost.Overheads(decode_round_s=0.001, layer_launch_s=0.002, eager_step_s=0.003)
    x = SimExecutor(H100, QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0),
                    step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.5), overheads=host)
    reqs = prompt_during_decode(QWEN.vocab, batch=1, context=16, prompt=16, decode_tokens=12)
    result = scheduler.run("chunked", x, reqs, chunk=16)
    chunk = next(r for r in result.rounds if r.prefill.startswith("chunk"))
    # a 16-token chunk computes in microseconds: its batch and 36 eager layers' launches bound
    # it, and the last layer runs after its launch (its GPU time, well under a launch here)
    assert 0.003 + 36 * 0.002 < chunk.end - chunk.start < 0.003 + 36 * 0.002 + 0.0005
    plain = [r for r in result.rounds if not r.prefill]
    assert all(r.end - r.start > 0.001 for r in plain)  # each round pays the host's share


def test_a_decode_round_pays_the_hosts_share_for_its_requests_and_their_kv():
    """The host's share of a round grows with the requests it steps and the KV their page
    tables name (the serving loop's bookkeeping), before the step runs; at a level that splits
    the GPU it pays the split term too, on the whole GPU (either way round) not."""
    host = step_cost.Overheads(decode_round_s=1e-4, decode_round_per_request_s=5e-6,
                               decode_round_per_kv_token_s=2e-9, decode_round_split_s=7e-5)
    x = SimExecutor(H100, QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0),
                    step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.5), overheads=host)
    reqs = prompt_during_decode(QWEN.vocab, batch=48, context=1000)[:48]
    for r in reqs:
        r.context = 1000
    levels = sglang_rules.stream_groups(H100.sms, H100.cc_major)
    whole = 1e-4 + 48 * 5e-6 + 48 * 1000 * 2e-9
    for level, paid in [(next(lv for lv in levels if 0 < lv[1] < H100.sms), whole + 7e-5),
                        *[(lv, whole) for lv in levels if lv[1] in (0, H100.sms)]]:
        x.start([])
        x.set_level(level)
        began = x.t
        _, launched = x.launch_decode(reqs)
        assert launched - began == pytest.approx(paid, rel=1e-12), level


def _split_executor(host):
    """An executor at a level that splits the H100, its prefill at different rates alone and
    beside decode (0.6 and 0.4 of the peak)."""
    rate = step_cost.PrefillRate(H100.bf16_tflops, H100.sms, ((60, 0.4), (112, 0.4)),
                                 ((60, 0.6), (112, 0.6)))
    x = SimExecutor(H100, QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0), rate,
                    overheads=host)
    x.start([])
    x.set_level(next(lv for lv in sglang_rules.stream_groups(H100.sms, H100.cc_major)
                     if 0 < lv[1] < H100.sms))
    return x, rate


@pytest.mark.parametrize("decode_ends, launched, expect", [
    (0.0, 0.0, "corun"),            # no idle window: all beside decode
    (0.0, 1.0, "alone"),            # decode idle until long after: all alone
    (5.0, 6.0, "corun"),            # the round's step outlasts it: all beside decode
    (0.002, 0.004, "mixed"),        # beside the step, alone while the host launches, beside
])
def test_a_split_prefill_runs_alone_while_decode_waits_for_the_hosts_launches(
        decode_ends, launched, expect):
    """A split prefill's work runs at its co-run rate while the round's decode step runs, at
    its rate alone from that step's end to the host's last launch, and at its co-run rate
    after; its time is the sum of the parts."""
    x, rate = _split_executor(step_cost.Overheads())
    sms, flops = x.sms["prefill"], 2e13
    corun = step_cost.compute_s(flops, rate, sms, True)
    alone = step_cost.compute_s(flops, rate, sms, False)
    x.decode_ends = decode_ends
    got = x._split_prefill_s(flops, 0.0, launched)
    if expect == "mixed":  # 2 ms beside, 2 ms alone, the rest beside
        left = 1 - 0.002 / corun - 0.002 / alone
        assert corun > 0.004 and got == pytest.approx(0.004 + left * corun, rel=1e-12)
        assert alone < got < corun
    else:
        assert got == pytest.approx({"corun": corun, "alone": alone}[expect], rel=1e-12)
    assert x._split_prefill_s(0.0, 0.0, launched) == 0.0


def test_a_split_batch_pays_its_upload_and_a_whole_gpu_batch_the_eager_step():
    """A split prefill's batch costs the host its fitted upload (the eager step's without one),
    a whole-GPU batch the eager step, which also holds the blocking read-back."""
    prompt = prompt_during_decode(QWEN.vocab, batch=1, prompt=64)[-1]
    for batch_s, split_pays in ((0.0005, 0.0005), (None, 0.003)):
        x, _ = _split_executor(step_cost.Overheads(eager_step_s=0.003, prefill_batch_s=batch_s))
        before = x.now()
        x.begin_prefill([prompt])
        assert x.now() - before == pytest.approx(split_pays)
        x.set_level((H100.sms, 0))
        before = x.now()
        x.begin_prefill([prompt])
        assert x.now() - before == pytest.approx(0.003)


def test_a_launched_decode_step_is_expected_to_end_as_priced_at_its_level():
    """Until it is waited for, a launched step is expected to last its price at the level it
    runs on (beside the prefill on a split), not as long as the step before, which may have
    run on the whole GPU; waited for, its end is the priced one."""
    x, _ = _split_executor(step_cost.Overheads())
    reqs = prompt_during_decode(QWEN.vocab, batch=32, context=2000)[:32]
    x.set_level((0, H100.sms))
    x.wait_decode(x.launch_decode(reqs))  # a whole-GPU step first
    whole = x.decode_steps[-1]
    x.set_level(next(lv for lv in sglang_rules.stream_groups(H100.sms, H100.cc_major)
                     if 0 < lv[1] < H100.sms))
    pending = x.launch_decode(reqs)
    priced = x.decode_price_s(sum(r.context for r in reqs), x.sms["decode"], True, 32, None)
    assert priced > 1.2 * whole
    assert x._decode_ends() == pytest.approx(max(x.now(), x.free["decode"]) + priced, rel=1e-12)
    x.wait_decode(pending)
    assert x._decode_ends() == x.decode_ends == x.free["decode"]


def test_a_prefill_bound_by_its_launches_ends_after_its_last_layer_runs():
    """The GPU runs a launched layer after its launch: a short prompt on a slow host is done
    one layer's GPU time after its last launch, not at it."""
    host = step_cost.Overheads(layer_launch_s=0.002, eager_step_s=0.003)
    rate = step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.5)
    x = SimExecutor(H100, QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0), rate,
                    overheads=host)
    prompt = prompt_during_decode(QWEN.vocab, batch=1, prompt=64)[-1]  # the arriving prompt
    carry = x.begin_prefill([prompt])
    x.launch_prefill(carry, 0, QWEN.layers)
    gpu = step_cost.compute_s(step_cost.layer_flops(QWEN, 64, 0, QWEN.layers)
                              + step_cost.lm_head_flops(QWEN, 1), rate, H100.sms, False)
    assert gpu < QWEN.layers * 0.002  # bound by its launches
    assert carry.ends_at == pytest.approx(0.003 + QWEN.layers * 0.002 + gpu / QWEN.layers,
                                          rel=1e-9)


def test_a_split_prefills_later_layers_launch_at_the_replayed_layers_time():
    """PD-mux's split prefill: each call's first layer at the launch time, its later ones at
    the replayed layers'."""
    host = step_cost.Overheads(layer_launch_s=0.002, later_layer_s=0.0005, eager_step_s=0.003)
    rate = step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.5)
    x = SimExecutor(H100, QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0), rate,
                    overheads=host)
    prompt = prompt_during_decode(QWEN.vocab, batch=1, prompt=64)[-1]
    carry = x.begin_prefill([prompt])
    began = x.t
    x.launch_prefill(carry, 0, 12)
    assert x.t - began == pytest.approx(0.002 + 11 * 0.0005)
    # a tensor-parallel rank's layers reduce between their launches: none is replayed
    from pdmux_triton.cost.parallel import LINKS, TensorParallel

    rank = SimExecutor(H100, QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0), rate,
                       overheads=host, comm=TensorParallel.of(QWEN, 2, LINKS["nvlink4"]))
    assert rank.overheads.later_layer_s is None and x.overheads.later_layer_s == 0.0005


def test_a_prefill_with_the_whole_gpu_runs_at_the_served_mfu_and_a_split_one_as_compared():
    law = step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0)
    rate = step_cost.PrefillRate(H100.bf16_tflops, H100.sms, ((60, 0.5), (112, 0.6)))
    served = SimExecutor(H100, QWEN, law, rate,
                         overheads=step_cost.Overheads(whole_gpu_prefill_mfu=0.45))
    assert served.prefill_rate.mfu_at(H100.sms, corun=False) == pytest.approx(0.45)
    assert served.prefill_rate.mfu_at(60) == rate.mfu_at(60)  # beside a decode: as compared
    reqs = prompt_during_decode(QWEN.vocab, batch=1, prompt=8192)
    first = {name: metrics.summarize(scheduler.run("prefill_first", x, copy.deepcopy(reqs)))
             for name, x in (("as compared", SimExecutor(H100, QWEN, law, rate)),
                             ("served", served))}
    assert first["served"]["prefill_ms"] == pytest.approx(
        first["as compared"]["prefill_ms"] * 0.6 / 0.45, rel=1e-3)


def test_a_split_prefill_slows_to_its_sustained_rate_as_it_runs_on():
    """A split prefill after an idle spell runs at the comparison's burst rate; one whose side
    ran the whole window before it at the sustained rate; between, by the share it ran. The
    whole GPU's prefill is not a split one and keeps its rate."""
    law = step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0)
    rate = step_cost.PrefillRate(H100.bf16_tflops, H100.sms, ((60, 0.5), (112, 0.6)))
    host = step_cost.Overheads(split_prefill_sustained=((60, 0.8), (112, 0.8)))
    x = SimExecutor(H100, QWEN, law, rate, overheads=host)
    x.start([])
    level = next(lv for lv in sglang_rules.stream_groups(H100.sms, H100.cc_major)
                 if 0 < lv[1] < H100.sms)
    x.set_level(level)
    sms = x.sms["prefill"]
    req = traffic.Request(0, 4096, 1, 0.0)
    layer = step_cost.compute_s(step_cost.layer_flops(QWEN, 4096, 0, 1), rate, sms, True)
    spans = []
    for _ in range(int(2 * SUSTAINED_WINDOW_S / layer) + 2):  # back to back past the window
        carry = x.begin_prefill([req])
        start = max(x.now(), x.free["prefill"])
        x.launch_prefill(carry, 0, 1)
        spans.append(carry.ends_at - start)
    assert spans[0] == pytest.approx(layer, rel=1e-9)  # after idle: the burst's rate
    assert spans[-1] == pytest.approx(layer / 0.8, rel=1e-9)  # the window full: sustained
    assert all(a <= b + 1e-12 for a, b in zip(spans, spans[1:]))
    assert layer < spans[len(spans) // 4] < layer / 0.8
    x.idle_until(x.free["prefill"] + 2 * SUSTAINED_WINDOW_S)  # an idle spell: back to burst
    carry = x.begin_prefill([req])
    start = max(x.now(), x.free["prefill"])
    x.launch_prefill(carry, 0, 1)
    assert carry.ends_at - start == pytest.approx(layer, rel=1e-9)


def test_a_split_prefill_slows_as_measured_by_the_share_it_ran():
    """With measured (busy share, fraction) points the blend follows them between (0, 0) and
    (1, 1): no slowdown where the clocks held, the sustained rate when busy throughout."""
    law = step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0)
    rate = step_cost.PrefillRate(H100.bf16_tflops, H100.sms, ((60, 0.5), (112, 0.6)))
    host = step_cost.Overheads(split_prefill_sustained=((60, 0.8), (112, 0.8)),
                               split_prefill_slowdown=((0.6, 0.0), (0.8, 0.5)))
    x = SimExecutor(H100, QWEN, law, rate, overheads=host)
    assert [x._slowdown(b) for b in (0.0, 0.3, 0.6, 0.7, 0.8, 0.9, 1.0)] == pytest.approx(
        [0.0, 0.0, 0.0, 0.25, 0.5, 0.75, 1.0])
    linear = SimExecutor(H100, QWEN, law, rate, overheads=step_cost.Overheads(
        split_prefill_sustained=((60, 0.8),)))
    assert linear._slowdown(0.3) == pytest.approx(0.3)  # none measured: in proportion


class _Link:
    """Collectives of a fixed time a decode step, none elsewhere."""

    tp = 2  # a rank of two
    def decode_s(self, batch):
        return 0.001

    def layers_s(self, rows, layers):
        return 0.0

    def logits_s(self, rows):
        return 0.0


def test_a_decode_step_beside_a_split_prefill_takes_the_served_ratio_of_its_busy_share():
    """A decode step beside a split prefill takes the served ratio (read between the busy
    shares given, held at the ends) of the share of the window before it that the prefill ran:
    the whole window, the last point's; a part, the ratio read there; after an idle spell, the
    first point's; with no ratios, the comparison's co-run price; alone, never; a
    tensor-parallel rank's collectives keep their time. The prefill's spans are kept with no
    sustained terms of its own."""
    law = step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0)
    rate = step_cost.PrefillRate(H100.bf16_tflops, H100.sms, ((60, 0.5), (112, 0.6)))
    level = next(lv for lv in sglang_rules.stream_groups(H100.sms, H100.cc_major)
                 if 0 < lv[1] < H100.sms)
    req = traffic.Request(0, 4096, 1, 0.0)
    decoding = [traffic.Request(1, 2048, 64, 0.0)]
    ratios = ((0.2, 0.95), (0.6, 1.0), (0.95, 1.1))

    def steps(by_busy, busy_spells, comm=None):
        x = SimExecutor(H100, QWEN, law, rate, comm=comm,
                        overheads=step_cost.Overheads(split_decode_by_busy=by_busy))
        x.start(decoding)
        x.set_level(level)
        out = []
        for _ in range(busy_spells):  # back to back, so the window before fills
            x.launch_prefill(x.begin_prefill([req]), 0, 1)
            x.idle_until(x.free["prefill"])
        x.launch_prefill(x.begin_prefill([req]), 0, 1)  # the one the step runs beside
        x.wait_decode(x.launch_decode(decoding))
        out.append(x.decode_steps[-1])
        x.idle_until(max(x.free.values()) + 2 * SUSTAINED_WINDOW_S)
        x.wait_decode(x.launch_decode(decoding))  # alone: the prefill side idle
        out.append(x.decode_steps[-1])
        return out, x.sms["prefill"]

    plain, sms = steps((), 0)
    layer = step_cost.compute_s(step_cost.layer_flops(QWEN, 4096, 0, 1), rate, sms, True)
    whole, _ = steps(ratios, int(SUSTAINED_WINDOW_S / layer) + 2)
    part = int(0.4 * SUSTAINED_WINDOW_S / layer)
    share = part * layer / SUSTAINED_WINDOW_S
    some, _ = steps(ratios, part)
    fresh, _ = steps(ratios, 0)
    assert 0.2 < share < 0.6
    assert whole[0] == pytest.approx(plain[0] * 1.1, rel=1e-9)  # busy throughout: held at 1.1
    assert some[0] == pytest.approx(plain[0] * (0.95 + (share - 0.2) / 0.4 * 0.05), rel=1e-6)
    assert fresh[0] == pytest.approx(plain[0] * 0.95, rel=1e-9)  # after idle: the first ratio
    assert whole[1] == fresh[1] == plain[1]  # alone: never scaled
    linked, _ = steps(ratios, int(SUSTAINED_WINDOW_S / layer) + 2, _Link())
    assert linked[0] == pytest.approx(plain[0] * 1.1 + 0.001, rel=1e-9)
    for bad in ((1.5, 1.0), (0.5, 0.2), (0.5, float("nan"))):
        with pytest.raises(PdmuxError, match="split_decode_by_busy needs busy shares"):
            step_cost.Overheads(split_decode_by_busy=(bad,))


@pytest.mark.parametrize("launch_s", [0.0001, 0.002])
def test_fitted_mixed_steps_and_decode_extras_price_the_executors_steps(launch_s):
    """A fitted mixed step: its fixed cost, then its layers launched and run as a pipeline
    (a fast host: the phases and one launch; a slow one: the launches and one layer's
    phases); a decode step: its bytes at the rate, plus the extra for its batch."""
    tiles = step_cost.TileTimes(((64, 128, 25e-6, 1.0), (128, 128, 27e-6, 1.0)), 2.5e-6, 2.3e-6,
                                7e-8)
    fit = step_cost.MixedStepFit(0.010, tiles)
    host = step_cost.Overheads(layer_launch_s=launch_s, eager_step_s=0.003,
                               decode_step_extra=((1, 0.0007), (64, 0.0007)), mixed=fit)
    law = step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0)
    rate = step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.5)
    x = SimExecutor(H100, QWEN, law, rate, overheads=host)
    reqs = prompt_during_decode(QWEN.vocab, batch=4, context=1000, prompt=600, decode_tokens=12)
    result = scheduler.run("chunked", x, reqs, chunk=256)
    # (the chunk counts its 4 decode rows)
    first = next(r for r in result.rounds if r.prefill == "chunk 0+252")
    phases = step_cost.mixed_step_s(QWEN, law, rate, H100.sms, first.decode_context, 4, 252, 0,
                                    samples_chunk=False, phases=fit)
    launches = QWEN.layers * launch_s
    assert (phases > launches) == (launch_s < 0.001)  # each case is the bound it tests
    slower = QWEN.layers * max(phases / QWEN.layers, launch_s)
    faster = min(phases / QWEN.layers, launch_s)
    assert first.end - first.start == pytest.approx(0.010 + slower + faster, rel=1e-6)
    plain = next(r for r in result.rounds if not r.prefill)
    step = step_cost.decode_step_s(QWEN, law, plain.decode_context, H100.sms, False) + 0.0007
    assert plain.end - plain.start == pytest.approx(step, rel=1e-6)
    # a run saved before a mixed step's decode rows left the extend kernel, simulated as it
    # ran (`Overheads.served_on`): the whole chunk beside the rows, each decode row's context in
    # the tiles; one saved after that but before the chunk counted the rows: the whole chunk
    today = {"mixed_decode_rows": metrics.MIXED_DECODE_ROWS,
             "mixed_chunk_rows": metrics.MIXED_CHUNK_ROWS}
    def as_served(strategy, saved):
        return host.served_on(metrics.chunked_steps_of(strategy, saved))
    then = as_served("chunked_256", {})
    assert then.mixed.decode_rows_in_extend and then.chunked_steps == 0
    between = as_served("chunked_256", {"mixed_decode_rows": today["mixed_decode_rows"]})
    assert between.chunked_steps == 1 and between.mixed == host.mixed
    assert as_served("chunked_256", today) == host
    assert as_served("prefill_first", {}) == host
    assert step_cost.Overheads().served_on(0).chunked_steps == 0  # (no mixed fit: still the generation)
    old = scheduler.run("chunked", SimExecutor(H100, QWEN, law, rate, overheads=then),
                        prompt_during_decode(QWEN.vocab, batch=4, context=1000, prompt=600,
                                             decode_tokens=12), chunk=256)
    same = next(r for r in old.rounds if r.prefill == "chunk 0+256")
    assert (same.start, same.decode_context) == (first.start, first.decode_context)
    rows = step_cost.mixed_step_s(QWEN, law, rate, H100.sms, first.decode_context, 4, 256, 0,
                                  samples_chunk=False, phases=then.mixed)
    slower = QWEN.layers * max(rows / QWEN.layers, launch_s)
    faster = min(rows / QWEN.layers, launch_s)
    assert same.end - same.start == pytest.approx(0.010 + slower + faster, rel=1e-6)


def test_a_run_simulated_as_it_ran_prices_each_decode_rows_own_context(tmp_path):
    """With `decode_rows_in_extend` each mixed step's decode rows go to the extend tiles
    with their own contexts (which differ between requests), not the batch's shared evenly;
    without it, none."""
    tiles = step_cost.TileTimes(((64, 128, 25e-6, 1.0), (128, 128, 27e-6, 1.0)), 2.5e-6, 2.3e-6,
                                7e-8)
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,300,40\n0.05,1900,40\n"
                    "0.1,700,40\n0.4,3000,8\n")
    seen = {}
    for before in (False, True):
        host = step_cost.Overheads(layer_launch_s=2e-4, mixed=step_cost.MixedStepFit(
            0.003, tiles, decode_rows_in_extend=before))
        rows, price = [], step_cost._mixed_by_tiles
        with mock.patch.object(step_cost, "_mixed_by_tiles", lambda *a: rows.append(
                (a[4], a[5], list(a[-1]))) or price(*a)):
            scheduler.run("chunked", SimExecutor(
                H100, QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0),
                step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.5), overheads=host),
                          traces.load_trace(path).requests(QWEN.vocab), chunk=512)
        seen[before] = [r for r in rows if r[1]]  # the steps with decode rows
    assert seen[False] and all(not contexts for *_, contexts in seen[False])
    assert all(len(c) == batch and sum(c) == total for total, batch, c in seen[True])
    assert any(len(set(c)) > 1 for *_, c in seen[True])  # each row's own, unequal ones too


def test_overheads_are_read_from_the_measured_file():
    from pdmux_triton.cost.measured_inputs import load_host_costs

    host = load_host_costs("bench/results/host-costs-h200.json", "h200")
    assert 0 < host.decode_round_s < 0.002 and 0.0002 < host.layer_launch_s < 0.005
    assert 0 < host.eager_step_s < 0.02 and host.mixed is not None
    assert 0 < host.mixed.tiles.attention_prefix_s < 1e-5 and host.mixed.tiles.gemm_wave_s
    assert 0 < host.mixed.fixed_s < 0.05 and 0 < host.decode_extra_s(32) < 0.005


def test_simulating_a_trace_draws_no_token_ids(tmp_path, monkeypatch):
    def refuse(*_):
        raise AssertionError("a simulation drew prompt ids")
    monkeypatch.setattr(traffic.TokenIds, "draw", refuse)
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,3000,20\n0.01,700,9\n0.3,50,2\n")
    for strategy in scheduler.LOOPS:
        result = scheduler.run(strategy, executor(), traces.load_trace(path).requests(QWEN.vocab))
        assert all(r.done and r.tokens is None and r._ids is None for r in result.requests)
        metrics.summarize(result)


def test_a_long_trace_is_served_in_memory_that_does_not_grow_with_its_tokens(tmp_path):
    """bench/trace_scale.py on 20,000 requests of ~200 output tokens, overloading the GPU (a
    queue, full batches): what serving and its figures add to the peak RSS stays well under a
    list entry per token (16 bytes a token at the least). How long it takes is the bench
    script's figure, not this test's."""
    script = Path(__file__).parents[1] / "bench" / "trace_scale.py"
    subprocess.run([sys.executable, str(script), "--rows", "20000", "--out", str(tmp_path),
                    "--trace", str(tmp_path / "t.csv")], capture_output=True, text=True,
                   timeout=120, check=True)
    summary = json.loads((tmp_path / "trace-scale-h200-simulated.json").read_text())["summary"]
    assert summary["requests_served"] == 20000 and summary["tokens_per_request"] > 150
    assert summary["bytes_per_request"] < 16 * summary["tokens_per_request"]


def test_a_whole_gpu_prefill_takes_its_served_ratio_by_the_prefills_busy_share():
    """A whole-GPU prefill batch lasts its price times the served ratio read at the share of
    the window ending with it that prefills ran, its own span included (between the points
    given, held at the ends): a short batch after an idle spell the first ratio, one with the
    window full of prefills before it the last, one whose own span fills a part of the window
    the ratio read there; with no ratios, its price."""
    rate = step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.6)
    law = step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0)
    ratios = ((0.2, 0.95), (0.9, 1.05))

    def spans(by_busy, prompts) -> list[float]:
        x = SimExecutor(H100, QWEN, law, rate,
                        overheads=step_cost.Overheads(whole_gpu_prefill_by_busy=by_busy))
        x.start([])
        out = []
        for i, prompt in enumerate(prompts):  # back to back on the prefill side
            began = x.free["prefill"]
            x.launch_prefill(x.begin_prefill([traffic.Request(i, prompt, 1, 0.0)]), 0,
                             QWEN.layers)
            out.append(x.free["prefill"] - began)
        return out

    short = spans((), [512])[0]
    assert short < 0.2 * SUSTAINED_WINDOW_S
    run = spans(ratios, [512] * (int(SUSTAINED_WINDOW_S / short) + 3))
    assert run[0] == pytest.approx(short * 0.95, rel=1e-9)  # after idle: the first ratio
    assert run[-1] == pytest.approx(short * 1.05, rel=1e-9)  # the window full: the last
    assert all(b > a * (1 - 1e-12) for a, b in zip(run, run[1:]))  # slower as it fills
    # alone, a batch whose own span is half the window: the ratio read at half
    prompt = next(p for p in range(4096, 65536, 256)
                  if spans((), [p])[0] >= 0.5 * SUSTAINED_WINDOW_S)
    plain = spans((), [prompt])[0]
    share = plain / SUSTAINED_WINDOW_S
    assert spans(ratios, [prompt])[0] == pytest.approx(
        plain * (0.95 + (share - 0.2) / 0.7 * 0.1), rel=1e-9)
    for bad in ((1.5, 1.0), (0.5, 0.2), (0.5, float("nan"))):
        with pytest.raises(PdmuxError, match="whole_gpu_prefill_by_busy needs busy shares"):
            step_cost.Overheads(whole_gpu_prefill_by_busy=(bad,))


def test_a_whole_gpu_prefill_takes_the_longer_of_its_mfu_and_its_tiles():
    """On the whole GPU a prefill batch lasts the longer of its FLOPs at the prefill's MFU and
    its kernels' tiles (GEMM waves, small ops per token, the extend attention): short prompts'
    partial waves cost more than the MFU says, a long prompt's attention less than its FLOPs;
    with no tile times, or 64 tokens or fewer (the skinny tile), the MFU alone."""
    tiles = step_cost.TileTimes(((64, 128, 25e-6, 1.0), (128, 128, 27e-6, 1.0),
                                 (128, 256, 50e-6, 0.5)), 1e-7, 1e-7, 5e-9)
    rate = step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.6)
    law = step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0)
    with_tiles = step_cost.Overheads(mixed=step_cost.MixedStepFit(0.0, tiles=tiles))

    def prefill_s(prompt: int, overheads) -> tuple[float, float, float]:
        x = SimExecutor(H100, QWEN, law, rate, overheads=overheads)
        x.start([])
        req = traffic.Request(0, prompt, 1, 0.0)
        x.launch_prefill(x.begin_prefill([req]), 0, QWEN.layers)
        mfu = step_cost.compute_s(step_cost.layer_flops(QWEN, prompt, 0, QWEN.layers)
                                  + step_cost.lm_head_flops(QWEN, 1), rate, H100.sms, False)
        # the executor's own price of the batch is what it served
        assert x.whole_gpu_prefill_s([(prompt, 0)], QWEN.layers, True) == x.free["prefill"]
        tiled = (step_cost.tiled_layers_s(QWEN, prompt, [(prompt, 0)], tiles, H100.sms,
                                          QWEN.layers) or 0.0) if overheads.mixed else 0.0
        return x.free["prefill"], mfu, tiled

    for prompt in (300, 1500, 16000, 40):
        plain, mfu, tiled = prefill_s(prompt, step_cost.Overheads())
        assert plain == pytest.approx(mfu, rel=1e-9)  # no tile times: the MFU
        ends, mfu, tiled = prefill_s(prompt, with_tiles)
        assert ends == pytest.approx(max(mfu, tiled), rel=1e-9)
        if prompt <= 64:
            assert tiled == 0.0
    assert prefill_s(300, with_tiles)[2] > prefill_s(300, with_tiles)[1]  # partial waves
    assert prefill_s(16000, with_tiles)[2] < prefill_s(16000, with_tiles)[1]  # long attention


def test_a_split_prefill_is_slowed_by_its_partial_waves_against_the_timed_prompt():
    """A split batch's work, at the co-run and alone rates alike, is its FLOPs times its wave
    slowdown on the level's prefill SMs (`step_cost.wave_slowdown`) when the host costs hold
    tile times and the rate names the prompt it was timed on; without either, its FLOPs."""
    tiles = step_cost.TileTimes(((64, 128, 25e-6, 1.0), (128, 128, 27e-6, 1.0),
                                 (128, 256, 50e-6, 0.5)), 1e-7, 1e-7, 5e-9)
    law = step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0)
    level = next(lv for lv in sglang_rules.stream_groups(H100.sms, H100.cc_major)
                 if 0 < lv[1] < H100.sms)
    req = traffic.Request(0, 1000, 1, 0.0)

    def split_prefill_s(timed, overheads) -> float:
        rate = step_cost.PrefillRate(H100.bf16_tflops, H100.sms, ((60, 0.4), (112, 0.4)),
                                     timed_tokens=timed)
        x = SimExecutor(H100, QWEN, law, rate, overheads=overheads)
        x.start([])
        x.set_level(level)
        x.launch_prefill(x.begin_prefill([req]), 0, QWEN.layers)
        return x.free["prefill"], x.sms["prefill"]

    with_tiles = step_cost.Overheads(mixed=step_cost.MixedStepFit(0.0, tiles=tiles))
    plain, sms = split_prefill_s(None, with_tiles)
    slowed, _ = split_prefill_s(8192, with_tiles)
    wave = step_cost.wave_slowdown(QWEN, [(1000, 0)], tiles, sms, 8192)
    assert wave > 1.05 and slowed == pytest.approx(plain * wave, rel=1e-9)
    assert split_prefill_s(8192, step_cost.Overheads())[0] == pytest.approx(plain, rel=1e-9)


def test_a_split_prefill_pays_its_layers_fixed_time_on_the_gpu():
    """Each layer of a split prefill takes `split_prefill_layer_s` of GPU time beyond its FLOPs
    at its rate (over the card's prefill speed), whichever call launches it: a batch launched
    as two calls of layers pays its 36 layers' worth, a whole-GPU batch none of it (its eager
    step holds its fixed costs)."""
    law = step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0)
    rate = step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.5)
    level = next(lv for lv in sglang_rules.stream_groups(H100.sms, H100.cc_major)
                 if 0 < lv[1] < H100.sms)

    def prefill_ends(layer_s: float, at=level, speed: float = 1.0) -> float:
        x = SimExecutor(H100, QWEN, law, rate, prefill_speed=speed,
                        overheads=step_cost.Overheads(split_prefill_layer_s=layer_s))
        x.start([])
        x.set_level(at)
        carry = x.begin_prefill([traffic.Request(0, 700, 1, 0.0)])
        x.launch_prefill(carry, 0, 10)
        x.launch_prefill(carry, 10, QWEN.layers)
        return carry.ends_at

    assert prefill_ends(120e-6) - prefill_ends(0.0) == pytest.approx(QWEN.layers * 120e-6)
    # the busy share the clocks follow counts it: the prefill's span grows by as much

    def busy_span(layer_s: float) -> float:
        x = SimExecutor(H100, QWEN, law, rate, overheads=step_cost.Overheads(
            split_prefill_layer_s=layer_s, split_prefill_sustained=((72, 0.9), (112, 0.9))))
        x.start([])
        x.set_level(level)
        x.launch_prefill(x.begin_prefill([traffic.Request(0, 700, 1, 0.0)]), 0, QWEN.layers)
        (began, ended), = x.prefill_spans
        return ended - began

    assert busy_span(120e-6) - busy_span(0.0) == pytest.approx(QWEN.layers * 120e-6)
    assert prefill_ends(120e-6, speed=1.25) - prefill_ends(0.0, speed=1.25) == pytest.approx(
        QWEN.layers * 120e-6 / 1.25)
    whole = (H100.sms, 0)
    assert prefill_ends(120e-6, whole) == prefill_ends(0.0, whole)
    with pytest.raises(PdmuxError, match="split_prefill_layer_s"):
        step_cost.Overheads(split_prefill_layer_s=-1e-6)


def test_a_faster_card_divides_its_prefill_times_and_nothing_else():
    """At `prefill_speed` s a whole-GPU prefill's time (at its MFU and by its tiles) and a
    mixed step's are their price at 1 over s, and a split prefill's work is its FLOPs over s
    (what `_split_prefill_s` turns into time beside decode, alone while decode waits for the
    host, and toward its sustained rate); a decode step's (memory-bound), the host's share
    and the link's are not; a speed outside [0.5, 2] is refused in one line."""
    tiles = step_cost.TileTimes(((64, 128, 25e-6, 1.0), (128, 128, 27e-6, 1.0),
                                 (128, 256, 50e-6, 0.5)), 1e-7, 1e-7, 5e-9)
    law = step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 66.0)
    rate = step_cost.PrefillRate(H100.bf16_tflops, H100.sms, ((60, 0.4), (112, 0.45)))
    host = step_cost.Overheads(decode_round_s=1e-3, layer_launch_s=1e-6, eager_step_s=1e-5,
                               mixed=step_cost.MixedStepFit(2e-3, tiles=tiles))
    level = next(lv for lv in sglang_rules.stream_groups(H100.sms, H100.cc_major)
                 if 0 < lv[1] < H100.sms)

    def served(speed: float) -> dict:
        x = SimExecutor(H100, QWEN, law, rate, overheads=host, prefill_speed=speed)
        x.start([])
        out = {"decode": x.decode_price_s(32 * 2048, 40, True, 32, None),
               "round": x.overheads.decode_round_host_s(8, 16000, True),
               "short": x.whole_gpu_prefill_s([(300, 0)], QWEN.layers, True),  # by its tiles
               "long": x.whole_gpu_prefill_s([(16000, 0)], QWEN.layers, True)}  # by its MFU
        work = []
        priced = x._split_prefill_s
        x._split_prefill_s = lambda flops, *when: work.append(flops) or priced(flops, *when)
        x.set_level(level)
        x.launch_prefill(x.begin_prefill([traffic.Request(0, 4000, 1, 0.0)]), 0, QWEN.layers)
        out["split_work"] = work[0]
        x.set_level((0, H100.sms))
        decoding = [traffic.Request(3, 2000, 8, 0.0)]
        decoding[0].context = 2000
        began = x.t + host.mixed.fixed_s + host.layer_launch_s  # the GPU waits for one launch
        x.mixed(decoding, traffic.Request(2, 8000, 4, 0.0), 0, 4096)  # bound by its GPU
        out["mixed"] = x.t - began
        return out

    one, fast = served(1.0), served(1.25)
    assert one["mixed"] > 2 * QWEN.layers * host.layer_launch_s  # not its launches'
    assert one["short"] > step_cost.compute_s(
        step_cost.layer_flops(QWEN, 300, 0, QWEN.layers) + step_cost.lm_head_flops(QWEN, 1),
        rate, H100.sms, False)  # its tiles', not its MFU's
    for k in ("short", "long", "split_work", "mixed"):
        assert fast[k] == pytest.approx(one[k] / 1.25, rel=1e-9), k
    assert fast["decode"] == one["decode"] and fast["round"] == one["round"]
    for bad in (0.4, 2.5, float("nan"), float("inf"), True, "2"):
        with pytest.raises(PdmuxError, match="prefill_speed"):
            SimExecutor(H100, QWEN, law, rate, prefill_speed=bad)
