"""The calibration's pure part: the S_SAT fit, the resumable point store, the sweep's plan,
the summary and the results file."""

import json
import math

import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.measure import calibration_sweep
from pdmux_triton.measure.calibration_sweep import (PointKey, SweepPlan, fit_s_sat, forget,
                                                    point_store)

BUDGETS = list(range(8, 132, 8)) + [132]


@pytest.mark.parametrize("s_sat", [24, 44, 66, 88, 100])
@pytest.mark.parametrize("peak", [1.0, 4.4])
def test_fit_recovers_the_chapter_model(s_sat, peak):
    rates = [peak * min(1.0, b / s_sat) for b in BUDGETS]
    fit = fit_s_sat(BUDGETS, rates)
    assert fit["peak_tbps"] == pytest.approx(peak)
    assert fit["s_sat_fit"] == pytest.approx(s_sat, rel=1e-9)
    assert fit["s_sat_95"] == min(b for b in BUDGETS if b >= 0.95 * s_sat)


def test_fit_on_a_soft_knee():
    # saturating curve r = peak * (1 - exp(-b / 30)): linear part slope ~ peak / 30
    rates = [4.0 * (1 - math.exp(-b / 30)) for b in BUDGETS]
    fit = fit_s_sat(BUDGETS, rates)
    assert 30 < fit["s_sat_fit"] < 45
    # 95% of the peak at 132 SMs: 1 - e^(-b/30) >= 0.95 (1 - e^-4.4) -> b >= 83.6
    assert fit["s_sat_95"] == 88


@pytest.mark.parametrize("budgets,rates,message", [
    ([8, 16], [1.0], "equally many"),
    ([], [], "equally many"),
    ([0, 8], [0.0, 1.0], "positive"),
    ([8, 16], [0.0, 0.0], "every rate is zero"),
])
def test_fit_errors(budgets, rates, message):
    with pytest.raises(PdmuxError, match=message):
        fit_s_sat(budgets, rates)


def test_store_resumes_and_skips_a_torn_line(tmp_path, capsys):
    path = tmp_path / "points.jsonl"
    store = point_store(path)
    k1 = PointKey("stream_read", "green", 1, "alone", 8)
    store.add(k1, ms=1.0, tbps=0.5)
    with path.open("a") as f:
        f.write('{"workload": "stream_read", "kind": "gre')  # a crash mid-write
    again = point_store(path)
    assert again.has(k1) and again.get(k1)["tbps"] == 0.5
    assert not again.has(PointKey("stream_read", "green", 1, "alone", 16))
    assert "skipping an unreadable point" in capsys.readouterr().err


def test_store_forgets_the_points_a_sweep_measures_again_on_disk(tmp_path):
    path = tmp_path / "points.jsonl"
    store = point_store(path)
    keep = [PointKey("stream_read", "green", 2, "alone", 8),  # another workload
            PointKey("decode_step", "grid_cap", 2, "corun", 16),  # other CTAs
            PointKey("decode_step", "grid_cap", 1, "corun", 24, batch=96),  # another budget
            PointKey("decode_step", "grid_cap", 1, "corun", 16, batch=64)]  # another batch
    for k in keep:
        store.add(k, ms=1.0, tbps=0.5)
    again_measured = [PointKey("decode_step", "grid_cap", 1, "corun", 16, batch=96),
                      PointKey("decode_step", "grid_cap", 1, "alone", 16)]
    for k in again_measured:
        store.add(k, ms=2.0, tbps=0.2)
    with path.open("a") as f:  # a point saved before keys had a batch reads as batch 0
        f.write('{"workload": "decode_step", "kind": "grid_cap", "ctas_per_sm": 1, '
                '"state": "corun", "sms": 16, "ms": 3.0, "tbps": 0.1}\n')
    store = point_store(path)
    plan = SweepPlan(("decode_step",), ("grid_cap",), (1,), (16, 132), corun=True,
                     decode_batches=(96,))
    assert forget(store, plan) == 3
    again = point_store(path)
    assert all(again.has(k) for k in keep) and len(again.points) == len(store.points) == 4


def test_plan_has_no_corun_at_the_whole_gpu():
    plan = SweepPlan(("stream_read",), ("grid_cap", "green"), (1, 2), (8, 16, 132), corun=True)
    keys = list(plan.keys())
    assert len(keys) == 2 * 2 * (3 + 2)  # kinds x ctas x (alone at 3 budgets + corun at 2)
    assert not any(k.state == "corun" and k.sms == 132 for k in keys)
    assert not any(k.state == "corun" for k in SweepPlan(("x",), ("green",), (1,), (8,), False).keys())


def test_summary_fits_ctas_1_and_reports_best_peak():
    points = []
    for ctas, peak in ((1, 4.0), (2, 4.5)):
        for b in BUDGETS:
            points.append({"workload": "decode_step", "kind": "green", "state": "alone",
                           "ctas_per_sm": ctas, "sms": b, "tbps": peak * min(1, b / 66)})
    s = calibration_sweep.summarize(points)["decode_step"]["green"]["alone"]
    assert s["peak_tbps"] == pytest.approx(4.0) and s["s_sat_fit"] == pytest.approx(66)
    assert s["peak_tbps_any_ctas"] == pytest.approx(4.5)


def test_results_json_has_the_issue_schema(tmp_path):
    points = [{"workload": wl, "kind": kind, "state": state, "ctas_per_sm": 1, "sms": b,
               "tbps": 4.0 * min(1, b / 48)}
              for wl in ("stream_read", "decode_step") for kind in ("grid_cap", "green")
              for state in ("alone", "corun") for b in BUDGETS]
    summary = calibration_sweep.summarize(points)
    path = calibration_sweep.write_results(tmp_path / "c.json", "h200", {"model": "qwen3-8b"}, points,
                                           summary)
    data = json.loads(path.read_text())
    assert {"gpu", "torch", "triton", "date", "commit", "version", "rows", "summary"} <= set(data)
    fit = data["summary"]["decode_step"]["green"]["corun"]
    assert set(fit) >= {"peak_tbps", "s_sat_fit", "s_sat_95"}
    assert fit["s_sat_fit"] == pytest.approx(48)


def test_plan_measures_decode_step_at_other_batches_at_one_cta_only():
    plan = SweepPlan(("decode_step", "stream_read"), ("grid_cap",), (1, 2), (20, 132),
                     corun=True, batch=32, decode_batches=(8, 32, 72))
    keys = list(plan.keys())
    others = [k for k in keys if k.batch]
    assert {(k.batch, k.sms, k.state) for k in others} == {
        (b, s, st) for b in (8, 72) for s, st in ((20, "alone"), (20, "corun"), (132, "alone"))}
    assert all(k.workload == "decode_step" and k.ctas_per_sm == 1 for k in others)
    assert len(keys) == len(set(keys))


def test_plan_measures_decode_step_at_other_contexts_at_the_own_batch_and_one_cta():
    plan = SweepPlan(("decode_step", "decode_attention"), ("grid_cap",), (1, 2), (20, 132),
                     corun=True, batch=32, context=2048, decode_batches=(8,),
                     decode_contexts=(2048, 8192))
    keys = list(plan.keys())
    longer = [k for k in keys if k.context]
    assert {(k.context, k.batch, k.sms, k.state) for k in longer} == {
        (8192, 0, s, st) for s, st in ((20, "alone"), (20, "corun"), (132, "alone"))}
    assert all(k.workload == "decode_step" and k.ctas_per_sm == 1 for k in longer)
    assert not any(k.batch and k.context for k in keys) and len(keys) == len(set(keys))


def test_points_saved_before_the_batch_key_read_as_the_own_batch(tmp_path):
    path = tmp_path / "points.jsonl"
    path.write_text(json.dumps({"workload": "decode_step", "kind": "grid_cap", "ctas_per_sm": 1,
                                "state": "alone", "sms": 20, "ms": 1.0, "tbps": 2.0}) + "\n")
    store = point_store(path)
    assert store.has(PointKey("decode_step", "grid_cap", 1, "alone", 20))
    assert not store.has(PointKey("decode_step", "grid_cap", 1, "alone", 20, batch=72))


def test_the_summary_fits_the_own_batch_only():
    points = [{"workload": "decode_step", "kind": "grid_cap", "state": "alone", "ctas_per_sm": 1,
               "sms": s, "tbps": float(s)} for s in (8, 16)]
    points.append({"workload": "decode_step", "kind": "grid_cap", "state": "alone",
                   "ctas_per_sm": 1, "sms": 16, "tbps": 100.0, "batch": 72})
    points.append({"workload": "decode_step", "kind": "grid_cap", "state": "alone",
                   "ctas_per_sm": 1, "sms": 16, "tbps": 100.0, "context": 8192})
    fit = calibration_sweep.summarize(points)["decode_step"]["grid_cap"]["alone"]
    assert fit["peak_tbps"] == 16.0 and fit["peak_tbps_any_ctas"] == 16.0
