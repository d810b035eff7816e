"""`pdmux-triton capacity`: per strategy, the highest request rate within the SLOs, measured
on the GPU or simulated, every point saved as it is served and resumed on rerun.

A point is one stream of the same requests (same seed: the same lengths at every rate, only
the arrival times scale) served at one rate. Simulated, the rate is searched
(`capacity_search.search`); measured, it is searched too, or read off the rates given
(`capacity_search.crossing`: they are served in order up to the first that fails the goodput
criterion, so adding higher rates later only serves what an unbracketed strategy still needs),
and the same traffic is simulated beside it so the simulator's error can be read against the
measurement (a point served on an older executor against a simulation of that executor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments import capacity_search
from pdmux_triton.experiments.capacity_search import CRITERIA, Criteria
from pdmux_triton.experiments.repeats import repeat, spread_pct
from pdmux_triton.experiments.run import GUARDS, Servers, host_overheads
from pdmux_triton.experiments.settings import RunSettings, make_requests
from pdmux_triton.experiments.variants import Variant, variant
from pdmux_triton.results import PointStore, check_settings, provenance, read_json
from pdmux_triton.serve import metrics
from pdmux_triton.spec.gpus import GPUSpec

POINT_KEYS = ("rate", "slo_attainment", "slo_attainment_last_half", "goodput_rps",
              "slo_met_throughput_rps", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
              "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms",
              "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms", "sched_delay_p50_s", "decode_gpu_p50_ms",
              "host_layer_p50_ms", "host_later_layer_p50_ms", "prefill_ms", "gpu_idle_frac", "level_changes", "level_drain_ms",
              "request_throughput_rps", "output_throughput_tps", "requests_served",
              "prefix_hit_rate", "prefix_evicted_blocks", *GUARDS)


@dataclass(frozen=True)
class PointKey:
    mode: str  # gpu or simulated
    strategy: str
    rate: float


MADE_WITH = ("commit", "source_sha256", "torch", "triton")  # saved with every point
# what a strategy, a rate or the mode choose: points that differ only in these share a folder
PER_POINT_SETTINGS = ("simulate", "rate", "chunks", "kinds", "level_policies",
                      "warm_requests")  # (the untimed warm-up: saved with each point)


def open_folder(folder: Path, s: RunSettings) -> PointStore:
    """The point store of a folder whose points all come from the traffic, model, GPU, cost
    model and level settings of `s` (refused if they do not; saved on first use)."""
    stable = {k: v for k, v in s.as_dict().items() if k not in PER_POINT_SETTINGS}
    # the model's context length only refuses requests, never changes a point: folders saved
    # before it was read resume
    stable["model"].pop("max_context")
    check_settings(folder / f"capacity-settings-{s.gpu.name}.json", stable, RunSettings.defaults())
    return PointStore(folder / f"capacity-points-{s.gpu.name}.jsonl", PointKey)


def open_diagnostics(folder: Path, gpu: str) -> PointStore:
    """Beside a folder's points, what each measured point's figures come from (its first
    repeat's prefill batches, rounds, decode steps and host launch time:
    `metrics.diagnostics`), keyed as the points are: bench/fit_host_costs.py fits the host
    costs to them; the capacity is read from the points alone."""
    return PointStore(folder / f"capacity-diagnostics-{gpu}.jsonl", PointKey)


def measured_gpu(folder: Path, name: str) -> GPUSpec:
    """The GPU a folder's points were measured on, as it was detected there (its memory is
    the device's, not the preset's)."""
    path = folder / f"capacity-settings-{name}.json"
    held = sorted(f.name.removeprefix("capacity-settings-").removesuffix(".json")
                  for f in folder.glob("capacity-settings-*.json"))
    if not path.is_file() and held:  # the flags name another GPU than the points'
        raise PdmuxError(f"{folder} holds capacity points of the {', '.join(held)}, not the "
                         f"{name}: add --gpu {held[0]}")
    saved = read_json(path, "capacity settings")
    try:
        return GPUSpec(**{**saved["gpu"], "cc": tuple(saved["gpu"]["cc"])})
    except (KeyError, TypeError):
        raise PdmuxError(f"{folder} holds no capacity settings with a GPU") from None


# a measured point's simulation priced on the host its run timed (an eager layer's launch
# time): hosts beside one GPU launch at different speeds, so like is compared with like
ON_RUN_HOST = "simulated_on_run_host"


@dataclass(frozen=True)
class OlderSteps:
    """What tells an older generation of chunked steps apart in a capacity store and result."""

    suffix: str  # its simulations' mode suffix, apart from today's (the prediction)
    judged: str  # the result's list of measured points judged against it, as they ran
    before: str  # what its points were measured before, in log lines


# each older generation of chunked steps (`metrics.chunked_steps_of`): decode rows in the
# extend tiles (0), or the whole chunk beside them (1)
OLDER_STEPS = {
    0: OlderSteps("_as_served", "judged_as_served_before_decode_rows_left_the_extend_kernel",
                  "a mixed step's decode rows left the extend kernel"),
    1: OlderSteps("_as_served_whole_chunk",
                  "judged_as_served_before_the_chunk_counted_its_decode_rows",
                  "a chunked step's chunk counted its decode rows")}
# the mode suffix of a simulation of each generation's executor (today's: none)
SERVED_ON = {**{steps: o.suffix for steps, o in OLDER_STEPS.items()}, metrics.CHUNKED_STEPS: ""}
SIMULATED = ("simulated", ON_RUN_HOST)
# where a bounded simulation is read (`sim_error_read_from`) when a strategy's points ran on
# more than one executor: no one simulation's crossing compares with them
ON_TWO_EXECUTORS = "none: the points ran on two executors"


def is_simulated(point: dict) -> bool:
    """A simulated point, on the cost model's host or on a measured run's, of today's
    executor or of one a stale measured point was served on."""
    return any(point["mode"] == base + suffix for base in SIMULATED
               for suffix in SERVED_ON.values())


def simulated_for(strategies) -> Callable[[dict], bool]:
    """Picks the simulated points of these strategies: what a run serving them simulates
    again, while other strategies' points in a shared folder stay."""
    return lambda point: is_simulated(point) and point["strategy"] in strategies


class Sweep:
    """Serves points of one mode (measured or simulated) and keeps them in the store; its
    executors are made only when a point is missing (`offline`: a missing measured point is an
    error, so a measured sweep can be read again, with a newer simulation beside it, anywhere)."""

    def __init__(self, s: RunSettings, store: PointStore, log, offline: bool = False,
                 diagnostics: PointStore | None = None, on_host_s: float | None = None,
                 on_host_later_s: float | None = None, served_on: int = metrics.CHUNKED_STEPS):
        """`diagnostics`: where a measured point's `metrics.diagnostics` are kept; `on_host_s`
        (simulated): price on a host that launches an eager layer in that time (mode
        ON_RUN_HOST), each later layer of a launch in `on_host_later_s` where the run timed
        it (`Overheads.on_host`); `served_on` (simulated): price the executor of that
        generation of chunked steps, a stale point's (`Overheads.served_on`; a mode ending in
        its SERVED_ON suffix)."""
        if served_on != metrics.CHUNKED_STEPS and not s.simulate:  # (a measured sweep serves today's)
            raise PdmuxError("a measured sweep cannot be priced as an older executor served")
        self.s, self.store, self.log, self.offline = s, store, log, offline
        self.diagnostics, self.on_host_s = diagnostics, on_host_s
        self.on_host_later_s = on_host_later_s
        self.served_on = served_on
        self.mode = ("gpu" if not s.simulate else "simulated" if on_host_s is None
                     else ON_RUN_HOST) + SERVED_ON[served_on]
        self.servers = None

    def measure(self, v: Variant, rate: float) -> dict:
        key = PointKey(self.mode, v.name, rate)
        saved = self.store.get(key)
        if saved is not None and _read(saved, self.offline):
            return saved
        if saved is not None:
            self.log(f"[gpu] {v.name} at {rate:g} req/s was measured before "
                     f"{OLDER_STEPS[_generation(saved)].before}: served again")
        if self.offline and self.mode == "gpu":
            raise PdmuxError(f"{v.name} at {rate:g} req/s was never measured in "
                             f"{self.store.path}: measure it on the GPU (drop --offline)")
        if self.servers is None:
            self.servers = Servers(self.s, make_requests(self.s), self.log,
                                   overheads=self._overheads())
        row, first = self.servers.serve(v, make_requests(self.s, rate))
        made_with = provenance(self.s.gpu.name)  # a point outlives the code that measured it
        if self.diagnostics is not None and self.mode == "gpu":
            # saved before the point, so a point on record has them; launch spans left out (a
            # long stream's are most of the bytes, and nothing reads them here)
            self.diagnostics.add(key, **metrics.diagnostics(first, spans=False),
                                 device_allocations_by_stream=row.get(
                                     "device_allocations_by_stream"),
                                 commit=made_with["commit"])
        spread = {}
        if "repeats" in row:  # medians; each repeat's figures kept for its own capacity
            spread = {"repeats": row["repeats"],
                      **{name: {k: v for k, v in row[name].items() if k in POINT_KEYS}
                         for name in ("repeat_values", "spread_pct")}}
        point = self.store.add(key, **{k: row.get(k) for k in POINT_KEYS if k != "rate"},
                               **spread, **{k: made_with[k] for k in MADE_WITH},
                               **({"warm_requests": self.s.warm_requests}
                                  if self.mode == "gpu" else {}),
                               # the chunked steps it was served with (a simulation's too: one
                               # of an older loop is told apart, `_forget_older_simulations`)
                               **metrics.steps_marks(first.chunked_steps))
        self.log(f"[{self.mode}] {v.name} at {rate:g} req/s: attainment "
                 f"{_fmt(point['slo_attainment'], '.0%')}, TTFT p99 {_fmt(point['ttft_p99_ms'])} "
                 f"ms, TPOT p99 {_fmt(point['tpot_p99_ms'])} ms, ITL p99 "
                 f"{_fmt(point['itl_p99_ms'])} ms")
        return point

    def _overheads(self):
        """The host costs a simulation prices with (None: the settings')."""
        if self.on_host_s is None and self.served_on == metrics.CHUNKED_STEPS:
            return None
        costs = host_overheads(self.s).served_on(self.served_on)
        return (costs if self.on_host_s is None
                else costs.on_host(self.on_host_s, self.on_host_later_s))

    def points(self, name: str) -> list[tuple[float, dict]]:
        return sorted((p["rate"], p) for p in self.store.points.values()
                      if p["mode"] == self.mode and p["strategy"] == name
                      and _read(p, self.offline))

    def close(self) -> None:
        if self.servers is not None:
            self.servers.close()


def _simulate_as_served(simulated: Sweep, measured: Sweep, v: Variant, criteria: Criteria,
                        tol: float, found: dict, log) -> None:
    """Where measured points of `v` were served before today's chunked steps (`_stale`), the
    simulation of the executor each ran on (`Overheads.served_on`, modes ending in its SERVED_ON
    suffix): beside each such point, and, where all the points ran on one, searched as
    today's is (`found`: its capacities, where each search starts), for the capacity to read
    the measured one against where those rates only bound it. Today's simulation stays the
    prediction."""
    points = measured.points(v.name)
    for steps in sorted({_generation(p) for _, p in points} - {metrics.CHUNKED_STEPS}):
        then = [rate for rate, point in points if _generation(point) == steps]
        as_ran = Sweep(simulated.s, simulated.store, log, served_on=steps)
        try:
            for rate in then:
                as_ran.measure(v, rate)
            if _executor(p for _, p in points) == SERVED_ON[steps]:  # (read only then: `_result`)
                for c in CRITERIA:
                    _searched(as_ran, v, getattr(criteria, c),
                              found[f"simulated_{c}_capacity_rps"] or then[-1], tol)
        finally:
            as_ran.close()


def _searched(sweep: Sweep, v: Variant, margin, guess: float, tol: float) -> float:
    """`v`'s capacity under `margin` on `sweep`'s simulation, searched from `guess` req/s."""
    cap, _ = capacity_search.search(lambda r: sweep.measure(v, r), margin,
                                    max(guess, capacity_search.LOWEST_RATE), tol)
    return cap


def _simulate_on_run_hosts(simulated: Sweep, measured: Sweep, v: Variant, log) -> None:
    """Each measured point of `v` whose run timed its host, simulated again on that host
    (where the cost model's host costs give an eager layer's launch time to scale from), on
    the executor it was served on (`Overheads.served_on`)."""
    if not host_overheads(simulated.s).layer_launch_s:
        return
    for rate, point in measured.points(v.name):
        if point.get("host_layer_p50_ms"):
            on_host = Sweep(simulated.s, simulated.store, log,
                            on_host_s=point["host_layer_p50_ms"] / 1e3,
                            on_host_later_s=_later_layer_s(point, measured, v.name),
                            served_on=_generation(point))
            try:
                on_host.measure(v, rate)
            finally:
                on_host.close()


def _later_layer_s(point: dict, measured: Sweep, name: str) -> float | None:
    """The host time a later layer of an eager launch took in a measured point's run: the
    point's own, else its diagnostics' (points saved before the point kept it); None where
    the run timed none (measured before replays: every layer launched as the first)."""
    if point.get("host_later_layer_p50_ms"):
        return point["host_later_layer_p50_ms"] / 1e3
    kept = (measured.diagnostics.get(PointKey(measured.mode, name, point["rate"]))
            if measured.diagnostics is not None else None)
    return metrics.later_layer_s(kept) if kept else None


def _forget_older_simulations(store: PointStore) -> None:
    """Drop the store's simulated chunked points of today's executor saved before its chunk
    counted the decode rows (they lack the mark): a resumed run would read them as today's."""
    store.forget(lambda p: p["mode"] in SIMULATED and metrics.stale_steps(p["strategy"], p))


def _require_measured(sweep: Sweep, name: str) -> None:
    if not sweep.points(name):
        raise PdmuxError(f"{name} was never measured in {sweep.store.path}: measure it on the "
                         f"GPU (drop --offline)")


def _fmt(value, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def run_capacity(s: RunSettings, names: tuple[str, ...], criteria: Criteria, store: PointStore,
                 rates: tuple[float, ...] | None = None, start: float = 1.0, tol: float = 0.05,
                 log=print, offline: bool = False, also: tuple[float, ...] = (),
                 diagnostics: PointStore | None = None) -> dict:
    """Capacities of each strategy, and every point behind them. Measured (`s.simulate` off),
    the same traffic is also simulated, searched, and served at the measured rates; `offline`,
    the measured points come from the store alone, every one of each strategy (at whatever
    rates it was measured: strategies are measured near their own capacities), as a measured
    run reads them after serving `rates`. Each strategy is also served at the rates `also`
    names, whatever the search needs (strategies compared at fixed rates)."""
    chosen = [variant(n) for n in names]
    _forget_older_simulations(store)
    sweeps = [Sweep(replace(s, simulate=True, repeats=1), store, log)]
    if not s.simulate:
        sweeps.append(Sweep(s, store, log, offline, diagnostics))
    found: dict[str, dict] = {}
    try:
        for sweep in sweeps:
            for v in chosen:
                res = found.setdefault(v.name, {})
                for r in also:
                    sweep.measure(v, r)
                for criterion in CRITERIA:
                    margin = getattr(criteria, criterion)
                    if sweep.mode == "simulated" or (rates is None and not offline):
                        cap = _searched(sweep, v, margin,
                                        res.get(f"simulated_{criterion}_capacity_rps") or start,
                                        tol)
                    else:
                        if offline:  # every point measured before, whatever rates it was at
                            _require_measured(sweep, v.name)
                        else:  # the given rates, up to the first that fails the goodput criterion
                            for r in sorted(rates):
                                if capacity_search.bracketed(sweep.points(v.name),
                                                             criteria.goodput, r):
                                    break
                                sweep.measure(v, r)
                        cap = capacity_search.crossing(sweep.points(v.name), margin)
                    res[f"{'simulated_' if sweep.mode == 'simulated' else ''}{criterion}"
                        f"_capacity_rps"] = cap
        if not s.simulate:  # the simulation at the given rates and beside every measured
            for v in chosen:  # point, those of earlier runs too, to be read the same way
                given = () if offline else (rates or ())
                for r in sorted(set(given) | {r for r, _ in sweeps[1].points(v.name)}):
                    sweeps[0].measure(v, r)
                _simulate_as_served(sweeps[0], sweeps[1], v, criteria, tol, found[v.name], log)
                _simulate_on_run_hosts(sweeps[0], sweeps[1], v, log)
    finally:
        for sweep in sweeps:
            sweep.close()
    return _result(s, chosen, criteria, store, found, offline)


def _result(s: RunSettings, chosen: list[Variant], criteria: Criteria, store: PointStore,
            found: dict[str, dict], offline: bool) -> dict:
    measured = not s.simulate
    summary = {}
    # measured points judged against the executor they were served on, by its generation
    as_they_ran: dict[int, list[str]] = {}
    for v in chosen:
        res = found[v.name]
        mine = [p for p in store.points.values() if p["strategy"] == v.name
                and p["mode"] == ("gpu" if measured else "simulated") and _read(p, offline)]
        row = {f"{c}_capacity_rps": res.get(f"{c}_capacity_rps" if measured
                                            else f"simulated_{c}_capacity_rps")
               for c in CRITERIA}
        row.update({f"simulated_{c}_capacity_rps": res[f"simulated_{c}_capacity_rps"]
                    for c in CRITERIA})
        row["points"] = len(mine)
        row["stale_mixed_step_points"] = sum(_stale(p) for p in mine)
        by_rate = sorted((p["rate"], p) for p in mine)
        # whether a capacity reads a stale point (stale ones away from its crossing do not
        # move it)
        row["stale_capacity"] = {c: any(_stale(p) for _, p in capacity_search.bracket(
            by_rate, getattr(criteria, c))) for c in CRITERIA}
        read = {c: capacity_search.read_from(by_rate, getattr(criteria, c),
                                             row[f"{c}_capacity_rps"]) for c in CRITERIA}
        # read where the stream was long enough for its rate, or a burst's
        row["steady"] = {c: capacity_search.steady(read[c]) for c in CRITERIA}
        # the prefix cache's hit rate at the goodput capacity (None: off, or no capacity)
        row["prefix_hit_rate"] = (read["goodput"] or {}).get("prefix_hit_rate")
        if measured and s.repeats > 1:
            row.update(repeat_capacities(by_rate, criteria, s.repeats))
        # the capacity is the highest rate served (the search's ceiling, or the highest rate
        # given), which still met the criterion: the strategy can take at least that
        top = max((p["rate"] for p in mine), default=None)
        row["at_least"] = {c: top is not None and (row[f"{c}_capacity_rps"] or 0) >= top
                           for c in CRITERIA}
        # a capacity of 0.0 failed at every rate served: it lies below the lowest (not at zero)
        bottom = min((p["rate"] for p in mine), default=None)
        row["below_rps"] = {c: bottom if row[f"{c}_capacity_rps"] == 0.0 else None
                            for c in CRITERIA}
        for guard in GUARDS:
            row[guard] = sum(p.get(guard) or 0 for p in mine)
        if measured:
            # like for like: the simulation read at the rates measured, the same way, each
            # measured point's on the executor it was served on
            beside = _beside(store, mine, "simulated")
            # each measured point's simulation on its run's own host, where every run timed it
            on_hosts = _beside(store, mine, ON_RUN_HOST)
            row["simulated_on_run_hosts"] = bool(mine) and len(on_hosts) == len(mine)
            if row["simulated_on_run_hosts"]:
                beside = on_hosts
            # where those rates only bound it: every rate simulated on the executor the
            # points ran on (as served where all were stale; none where they ran on two)
            executor = _executor(mine)
            simulated = [] if executor is None else sorted(
                (p["rate"], p) for p in store.points.values()
                if p["strategy"] == v.name and p["mode"] == "simulated" + executor)
            row["sim_error_pct"], row["sim_error_read_from"] = {}, {}
            for c in CRITERIA:
                margin = getattr(criteria, c)
                cap = (capacity_search.crossing(beside, margin)
                       if len(beside) == len(mine) else None)
                row[f"simulated_{c}_capacity_at_measured_rates_rps"] = cap
                # where the simulation meets the criterion at every measured rate, or at none,
                # those rates only bound it: its error is read from all its points instead
                bounded = cap is not None and len({margin(p) >= 0 for _, p in beside}) == 1
                sim = ((capacity_search.crossing(simulated, margin) if simulated else None)
                       if bounded else cap)
                row[f"simulated_{c}_capacity_compared_rps"] = sim
                row["sim_error_read_from"][c] = (
                    None if cap is None else "measured rates" if not bounded
                    else "all simulated rates" if simulated
                    else ON_TWO_EXECUTORS)
                row["sim_error_pct"][c] = _error(sim, res[f"{c}_capacity_rps"])
            row["latency_sim_error_pct"] = _latency_errors(mine, dict(beside))
            for r, p in by_rate:
                if _stale(p):
                    as_they_ran.setdefault(_generation(p), []).append(f"{v.name} {r:g} req/s")
        summary[v.name] = row
    own = s.loaded_trace.rate if s.workload == "trace" else None
    if own is not None:  # a trace's capacity is also how much faster it may come
        for row in summary.values():
            row["x_trace_rate"] = {c: None if row[f"{c}_capacity_rps"] is None
                                   else row[f"{c}_capacity_rps"] / own for c in CRITERIA}
    best = max(summary, key=lambda n: summary[n]["goodput_capacity_rps"] or 0.0)
    totals = {guard: sum(row[guard] for row in summary.values()) for guard in GUARDS}
    # offline, the provenance is the analysis's: each measured point names its own
    return {"mode": "gpu" if measured else "simulated", **provenance(s.gpu.name),
            "analysed_offline": offline,
            **{OLDER_STEPS[steps].judged: names for steps, names in sorted(as_they_ran.items())},
            "model": s.model.name, "inputs": s.as_dict(),
            **({"trace_rate_rps": own} if own is not None else {}),
            "criteria": {"slo_ttft_ms": criteria.slo.ttft_ms, "slo_tpot_ms": criteria.slo.tpot_ms,
                         "attainment": criteria.attainment,
                         "max_sched_delay_s": criteria.max_sched_delay_s},
            "summary": {"strategies": summary, "highest_goodput_capacity": best, **totals},
            "points": sorted((p for p in store.points.values() if _read(p, offline)),
                             key=lambda p: (p["mode"], p["strategy"], p["rate"]))}


def _beside(store: PointStore, points: list[dict], mode: str) -> list[tuple[float, dict]]:
    """(rate, point) of the simulation of `mode` at each measured point's rate, priced on the
    executor that point was served on (`Sweep`'s `served_on`)."""
    return sorted((p["rate"], sim) for p in points if (sim := store.get(
        PointKey(mode + SERVED_ON[_generation(p)], p["strategy"], p["rate"]))))


def _executor(points) -> str | None:
    """The mode suffix of the executor all the measured `points` were served on (SERVED_ON:
    today's is ""), or None where they ran on more than one."""
    ran_on = {_generation(p) for p in points}
    return SERVED_ON[ran_on.pop()] if len(ran_on) == 1 else None if ran_on else ""


def _generation(point: dict) -> int:
    """The chunked steps a measured point was served with (`metrics.chunked_steps_of`);
    today's for a simulated one."""
    return (metrics.chunked_steps_of(point["strategy"], point) if point["mode"] == "gpu"
            else metrics.CHUNKED_STEPS)


def _stale(point: dict) -> bool:
    """A chunked point measured before today's chunked steps."""
    return point["mode"] == "gpu" and metrics.stale_steps(point["strategy"], point)


def _read(point: dict, offline: bool) -> bool:
    """Whether a result reads `point`: a measured sweep served a stale point's rate again and
    reads nothing from one it did not (not even where to stop); offline the points saved are
    all there is, so stale ones are read, counted (`stale_mixed_step_points`) and judged
    against a simulation of the executor they were served on (`Overheads.served_on`)."""
    return offline or not _stale(point)


def repeat_capacities(points: list[tuple[float, dict]], criteria: Criteria,
                      repeats: int) -> dict:
    """Each repeat's own capacity over (rate, point) pairs (its figures alone) and their
    spread, per criterion."""
    out = {"capacity_by_repeat_rps": {}, "capacity_spread_pct": {}}
    for c in CRITERIA:
        caps = [capacity_search.crossing([(r, repeat(p, i)) for r, p in points],
                                         getattr(criteria, c)) for i in range(repeats)]
        out["capacity_by_repeat_rps"][c] = caps
        out["capacity_spread_pct"][c] = (spread_pct(caps) if caps and None not in caps
                                         else None)
    return out


LATENCIES = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")


def _latency_errors(measured: list[dict], simulated: dict[float, dict]) -> dict:
    """Per latency, the simulation's error at each measured rate: its median and the worst."""
    out = {}
    for key in LATENCIES:
        errors = [e for p in measured if p["rate"] in simulated
                  if (e := _error(simulated[p["rate"]].get(key), p.get(key))) is not None]
        out[key] = ({"median": float(np.median(errors)), "worst": max(errors, key=abs)}
                    if errors else None)
    return out


def _error(simulated: float | None, measured: float | None) -> float | None:
    if simulated is None or not measured:
        return None
    return (simulated - measured) / measured * 100
