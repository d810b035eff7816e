"""What a finished run reports: idle time from busy spans, ITL during prefills, TTFT."""

import pytest

from pdmux_triton import metrics
from pdmux_triton.scheduler import Activity, Round, RunResult
from pdmux_triton.traffic import Request


def test_uncovered_time_of_overlapping_spans():
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]
    assert metrics.uncovered(spans, 0.0, 6.0) == pytest.approx(2.0)  # the gap 3-5
    assert metrics.uncovered(spans, 0.0, 8.0) == pytest.approx(4.0)  # plus the tail
    assert metrics.uncovered([], 1.0, 2.0) == pytest.approx(1.0)


def test_summary_of_a_hand_made_run():
    warm = Request(0, [1] * 4, 4, 0.0, warm=True)
    warm.tokens, warm.token_times = [9, 9, 9, 9], [0.0, 0.01, 0.05, 0.06]
    new = Request(1, [2] * 8, 2, 0.015)
    new.prefill_start, new.prefill_end = 0.015, 0.05
    new.tokens, new.token_times = [7, 7], [0.05, 0.06]
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
    r = Request(rid, [1] * 8, len(times), arrival)
    r.prefill_start, r.prefill_end = start, times[0]
    r.tokens, r.token_times = [0] * len(times), list(times)
    return r


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
    assert s["goodput_rps"] == pytest.approx(2 / 2.1)
    assert metrics.Slo(1000, 50).met(0.2, None) and not metrics.Slo(1000, 50).met(None, 0.01)
