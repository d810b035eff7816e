"""What users read from a finished run.

The chapter's figures: ITL (overall and during prefills), prefill time, decode tokens produced
while a prompt was prefilled, GPU idle time. The serving figures (as vLLM's and SGLang's
serving benchmarks define them): per request TTFT, TPOT = (E2E - TTFT) / (output - 1), E2E
latency and the scheduling delay before its prefill starts; ITL over every token; request and
output-token throughput over the served span (first arrival to last token). Given SLOs: the
share of requests meeting both the TTFT and the TPOT target (`slo_attainment`, and over the
later half of the requests by arrival, `slo_attainment_last_half`); the goodput
(DistServe's), those requests per second of arrivals (`goodput_rps`: over the span from the
first arrival to the last; a run whose arrivals span no time, one request say, counts the
served span instead); and `slo_met_throughput_rps`, those requests per second of the whole
served span, the drain after the last arrival included.

Waits between tokens are counted per decode step, not per token (`waits`): the requests of a
batch share each step's wait. Percentiles over them are exactly numpy's (linear) over every
token; a mean is summed per distinct wait, so it can differ from a per-token sum in its last
digits (float rounding).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from pdmux_triton.cost.step_cost import CHUNKED_STEPS
from pdmux_triton.serve.executor import RunResult
from pdmux_triton.spec.traffic import Request

MS = 1e3
# How the executor's chunked steps were when a run was saved, by what it wrote: generation 0
# (neither key) gave each decode row an extend tile a query head and took the whole chunk
# beside the rows; 1 (MIXED_DECODE_ROWS alone) ran the rows through decode attention, the
# whole chunk beside them; 2, today (both), also counts the rows in the chunk, as SGLang's
# mixed chunk does (`PrefillAdder`'s chunk budget less the running batch).
MIXED_DECODE_ROWS = "decode_attention"  # under "mixed_decode_rows"
MIXED_CHUNK_ROWS = "counted_in_chunk"  # under "mixed_chunk_rows"


def steps_marks(steps: int) -> dict:
    """What a saved run writes of the generation of chunked steps it was served with (what
    `chunked_steps_of` reads back)."""
    return {**({"mixed_decode_rows": MIXED_DECODE_ROWS} if steps >= 1 else {}),
            **({"mixed_chunk_rows": MIXED_CHUNK_ROWS} if steps >= CHUNKED_STEPS else {})}


def chunked_steps_of(strategy: str, saved: dict) -> int:
    """The generation of chunked steps a saved run (its diagnostics, a strategy's details or
    a capacity point) was served with; CHUNKED_STEPS for any strategy but chunked prefill."""
    if not strategy.startswith("chunked_"):
        return CHUNKED_STEPS
    if saved.get("mixed_decode_rows") != MIXED_DECODE_ROWS:
        return 0
    return CHUNKED_STEPS if saved.get("mixed_chunk_rows") == MIXED_CHUNK_ROWS else 1


def stale_steps(strategy: str, saved: dict) -> bool:
    """A saved chunked run served before today's chunked steps (`chunked_steps_of`)."""
    return chunked_steps_of(strategy, saved) < CHUNKED_STEPS


def rows_in_extend_tiles(strategy: str, saved: dict) -> bool:
    """A chunked run whose mixed steps gave each decode row an extend tile (generation 0):
    what a round of it is priced with, alone (fits and round-by-round prices read a round's
    chunk from its label, so only this tells its rounds from today's)."""
    return chunked_steps_of(strategy, saved) == 0


def later_layer_s(diagnostics: dict) -> float | None:
    """A measured run's host time a later layer of an eager launch (they replay the first's
    launches; `diagnostics`' median), or None where it timed none: a run measured before
    replays launched every layer as it did the first."""
    us = diagnostics.get("host_later_layer_us")
    return us / 1e6 if us else None


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    tpot_ms: float

    def met(self, ttft_s: float | None, tpot_s: float | None) -> bool:
        return (ttft_s is not None and ttft_s * MS <= self.ttft_ms
                and (tpot_s is None or tpot_s * MS <= self.tpot_ms))


def uncovered(spans, start: float, end: float) -> float:
    """Time in [start, end] that no (begin, finish) span covers: when the GPU had nothing queued."""
    spans = np.asarray(spans, dtype=float).reshape(-1, 2)
    if not len(spans):
        return max(0.0, end - start)
    order = np.lexsort((spans[:, 1], spans[:, 0]))
    begin, finish = spans[order, 0], spans[order, 1]
    del order  # a long run holds millions of launches: no more copies than needed
    np.minimum(finish, end, out=finish)
    # a sweep in start order: each span covers what lies past the furthest end before it
    reached = np.empty_like(finish)
    reached[0] = start
    np.maximum.accumulate(finish[:-1], out=reached[1:])
    np.maximum(begin, np.maximum(reached, start, out=reached), out=begin)
    np.subtract(finish, begin, out=finish)
    pieces = np.maximum(finish, 0.0, out=finish)
    covered = np.cumsum(pieces, out=pieces)[-1]  # summed in order, as the sweep adds them
    return max(0.0, (end - start) - float(covered))


@dataclass(frozen=True)
class Waits:
    """Every wait between two tokens of a request, each distinct (end, length) once with the
    number of tokens that waited it (0 for a step no request waited through)."""

    end: np.ndarray
    gap: np.ndarray
    count: np.ndarray

    @staticmethod
    def joined(parts: list["Waits"]) -> "Waits":
        if not parts:
            return Waits(np.zeros(0), np.zeros(0), np.zeros(0, np.int32))
        return Waits(*(np.concatenate([getattr(w, k) for w in parts])
                       for k in ("end", "gap", "count")))


def waits(requests: list[Request]) -> Waits:
    """The waits of `requests`: after its first token a request's tokens are the decode steps
    of its server's log from `step0` on, so a step's wait is counted once for all the requests
    decoding through it; the wait for the first decode token is each request's own."""
    groups: dict[int, list[Request]] = {}
    for r in requests:
        if r.step_ends is not None:
            groups.setdefault(id(r.step_ends), []).append(r)
    parts = []
    for reqs in groups.values():
        times = np.frombuffer(reqs[0].step_ends, dtype=np.float64)  # the step ends, read in place
        step0 = _column(reqs, "step0", np.int64)
        first = np.array([r.first_token_s is not None for r in reqs])
        decoded = _column(reqs, "generated", np.int64) - first
        # step j's wait (from step j-1) counts once for each request holding both steps
        spans = decoded >= 2
        held = np.bincount(step0[spans] + 1, minlength=len(times) + 1)
        held -= np.bincount(step0[spans] + decoded[spans], minlength=len(times) + 1)
        count = np.cumsum(held, out=held)[1:len(times)].astype(np.int32)
        del held  # a long run's log holds millions of steps: one array of them at a time
        parts.append(Waits(times[1:], np.diff(times), count))
        first &= decoded >= 1
        starts = times[step0[first]]
        prefilled = [r.first_token_s for r, f in zip(reqs, first.tolist()) if f]
        parts.append(Waits(starts, starts - np.array(prefilled, dtype=float),
                           np.ones(len(starts), np.int32)))
    return Waits.joined(parts)


def _column(reqs: list[Request], attr: str, dtype=float) -> np.ndarray:
    return np.fromiter((getattr(r, attr) for r in reqs), dtype, len(reqs))


def _given(values) -> np.ndarray:
    """The values that are not None, as an array (a run's may be millions)."""
    out = np.fromiter((math.nan if v is None else v for v in values), float)
    return out[~np.isnan(out)]


class _Ranked:
    """Sorted values each repeated by its count: numpy's (linear) percentiles and the mean of
    the repeated values, without repeating them."""

    def __init__(self, values: np.ndarray, counts: np.ndarray):
        self.values, self.upto = values, np.cumsum(counts, dtype=np.int64)
        self.n = int(self.upto[-1]) if len(self.upto) else 0
        self.total = float(np.dot(values, counts))

    @classmethod
    def of(cls, values: np.ndarray, counts: np.ndarray) -> "_Ranked":
        order = np.argsort(values, kind="stable")
        return cls(values[order], counts[order])

    def _nth(self, i: int) -> float:
        """The i-th smallest of the repeated values (values counted 0 times never are)."""
        return float(self.values[np.searchsorted(self.upto, min(i, self.n - 1), side="right")])

    def max(self) -> float | None:
        return self._nth(self.n - 1) * MS if self.n else None

    def pct(self, q: float) -> float | None:
        if not self.n:
            return None
        h = (self.n - 1) * (q / 100)
        lo = math.floor(h)
        a, b, t = self._nth(lo), self._nth(lo + 1), h - lo
        # numpy's interpolation, to the same bits
        return (a + (b - a) * t if t < 0.5 else b - (b - a) * (1 - t)) * MS

    def spread(self, prefix: str) -> dict:
        """As `_spread`: mean, p50, p90 and p99 in ms."""
        out = {f"{prefix}_mean_ms": self.total / self.n * MS if self.n else None}
        for q in (50, 90, 99):
            out[f"{prefix}_p{q}_ms"] = self.pct(q)
        return out


def _pct(values, q: float, scale: float = MS) -> float | None:
    return float(np.percentile(values, q)) * scale if len(values) else None


def _spread(prefix: str, values, scale: float = MS) -> dict:
    """mean, p50, p90 and p99 of `values` (seconds) in ms, None when there are none."""
    out = {f"{prefix}_mean_ms": float(np.mean(values)) * scale if len(values) else None}
    for q in (50, 90, 99):
        out[f"{prefix}_p{q}_ms"] = _pct(values, q, scale)
    return out


def _windows(result: RunResult) -> np.ndarray:
    """The server's prefill windows (start, end), distinct (a batch shares one), by start."""
    prefilled = [r for r in result.requests
                 if not r.warm and r.prefill_start is not None and r.prefill_end is not None]
    spans = np.column_stack([_column(prefilled, "prefill_start"),
                             _column(prefilled, "prefill_end")])
    spans = spans[np.lexsort((spans[:, 1], spans[:, 0]))]
    distinct = np.ones(len(spans), dtype=bool)
    distinct[1:] = np.any(spans[1:] != spans[:-1], axis=1)
    return spans[distinct]


def prefill_windows(result: RunResult) -> list[tuple[float, float]]:
    return [(a, b) for a, b in _windows(result).tolist()]


def _decode_ends(result: RunResult) -> np.ndarray:
    """When each of the server's decode steps ended, in order."""
    rounds = result.rounds
    return np.sort(rounds.column("end")[rounds.column("decode_bs") > 0])


def _steps_within(ends: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """Decode steps ending in each (start, end] window."""
    return (np.searchsorted(ends, windows[:, 1], side="right")
            - np.searchsorted(ends, windows[:, 0], side="right"))


def _during(w: Waits, windows: np.ndarray) -> np.ndarray:
    """Which waits (end, gap) overlap a prefill window: start < window end and end > start."""
    if not len(windows) or not len(w.end):
        return np.zeros(len(w.end), dtype=bool)
    stops = np.maximum.accumulate(windows[:, 1])  # windows by start
    # the last window starting before the wait ends is the latest-ending candidate
    i = np.searchsorted(windows[:, 0], w.end, side="left") - 1
    overlap = i >= 0
    overlap &= stops[np.maximum(i, 0, out=i)] > w.end - w.gap
    return overlap


def _ranked_waits(result: RunResult, windows: np.ndarray) -> tuple[_Ranked, _Ranked]:
    """Every token's wait, and those that overlap one of their server's prefills (`windows`,
    for one server), ranked."""
    every = waits(result.requests)
    if result.parts:
        inside = []
        for part in result.parts:
            w = waits(part.requests)
            mask = _during(w, _windows(part))
            inside.append((w.gap[mask], w.count[mask]))
        gap, count = (np.concatenate(x) for x in zip(*inside))
        return _Ranked.of(every.gap, every.count), _Ranked.of(gap, count)
    # one sort for both, one array of the run's waits at a time: a long run holds millions
    inside = _during(every, windows)
    gap, count = every.gap, every.count
    del every
    order = np.argsort(gap, kind="stable")
    gap = gap[order]
    count = count[order]
    inside = inside[order]
    del order
    return _Ranked(gap, count), _Ranked(gap[inside], count[inside])


def intervals(result: RunResult) -> list[tuple[float, float]]:
    """(end time, inter-token latency) of every token after a request's first."""
    w = waits(result.requests)
    return sorted(zip(np.repeat(w.end, w.count).tolist(), np.repeat(w.gap, w.count).tolist()))


def tpot(r: Request) -> float | None:
    """Time per output token after the first, in s (None for a single-token request)."""
    if r.generated < 2:
        return None
    return (r.last_time - r.first_time) / (r.generated - 1)


def summarize(result: RunResult, slo: Slo | None = None) -> dict:
    """The run's figures; behind a router, those of one GPU's timeline (idle time, level
    changes, tokens during a prefill: the server's own) are taken on each server and combined."""
    servers = result.parts or [result]
    idle = float(np.mean([gpu_idle_frac(part) for part in servers]))  # before the waits: memory
    windows = _windows(result)
    ranked, during = _ranked_waits(result, windows)
    tokens_during = np.concatenate([_steps_within(_decode_ends(p), _windows(p) if result.parts
                                                  else windows) for p in servers])
    ttfts = _given(r.ttft for r in result.requests if not r.warm)
    return {
        "strategy": result.strategy,
        "itl_p50_ms": ranked.pct(50),
        "itl_p99_ms": ranked.pct(99),
        "itl_during_prefill_p50_ms": during.pct(50),
        "itl_during_prefill_max_ms": during.max(),
        # the decode step on the GPU alone, without the host's share of the ITL
        "decode_gpu_p50_ms": _pct(result.activity.decode_step_s, 50),
        # how fast this machine's host launched an eager layer, a launch's first (measured
        # runs): hosts beside one GPU model differ, and host-bound steps follow it
        "host_layer_p50_ms": _pct(result.activity.host_layer_s, 50),
        # and on average: launch-bound steps add up their launches, slow tail included
        "host_layer_mean_ms": (float(np.mean(result.activity.host_layer_s)) * MS
                               if len(result.activity.host_layer_s) else None),
        # a launch's later layers, which replay its first layer's launches
        "host_later_layer_p50_ms": _pct(result.activity.host_later_layer_s, 50),
        "prefill_ms": _pct(windows[:, 1] - windows[:, 0], 50),
        "tokens_during_prefill": float(np.mean(tokens_during)) if len(tokens_during) else None,
        "ttft_p50_ms": _pct(ttfts, 50),
        "ttft_p99_ms": _pct(ttfts, 99),
        "requests": len(result.requests),
        "rounds": len(result.rounds),
        "wall_s": result.wall_s,
        "gpu_idle_frac": idle,
        "level_changes": sum(int(np.count_nonzero(np.diff(part.rounds.column("level"))))
                             for part in servers),
        "level_drain_ms": float(sum(result.activity.drain_s)) * MS,
        **prefix_cache_figures(result),
        **serving(result, slo, ranked),
    }


def prefix_cache_figures(result: RunResult) -> dict:
    """The prefix cache's hit rate (prompt tokens read from it over prompt tokens admitted) and
    the blocks it evicted, over every server; None where it was off."""
    stats = [p.prefix_cache for p in (result.parts or [result]) if p.prefix_cache is not None]
    if not stats:
        return {"prefix_hit_rate": None, "prefix_evicted_blocks": None}
    prompt = sum(st["prompt_tokens"] for st in stats)
    return {"prefix_hit_rate": sum(st["cached_tokens"] for st in stats) / prompt if prompt else 0.0,
            "prefix_evicted_blocks": sum(st["evicted_blocks"] for st in stats)}


def serving(result: RunResult, slo: Slo | None = None, ranked: _Ranked | None = None) -> dict:
    """The serving benchmark's figures over the requests that arrived during the run (`ranked`:
    their waits, when the caller has them)."""
    served = [r for r in result.requests if not r.warm]
    out = {"requests_served": len(served),
           "requests_lost": sum(not r.done for r in result.requests)}
    if not served:
        return out
    ttft = _given(r.ttft for r in served)
    tpots = _given(map(tpot, served))
    e2e = _given(r.last_time - r.arrival for r in served if r.generated)
    delay = _given(r.prefill_start - r.arrival for r in served if r.prefill_start is not None)
    first = min(r.arrival for r in served)
    last = max((r.last_time for r in served if r.generated), default=first)
    span = max(last - first, 1e-9)
    out.update(_spread("ttft", ttft))
    out.update(_spread("tpot", tpots))
    if ranked is None:
        every = waits(result.requests)
        ranked = _Ranked.of(every.gap, every.count)
    out.update(ranked.spread("itl"))
    out.update(_spread("e2e", e2e))
    out["sched_delay_p50_s"] = _pct(delay, 50, scale=1.0)
    out["request_throughput_rps"] = len(served) / span
    out["output_throughput_tps"] = sum(r.generated for r in served) / span
    if slo is not None:
        meets = [slo.met(r.ttft, tpot(r)) for r in served]
        met = sum(meets)
        arrivals = max(r.arrival for r in served) - first
        out["slo_attainment"] = met / len(served)
        # the later half by arrival: where a stream too short for its rate still fills its
        # queue, this half's attainment falls below the whole's (`capacity` reads it)
        order = sorted(range(len(served)), key=lambda i: (served[i].arrival, served[i].rid))
        later = order[len(order) // 2:]
        out["slo_attainment_last_half"] = sum(meets[i] for i in later) / len(later)
        out["goodput_rps"] = met / (arrivals if arrivals > 0 else span)
        out["slo_met_throughput_rps"] = met / span
    return out


def gpu_idle_frac(result: RunResult) -> float:
    """Share of the executor's window in which no launch was running (host overhead)."""
    start, end = result.activity.window
    if end <= start:
        return 0.0
    return uncovered(result.activity.busy, start, end) / (end - start)


DETAIL_RECORDS = 100_000  # records a list of `details` keeps at most


def details(result: RunResult, limit: int = DETAIL_RECORDS) -> dict:
    """Per-request and per-round records of a run, for the JSON: TTFT of every served request,
    decode steps during each prefill, and the round timeline. A long run keeps the first
    `limit` records of each and says how many there were (`<name>_total`)."""
    windows = _windows(result)
    steps = _steps_within(_decode_ends(result), windows[:limit]).tolist()
    rounds = result.rounds
    n = min(len(rounds), limit)
    ttft = [r for r in result.requests if not r.warm and r.ttft is not None]
    out = {
        "ttft_ms": {r.rid: r.ttft * MS for r in ttft[:limit]},
        "prefills": [{"start_s": a, "end_s": b, "decode_steps": k}
                     for (a, b), k in zip(windows[:limit].tolist(), steps)],
        "rounds": [{"start_s": a, "end_s": b, "level": lv, "decode_bs": bs,
                    "prefill": rounds.labels[label], "decode_context": c}
                   for a, b, lv, bs, label, c in zip(
                       *(getattr(rounds, k)[:n].tolist() for k in
                         ("start", "end", "level", "decode_bs", "label", "decode_context")))],
        **steps_marks(result.chunked_steps),
    }
    for name, total in (("ttft_ms", len(ttft)), ("prefills", len(windows)),
                        ("rounds", len(rounds))):
        if total > limit:
            out[f"{name}_total"] = total
    return out


ROUND_US = 1e6  # diagnostics' times are kept in whole microseconds


def diagnostics(result: RunResult, spans: bool = True) -> dict:
    """What a measured point's figures come from, in microseconds: each prefill batch (start,
    end, tokens computed, prompts, tokens read from the prefix cache), every round, every
    decode step's GPU time, how fast the host launched an eager layer (the median, and each
    launch's with when it began) and, with `spans`, every launch's span on the GPU."""
    batches: dict[tuple, list] = {}
    for r in result.requests:
        if not r.warm and r.prefill_start is not None and r.prefill_end is not None:
            batch = batches.setdefault((r.prefill_start, r.prefill_end), [0, 0, 0])
            batch[0] += r.prompt_len - r.cached_len  # computed: a cached prefix is read
            batch[1] += 1
            batch[2] += r.cached_len
    rounds = result.rounds
    us = lambda seconds: round(seconds * ROUND_US)  # noqa: E731
    out = {
        "prefills": [[us(a), us(b), tokens, n, cached]
                     for (a, b), (tokens, n, cached) in sorted(batches.items())],
        "rounds": {"start_us": [us(t) for t in rounds.start], "end_us": [us(t) for t in rounds.end],
                   "level": list(rounds.level), "decode_bs": list(rounds.decode_bs),
                   "decode_context": list(rounds.decode_context), "label": list(rounds.label),
                   "labels": rounds.labels},
        "decode_step_us": [us(t) for t in result.activity.decode_step_s],
        **steps_marks(result.chunked_steps),
        # how fast the host launched an eager layer in this run, a launch's first, through the
        # kernels' launchers (None: simulated, or a point measured before the executor timed
        # its launches)
        "host_layer_us": (us(statistics.median(result.activity.host_layer_s))
                          if len(result.activity.host_layer_s) else None),
        # and a layer of its later layers, which replay the first's launches (None: one layer
        # a launch, or a point measured before replays)
        "host_later_layer_us": (us(statistics.median(result.activity.host_later_layer_s))
                                if len(result.activity.host_later_layer_s) else None),
        # and every eager launch's (began, its first layer's host time): the host's phases
        "host_layers_us": [[us(t), us(s)] for t, s in zip(result.activity.host_layer_at_s,
                                                           result.activity.host_layer_s)],
    }
    if spans:  # every launch's (start, end) on the GPU, from its first (not the rounds' clock)
        out["busy_us"] = [[us(a), us(b)] for a, b in result.activity.busy]
    return out
