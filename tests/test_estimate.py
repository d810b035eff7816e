"""The chapter's table must come out of the cost model with its defaults; a calibration and a
comparison replace its law and its MFU."""

from dataclasses import replace

import pytest

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import Calibration, Comparison
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments import estimate
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.spec.gpus import gpu_preset


def rows_by_name(**kw):
    return {r.approach: r for r in estimate.estimate(estimate.Scenario(**kw))}


def test_the_chapters_table():
    """The chapter's scenario (H100, Qwen3-8B): its LM head runs over each prompt's sampled row,
    where the chapter's rougher count ran it over every prompt token (299 ms prefill-first),
    and a chunk counts the 32 decode rows beside it, as SGLang's mixed chunk does, where the
    chapter took whole chunks beside them (4 and 16 steps, ITL 69 and 18 ms)."""
    rows = rows_by_name()
    assert round(rows["decode_only"].itl_ms) == 9
    pf = rows["prefill_first"]
    assert (round(pf.itl_ms), round(pf.prefill_ms), pf.tokens_during_prefill, pf.steps) == (279, 270, 0, 1)
    c = rows["chunked_2048"]
    assert (round(c.itl_ms), round(c.prefill_ms), c.tokens_during_prefill, c.steps) == (56, 278, 5, 5)
    c = rows["chunked_512"]
    assert (round(c.itl_ms), round(c.prefill_ms), c.tokens_during_prefill, c.steps) == (16, 294, 18, 18)
    for s_sat, itl, tokens in ((44, 9, 51), (66, 11, 40), (88, 15, 30)):
        r = rows[f"pdmux_ssat{s_sat}"]
        assert (r.prefill_sms, r.decode_sms) == (80, 52)
        assert (round(r.itl_ms), round(r.prefill_ms), r.tokens_during_prefill) == (itl, 446, tokens)


def test_a_last_partial_chunk_is_counted():
    assert rows_by_name(prompt=1000, chunk_sizes=(300,))["chunked_300"].steps == 4


@pytest.mark.parametrize("kwargs,message", [
    ({"decode_batch": -1}, "decode batch must be an integer >= 1"),
    ({"prompt": 0}, "prompt must be an integer >= 1"),
    ({"chunk_sizes": (0,)}, "chunk sizes must be positive"),
    ({"chunk_sizes": (32, 512)}, "chunk sizes 32 hold no prompt tokens beside 32 decode rows"),
    ({"s_sat": (0,)}, "S_SAT values must be positive"),
    ({"s_sat": (float("inf"),)}, "S_SAT values must be positive"),
    ({"mfu": 1.5}, r"MFU must be in \(0, 1\]"),
])
def test_bad_scenarios(kwargs, message):
    with pytest.raises(PdmuxError, match=message):
        estimate.Scenario(**kwargs)


def _calibration():
    point = {"workload": "decode_step", "kind": "grid_cap", "ctas_per_sm": 1}
    rows = ([{**point, "state": "corun", "sms": s, "tbps": t} for s, t in ((32, 1.0), (64, 1.6),
                                                                          (124, 2.4))]
            + [{**point, "state": "alone", "sms": s, "tbps": t} for s, t in ((32, 1.2), (132, 3.0))]
            + [{**point, "state": "corun", "sms": 48, "tbps": 9.0, "ctas_per_sm": 2}])
    summary = {"decode_step": {"grid_cap": {"corun": {"peak_tbps": 2.4, "s_sat_fit": 110.0}}}}
    return Calibration("cal.json", "h200", {}, tuple(rows), summary)


def test_a_calibration_replaces_the_law_with_the_measured_curves():
    sc = estimate.Scenario(gpu=gpu_preset("h200"))
    cal = estimate.calibrated(sc, _calibration())
    assert cal.bw_efficiency == pytest.approx(0.5) and cal.s_sat == (110.0,)
    rows = {r.approach: r for r in estimate.estimate(cal)}
    step_bytes = step_cost.decode_step_bytes(cal.model, cal.decode_batch * cal.context)
    # pd-mux's step beside the prefill reads the corun curve at 52 SMs (ctas 1 only) ...
    assert rows["pdmux_ssat110"].itl_ms == pytest.approx(step_bytes / 1.375e12 * 1e3)
    # ... decode alone on the whole GPU the alone curve
    assert rows["decode_only"].itl_ms == pytest.approx(step_bytes / 3.0e12 * 1e3)
    with pytest.raises(PdmuxError, match="no decode_step / green / corun fit"):
        estimate.calibrated(sc, _calibration(), "green")


def test_a_comparison_sets_the_prefill_mfu_by_level():
    sc = estimate.Scenario(gpu=gpu_preset("h200"))
    levels = [{"prefill_sms": 80, "prefill": {"grid_cap": {"corun_tflops": 300.0,
                                                            "alone_tflops": 360.0}}}]
    cal = estimate.calibrated(sc, _calibration(), comparison=Comparison("c.json", "h200",
                                                                         tuple(levels)))
    assert cal.mfu == pytest.approx(300 / (989 * 80 / 132))
    rows = {r.approach: r for r in estimate.estimate(cal)}
    assert rows["pdmux_ssat110"].prefill_ms == pytest.approx(
        step_cost.prefill_flops(cal.model, 8192) / 300e12 * 1e3)
    # prefill-first has the GPU to itself: the MFU measured alone, held past the last level
    alone_mfu = 360 / (989 * 80 / 132)
    assert rows["prefill_first"].prefill_ms == pytest.approx(
        step_cost.prefill_flops(cal.model, 8192) / (989e12 * alone_mfu) * 1e3)
    # a level the comparison did not measure (advised levels): MFU read between levels
    mfu = {64: 0.40, 96: 0.50}
    levels = tuple({"prefill_sms": n, "prefill": {"grid_cap": {
        "corun_tflops": m * 989 * n / 132, "alone_tflops": m * 989 * n / 132}}}
                   for n, m in mfu.items())
    cmp = Comparison("c.json", "h200", levels)
    assert estimate.calibrated(sc, _calibration(), comparison=cmp).mfu == pytest.approx(0.45)
    sc72 = replace(sc, pdmux=sglang_rules.PDMuxConfig(sm_group_num=3, manual_divisions=[[72, 60, 1]]))
    assert estimate.calibrated(sc72, _calibration(), comparison=cmp).mfu == pytest.approx(0.425)
    with pytest.raises(PdmuxError, match="lack prefill / grid_cap / corun_tflops"):
        estimate.calibrated(sc, _calibration(),
                            comparison=Comparison("c.json", "h200", ({"prefill_sms": 64},)))
