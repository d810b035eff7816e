"""Grid capping against real green contexts, the pure part: the emulation error of a measured
level (`comparison_run` measures them). The error is grid cap's rate relative to the green
context's, in percent, for each side alone and co-running.
"""

from __future__ import annotations


def error_pct(emulated: float, real: float) -> float:
    return (emulated - real) / real * 100.0


def level_errors(entry: dict) -> dict:
    """Errors of one level from its measured rates (co-running, the state PD-mux runs in)."""
    d, p = entry["decode"], entry["prefill"]
    return {
        "decode_error_pct": error_pct(d["grid_cap"]["corun_tbps"], d["green"]["corun_tbps"]),
        "prefill_error_pct": error_pct(p["grid_cap"]["corun_tflops"], p["green"]["corun_tflops"]),
        "decode_alone_error_pct": error_pct(d["grid_cap"]["alone_tbps"], d["green"]["alone_tbps"]),
        "prefill_alone_error_pct": error_pct(p["grid_cap"]["alone_tflops"],
                                             p["green"]["alone_tflops"]),
    }
