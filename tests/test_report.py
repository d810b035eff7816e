"""Tables: aligned columns with units, "-" where a figure does not apply."""

from pdmux_triton import calibrate, compare, estimate, policy, report
from pdmux_triton.hardware import gpu_preset
from test_compare import level_entry


def test_table_aligns_and_separates_columns():
    text = report.table(["name", "ITL ms"], [["decode_only", "8.7"], ["chunked_512", "17.9"]])
    lines = text.splitlines()
    assert lines[0] == "name         ITL ms"
    assert lines[1].endswith("   8.7") and lines[2].endswith("  17.9")
    assert len({len(line) for line in lines}) == 1


def test_estimate_table_names_the_gpus_figures():
    sc = estimate.Scenario()
    text = report.estimate_table(sc, estimate.estimate(sc))
    assert "132 SMs, 3.35 TB/s, 989 bf16 TFLOP/s" in text
    assert "SMs prefill/decode" in text and "80/52" in text


def test_levels_table():
    gpu = gpu_preset("h100-sxm")
    config = policy.PDMuxConfig()
    levels = config.levels(gpu.sms, gpu.cc_major)
    text = report.levels_table(gpu, config, levels, config.batch_ranges(levels))
    assert "prefill only" in text and "decode only" in text and "level 6 (72/60)" in text


def test_calibration_and_compare_tables():
    points = [{"workload": "decode_step", "kind": "green", "state": "alone", "ctas_per_sm": 1,
               "sms": b, "tbps": 4.0 * min(1, b / 66)} for b in (8, 16, 64, 132)]
    assert "S_SAT fit (SMs)" in report.calibration_table(calibrate.summarize(points))
    entry = level_entry()
    entry.update(compare.level_errors(entry))
    assert "80/52" in report.compare_table([entry])
