"""Capacity: the highest request rate a strategy serves within its SLOs, two ways.

- goodput capacity (DistServe): at least `attainment` (90%) of requests meet both the TTFT and
  the TPOT target;
- Sarathi-Serve's capacity: the P99 time between tokens stays under the TPOT target and the
  median scheduling delay (queueing before a request's prefill starts) under 2 s.

`search` brackets the rate (doubling or halving from a start) and bisects to a relative
tolerance; `crossing` reads the rate off a fixed set of measured points, interpolating
between the last rate that meets a criterion and the first that does not. Pure: a point is
whatever `measure(rate)` returns (a run's summary row).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from pdmux_triton.errors import PdmuxError
from pdmux_triton.serve.metrics import Slo


@dataclass(frozen=True)
class Criteria:
    slo: Slo
    attainment: float = 0.9
    max_sched_delay_s: float = 2.0

    def __post_init__(self):
        if not 0 < self.attainment <= 1:
            raise PdmuxError(f"attainment must be in (0, 1], got {self.attainment}")

    def goodput(self, point: dict) -> float:
        """How far the point is inside the goodput criterion (>= 0 meets it): the attainment
        over the one asked for, less 1."""
        return (point.get("slo_attainment") or 0.0) / self.attainment - 1

    def sarathi(self, point: dict) -> float:
        """How far inside Sarathi-Serve's criterion (>= 0 meets it): the tighter of the P99
        time-between-tokens and the median scheduling delay, as a share of their limits."""
        itl = point.get("itl_p99_ms")
        delay = point.get("sched_delay_p50_s")
        if itl is None or delay is None:
            return -1.0
        return min(1 - itl / self.slo.tpot_ms, 1 - delay / self.max_sched_delay_s)


CRITERIA = ("goodput", "sarathi")


def _key(rate: float) -> float:
    """Rates are measured at 4 significant digits, so a search and a rerun meet at one point."""
    return float(f"{rate:.4g}")


# the rates a search may try, req/s
LOWEST_RATE, HIGHEST_RATE = 0.01, 1000.0


def search(measure: Callable[[float], dict], margin: Callable[[dict], float], start: float,
           tol: float = 0.05, lowest: float = LOWEST_RATE, highest: float = HIGHEST_RATE,
           max_points: int = 24) -> tuple[float, list[float]]:
    """The highest rate whose point meets the criterion (`margin` >= 0), to within `tol`
    (relative), and the rates measured on the way; 0.0 when even `lowest` does not meet it,
    `highest` when that still does."""
    if not (start > 0 and tol > 0 and 0 < lowest < highest):
        raise PdmuxError(f"a rate search needs start > 0, tol > 0 and 0 < lowest < highest, got "
                         f"{start}, {tol}, {lowest}, {highest}")
    tried: list[float] = []

    def ok(rate: float) -> bool:
        if len(tried) >= max_points:
            raise PdmuxError(f"the rate search did not converge within {max_points} points")
        rate = _key(rate)
        tried.append(rate)
        return margin(measure(rate)) >= 0

    rate = _key(min(max(start, lowest), highest))
    if ok(rate):
        lo, hi = rate, None
        while hi is None:
            if lo >= highest:
                return lo, tried
            nxt = _key(min(lo * 2, highest))
            lo, hi = (nxt, None) if ok(nxt) else (lo, nxt)
    else:
        lo, hi = None, rate
        while lo is None:
            if hi <= lowest:
                return 0.0, tried
            nxt = _key(max(hi / 2, lowest))
            lo, hi = (nxt, hi) if ok(nxt) else (None, nxt)
    while hi / lo > 1 + tol:
        mid = _key(math.sqrt(lo * hi))
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, tried


def bracket(points: list[tuple[float, dict]],
            margin: Callable[[dict], float]) -> list[tuple[float, dict]]:
    """The (rate, point) pairs a crossing is read from: the highest meeting rate and the
    failing rate just above it; that rate alone where none is above it, the lowest rate alone
    where none meets."""
    # (by margin within a rate, so repeats at one rate read the same in any order)
    pts = sorted(points, key=lambda rp: (rp[0], margin(rp[1])))
    meeting = [i for i, (_, p) in enumerate(pts) if margin(p) >= 0]
    return pts[meeting[-1]:meeting[-1] + 2] if meeting else pts[:1]


def crossing(points: list[tuple[float, dict]], margin: Callable[[dict], float]) -> float | None:
    """The highest rate where the criterion holds, from measured (rate, point) pairs: the
    highest meeting rate, moved towards the failing rate just above it as far as the margin
    falls linearly to zero; the highest rate when it meets, 0.0 when no rate does, None
    without points. (A criterion can hold again above a failing rate: Sarathi-Serve's P99 time
    between tokens falls as decode batches grow.)"""
    if not points:
        return None
    read = [(rate, margin(p)) for rate, p in bracket(points, margin)]
    (r0, m0) = read[0]
    if m0 < 0:
        return 0.0
    if len(read) == 1:
        return r0
    (r1, m1) = read[1]
    return r0 + (r1 - r0) * m0 / (m0 - m1)


# how far apart (in attainment) a point's later half may be from the whole for the point to
# read as a steady state
STEADY_POINTS = 0.05


def read_from(points: list[tuple[float, dict]], margin: Callable[[dict], float],
              capacity: float | None) -> dict | None:
    """The point a capacity is read from: the highest-rate point at or below it that meets
    the criterion (None when none does)."""
    if not capacity:
        return None
    meeting = [p for r, p in sorted(points, key=lambda rp: rp[0])
               if r <= capacity and margin(p) >= 0]
    return meeting[-1] if meeting else None


def steady(point: dict | None) -> bool | None:
    """Whether a point's stream was long enough for its rate: its later half of requests
    (by arrival) met the SLOs within STEADY_POINTS of the whole. A stream that ends before
    its queue settles serves a burst: the later arrivals wait behind the earlier ones, so
    their attainment falls below the whole's. None where unknown (no point, or one saved
    before the later half was counted)."""
    if point is None or point.get("slo_attainment_last_half") is None:
        return None
    return abs(point["slo_attainment_last_half"] - point["slo_attainment"]) <= STEADY_POINTS


def bracketed(points: list[tuple[float, dict]], margin: Callable[[dict], float],
              rate: float) -> bool:
    """Whether a rate at or below `rate` already fails the criterion (a higher one need not
    be measured to find the capacity)."""
    return any(r <= rate and margin(p) < 0 for r, p in points)
