"""What users read from a finished run.

The chapter's figures: ITL (overall and during prefills), prefill time, decode tokens produced
while a prompt was prefilled, GPU idle time. The serving figures (as vLLM's and SGLang's
serving benchmarks define them): per request TTFT, TPOT = (E2E - TTFT) / (output - 1), E2E
latency and the scheduling delay before its prefill starts; ITL over every token; request and
output-token throughput; and, given SLOs, the share of requests meeting both the TTFT and the
TPOT target and the goodput, those requests per second (DistServe).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pdmux_triton.scheduler import RunResult
from pdmux_triton.traffic import Request

MS = 1e3


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    tpot_ms: float

    def met(self, ttft_s: float | None, tpot_s: float | None) -> bool:
        return (ttft_s is not None and ttft_s * MS <= self.ttft_ms
                and (tpot_s is None or tpot_s * MS <= self.tpot_ms))


def uncovered(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Time in [start, end] that no (begin, finish) span covers: when the GPU had nothing queued."""
    covered, last = 0.0, start
    for a, b in sorted(spans):
        a, b = max(a, last), min(b, end)
        if b > a:
            covered += b - a
            last = b
    return max(0.0, (end - start) - covered)


def _pct(values, q: float, scale: float = MS) -> float | None:
    return float(np.percentile(values, q)) * scale if len(values) else None


def _spread(prefix: str, values, scale: float = MS) -> dict:
    """mean, p50, p90 and p99 of `values` (seconds) in ms, None when there are none."""
    out = {f"{prefix}_mean_ms": float(np.mean(values)) * scale if len(values) else None}
    for q in (50, 90, 99):
        out[f"{prefix}_p{q}_ms"] = _pct(values, q, scale)
    return out


def _gaps_during_prefills(result: RunResult) -> np.ndarray:
    """Inter-token waits on this server that overlap one of its prefills."""
    itl = intervals(result)
    ends = np.array([t for t, _ in itl])
    gaps = np.array([d for _, d in itl])
    return gaps[_during(ends, gaps, prefill_windows(result))]


def _tokens_during_prefills(result: RunResult) -> list[int]:
    """Decode steps this server finished during each of its prefills."""
    decode_ends = np.array([rd.end for rd in result.rounds if rd.decode_bs > 0])
    return [int(np.sum((decode_ends > a) & (decode_ends <= b))) for a, b in prefill_windows(result)]


def prefill_windows(result: RunResult) -> list[tuple[float, float]]:
    return sorted({(r.prefill_start, r.prefill_end) for r in result.requests
                   if not r.warm and r.prefill_start is not None and r.prefill_end is not None})


def intervals(result: RunResult) -> list[tuple[float, float]]:
    """(end time, inter-token latency) of every token after a request's first."""
    out = []
    for r in result.requests:
        out += [(b, b - a) for a, b in zip(r.token_times, r.token_times[1:])]
    return sorted(out)


def _during(ends: np.ndarray, gaps: np.ndarray, windows) -> np.ndarray:
    """Which waits (end, gap) overlap any prefill window: start < window end and end > start."""
    if not windows or not len(ends):
        return np.zeros(len(ends), dtype=bool)
    starts = np.array([a for a, _ in windows])
    stops = np.maximum.accumulate(np.array([b for _, b in windows]))  # windows sorted by start
    # the last window starting before the wait ends is the latest-ending candidate
    i = np.searchsorted(starts, ends, side="left") - 1
    return (i >= 0) & (stops[np.clip(i, 0, None)] > ends - gaps)


def tpot(r: Request) -> float | None:
    """Time per output token after the first, in s (None for a single-token request)."""
    if len(r.token_times) < 2:
        return None
    return (r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1)


def summarize(result: RunResult, slo: Slo | None = None) -> dict:
    """The run's figures; behind a router, those of one GPU's timeline (idle time, level
    changes, tokens during a prefill: the server's own) are taken on each server and combined."""
    windows = prefill_windows(result)
    gaps = np.array([d for _, d in intervals(result)])
    servers = result.parts or [result]
    during = np.concatenate([_gaps_during_prefills(part) for part in servers])
    tokens_during = [n for part in servers for n in _tokens_during_prefills(part)]
    served = [r for r in result.requests if not r.warm]
    ttfts = [r.ttft for r in served if r.ttft is not None]
    return {
        "strategy": result.strategy,
        "itl_p50_ms": _pct(gaps, 50),
        "itl_p99_ms": _pct(gaps, 99),
        "itl_during_prefill_p50_ms": _pct(during, 50),
        "itl_during_prefill_max_ms": float(during.max()) * MS if len(during) else None,
        # the decode step on the GPU alone, without the host's share of the ITL
        "decode_gpu_p50_ms": _pct(result.activity.decode_step_s, 50),
        "prefill_ms": _pct([b - a for a, b in windows], 50),
        "tokens_during_prefill": float(np.mean(tokens_during)) if tokens_during else None,
        "ttft_p50_ms": _pct(ttfts, 50),
        "ttft_p99_ms": _pct(ttfts, 99),
        "requests": len(result.requests),
        "rounds": len(result.rounds),
        "wall_s": result.wall_s,
        "gpu_idle_frac": float(np.mean([gpu_idle_frac(part) for part in servers])),
        "level_changes": sum(sum(a.level != b.level for a, b in zip(part.rounds, part.rounds[1:]))
                             for part in servers),
        "level_drain_ms": sum(result.activity.drain_s) * MS,
        **serving(result, slo),
    }


def serving(result: RunResult, slo: Slo | None = None) -> dict:
    """The serving benchmark's figures over the requests that arrived during the run."""
    served = [r for r in result.requests if not r.warm]
    lost = [r for r in result.requests if len(r.tokens) < r.output_len]
    out = {"requests_served": len(served), "requests_lost": len(lost)}
    if not served:
        return out
    ttft = [r.ttft for r in served if r.ttft is not None]
    tpots = [t for t in map(tpot, served) if t is not None]
    e2e = [r.token_times[-1] - r.arrival for r in served if r.token_times]
    delay = [r.prefill_start - r.arrival for r in served if r.prefill_start is not None]
    gaps = np.array([d for _, d in intervals(result)])
    first = min(r.arrival for r in served)
    last = max((r.token_times[-1] for r in served if r.token_times), default=first)
    span = max(last - first, 1e-9)
    out.update(_spread("ttft", ttft))
    out.update(_spread("tpot", tpots))
    out.update(_spread("itl", gaps))
    out.update(_spread("e2e", e2e))
    out["sched_delay_p50_s"] = _pct(delay, 50, scale=1.0)
    out["request_throughput_rps"] = len(served) / span
    out["output_throughput_tps"] = sum(len(r.tokens) for r in served) / span
    if slo is not None:
        met = sum(slo.met(r.ttft, tpot(r)) for r in served)
        out["slo_attainment"] = met / len(served)
        out["goodput_rps"] = met / span
    return out


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
    decode_ends = np.array([rd.end for rd in result.rounds if rd.decode_bs > 0])
    return {
        "ttft_ms": {r.rid: r.ttft * MS for r in result.requests
                    if not r.warm and r.ttft is not None},
        "prefills": [{"start_s": a, "end_s": b,
                      "decode_steps": int(np.sum((decode_ends > a) & (decode_ends <= b)))}
                     for a, b in windows],
        "rounds": [{"start_s": rd.start, "end_s": rd.end, "level": rd.level,
                    "decode_bs": rd.decode_bs, "prefill": rd.prefill,
                    "decode_context": rd.decode_context} for rd in result.rounds],
    }
