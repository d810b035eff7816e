"""S_SAT calibration, the pure part: the fit, the store of measured points, the sweep's plan
and the results file. `calibration_run` measures the points.

The sweep saves every point as a JSON line the moment it is measured; a rerun with the same
output folder skips the points already there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pdmux_triton.cost.measured_inputs import at_own_settings
from pdmux_triton.errors import PdmuxError
from pdmux_triton.results import PointStore, provenance, write_json

STATES = ("alone", "corun")
DECODE_WORKLOADS = ("stream_read", "decode_attention", "decode_linear", "decode_step")


# --- the fit ------------------------------------------------------------------------------

def fit_s_sat(budgets: list[int], rates: list[float], linear_below: float = 0.6) -> dict:
    """Peak rate and two S_SAT figures of a rate-vs-SMs curve.

    s_sat_fit: the chapter model's parameter, rate = peak * min(1, SMs / S_SAT): peak over the
    slope of the linear part (a least-squares line through the origin over the points below
    `linear_below` of the peak; the first two points if none are).
    s_sat_95: the smallest budget reaching 95% of the peak.
    """
    if len(budgets) != len(rates) or not budgets:
        raise PdmuxError(f"need equally many budgets and rates (>0), got {len(budgets)} and "
                         f"{len(rates)}")
    pts = sorted(zip(budgets, rates))
    if any(b <= 0 for b, _ in pts) or any(r < 0 for _, r in pts):
        raise PdmuxError("budgets must be positive and rates non-negative")
    peak = max(r for _, r in pts)
    if peak <= 0:
        raise PdmuxError("every rate is zero: nothing to fit")
    linear = [(b, r) for b, r in pts if r <= linear_below * peak] or pts[:2]
    slope = sum(b * r for b, r in linear) / sum(b * b for b, _ in linear)
    return {
        "peak_tbps": peak,
        "s_sat_fit": peak / slope,
        "s_sat_95": next(b for b, r in pts if r >= 0.95 * peak),
    }


# --- the store ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PointKey:
    workload: str
    kind: str  # grid_cap or green
    ctas_per_sm: int
    state: str  # alone or corun
    sms: int
    batch: int = 0  # decode_step at another batch than the settings' (0: the settings' own)
    # decode_step at another context a request than the settings' (0: the settings' own), at
    # the settings' batch
    context: int = 0


def point_store(path: Path) -> PointStore:
    """The sweep's saved points, keyed by PointKey."""
    return PointStore(path, PointKey)


def forget(store: PointStore, plan: "SweepPlan") -> int:
    """Drop the saved points this plan measures, so it measures them again (after a kernel
    change); points of other workloads, kinds, CTAs, budgets or batches stay. Returns how many
    were dropped."""
    keys = set(plan.keys())
    return store.forget(lambda point: store.key_of(point) in keys)


def summarize(points: list[dict]) -> dict:
    """summary[workload][kind][state] = fit of the ctas_per_sm=1 curve (the honest emulation:
    more CTAs per SM let a capped grid spread over more SMs), plus the best over ctas."""
    curves: dict[tuple, dict[int, float]] = {}
    for p in points:
        if "tbps" in p and at_own_settings(p):
            curves.setdefault((p["workload"], p["kind"], p["state"], p["ctas_per_sm"]), {})[p["sms"]] = p["tbps"]
    summary: dict = {}
    for (wl, kind, state, ctas), curve in sorted(curves.items()):
        if ctas != 1 or len(curve) < 2:
            continue
        fit = fit_s_sat(list(curve), list(curve.values()))
        others = [c for (w, k, s, ct), c in curves.items() if (w, k, s) == (wl, kind, state)]
        fit["peak_tbps_any_ctas"] = max(max(c.values()) for c in others)
        summary.setdefault(wl, {}).setdefault(kind, {})[state] = fit
    return summary


def write_results(path: Path, gpu: str, settings: dict, points: list[dict], summary: dict) -> Path:
    data = {**provenance(gpu), "settings": settings,
            "rows": sorted(points, key=lambda p: (p["workload"], p.get("batch", 0),
                                                  p.get("context", 0), p["kind"], p["state"],
                                                  p["ctas_per_sm"], p["sms"])),
            "summary": summary}
    return write_json(path, data)


# --- the sweep's plan ----------------------------------------------------------------------

@dataclass
class SweepPlan:
    workloads: tuple[str, ...]
    kinds: tuple[str, ...]
    ctas: tuple[int, ...]
    budgets: tuple[int, ...]
    corun: bool
    model: str = "qwen3-8b"
    batch: int = 32
    context: int = 2048
    prefill_tokens: int = 8192
    # decode_step also at these batches (one CTA per SM): what a step of another batch costs
    # beyond its bytes at `batch`'s rate, by SMs (`step_cost.BatchTerm`)
    decode_batches: tuple[int, ...] = ()
    # decode_step also at these contexts a request (one CTA per SM, at `batch`): what a step's
    # KV costs beside its weights as contexts grow (decode attention reads long contexts
    # closer to the streaming rate than the calibration's own)
    decode_contexts: tuple[int, ...] = ()

    def keys(self):
        others = tuple(b for b in self.decode_batches if b != self.batch)
        contexts = tuple(c for c in self.decode_contexts if c != self.context)
        for kind in self.kinds:
            for sms in self.budgets:
                for wl in self.workloads:
                    for ctas in self.ctas:
                        for state in STATES:
                            if state == "corun" and (not self.corun or sms >= max(self.budgets)):
                                continue  # no SMs left for a prefill beside it
                            yield PointKey(wl, kind, ctas, state, sms)
                            if wl == "decode_step" and ctas == 1:
                                for b in others:
                                    yield PointKey(wl, kind, ctas, state, sms, b)
                                for c in contexts:
                                    yield PointKey(wl, kind, ctas, state, sms, context=c)


def default_budgets(total_sms: int, granularity: int) -> tuple[int, ...]:
    return tuple(range(granularity, total_sms, granularity)) + (total_sms,)
