"""How much of each trace point's error its host's phases make: the first repeat of every
bench/trace_fidelity.py point simulated twice, on the one host speed the simulator prices a
run on (that repeat's median eager-layer launch, a launch's first layer, `Overheads.on_host`,
which moves the later layers' launch with it) and on the speeds its launches ran at through
the run (their median over a window of HOST_WINDOW_S around each moment), each against that
repeat's measured figures. A run measured since session 40 keeps every eager launch's host
time (its first layer's) and moment (`host_layers_us`); an older one gives only its
launch-bound launches, read off its rounds (bench/launch_bound_hosts.py).

A host runs in phases (bench/NOTES.md: 5-30 s at ~0.75 and ~1.25 ms a layer) that no
simulator can know ahead, so the part of an error that the replayed host removes is the
host's, not the cost model's. An older run gives 5-33 launch-bound launches, so its timeline
is sparse: far from any launch the nearest one's speed holds, which can be wrong for seconds;
read the medians over the points before any one point. Points with fewer than MIN_LAUNCHES
launches, and green contexts' (their split levels are another kind's), are left out.
Writes <out>/host-replay-<gpu>.json; prints per metric the largest and median |error| on
either host, over every point replayed and over the stable region of trace_fidelity's file.

    python bench/host_replay.py --out /tmp/x
"""

from __future__ import annotations

import argparse
import statistics
import sys
from bisect import bisect_left, bisect_right
from pathlib import Path

from corun_rounds import Pricer
from launch_bound_hosts import MIN_LAUNCHES, LayerPrice, launch_bound
from script import MEASURED_ON_H200, bench_inputs, bench_parser, card_inputs, finish, run_script
from trace_fidelity import COUNT, Key, error_pct, settings, worst_by_metric

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments.run import Servers
from pdmux_triton.experiments.settings import make_requests
from pdmux_triton.experiments.variants import variant
from pdmux_triton.results import PointStore, provenance, read_json
from pdmux_triton.serve.metrics import chunked_steps_of
from pdmux_triton.serve.simulated import SimExecutor

# a card's committed trace points and trace_fidelity's file on them (`--gpu`)
POINTS = "bench/results/trace-fidelity/points-{gpu}.jsonl"
FIDELITY = "bench/results/trace-fidelity-{gpu}.json"
HOST_WINDOW_S = 2.0  # a host's phases last 5-30 s: the launches within +-1 s of a moment
FIGURES = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms")


class HostTimeline:
    """A run's host over its clock: the median first layer's launch time of its launches
    within HOST_WINDOW_S of a moment, the nearest launch's where none is."""

    def __init__(self, launches: list[tuple[float, float]]):
        if not launches:
            raise PdmuxError("a host timeline needs one launch at least")
        launches = sorted(launches)
        self.at = [t for t, _ in launches]
        self.layer_s = [s for _, s in launches]

    def __call__(self, t: float) -> float:
        lo = bisect_left(self.at, t - HOST_WINDOW_S / 2)
        hi = bisect_right(self.at, t + HOST_WINDOW_S / 2)
        if lo < hi:
            return statistics.median(self.layer_s[lo:hi])
        i = min(lo, len(self.at) - 1)  # none near: the nearest one's
        if i > 0 and t - self.at[i - 1] < self.at[i] - t:
            i -= 1
        return self.layer_s[i]


class HostFollowing(SimExecutor):
    """A simulated executor whose host moves with a run's: every call that spends host time
    (a decode round's share, an eager step's batch, eager layers' launches) is priced on the
    host as the run's ran at that moment of its clock (`Overheads.on_host`)."""

    @classmethod
    def of(cls, x: SimExecutor, timeline: HostTimeline) -> "HostFollowing":
        y = cls.__new__(cls)
        y.__dict__.update(x.__dict__)
        y.fitted, y.timeline = x.overheads, timeline
        return y

    def _on_host_now(self) -> None:
        self.overheads = self.fitted.on_host(self.timeline(self.t))

    def launch_decode(self, reqs):
        self._on_host_now()
        return super().launch_decode(reqs)

    def begin_prefill(self, reqs):
        self._on_host_now()
        return super().begin_prefill(reqs)

    def launch_prefill(self, carry, start, end):
        self._on_host_now()
        return super().launch_prefill(carry, start, end)

    def mixed(self, decoding, prompt, start, n):
        self._drain()  # (as the round does first: its host time is spent after the drain)
        self._on_host_now()
        return super().mixed(decoding, prompt, start, n)


class ReplayedHost(Servers):
    """Simulated servers whose executors' host follows `timeline`."""

    def __init__(self, s, overheads: step_cost.Overheads, timeline: HostTimeline):
        super().__init__(s, [], overheads=overheads)
        self.timeline = timeline

    def executor(self, v, kv_arrives: bool = False):
        return HostFollowing.of(super().executor(v, kv_arrives), self.timeline)


def host_launches(point: dict, price: LayerPrice, where: str) -> tuple[list, str]:
    """A point's eager launches, (began s, its first layer's host seconds) each, and where
    they came from: every launch as its run kept it, else the launch-bound ones read off its
    rounds."""
    kept = point["diagnostics"].get("host_layers_us")
    if kept:
        if not (isinstance(kept, list) and all(
                isinstance(x, list) and len(x) == 2 and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)
                for x in kept)):
            raise PdmuxError(f"{where}: its host_layers_us are not [began us, first layer's us] "
                             "pairs")
        return [(t / 1e6, s / 1e6) for t, s in kept], "every launch, as the run kept it"
    return launch_bound(point, price, where)[0], "launch-bound launches, from the rounds"


def first_repeat(point: dict, k: str) -> float | None:
    """A measured point's figure in its first repeat (the one whose launches it kept)."""
    values = point.get("repeat_values", {}).get(k)
    return values[0] if values else point.get(k)


def replayed(args, point: dict, launches, overheads: step_cost.Overheads) -> dict:
    """One point's first repeat: measured, and simulated on its median host and on its host's
    timeline."""
    served = argparse.Namespace(**{**vars(args), "strategies": (point["strategy"],)})
    s = settings(served, point["trace"], point["start"], simulate=True)
    median_host = point["diagnostics"]["host_layer_us"] / 1e6
    rows = {name: servers.serve(variant(point["strategy"]), make_requests(s, point["rate"]))[0]
            for name, servers in (
                ("median_host", Servers(s, [], overheads=overheads.on_host(median_host))),
                ("host_timeline", ReplayedHost(s, overheads, HostTimeline(launches))))}
    measured = {k: first_repeat(point, k) for k in FIGURES}
    hosts = sorted(h for _, h in launches)
    return {"trace": point["trace"], "start": point["start"], "rate": point["rate"],
            "strategy": point["strategy"], "median_host_ms": median_host * 1e3,
            "launches": len(launches), "host_ms": {
                "min": hosts[0] * 1e3, "median": statistics.median(hosts) * 1e3,
                "max": hosts[-1] * 1e3},
            "measured": measured,
            **{name: {"simulated": {k: row.get(k) for k in FIGURES},
                      "error_pct": {k: error_pct(row.get(k), measured[k]) for k in FIGURES}}
               for name, row in rows.items()}}


def summarize(rows: list[dict]) -> dict:
    """Per region (every point replayed, the stable region) and host: each figure's largest
    |error|, where, and its median."""
    out = {}
    for region, chosen in (("all_points", rows),
                           ("stable_region", [r for r in rows if r["inside_stable_region"]])):
        out[region] = {"points": len(chosen), **{host: worst_by_metric({
            k: [(r[host]["error_pct"][k], f"{r['strategy']} {r['trace']}@{r['start']} "
                                           f"{r['rate']:g} req/s")
                for r in chosen if r[host]["error_pct"][k] is not None] for k in FIGURES})
            for host in ("median_host", "host_timeline")}}
    return out


def table(data: dict) -> str:
    lines = ["each point's first repeat against its simulation on its median host -> on its "
             "host's timeline (|error| %)"]
    for region, v in data["summary"].items():
        lines.append(f"{region} ({v['points']} points):")
        for k in FIGURES:
            a, b = v["median_host"].get(k), v["host_timeline"].get(k)
            if a and b:
                lines.append(f"  {k:<12} median {a['median']:5.1f} -> {b['median']:5.1f}   max "
                             f"{a['max']:6.1f} -> {b['max']:6.1f} (now at {b['at']})")
    return "\n".join(lines)


def stable_region(path: str) -> dict[tuple, bool]:
    """Whether trace_fidelity's file put each point inside its strategy's stable region."""
    points = read_json(path, "trace-fidelity file").get("points")
    try:
        if points:
            return {(p["trace"], p["start"], p["rate"], p["strategy"]):
                    p["inside_stable_region"] for p in points}
    except (KeyError, TypeError):
        pass
    raise PdmuxError(f"{path} is not bench/trace_fidelity.py's file (its points, each with its "
                     f"stable region)")


def run(args) -> int:
    card_inputs(args, measuring=None)  # the H200 unless named, priced by its files
    gpu = args.gpu
    args.points = args.points or POINTS.format(gpu=gpu)
    args.fidelity = args.fidelity or FIDELITY.format(gpu=gpu)
    overheads = load_host_costs(args.host_costs, gpu)
    stable = stable_region(args.fidelity)
    price = LayerPrice(Pricer(args.points, args.calibration, args.compare, overheads, gpu),
                       overheads)
    rows = []
    for point in PointStore(args.points, Key).points.values():
        diagnostics = point.get("diagnostics") or {}
        if ("green" in point["strategy"] or not diagnostics.get("host_layer_us")
                or "rounds" not in diagnostics):  # an untimed host, or no rounds to read
            continue
        launches, source = host_launches(point, price, f"{args.points} {point['strategy']}")
        if len(launches) < MIN_LAUNCHES:
            continue
        # (a point served before today's mixed steps, simulated as it ran)
        row = {**replayed(args, point, launches,
                          overheads.served_on(chunked_steps_of(point["strategy"], diagnostics))),
               "launches_from": source}
        row["inside_stable_region"] = stable.get(
            (point["trace"], point["start"], point["rate"], point["strategy"]), False)
        rows.append(row)
    if not rows:
        raise PdmuxError(f"no point of {args.points} kept {MIN_LAUNCHES} host launches on a "
                         f"timed host: nothing to replay")
    data = {**provenance(gpu), "inputs": {"points": args.points, "fidelity": args.fidelity,
                                          "host_window_s": HOST_WINDOW_S,
                                          "min_launches": MIN_LAUNCHES,
                                          **{k: getattr(args, k) for k in MEASURED_ON_H200}},
            "summary": summarize(rows), "points": rows}
    return finish(Path(args.out) / f"host-replay-{gpu}.json", data, table(data))


def parser():
    p = bench_parser("host_replay.py", __doc__)
    bench_inputs(p, *MEASURED_ON_H200, by_gpu=True)
    p.add_argument("--points", help="bench/trace_fidelity.py's measured points (default: "
                                    "--gpu's committed ones)")
    p.add_argument("--fidelity", help="bench/trace_fidelity.py's file, for each point's stable "
                                      "region (default: --gpu's committed one)")
    # what trace_fidelity's settings read besides: its windows' length, a simulation's
    p.set_defaults(count=COUNT, offline=True, repeats=1, strategies=())
    return p


def main(argv=None) -> int:
    return run_script(parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
