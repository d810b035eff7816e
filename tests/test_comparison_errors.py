"""The emulation error of a measured level: grid cap's rate relative to the green context's."""

import json

import pytest

from pdmux_triton.measure import comparison_errors


def level_entry():
    return {"level": 5, "prefill_sms": 80, "decode_sms": 52,
            "decode": {"grid_cap": {"alone_tbps": 3.0, "corun_tbps": 2.0, "alone_ms": 1, "corun_ms": 1.5},
                       "green": {"alone_tbps": 2.5, "corun_tbps": 2.5, "alone_ms": 1.2, "corun_ms": 1.2}},
            "prefill": {"grid_cap": {"alone_tflops": 400.0, "corun_tflops": 330.0},
                        "green": {"alone_tflops": 400.0, "corun_tflops": 300.0}},
            "telemetry": {"grid_cap": {"shared_sms": 12}, "green": {"shared_sms": 0}}}


def test_level_errors():
    entry = level_entry()
    entry.update(comparison_errors.level_errors(entry))
    assert entry["decode_error_pct"] == pytest.approx(-20.0)
    assert entry["prefill_error_pct"] == pytest.approx(10.0)
    assert entry["decode_alone_error_pct"] == pytest.approx(20.0)
    assert entry["prefill_alone_error_pct"] == pytest.approx(0.0)
    assert not any(k.startswith("pinned_") for k in entry)  # not measured, no pinned errors
    json.dumps(entry)


def test_pinned_errors_beside_grid_capping_and_none_without_green():
    entry = level_entry()
    entry["decode"]["pinned"] = {"alone_tbps": 2.6, "corun_tbps": 2.4, "alone_ms": 1, "corun_ms": 1}
    entry["prefill"]["pinned"] = {"alone_tflops": 404.0, "corun_tflops": 303.0}
    errors = comparison_errors.level_errors(entry)
    assert errors["decode_error_pct"] == pytest.approx(-20.0)  # grid capping's, as before
    assert errors["pinned_decode_error_pct"] == pytest.approx(-4.0)
    assert errors["pinned_prefill_error_pct"] == pytest.approx(1.0)
    assert errors["pinned_decode_alone_error_pct"] == pytest.approx(4.0)
    for side in ("decode", "prefill"):
        del entry[side]["green"]
    assert comparison_errors.level_errors(entry) == {}
