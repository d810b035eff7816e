"""What a finished run reports: idle time from busy spans, ITL during prefills, TTFT, the
serving figures and goodput."""

from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdmux_triton.cost import step_cost
from pdmux_triton.serve import metrics, scheduler
from pdmux_triton.serve.executor import Activity, Round, RunResult
from pdmux_triton.serve.simulated import SimExecutor
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import Exponential, Request, stream


def _times(r: Request, times: list[float]) -> Request:
    """A hand-made request's token times: the first from its prefill (for a request decoding
    from the start, none), the rest as decode steps of a log of its own."""
    first = not r.warm
    r.first_token_s = times[0] if first else None
    r.step_ends, r.step0, r.generated = array("d", times[first:]), 0, len(times)
    return r


def test_uncovered_time_of_overlapping_spans():
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]
    assert metrics.uncovered(spans, 0.0, 6.0) == pytest.approx(2.0)  # the gap 3-5
    assert metrics.uncovered(spans, 0.0, 8.0) == pytest.approx(4.0)  # plus the tail
    assert metrics.uncovered([], 1.0, 2.0) == pytest.approx(1.0)


def test_summary_of_a_hand_made_run():
    warm = _times(Request(0, 4, 4, 0.0, warm=True), [0.0, 0.01, 0.05, 0.06])
    new = _times(Request(1, 8, 2, 0.015, prefill_start=0.015, prefill_end=0.05), [0.05, 0.06])
    rounds = [Round(0.0, 0.01, -1, 1, ""), Round(0.01, 0.05, -1, 1, "chunk 0+8"),
              Round(0.05, 0.06, -1, 2, "")]
    result = RunResult("chunked", [warm, new], rounds, 0.06,
                       Activity([(0.0, 0.01), (0.01, 0.05), (0.05, 0.055)], (0.0, 0.06),
                                [0.01, 0.04, 0.005]))
    s = metrics.summarize(result)
    assert s["ttft_p50_ms"] == pytest.approx(35.0)
    assert s["prefill_ms"] == pytest.approx(35.0)
    assert s["itl_during_prefill_p50_ms"] == pytest.approx(40.0)  # the token whose wait overlaps
    assert s["tokens_during_prefill"] == 1
    assert s["gpu_idle_frac"] == pytest.approx(0.005 / 0.06)
    d = metrics.details(result)
    assert d["ttft_ms"] == {1: pytest.approx(35.0)} and d["prefills"][0]["decode_steps"] == 1


def _served(rid, arrival, start, times):
    return _times(Request(rid, 8, len(times), arrival, prefill_start=start,
                          prefill_end=times[0]), times)


def test_serving_figures_and_slo_attainment():
    fast = _served(0, 0.0, 0.0, [0.1, 0.12, 0.14, 0.16])  # TTFT 100 ms, TPOT 20 ms
    slow = _served(1, 0.5, 1.5, [2.0, 2.1])  # queued 1 s, TTFT 1500 ms, TPOT 100 ms
    lost = _served(2, 0.5, 0.6, [0.7])
    lost.output_len = 3  # got one token of three
    result = RunResult("pdmux", [fast, slow, lost], [], 2.1,
                       Activity([(0.0, 2.1)], (0.0, 2.1), []))
    s = metrics.serving(result, metrics.Slo(ttft_ms=1000, tpot_ms=50))
    assert s["requests_served"] == 3 and s["requests_lost"] == 1
    assert s["ttft_p50_ms"] == pytest.approx(200.0)
    assert s["tpot_mean_ms"] == pytest.approx(60.0)  # (20 + 100) / 2: one-token requests have none
    assert s["e2e_p50_ms"] == pytest.approx(200.0)
    assert s["sched_delay_p50_s"] == pytest.approx(0.1)
    assert s["request_throughput_rps"] == pytest.approx(3 / 2.1)
    assert s["output_throughput_tps"] == pytest.approx(7 / 2.1)
    # fast meets both; slow misses TTFT and TPOT; the lost one meets TTFT and has no TPOT
    assert s["slo_attainment"] == pytest.approx(2 / 3)
    # the later half by arrival (ties by id) is slow and the lost one: one of two meets
    assert s["slo_attainment_last_half"] == pytest.approx(1 / 2)
    # goodput: per second of arrivals (0 to 0.5 s); the run's own rate counts the drain too
    assert s["goodput_rps"] == pytest.approx(2 / 0.5)
    assert s["slo_met_throughput_rps"] == pytest.approx(2 / 2.1)
    assert metrics.Slo(1000, 50).met(0.2, None) and not metrics.Slo(1000, 50).met(None, 0.01)


def test_goodput_of_arrivals_that_span_no_time_counts_the_served_span():
    one = _served(0, 1.0, 1.0, [1.2, 1.3])
    result = RunResult("pdmux", [one], [], 1.3, Activity([(1.0, 1.3)], (0.0, 1.3), []))
    s = metrics.serving(result, metrics.Slo(ttft_ms=1000, tpot_ms=500))
    assert s["goodput_rps"] == s["slo_met_throughput_rps"] == pytest.approx(1 / 0.3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e3, allow_subnormal=False), st.integers(0, 40)),
                min_size=1, max_size=30), st.sampled_from([0, 1, 37.5, 50, 90, 99, 100]))
def test_percentiles_of_counted_waits_are_numpys_over_every_token(pairs, q):
    values = np.array([v for v, _ in pairs])
    counts = np.array([c for _, c in pairs])
    got = metrics._Ranked.of(values, counts).pct(q)
    if counts.sum() == 0:
        assert got is None
    else:
        assert got == float(np.percentile(np.repeat(values, counts), q)) * metrics.MS


@pytest.mark.parametrize("strategy", scheduler.LOOPS)
def test_waits_counted_per_step_are_every_tokens_wait(strategy):
    """The waits a run's step log gives, repeated by their counts, are the per-token gaps of
    every request's token times."""
    gpu, model = gpu_preset("h200"), model_preset("qwen3-8b")
    x = SimExecutor(gpu, model, step_cost.SaturationLaw(4.0, 66),
                    step_cost.PrefillRate.fixed(gpu.bf16_tflops, gpu.sms, 0.5))
    reqs = stream(model.vocab, 20.0, 40, Exponential(800, 4000, 30, 120), seed=2)
    result = scheduler.run(strategy, x, reqs, chunk=512)
    by_token = sorted((b, b - a) for r in result.requests
                      for a, b in zip(r.token_times, r.token_times[1:]))
    assert metrics.intervals(result) == by_token
    assert len(by_token) == sum(r.output_len - 1 for r in reqs)
