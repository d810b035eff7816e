"""Tables: aligned columns with units, "-" where a figure does not apply."""

import pytest
from test_comparison_errors import level_entry

from pdmux_triton.cli import tables
from pdmux_triton.experiments import estimate
from pdmux_triton.measure import calibration_sweep, comparison_errors
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.spec.gpus import gpu_preset


def test_table_aligns_and_separates_columns():
    text = tables.table(["name", "ITL ms"], [["decode_only", "8.7"], ["chunked_512", "17.9"]])
    lines = text.splitlines()
    assert lines[0] == "name         ITL ms"
    assert lines[1].endswith("   8.7") and lines[2].endswith("  17.9")
    assert len({len(line) for line in lines}) == 1


def test_estimate_table_names_the_gpus_figures():
    sc = estimate.Scenario()
    text = tables.estimate_table(sc, estimate.estimate(sc))
    assert "132 SMs, 3.35 TB/s, 989 bf16 TFLOP/s" in text
    assert "SMs prefill/decode" in text and "80/52" in text


def test_levels_table():
    gpu = gpu_preset("h100-sxm")
    config = sglang_rules.PDMuxConfig()
    levels = config.levels(gpu.sms, gpu.cc_major)
    text = tables.levels_table(gpu, config, levels, config.batch_ranges(levels))
    assert "prefill only" in text and "decode only" in text and "level 6 (72/60)" in text


def test_calibration_and_compare_tables():
    points = [{"workload": "decode_step", "kind": "green", "state": "alone", "ctas_per_sm": 1,
               "sms": b, "tbps": 4.0 * min(1, b / 66)} for b in (8, 16, 64, 132)]
    assert "S_SAT fit (SMs)" in tables.calibration_table(calibration_sweep.summarize(points))
    entry = level_entry()
    entry.update(comparison_errors.level_errors(entry))
    assert "80/52" in tables.compare_table([entry])
    assert "pinned" not in tables.compare_table([entry])
    entry["decode"]["pinned"] = dict(entry["decode"]["green"])
    entry["prefill"]["pinned"] = dict(entry["prefill"]["green"])
    entry["telemetry"]["pinned"] = {"shared_sms": 0}
    entry.update(comparison_errors.level_errors(entry))
    text = tables.compare_table([entry])
    assert "pinned decode err %" in text and "SMs both sides used (pinned)" in text


def _inputs(**files):
    return {"gpu": {"name": "h200"}, "s_sat": 66.0, "bw_eff": 0.85, "mfu": 0.5,
            "kinds": ["grid_cap", "green"], "calibration": None, "compare": None,
            "host_costs": None, **files}


@pytest.mark.parametrize("files, says", [
    ({"calibration": "shipped:calibrate-h200.json", "compare": "shipped:compare-h200.json",
      "host_costs": "shipped:host-costs-h200.json"}, "the h200's calibration, comparison and "
     "host costs shipped with the tool"),
    ({"calibration": "shipped:calibrate-h100-sxm.json",
      "compare": "shipped:compare-h100-sxm.json",
      "host_costs": "shipped:host-costs-h100-sxm.json"}, "shipped with the tool (measured there; "
     "README, 'How far a simulation sits from a measurement', gives its error)"),
    ({"calibration": "a.json", "compare": "b.json", "host_costs": "c.json"},
     "the calibration, comparison and host costs given"),
    ({"calibration": "a.json"}, "partly calibrated (prefill at 0.5 of the bf16 rate on its "
     "SMs; no host time between kernels)"),
    ({}, "first-order and uncalibrated (decode at min(1, SMs / S_SAT 66) of 0.85 x HBM "
     "bandwidth; prefill at 0.5"),
    ({}, "pdmux_grid_cap and pdmux_green are priced alike without a calibration"),
])
def test_the_cost_model_line_says_what_priced_the_steps(files, says):
    line = tables.cost_model_line(_inputs(**files))
    assert line.startswith("cost model: ") and says in line
    # the README's error figures are cited only for the measurements they were read with
    shipped = len(files) == 3 and all(v.startswith("shipped:") for v in files.values())
    assert ("gives its error" in line) == shipped


@pytest.mark.parametrize("value, fmt, shown", [
    (0.0042, ".1f", "0.0042"), (5.3, ".0f", "5.3"), (12.3, ".0f", "12"), (0.05, ".2f", "0.050"),
    (-0.004, "+.0f", "-0.0040"), (0.0, ".1f", "0.0"), (None, ".1f", "-"), (0.5, ".0%", "50%")])
def test_a_small_figure_keeps_two_significant_digits(value, fmt, shown):
    assert tables.cell(value, fmt) == shown


def test_gpu_idle_is_a_dash_where_the_run_had_no_time_between_kernels_to_count():
    rows = [{"strategy": "prefill_first", "gpu_idle_frac": 0.0, "itl_p50_ms": 0.00025,
             "prefill_ms": 270.4, "tokens_during_prefill": 4.0}]
    head, row = tables.strategy_table(rows, idle_known=False).splitlines()
    assert "prefill p50 ms" in head and "tokens in prefill mean" in head
    assert row.split()[-1] == "-" and "0.00025" in row
    assert tables.strategy_table(rows).splitlines()[1].split()[-1] == "0.0%"
