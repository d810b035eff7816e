import json

import pytest

from pdmux_triton import calibrate, compare, report
from pdmux_triton.calibrate import PointKey, PointStore, SweepPlan, fit_s_sat
from pdmux_triton.errors import PdmuxError
from pdmux_triton.telemetry import sm_usage

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
    import math

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
    store = PointStore(path)
    k1 = PointKey("stream_read", "green", 1, "alone", 8)
    store.add(k1, ms=1.0, tbps=0.5)
    with path.open("a") as f:
        f.write('{"workload": "stream_read", "kind": "gre')  # a crash mid-write
    again = PointStore(path)
    assert again.has(k1) and again.points[k1.as_tuple()]["tbps"] == 0.5
    assert not again.has(PointKey("stream_read", "green", 1, "alone", 16))
    assert "skipping an unreadable point" in capsys.readouterr().out


def test_store_forgets_a_workloads_points_on_disk(tmp_path):
    path = tmp_path / "points.jsonl"
    store = PointStore(path)
    keep = PointKey("stream_read", "green", 2, "alone", 8)
    store.add(keep, ms=1.0, tbps=0.5)
    for ctas in (1, 2):
        store.add(PointKey("decode_step", "grid_cap", ctas, "corun", 16), ms=2.0, tbps=0.2)
    assert store.forget(("decode_step", "decode_linear")) == 2
    again = PointStore(path)
    assert list(again.points) == [keep.as_tuple()] and list(store.points) == [keep.as_tuple()]


def test_plan_has_no_corun_at_the_whole_gpu():
    plan = SweepPlan(("stream_read",), ("grid_cap", "green"), (1, 2), (8, 16, 132), corun=True)
    keys = list(plan.keys())
    assert len(keys) == 2 * 2 * (3 + 2)  # kinds x ctas x (alone at 3 budgets + corun at 2)
    assert not any(k.state == "corun" and k.sms == 132 for k in keys)
    assert not any(k.state == "corun" for k in SweepPlan(("x",), ("green",), (1,), (8,), False).keys())


def test_run_sweep_with_nothing_left_needs_no_gpu(tmp_path):
    plan = SweepPlan(("stream_read",), ("green",), (1,), (8, 132), corun=False)
    store = PointStore(tmp_path / "p.jsonl")
    for key in plan.keys():
        store.add(key, ms=1.0, tbps=float(key.sms))
    calibrate.run_sweep(plan, store, log=lambda msg: None)  # resumes: nothing to measure


def test_summary_fits_ctas_1_and_reports_best_peak(tmp_path):
    points = []
    for ctas, peak in ((1, 4.0), (2, 4.5)):
        for b in BUDGETS:
            points.append({"workload": "decode_step", "kind": "green", "state": "alone",
                           "ctas_per_sm": ctas, "sms": b, "tbps": peak * min(1, b / 66)})
    s = calibrate.summarize(points)["decode_step"]["green"]["alone"]
    assert s["peak_tbps"] == pytest.approx(4.0) and s["s_sat_fit"] == pytest.approx(66)
    assert s["peak_tbps_any_ctas"] == pytest.approx(4.5)
    assert "decode_step" in report.calibration_table(calibrate.summarize(points))
    report.plot_calibration(points, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_settings_must_match_to_resume(tmp_path):
    path = tmp_path / "settings.json"
    calibrate.check_settings(path, {"model": "qwen3-8b", "batch": 32})
    calibrate.check_settings(path, {"model": "qwen3-8b", "batch": 32})
    with pytest.raises(PdmuxError, match="use another --out folder or the same settings"):
        calibrate.check_settings(path, {"model": "qwen3-8b", "batch": 64})


def test_sm_usage_overlap_and_tpcs():
    u = sm_usage([0, 1, 2, 3, -1], [3, 4, 5, -1, -1])
    assert (u["prefill_sms_used"], u["decode_sms_used"], u["shared_sms"]) == (4, 3, 1)
    assert u["shared_sm_ids"] == [3]
    assert (u["prefill_tpcs"], u["decode_tpcs"], u["shared_tpcs"]) == (2, 2, 1)


def test_compare_errors_and_report(tmp_path):
    entry = {"level": 5, "prefill_sms": 80, "decode_sms": 52,
             "decode": {"grid_cap": {"alone_tbps": 3.0, "corun_tbps": 2.0, "alone_ms": 1, "corun_ms": 1.5},
                        "green": {"alone_tbps": 2.5, "corun_tbps": 2.5, "alone_ms": 1.2, "corun_ms": 1.2}},
             "prefill": {"grid_cap": {"alone_tflops": 400.0, "corun_tflops": 330.0},
                         "green": {"alone_tflops": 400.0, "corun_tflops": 300.0}},
             "telemetry": {"grid_cap": {"shared_sms": 12}, "green": {"shared_sms": 0}}}
    entry.update(compare.level_errors(entry))
    assert entry["decode_error_pct"] == pytest.approx(-20.0)
    assert entry["prefill_error_pct"] == pytest.approx(10.0)
    assert entry["decode_alone_error_pct"] == pytest.approx(20.0)
    assert "80/52" in report.compare_table([entry])
    report.plot_compare([entry], tmp_path / "cmp.png")
    assert (tmp_path / "cmp.png").stat().st_size > 1000
    json.dumps(entry)


def test_calibrate_cli_without_gpu(capsys):
    import torch

    from pdmux_triton import cli

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert cli.main(["calibrate", "--out", "/tmp/none"]) == 2
    assert "measuring needs a CUDA GPU" in capsys.readouterr().err
    assert cli.main(["calibrate", "--workloads", "prefill_magic"]) == 2
    assert "unknown workload 'prefill_magic'" in capsys.readouterr().err
    assert cli.main(["calibrate", "--ctas", "0,2"]) == 2
    assert "--ctas takes CTAs per SM >= 1" in capsys.readouterr().err


def test_results_json_has_the_issue_schema(tmp_path):
    points = [{"workload": wl, "kind": kind, "state": state, "ctas_per_sm": 1, "sms": b,
               "tbps": 4.0 * min(1, b / 48)}
              for wl in ("stream_read", "decode_step") for kind in ("grid_cap", "green")
              for state in ("alone", "corun") for b in BUDGETS]
    summary = calibrate.summarize(points)
    path = calibrate.write_results(tmp_path / "c.json", "h200", {"model": "qwen3-8b"}, points,
                                   summary)
    data = json.loads(path.read_text())
    assert {"gpu", "torch", "triton", "date", "rows", "summary"} <= set(data)
    fit = data["summary"]["decode_step"]["green"]["corun"]
    assert set(fit) >= {"peak_tbps", "s_sat_fit", "s_sat_95"}
    assert fit["s_sat_fit"] == pytest.approx(48)
