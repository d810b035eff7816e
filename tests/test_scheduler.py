"""The scheduler's three strategies on the simulated clock (no GPU): the chapter's story."""

from dataclasses import replace

import pytest

from pdmux_triton import metrics, policy, scheduler
from pdmux_triton.errors import PdmuxError
from pdmux_triton.hardware import gpu_preset, model_preset
from pdmux_triton.simulate import SimExecutor
from pdmux_triton.traffic import chapter_scenario, poisson

QWEN = model_preset("qwen3-8b")
H100 = gpu_preset("h100-sxm")


def run(strategy, reqs=None, s_sat=44.0, **kw):
    reqs = reqs or chapter_scenario(QWEN.vocab, decode_tokens=96)
    x = SimExecutor(H100, QWEN, s_sat=s_sat)
    return metrics.summarize(scheduler.run(strategy, x, reqs, **kw)), x


def test_decode_only_itl_matches_the_cost_model():
    s, x = run("prefill_first", reqs=chapter_scenario(QWEN.vocab, decode_tokens=8,
                                                      arrive_after_steps=10**6)[:-1])
    assert s["itl_p50_ms"] == pytest.approx(8.7, abs=0.1)
    assert s["prefill_ms"] is None and s["gpu_idle_frac"] == 0.0


def test_prefill_first_stalls_decode_for_the_whole_prefill():
    s, _ = run("prefill_first")
    assert s["tokens_during_prefill"] == 0
    assert s["prefill_ms"] == pytest.approx(270, abs=3)  # 36 layers, no LM head over the prompt
    assert s["itl_p99_ms"] > 270


@pytest.mark.parametrize("chunk,steps", [(2048, 4), (512, 16)])
def test_chunked_prefill_spreads_the_prompt(chunk, steps):
    s, _ = run("chunked", chunk=chunk)
    assert s["tokens_during_prefill"] == steps  # every chunk step also decodes a token
    assert s["itl_during_prefill_p50_ms"] > 8.7


@pytest.mark.parametrize("s_sat,itl", [(44, 8.8), (66, 11.1), (88, 14.8)])
def test_pdmux_keeps_itl_and_stretches_prefill(s_sat, itl):
    s, x = run("pdmux", s_sat=s_sat)
    # batch 32 on an H100 picks level 5: 80 prefill SMs, 52 decode SMs
    assert s["itl_during_prefill_p50_ms"] == pytest.approx(itl, rel=0.03)
    # the prefill on 80 of 132 SMs, seen by the host after the decode step it waits on
    prefill_on_80 = 270 * 132 / 80
    assert prefill_on_80 - 3 <= s["prefill_ms"] <= prefill_on_80 + itl + 1
    assert s["tokens_during_prefill"] > 30


def test_pdmux_levels_follow_sglang():
    reqs = chapter_scenario(QWEN.vocab, decode_tokens=64)
    result = scheduler.run("pdmux", SimExecutor(H100, QWEN), reqs)
    levels = {r.level for r in result.rounds}
    assert 5 in levels and 7 in levels  # split while prefilling, decode-only otherwise
    split_rounds = [r for r in result.rounds if r.prefill]
    assert [r.prefill for r in split_rounds][:2] == ["layers 0-8", "layers 8-16"]
    assert all(r.level == 5 for r in split_rounds)


def test_poisson_stream_serves_every_request():
    def stream():
        return poisson(QWEN.vocab, rate=4.0, count=12, prompt_mean=600, prompt_max=4000,
                       output_mean=20, output_max=60, seed=3)
    reqs = stream()
    for strategy in scheduler.STRATEGIES:
        result = scheduler.run(strategy, SimExecutor(H100, QWEN), stream(), chunk=512)
        assert all(r.done for r in result.requests)
        assert all(r.ttft is not None and r.ttft > 0 for r in result.requests)
        s = metrics.summarize(result)
        assert s["ttft_p50_ms"] > 0 and 0 <= s["gpu_idle_frac"] < 1
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)


def test_manual_divisions_pick_the_level():
    manual = [[112, 20, 1], [104, 28, 100], [96, 36, 100], [88, 44, 100], [80, 52, 100],
              [72, 60, 100]]
    config = policy.PDMuxConfig(8, manual)
    result = scheduler.run("pdmux", SimExecutor(H100, QWEN),
                           chapter_scenario(QWEN.vocab, decode_tokens=64), config=config)
    assert {r.level for r in result.rounds if r.prefill} == {1}


def test_unknown_strategy():
    with pytest.raises(PdmuxError, match="unknown strategy 'fcfs'"):
        scheduler.run("fcfs", SimExecutor(H100, QWEN), [])


def test_run_cli_simulates_without_a_gpu(tmp_path, capsys):
    import json

    import torch

    from pdmux_triton import cli

    if torch.cuda.is_available():
        pytest.skip("has a GPU: run would measure")
    # 64 decode steps of ~12 ms outlast the simulated 480 ms prefill beside them
    assert cli.main(["run", "--gpu", "h200", "--decode-tokens", "64", "--out", str(tmp_path),
                     "--calibration", "bench/results/calibrate-h200.json", "--json"]) == 0
    printed = capsys.readouterr().out
    out = json.loads((tmp_path / "run-h200.json").read_text())
    assert json.loads(printed) == out  # progress goes to stderr, stdout is pure JSON
    assert out["mode"] == "simulated"
    strategies = out["summary"]["strategies"]
    assert set(strategies) == {"decode_only", "prefill_first", "chunked_2048", "chunked_512",
                               "pdmux_grid_cap", "pdmux_green"}
    assert strategies["prefill_first"]["tokens_during_prefill"] == 0
    assert "pdmux_grid_cap" in out["summary"]["estimate_error_pct"]
    pd = out["details"]["pdmux_grid_cap"]
    assert list(pd["ttft_ms"]) == ["32"] and pd["prefills"][0]["decode_steps"] > 0
    assert any(r["prefill"] == "layers 0-8" and r["level"] == 5 for r in pd["rounds"])
    assert (tmp_path / "run-h200.png").stat().st_size > 1000


def test_calibrated_estimate_uses_the_measured_curve():
    from pdmux_triton import estimate

    sc = estimate.Scenario(gpu=gpu_preset("h200"))
    point = {"workload": "decode_step", "kind": "grid_cap", "state": "corun", "ctas_per_sm": 1}
    summary = {"summary": {"decode_step": {"grid_cap": {"corun": {"peak_tbps": 2.4,
                                                                  "s_sat_fit": 110.0}}}},
               "rows": [{**point, "sms": 32, "tbps": 1.0}, {**point, "sms": 64, "tbps": 1.6},
                        {**point, "sms": 132, "tbps": 2.4}, {**point, "sms": 48, "tbps": 9.0,
                                                             "ctas_per_sm": 2}]}
    cal = estimate.calibrated(sc, summary)
    assert cal.bw_efficiency == pytest.approx(0.5) and cal.s_sat == (110.0,)
    # a step's rate is read off the measured curve (ctas 1 only), not the S_SAT line
    step_bytes = estimate.decode_step_bytes(cal.model, cal.decode_batch, cal.context)
    assert estimate.decode_step_s(cal, 52, 110.0) == pytest.approx(step_bytes / 1.375e12)
    assert estimate.decode_step_s(cal, 200, 110.0) == pytest.approx(step_bytes / 2.4e12)
    with pytest.raises(PdmuxError, match="no decode_step / green / corun fit"):
        estimate.calibrated(sc, summary, "green")
    # the comparison's co-running prefill rate at the chosen level (80 prefill SMs) sets MFU
    levels = [{"prefill_sms": 80, "prefill": {"grid_cap": {"corun_tflops": 300.0}}}]
    cal = estimate.calibrated(sc, summary, compare_levels=levels)
    assert cal.mfu == pytest.approx(300 / (989 * 80 / 132))
    rows = {r.approach: r for r in estimate.estimate(cal)}
    assert rows["pdmux_ssat110"].prefill_ms == pytest.approx(
        estimate.prefill_flops(cal.model, 8192) / 300e12 * 1e3)
    # a level the comparison did not measure (advised levels): MFU interpolated between levels
    mfu = {64: 0.40, 96: 0.50}
    levels = [{"prefill_sms": n, "prefill": {"grid_cap": {"corun_tflops": m * 989 * n / 132}}}
              for n, m in mfu.items()]
    assert estimate.calibrated(sc, summary, compare_levels=levels).mfu == pytest.approx(0.45)
    sc72 = replace(sc, pdmux=policy.PDMuxConfig(sm_group_num=3, manual_divisions=[[72, 60, 1]]))
    assert estimate.calibrated(sc72, summary, compare_levels=levels).mfu == pytest.approx(0.425)
    with pytest.raises(PdmuxError, match="lack prefill / grid_cap / corun_tflops"):
        estimate.calibrated(sc, summary, compare_levels=[{"prefill_sms": 64}])


def test_uncovered_time_of_overlapping_spans():
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]
    assert metrics.uncovered(spans, 0.0, 6.0) == pytest.approx(2.0)  # the gap 3-5
    assert metrics.uncovered(spans, 0.0, 8.0) == pytest.approx(4.0)  # plus the tail
    assert metrics.uncovered([], 1.0, 2.0) == pytest.approx(1.0)
