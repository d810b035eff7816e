"""What users came for, from a finished run: ITL (overall and during prefills), TTFT, prefill
time, decode tokens produced while a prompt was prefilled, and GPU idle time."""

from __future__ import annotations

import numpy as np

from pdmux_triton.scheduler import RunResult


def uncovered(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Time in [start, end] that no (begin, finish) span covers: when the GPU had nothing queued."""
    covered, last = 0.0, start
    for a, b in sorted(spans):
        a, b = max(a, last), min(b, end)
        if b > a:
            covered += b - a
            last = b
    return max(0.0, (end - start) - covered)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def prefill_windows(result: RunResult) -> list[tuple[float, float]]:
    return sorted({(r.prefill_start, r.prefill_end) for r in result.requests
                   if not r.warm and r.prefill_start is not None and r.prefill_end is not None})


def intervals(result: RunResult) -> list[tuple[float, float]]:
    """(end time, inter-token latency) of every token after a request's first."""
    out = []
    for r in result.requests:
        out += [(b, b - a) for a, b in zip(r.token_times, r.token_times[1:])]
    return sorted(out)


def summarize(result: RunResult) -> dict:
    windows = prefill_windows(result)
    itl = intervals(result)
    # a token's wait counts as "during a prefill" when it overlaps the prefill's window
    during = [d for t, d in itl if any(t - d < b and t > a for a, b in windows)]
    decode_ends = [rd.end for rd in result.rounds if rd.decode_bs > 0]
    tokens_during = [sum(a < t <= b for t in decode_ends) for a, b in windows]
    served = [r for r in result.requests if not r.warm]
    ms = 1e3
    return {
        "strategy": result.strategy,
        "itl_p50_ms": _scale(_pct([d for _, d in itl], 50), ms),
        "itl_p99_ms": _scale(_pct([d for _, d in itl], 99), ms),
        "itl_during_prefill_p50_ms": _scale(_pct(during, 50), ms),
        "itl_during_prefill_max_ms": _scale(max(during) if during else None, ms),
        # the decode step on the GPU alone, without the host's share of the ITL
        "decode_gpu_p50_ms": _scale(_pct(result.activity.decode_step_s, 50), ms),
        "prefill_ms": _scale(_pct([b - a for a, b in windows], 50), ms),
        "tokens_during_prefill": float(np.mean(tokens_during)) if tokens_during else None,
        "ttft_p50_ms": _scale(_pct([r.ttft for r in served if r.ttft is not None], 50), ms),
        "ttft_p99_ms": _scale(_pct([r.ttft for r in served if r.ttft is not None], 99), ms),
        "requests": len(result.requests),
        "rounds": len(result.rounds),
        "wall_s": result.wall_s,
        "gpu_idle_frac": gpu_idle_frac(result),
    }


def gpu_idle_frac(result: RunResult) -> float:
    """Share of the executor's window in which no launch was running (host overhead)."""
    start, end = result.activity.window
    if end <= start:
        return 0.0
    return uncovered(result.activity.busy, start, end) / (end - start)


def details(result: RunResult) -> dict:
    """Per-request and per-round records of a run, for the JSON: TTFT of every served request,
    decode steps during each prefill, and the round timeline."""
    windows = prefill_windows(result)
    decode_ends = [rd.end for rd in result.rounds if rd.decode_bs > 0]
    return {
        "ttft_ms": {r.rid: r.ttft * 1e3 for r in result.requests
                    if not r.warm and r.ttft is not None},
        "prefills": [{"start_s": a, "end_s": b, "decode_steps": sum(a < t <= b for t in decode_ends)}
                     for a, b in windows],
        "rounds": [{"start_s": rd.start, "end_s": rd.end, "level": rd.level,
                    "decode_bs": rd.decode_bs, "prefill": rd.prefill} for rd in result.rounds],
    }


def _scale(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor
