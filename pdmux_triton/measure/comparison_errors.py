"""Grid capping and pinned partitions against real green contexts, the pure part: the emulation
error of a measured level (`comparison_run` measures them). The error is an emulation's rate
relative to the green context's, in percent, for each side alone and co-running; grid capping's
keys are unprefixed, pinned's start with `pinned_`.
"""

from __future__ import annotations


def error_pct(emulated: float, real: float) -> float:
    return (emulated - real) / real * 100.0


EMULATIONS = {"grid_cap": "", "pinned": "pinned_"}  # kind -> its error keys' prefix


def level_errors(entry: dict) -> dict:
    """Errors of one level from its measured rates (co-running, the state PD-mux runs in), for
    each emulation measured beside green contexts."""
    d, p = entry["decode"], entry["prefill"]
    out = {}
    if "green" not in d:
        return out
    for kind, prefix in EMULATIONS.items():
        if kind not in d:
            continue
        out.update({
            f"{prefix}decode_error_pct": error_pct(d[kind]["corun_tbps"], d["green"]["corun_tbps"]),
            f"{prefix}prefill_error_pct": error_pct(p[kind]["corun_tflops"],
                                                    p["green"]["corun_tflops"]),
            f"{prefix}decode_alone_error_pct": error_pct(d[kind]["alone_tbps"],
                                                         d["green"]["alone_tbps"]),
            f"{prefix}prefill_alone_error_pct": error_pct(p[kind]["alone_tflops"],
                                                          p["green"]["alone_tflops"])})
    return out
