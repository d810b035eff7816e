"""How close the simulator comes to the GPU on real traces, metric by metric.

Windows of the Azure LLM inference traces of 2023 (bench/data/azure-llm-2023: conversation and
code, as published) are served at request rates below, near and above pd-mux's capacity on them
(each window sped up to the rate, its arrivals' shape kept), by every strategy: measured on the
GPU, each point `--repeats` times in one process, and simulated with the card's committed
calibration, comparison and host costs (bench/results' files of `--gpu`: the card measuring,
or offline the H200 unless named). Per point and metric the simulation's error against the
measured median: TTFT, TPOT and E2E at p50/p90/p99 and the decode step on the GPU and a prefill
batch's span (p50 over the first repeat's batches, measured and simulated alike) in percent, SLO
attainment in points; per window and strategy the goodput capacity (the 90% crossing over the
rates served) measured and simulated.

Measured points are saved as they are served in <out>/trace-fidelity/points-<gpu>.jsonl (a
run cut short resumes; each keeps its first repeat's prefill batches and rounds, to find what
an error comes from); the simulation is made again each run, so after a change to the cost
model `--offline` reads the measured points back and judges today's simulator anywhere.
Writes <out>/trace-fidelity-<gpu>.json (points and the summary: `max_abs_error_pct` and
`median_abs_error_pct` per metric against the issue's targets, `spread_pct` of the repeats,
`outside_repeats_pct`: each error's part that the measured repeats' range does not cover,
`stable_region`: the latencies' errors over the points at most 0.8 x their strategy's measured
capacity alone, where no queue grows through the window; `prefill_speed_by_commit`: how fast
each set of runs served at one commit ran its long prefill-first batches against the
simulator's price of them, bench/card_speeds.py) and prints the table. `--prefill-speed X`
simulates every point on a card that runs prefills X times as fast as the costs' card
(`SimExecutor`); `--card-band FILE` simulates each also on the slowest and fastest card a
card-speeds file read and reports each error beyond them and the repeats (`card_band`).

    python bench/trace_fidelity.py --out bench/results                 # on the GPU
    python bench/trace_fidelity.py --traces conv --repeats 2 --out /tmp/tf
    python bench/trace_fidelity.py --traces conv --strategies pdmux_grid_cap --rates 30,36 \
        --out bench/results                                # more points near its capacity
    python bench/trace_fidelity.py --offline --out bench/results       # anywhere
    python bench/trace_fidelity.py --offline --gpu h100-sxm --out bench/results  # its points
    python bench/trace_fidelity.py --offline --prefill-speed 0.98 --out /tmp/tf   # a slower card
    python bench/trace_fidelity.py --offline --held-out \
        --card-band bench/results/card-speeds-h200.json --out bench/results
    python bench/trace_fidelity.py --plan                              # the rates, simulated
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from script import (MEASURED_ON_H200, bench_inputs, bench_parser, card_inputs, finish,
                    run_script)

from pdmux_triton.cli.parsing import choice, integer, listed, number
from pdmux_triton.cost.measured_inputs import load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments import capacity_search, repeats
from pdmux_triton.experiments.capacity import OLDER_STEPS, repeat_capacities
from pdmux_triton.experiments.capacity_search import Criteria
from pdmux_triton.experiments.run import GUARDS, Servers
from pdmux_triton.experiments.settings import RunSettings, make_requests
from pdmux_triton.experiments.variants import served_by, variant
from pdmux_triton.results import PointStore, provenance, read_json, write_json
from pdmux_triton.serve import metrics
from pdmux_triton.serve.metrics import ROUND_US, Slo, diagnostics
from pdmux_triton.spec.gpus import detect_gpu, gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import Request

DATA = Path(__file__).parent / "data" / "azure-llm-2023"
TRACES = {"conv": DATA / "AzureLLMInferenceTrace_conv.csv",
          "code": DATA / "AzureLLMInferenceTrace_code.csv"}
# per trace: the windows' first rows (far apart in the hour), and the rates each is served
# at: below, near and above pd-mux's goodput capacity simulated on them (--plan)
PLAN = {"conv": ((2000, 12000), (12.0, 24.0, 48.0)),
        "code": ((1000, 6000), (2.0, 4.0, 7.0))}
STRATEGIES = ("prefill_first", "chunked_512", "chunked_2048", "pdmux_grid_cap", "pdmux_green",
              "pdmux_slo_grid_cap")
COUNT = 100  # requests a window
MODEL = "qwen3-8b"
# metric: the target for the simulation's largest error (percent; attainment in points)
LATENCIES = ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms",
             "tpot_p99_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms", "decode_gpu_p50_ms",
             "prefill_ms")
TARGETS = {"tpot_p50_ms": 5, "tpot_p99_ms": 10, "ttft_p50_ms": 10, "ttft_p99_ms": 20,
           "e2e_p50_ms": 5, "capacity": 5, "slo_attainment": 5}
STABLE = 0.8  # a rate at most this share of its measured capacity is inside the stable region
# decode steps a level needs in both a measured run and its simulation for its medians to be
# compared (`level_step_error_pct`)
MIN_LEVEL_STEPS = 20
BY_LEVEL = "decode_gpu_by_level"  # the decode step's error, level by level


@dataclass(frozen=True)
class Key:
    mode: str
    trace: str
    start: int
    rate: float
    strategy: str


def settings(args, trace: str, start: int, simulate: bool) -> RunSettings:
    gpu = gpu_preset(args.gpu) if simulate or args.offline else detect_gpu()
    return RunSettings(
        gpu=gpu, model=model_preset(MODEL), workload="trace", trace=str(TRACES[trace]),
        trace_start=start, trace_count=args.count, simulate=simulate,
        **served_by(tuple(args.strategies)), slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms, calibration=args.calibration, compare=args.compare,
        host_costs=args.host_costs, repeats=1 if simulate else args.repeats)


def windows(args, only: tuple | None = None):
    """(trace, first row) of every window served (`only`: of that (trace, row) one)."""
    return [(t, start) for t in args.traces for start in PLAN[t][0] if only in (None, (t, start))]


def rates_of(args, store: PointStore, trace: str, start: int, name: str) -> list[float]:
    """The rates a strategy is served and judged at on a window: the plan's, those asked for
    (`--rates`: points near a capacity, which the plan's rates bracket only coarsely), and
    any measured there before."""
    measured = {p["rate"] for p in store.points.values() if p["mode"] == "gpu"
                and (p["trace"], p["start"], p["strategy"]) == (trace, start, name)}
    return sorted({*PLAN[trace][1], *args.rates, *measured})


def judged_rates(args, store: PointStore, trace: str, start: int, name: str) -> list[float]:
    """The rates a strategy is simulated and judged at on a window: every rate it is served at
    (`rates_of`) or, offline, those of them measured (a trace measured in part is judged on
    the points it has; a `stale` one simulated as it ran)."""
    rates = rates_of(args, store, trace, start, name)
    if args.offline:
        rates = [r for r in rates if store.has(Key("gpu", trace, start, r, name))]
    return rates


def prefill_batches(diag: dict) -> dict[int, list]:
    """A run's prompt batches, by the moment they got their first token (the requests that got
    it at one moment are one batch): [first of them taken, tokens computed, prompts, tokens
    read from the prefix cache], in microseconds (points measured before the scheduler
    stamped a batch once carry each request's own start; before the prefix cache, no cached
    tokens)."""
    batches: dict[int, list] = {}
    for start, end, tokens, prompts, *cached in diag["prefills"]:
        b = batches.setdefault(end, [start, 0, 0, 0])
        b[0], b[1], b[2] = min(b[0], start), b[1] + tokens, b[2] + prompts
        b[3] += cached[0] if cached else 0
    return batches


def launched_rounds(diag: dict, what: str) -> list[int]:
    """The rounds of a run (its diagnostics) whose decode steps it timed, in order: every
    round with requests decoding, or the decode-only ones where its mixed rounds step decode
    in their forward (chunked prefill); a run whose steps match neither count is refused."""
    r, steps = diag["rounds"], diag["decode_step_us"]
    plain = {i for i, label in enumerate(r["labels"]) if label == ""}
    decoding = [i for i, bs in enumerate(r["decode_bs"]) if bs > 0]
    only = [i for i in decoding if r["label"][i] in plain]
    for launched in (decoding, only):
        if len(steps) == len(launched):
            return launched
    raise PdmuxError(f"{what}: {len(steps)} decode steps for {len(decoding)} rounds decoding "
                     f"({len(only)} decode-only): its rounds and steps cannot be matched")


def level_step_error_pct(measured: dict, simulated: dict, what: str) -> float | None:
    """The decode step's error level by level (two runs' diagnostics): each level's median
    step, simulated over measured, weighted by the measured steps at it, over the levels
    holding MIN_LEVEL_STEPS steps in both; None where none does. A run whose steps mix levels
    (pd-mux: a few ms at the whole GPU, two or three times that at a split level) has a
    median that jumps between them as the mix moves: this error is the cost model's alone,
    the mix is the scheduler's (its latencies judge it)."""
    def by_level(diag: dict) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {}
        for i, us in zip(launched_rounds(diag, what), diag["decode_step_us"]):
            out.setdefault(diag["rounds"]["level"][i], []).append(us)
        return out
    got, want = by_level(simulated), by_level(measured)
    kept = [lv for lv, steps in want.items()
            if len(steps) >= MIN_LEVEL_STEPS and len(got.get(lv, ())) >= MIN_LEVEL_STEPS]
    if not kept:
        return None
    weight = sum(len(want[lv]) for lv in kept)
    return sum(len(want[lv]) * error_pct(statistics.median(got[lv]), statistics.median(want[lv]))
               for lv in kept) / weight


def taken_batches(diag: dict, requests: list[Request] | None) -> tuple[list, list | None]:
    """A run's prompt batches (`prefill_batches`) in the order they were taken, as (end,
    [start, tokens, prompts, cached]), and each one's requests (`batch_prompts`: None where
    they do not add up, or no `requests` are given)."""
    batches = sorted(prefill_batches(diag).items(), key=lambda b: b[1][0])
    if requests is None:
        return batches, None
    return batches, batch_prompts([(prompts, tokens + cached)
                                   for _, (_, tokens, prompts, cached) in batches], requests)


def batch_prompts(batches, requests: list[Request]) -> list[list[Request]] | None:
    """Each prompt batch's requests: batches (each (prompts, prompt tokens with the cached
    ones), in the order they were taken) take the waiting requests in arrival order. None where
    a batch's prompts do not add up to the requests next in line, or the requests run out
    (requests left over at the end are a run's last, unbatched ones)."""
    waiting = iter(sorted(requests, key=lambda q: q.arrival))
    out = []
    for prompts, tokens in batches:
        mine = [next(waiting, None) for _ in range(prompts)]
        if None in mine or sum(q.prompt_len for q in mine) != tokens:
            return None
        out.append(mine)
    return out


def batch_prefill_ms(diag: dict) -> float | None:
    """The median prefill span of a run's prompt batches (`prefill_batches`)."""
    spans = [(end - start) / 1e3 for end, (start, *_) in prefill_batches(diag).items()]
    return statistics.median(spans) if spans else None


# host_layer_p50_ms: each repeat's host speed (repeat_values), which its simulation is priced on;
# host_layer_mean_ms beside it, with the slow launches' tail (kept, not yet priced), and the
# garbage collections inside the run, which may be that tail
FIGURES = (*LATENCIES, "slo_attainment", "slo_attainment_last_half", "itl_p50_ms", "itl_p99_ms",
           "sched_delay_p50_s", "requests_served", "host_layer_p50_ms", "host_layer_mean_ms",
           "gc_collections_during_measurement", "gc_pause_ms_during_measurement", *GUARDS)


def generation(point: dict | None) -> int:
    """The chunked steps a measured point was served with (`metrics.chunked_steps_of`); today's
    where none was measured."""
    return (metrics.CHUNKED_STEPS if point is None
            else metrics.chunked_steps_of(point["strategy"], point["diagnostics"]))


def stale(point: dict) -> bool:
    """A chunked point measured before today's chunked steps: served again where the GPU is
    there, else simulated as it ran (`Overheads.served_on`)."""
    return metrics.stale_steps(point["strategy"], point["diagnostics"])


def measure(args, store: PointStore, log) -> list[str]:
    """Every measured point the store lacks or holds `stale`, on one model and executor set
    for all windows; offline, those points are named instead (judged without the ones it
    lacks, the stale ones as they ran)."""
    # a strategy's rates highest first: the untimed warm-up before its first run on a trace
    # (the first window's requests at its highest rate) then forms its largest batches, so
    # the allocator already holds memory for most of the later runs' (another window's may
    # still form larger ones: the counts say)
    todo = [(t, start, rate, name) for t, start in windows(args) for name in args.strategies
            for rate in reversed(rates_of(args, store, t, start, name))
            if not store.has(Key("gpu", t, start, rate, name))
            or stale(store.get(Key("gpu", t, start, rate, name)))]
    if not todo or args.offline:
        return [f"{name} {t}@{start} {rate:g} req/s" for t, start, rate, name in todo]
    every = {(t, start): settings(args, t, start, simulate=False) for t, start in windows(args)}
    # one executor set sized for every window's requests: one model and cache for the run
    union = [r for s in every.values() for r in make_requests(s)]
    servers = Servers(next(iter(every.values())), union, log)
    try:
        trace_warmed = None
        for t, start, rate, name in todo:
            if t != trace_warmed:  # each trace's batches warm the allocator once, untimed
                servers.warm.clear()
                trace_warmed = t
            log(f"[gpu] {name} on {t} from row {start} at {rate:g} req/s ...")
            row, result = servers.serve(variant(name), make_requests(every[t, start], rate))
            made_with = provenance(servers.s.gpu.name)
            store.add(Key("gpu", t, start, rate, name), **{k: row.get(k) for k in FIGURES},
                      repeats=row.get("repeats", 1),
                      repeat_values={k: v for k, v in row.get("repeat_values", {}).items()
                                     if k in FIGURES},
                      spread_pct={k: v for k, v in row.get("spread_pct", {}).items()
                                  if k in FIGURES},
                      commit=made_with["commit"], source_sha256=made_with["source_sha256"],
                      diagnostics=diagnostics(result))
            del result
    finally:
        servers.close()
    return []


def prefill_speed_by_commit(args, store: PointStore) -> dict:
    """How fast each card of the measured points ran its long prefill-first batches against
    the simulator's price (bench/card_speeds.py): by commit, its speed, batches and runs. Read
    where the points are the plan's windows (COUNT requests, which its reader makes again)
    and their runs timed their host (the eager step it takes off)."""
    from card_speeds import measured_speeds, summary

    if args.count != COUNT or not any(p["diagnostics"].get("host_layer_us")
                                      for p in store.points.values()):
        return {}
    return summary(measured_speeds([str(store.path)], args.calibration, args.compare,
                                   load_host_costs(args.host_costs),
                                   settings(args, *windows(args)[0], simulate=True).gpu.name))


def simulate(args, store: PointStore, only: tuple | None = None) -> dict[tuple, dict]:
    """Every point (of window `only`) simulated with today's cost model (a `stale` one as it
    ran, `Overheads.served_on`): (trace, start, rate, strategy) -> its row priced with
    the committed host costs and, where the measured run timed its host's eager launches, a
    row priced on that host (`Overheads.on_host`): on each repeat's own host where the point
    kept them (the median over those simulations, as the measured row is the repeats'
    median, and a host's speed moves between repeats), on its first repeat's host where it
    did not. Both on a card of `--prefill-speed`."""
    out = {}
    base = settings(args, *windows(args, only)[0], simulate=True)
    shipped = Servers(base, [], prefill_speed=args.prefill_speed)
    made: dict[tuple, Servers] = {(None, metrics.CHUNKED_STEPS): shipped}

    def servers(us: int | None, steps: int) -> Servers:
        """On the host that launches an eager layer in `us` (None: the costs' own), a point
        served before today's chunked steps as it ran (by their generation)."""
        if (us, steps) not in made:
            costs = shipped.overheads.served_on(steps)
            made[us, steps] = Servers(base, [], prefill_speed=args.prefill_speed, overheads=(
                costs if us is None else costs.on_host(us / ROUND_US)))
        return made[us, steps]
    for t, start in windows(args, only):
        s = settings(args, t, start, simulate=True)
        for name in args.strategies:
            for rate in judged_rates(args, store, t, start, name):
                measured = store.get(Key("gpu", t, start, rate, name))
                steps = generation(measured)
                rows = {"shipped_host": [servers(None, steps)]}
                hosts_us = repeat_hosts_us(measured)
                if hosts_us:
                    rows["run_host"] = [servers(us, steps) for us in hosts_us]
                out[t, start, rate, name] = {which: _simulated(servers, name, s, rate)
                                             for which, servers in rows.items()}
    return out


def repeat_hosts_us(measured: dict | None) -> list[int]:
    """The eager layer's launch time (us) of each repeat of a measured point where it kept
    them, else its first repeat's (older points), else none."""
    if not measured:
        return []
    each = measured.get("repeat_values", {}).get("host_layer_p50_ms")
    if each and all(each):
        return [round(ms * 1e3) for ms in each]
    first = measured["diagnostics"].get("host_layer_us")
    return [first] if first else []


def _simulated(servers: list[Servers], name: str, s: RunSettings, rate: float) -> dict:
    """A point simulated on each of `servers` (one per measured repeat; repeats on one host
    share its simulation, which is deterministic): their median row, the first's
    diagnostics and prefill batches' span (the measured point keeps its first repeat's)."""
    sims: dict[int, tuple[dict, dict]] = {}
    for x in servers:
        if id(x) not in sims:
            row, result = x.serve(variant(name), make_requests(s, rate))
            diag = diagnostics(result)
            sims[id(x)] = ({**{k: row.get(k) for k in FIGURES},
                            "prefill_ms": batch_prefill_ms(diag)}, diag)
    rows = [sims[id(x)][0] for x in servers]
    first, diag = sims[id(servers[0])]
    return {**repeats.combined(rows), "prefill_ms": first["prefill_ms"], "diagnostics": diag}


def on_own_host(simulation: dict) -> dict:
    """A point's simulation on its run's own host where the run timed it, else on the
    committed host costs' (`simulate`)."""
    return simulation.get("run_host", simulation["shipped_host"])


def error_pct(simulated, measured) -> float | None:
    if simulated is None or measured is None or measured == 0:
        return None
    return (simulated - measured) / measured * 100


def outside_repeats_pct(simulated, values: list | None, band: tuple = ()) -> float | None:
    """How far the simulation lies outside the range its measured repeats spanned, in percent
    of their median (0 inside it): the part of an error that run-to-run variation on the
    GPU does not cover. With `band` (the same point simulated on other cards), the gap
    between the simulations' range and the repeats'. None without two repeats."""
    simulated = [simulated, *band]
    if None in simulated or not values or len(values) < 2 or None in values:
        return None
    low, high, mid = min(values), max(values), statistics.median(values)
    if mid == 0:
        return None
    return (max(0.0, low - max(simulated)) + max(0.0, min(simulated) - high)) / abs(mid) * 100


def _worst(errors: list[tuple[float, str]]) -> dict | None:
    if not errors:
        return None
    worst = max(errors, key=lambda e: abs(e[0]))
    return {"max_abs": abs(worst[0]), "median_abs": statistics.median(abs(e) for e, _ in errors),
            "at": worst[1], "points": len(errors)}


def judge(args, store: PointStore, simulations: dict[tuple, dict]) -> dict:
    """Each point's errors, each window's capacities, and the summary over them: against the
    simulation on the run's own host where the run timed it (the committed host costs where
    not), and against the committed host costs alone (`shipped_host`)."""
    out = _judged(args, store, {k: on_own_host(v) for k, v in simulations.items()})
    shipped = _judged(args, store, {k: v["shipped_host"] for k, v in simulations.items()})
    out["summary"]["shipped_host"] = {k: shipped["summary"][k] for k in
                                      ("max_abs_error_pct", "median_abs_error_pct", "met")}
    out["summary"]["points_on_their_own_host"] = sum("run_host" in v
                                                     for v in simulations.values())
    return out


def held_out(args, store: PointStore) -> dict:
    """Each window judged by a simulator whose host costs were fitted (bench/fit_host_costs.py)
    to the other windows' measured points alone, each point on its own run's host: its
    errors' median and largest per metric, and what the fit gave."""
    from fit_host_costs import FITTED, fitted

    measured = {k: v for k, v in read_json(args.host_costs, "host-costs file").items()
                if k not in FITTED}  # what calibrate --host-costs measured, nothing fitted
    out = {}
    for t, start in windows(args):
        train = [p for p in store.points.values() if (p["trace"], p["start"]) != (t, start)]
        with tempfile.TemporaryDirectory() as folder:
            points, host_costs = Path(folder) / "points.jsonl", Path(folder) / "host-costs.json"
            points.write_text("".join(json.dumps(p) + "\n" for p in train))
            write_json(host_costs, measured)
            host, _ = fitted([str(points)], str(host_costs), args.calibration, args.compare)
            write_json(host_costs, host)
            fit_args = argparse.Namespace(**{**vars(args), "host_costs": str(host_costs)})
            sims = simulate(fit_args, store, only=(t, start))
        judged = _judged(args, store, {k: on_own_host(v) for k, v in sims.items()},
                         only=(t, start))
        capacity_errors = {c["strategy"]: c["error_pct"] for c in judged["capacities"]
                           if c["error_pct"] is not None}
        judged = judged["summary"]
        out[f"{t}@{start}"] = {
            "fitted_on": sorted({f"{p['trace']}@{p['start']}" for p in train}),
            "fit": {"eager_step_s": host["eager_step"]["seconds"],
                    "whole_gpu_prefill_mfu": host.get("whole_gpu_prefill", {}).get("mfu"),
                    "mixed_fixed_s": host["mixed_step"]["fixed_s"],
                    "decode_beside_prefill_by_busy": host.get(
                        "decode_beside_prefill", {}).get("ratio_by_busy_share"),
                    "split_prefill_served_by_sms": host.get(
                        "split_prefill_served", {}).get("ratio_by_prefill_sms"),
                    "split_prefill_layer_s": host.get("split_prefill_served", {}).get("layer_s"),
                    "by_kind": {kind: {
                        "split_prefill_served_by_sms": fits.get(
                            "split_prefill_served", {}).get("ratio_by_prefill_sms"),
                        "decode_beside_prefill_by_busy": fits.get(
                            "decode_beside_prefill", {}).get("ratio_by_busy_share")}
                        for kind, fits in host.get("by_kind", {}).items()}},
            "median_abs_error_pct": judged["median_abs_error_pct"],
            "max_abs_error_pct": judged["max_abs_error_pct"],
            "capacity_error_pct": capacity_errors}
    return out


def card_speeds(path: str, gpu: str) -> tuple[float, float]:
    """The slowest and the fastest card of a bench/card_speeds.py file of the `gpu`'s points."""
    data = read_json(path, "card-speeds file")
    if data.get("gpu", gpu) != gpu:
        raise PdmuxError(f"{path} holds the {data['gpu']}'s card speeds; the points judged are "
                         f"the {gpu}'s")
    cards = data.get("cards")
    speeds = ([c.get("speed") if isinstance(c, dict) else None for c in cards.values()]
              if isinstance(cards, dict) else [])
    # a card's speed against the price, as SimExecutor takes one
    if not speeds or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                             and 0.5 <= v <= 2 for v in speeds):
        raise PdmuxError(f"{path} is not a card-speeds file with a speed in [0.5, 2] for each "
                         f"card (bench/card_speeds.py writes one)")
    return min(speeds), max(speeds)


def card_band(args, store: PointStore, result: dict, cards: tuple[float, float]) -> dict:
    """Each latency's error beyond what the GPU's own runs and its cards' speeds allow: every
    point simulated again on the slowest and the fastest card the card-speeds file read
    (bench/card_speeds.py: cards of one model serve prefills a few percent apart, and the
    costs are one card's), and its error taken as the gap between the three simulations'
    range and its measured repeats' (`outside_repeats_pct`). A miss with nothing beyond is
    one that a card within the measured spread, or the GPU's run-to-run variation, makes.
    Capacities likewise: each window's crossing on either card against its repeats' own."""
    on_card = [simulate(argparse.Namespace(**{**vars(args), "prefill_speed": speed}), store)
               for speed in cards]
    beyond: dict[str, list] = {k: [] for k in LATENCIES if k != "prefill_ms"}
    calm: dict[str, list] = {k: [] for k in beyond}
    for point in result["points"]:
        key = (point["trace"], point["start"], point["rate"], point["strategy"])
        sims = [on_own_host(sim[key]) for sim in on_card]
        values = store.get(Key("gpu", *key[:3], key[3])).get("repeat_values", {})
        point["outside_repeats_and_cards_pct"] = gaps = {
            k: outside_repeats_pct(point["simulated"].get(k), values.get(k),
                                   tuple(s.get(k) for s in sims)) for k in beyond}
        where = f"{key[3]} {key[0]}@{key[1]} {key[2]:g} req/s"
        for k, gap in gaps.items():
            if gap is not None:
                beyond[k].append((gap, where))
                if point["inside_stable_region"]:
                    calm[k].append((gap, where))

    # each crossing on either card, against its repeats' own crossings
    criteria = Criteria(Slo(args.slo_ttft_ms, args.slo_tpot_ms))
    for c in result["capacities"]:
        if c["error_pct"] is None:
            continue
        on = [capacity_search.crossing(sorted(
            (r, on_own_host(sim[c["trace"], c["start"], r, c["strategy"]]))
            for r in c["rates_rps"]), criteria.goodput) for sim in on_card]
        c["simulated_on_cards_rps"] = on
        # (None without two repeats, as a latency's)
        c["outside_repeats_and_cards_pct"] = gap = outside_repeats_pct(
            c["simulated_rps"], c["repeat_rps"], tuple(on))
        if gap is not None:
            beyond.setdefault("capacity", []).append((gap, f"{c['strategy']} {c['trace']}@"
                                                            f"{c['start']}"))

    return {"card_speeds": list(cards), "file": args.card_band,
            "all_points": worst_by_metric(beyond), "stable_region": worst_by_metric(calm)}


def _measured(point: dict) -> dict:
    """A measured point's figures, its prefill time read per batch from its diagnostics."""
    return {**point, "prefill_ms": batch_prefill_ms(point["diagnostics"])}


def _judged(args, store: PointStore, simulated: dict[tuple, dict],
            only: tuple | None = None) -> dict:
    criteria = Criteria(Slo(args.slo_ttft_ms, args.slo_tpot_ms))
    points, capacities, errors = [], [], {k: [] for k in (*LATENCIES, BY_LEVEL,
                                                           "slo_attainment")}
    # the latencies again over the points inside their strategy's stable region alone: past
    # a capacity a queue grows through the window and its latencies amplify any error
    calm: dict[str, list[tuple[float, str]]] = {k: [] for k in LATENCIES}
    # (the prefill per batch is read from the first repeat's batches: no repeats to span)
    beyond: dict[str, list[tuple[float, str]]] = {k: [] for k in LATENCIES if k != "prefill_ms"}
    spreads: dict[str, list[float]] = {}
    for t, start in windows(args, only):
        for name in args.strategies:
            rates = judged_rates(args, store, t, start, name)
            if not rates:
                continue
            measured = {r: _measured(store.get(Key("gpu", t, start, r, name))) for r in rates}
            sim = {r: simulated[t, start, r, name] for r in rates}
            cap = capacity_search.crossing(sorted(measured.items()), criteria.goodput)
            cap_sim = capacity_search.crossing(sorted(sim.items()), criteria.goodput)
            # a capacity at either end of the rates served is a bound, not a crossing: the
            # error beside a measured crossing is then at least the figure
            inside = cap is not None and 0 < cap < max(rates)
            capacities.append({"trace": t, "start": start, "strategy": name, "rates_rps": rates,
                               "measured_rps": cap, "simulated_rps": cap_sim,
                               "error_pct": error_pct(cap_sim, cap) if inside else None,
                               "error_is_a_bound": inside and not 0 < cap_sim < max(rates),
                               "repeat_rps": _repeat_capacities(measured, criteria)})
            for rate in rates:
                m, s = measured[rate], sim[rate]
                where = f"{name} {t}@{start} {rate:g} req/s"
                point = {"trace": t, "start": start, "rate": rate, "strategy": name,
                         "measured": {k: m.get(k) for k in FIGURES},
                         "simulated": {k: s.get(k) for k in FIGURES},
                         "spread_pct": m.get("spread_pct", {}), "repeats": m.get("repeats", 1),
                         "error_pct": {k: error_pct(s.get(k), m.get(k)) for k in LATENCIES}}
                point["error_pct"][BY_LEVEL] = level_step_error_pct(
                    m["diagnostics"], s["diagnostics"], where)
                if point["error_pct"][BY_LEVEL] is not None:
                    errors[BY_LEVEL].append((point["error_pct"][BY_LEVEL], where))
                # only below a crossing: a capacity at the top rate is a bound, and attainment
                # need not fall monotonically up to it (the slo policy's dips below 90% at 24
                # req/s and meets at 48 on one conversation window)
                stable = inside and rate <= STABLE * cap
                point["inside_stable_region"] = stable
                point["attainment_error_points"] = (
                    (s["slo_attainment"] - m["slo_attainment"]) * 100
                    if m.get("slo_attainment") is not None else None)
                point["outside_repeats_pct"] = {
                    k: outside_repeats_pct(s.get(k), m.get("repeat_values", {}).get(k))
                    for k in beyond}
                for k in LATENCIES:
                    if point["error_pct"][k] is not None:
                        errors[k].append((point["error_pct"][k], where))
                        if stable:
                            calm[k].append((point["error_pct"][k], where))
                    if point["outside_repeats_pct"].get(k) is not None:
                        beyond[k].append((point["outside_repeats_pct"][k], where))
                if stable and point["attainment_error_points"] is not None:
                    errors["slo_attainment"].append((point["attainment_error_points"], where))
                for k, v in point["spread_pct"].items():
                    if v is not None:
                        spreads.setdefault(k, []).append(v)
                points.append(point)
    calm = {k: _worst(v) for k, v in calm.items()}
    cap_errors = [(c["error_pct"], f"{c['strategy']} {c['trace']}@{c['start']}")
                  for c in capacities if c["error_pct"] is not None]
    per_metric = {k: _worst(v) for k, v in errors.items()}
    per_metric["capacity"] = _worst(cap_errors)
    summary = {
        "max_abs_error_pct": {k: v and v["max_abs"] for k, v in per_metric.items()},
        "median_abs_error_pct": {k: v and v["median_abs"] for k, v in per_metric.items()},
        "worst_at": {k: v and v["at"] for k, v in per_metric.items()},
        "targets_pct": TARGETS,
        "met": {k: (per_metric[k] is not None and per_metric[k]["max_abs"] <= target)
                for k, target in TARGETS.items()},
        "spread_pct": {k: {"median": statistics.median(v), "max": max(v)}
                       for k, v in sorted(spreads.items())
                       if k in (*LATENCIES, "slo_attainment")},
        # each error's part outside its measured repeats' range (0 where they cover it)
        "outside_repeats_pct": {k: v and {"max": v["max_abs"], "median": v["median_abs"],
                                          "at": v["at"], "points_inside": sum(
                                              e == 0 for e, _ in beyond[k])}
                                for k, v in ((k, _worst(b)) for k, b in beyond.items())},
        "stable_region": {
            "points": sum(p["inside_stable_region"] for p in points),
            "max_abs_error_pct": {k: v and v["max_abs"] for k, v in calm.items()},
            "median_abs_error_pct": {k: v and v["median_abs"] for k, v in calm.items()},
            "worst_at": {k: v and v["at"] for k, v in calm.items()},
            "met": {k: calm[k] is not None and calm[k]["max_abs"] <= target
                    for k, target in TARGETS.items() if k in calm}},
        "guards": {g: sum(p["measured"].get(g) or 0 for p in points) for g in GUARDS},
        # capacities whose simulated side is a bound: their error is at least its figure
        "capacity_error_at_least_at": [f"{c['strategy']} {c['trace']}@{c['start']}"
                                       for c in capacities if c["error_is_a_bound"]],
    }
    return {"points": points, "capacities": capacities, "summary": summary}


def worst_by_metric(errors: dict[str, list[tuple[float, str]]]) -> dict:
    """Per metric, the largest |error| over (error, where) pairs, where, and the median."""
    return {k: v and {"max": v["max_abs"], "median": v["median_abs"], "at": v["at"]}
            for k, v in ((k, _worst(e)) for k, e in errors.items())}


def _repeat_capacities(measured: dict[float, dict], criteria: Criteria) -> list | None:
    """Each repeat's own goodput capacity over the window's rates."""
    n = min(p.get("repeats", 1) for p in measured.values())
    if n < 2:
        return None
    return repeat_capacities(sorted(measured.items()), criteria, n)[
        "capacity_by_repeat_rps"]["goodput"]


def table(result: dict) -> str:
    s = result["summary"]
    lines = [f"{'metric':<20} {'max |err|':>10} {'median |err|':>13} {'target':>7} "
             f"{'repeats spread (median)':>24} {'outside repeats (max)':>22}  worst at"]
    for k in (*LATENCIES, BY_LEVEL, "slo_attainment", "capacity"):
        mx, md = s["max_abs_error_pct"].get(k), s["median_abs_error_pct"].get(k)
        target = s["targets_pct"].get(k)
        spread = s["spread_pct"].get(k, {}).get("median")
        outside = (s.get("outside_repeats_pct", {}).get(k) or {}).get("max")
        unit = " pt" if k == "slo_attainment" else " %"
        at_least = k == "capacity" and s["worst_at"].get(k) in s.get(
            "capacity_error_at_least_at", [])
        lines.append(f"{k:<20} {('>= ' if at_least else '') + _cell(mx, unit):>10} "
                     f"{_cell(md, unit):>13} "
                     f"{'' if target is None else f'{target}{unit}':>7} {_cell(spread, ' %'):>24}"
                     f" {_cell(outside, ' %'):>22}  {s['worst_at'].get(k) or ''}")
    speeds = s.get("prefill_speed_by_commit", {})
    if speeds:
        lines.append("cards' prefill speed against the price (long prefill-first batches, by "
                     "commit: bench/card_speeds.py): " + ", ".join(
                         f"{c[:7]} {v['speed']:.3f} ({v['batches']})" for c, v in speeds.items()))
    calm = s["stable_region"]
    lines.append(f"inside the stable region ({calm['points']} points at <= {STABLE:g} x their "
                 f"measured capacity): " + ", ".join(
                     f"{k} {_cell(calm['max_abs_error_pct'].get(k), ' %')}" for k in TARGETS
                     if k in calm["max_abs_error_pct"]) + " (max)")
    band = s.get("card_band")
    if band:
        lines.append(f"beyond the repeats' range and cards of {band['card_speeds'][0]:.3f}-"
                     f"{band['card_speeds'][1]:.3f} (max, all points / stable region): " +
                     ", ".join(f"{k} {_cell((band['all_points'][k] or {}).get('max'), ' %')} / "
                               f"{_cell((band['stable_region'].get(k) or {}).get('max'), ' %')}"
                               for k in TARGETS if k in band["all_points"]))
    for window, h in s.get("held_out", {}).items():
        md, mx = h["median_abs_error_pct"], h["max_abs_error_pct"]
        lines.append(f"held out {window} (fitted on {', '.join(h['fitted_on'])}): " + ", ".join(
            f"{k} {_cell(md.get(k), ' %')} / {_cell(mx.get(k), ' %')}"
            for k in ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "capacity")) + " (median / max)"
            + "; capacity by strategy " + (", ".join(
                f"{name} {err:+.1f} %" for name, err in h.get("capacity_error_pct", {}).items())
                or "none crossed"))
    lines.append("")
    lines.append(f"{'window':<14} {'strategy':<20} {'capacity measured':>18} {'simulated':>10}")
    for c in result["capacities"]:
        served = c["rates_rps"]
        lines.append(f"{c['trace'] + '@' + str(c['start']):<14} {c['strategy']:<20} "
                     f"{_bound(c['measured_rps'], served):>18} "
                     f"{_bound(c['simulated_rps'], served):>10}")
    return "\n".join(lines)


def _bound(capacity: float | None, rates) -> str:
    """A capacity, or the bound it is at either end of the rates served."""
    if capacity is None:
        return "-"
    if capacity >= max(rates):
        return f">= {max(rates):g}"
    return f"< {min(rates):g}" if capacity == 0 else f"{capacity:.1f}"


def _cell(v, unit: str) -> str:
    return "-" if v is None else f"{v:.1f}{unit}"


def plan(args) -> int:
    """pd-mux's simulated goodput capacity on each window (what PLAN's rates bracket)."""
    criteria = Criteria(Slo(args.slo_ttft_ms, args.slo_tpot_ms))
    for t, start in windows(args):
        s = settings(args, t, start, simulate=True)
        servers = Servers(s, [])
        rates = sorted({*PLAN[t][1], *args.rates})
        for name in ("pdmux_grid_cap", "prefill_first", "chunked_2048"):
            cap, _ = capacity_search.search(
                lambda r: servers.serve(variant(name), make_requests(s, r))[0],
                criteria.goodput, s.loaded_trace.rate, tol=0.05)
            print(f"{t} from row {start} ({s.loaded_trace.rate:.2f} req/s as recorded): {name} "
                  f"{cap:.2f} req/s; served at {', '.join(map(str, rates))}")
    return 0


def run(args) -> int:
    card_inputs(args, measuring=None if args.offline or args.plan else
                "without a GPU, --offline reads the points back and --plan simulates")
    if args.plan:
        return plan(args)
    # refused before any work
    cards = card_speeds(args.card_band, args.gpu) if args.card_band else None
    store = PointStore(Path(args.out) / "trace-fidelity" / f"points-{args.gpu}.jsonl", Key)
    missing = measure(args, store, lambda line: print(line, file=sys.stderr, flush=True))
    # (offline, the stale points among them are judged as they ran: named apart, by the
    # generation of chunked steps they were served with)
    as_they_ran = {steps: [] for steps in OLDER_STEPS}
    for t, start in windows(args):
        for name in args.strategies:
            for rate in judged_rates(args, store, t, start, name):
                if (steps := generation(store.get(Key("gpu", t, start, rate, name)))) in as_they_ran:
                    as_they_ran[steps].append(f"{name} {t}@{start} {rate:g} req/s")
    judged = {m for names in as_they_ran.values() for m in names}
    missing = [m for m in missing if m not in judged]
    if not any(judged_rates(args, store, t, start, name) for t, start in windows(args)
               for name in args.strategies):
        raise PdmuxError(f"no point of {','.join(args.strategies)} on {','.join(args.traces)} "
                         f"was measured in {store.path}: measure them on the GPU (drop --offline)")
    result = judge(args, store, simulate(args, store))
    result["summary"]["prefill_speed_by_commit"] = prefill_speed_by_commit(args, store)
    if args.held_out:
        result["summary"]["held_out"] = held_out(args, store)
    if args.card_band:
        result["summary"]["card_band"] = card_band(args, store, result, cards)
    inputs = {"traces": {t: str(TRACES[t].relative_to(Path(__file__).parent.parent))
                         for t in args.traces},
              "windows": {t: PLAN[t][0] for t in args.traces},
              "rates_rps": {t: PLAN[t][1] for t in args.traces},
              "rates_asked_rps": list(args.rates), "count": args.count,
              "strategies": list(args.strategies), "repeats": args.repeats,
              "slo_ttft_ms": args.slo_ttft_ms, "slo_tpot_ms": args.slo_tpot_ms,
              "calibration": args.calibration, "compare": args.compare,
              "host_costs": args.host_costs, "points_file": str(store.path),
              "prefill_speed": args.prefill_speed, "card_band": args.card_band}
    # (named after the judgement, so an error above stays one line; the set is partial)
    data = {**provenance(args.gpu), "analysed_offline": args.offline, "model": MODEL,
            "inputs": inputs, "not_measured": missing,
            **{OLDER_STEPS[steps].judged: names for steps, names in as_they_ran.items()},
            **result}
    if missing:
        print(f"{len(missing)} points not measured in {store.path} (judged without them): "
              + ", ".join(missing), file=sys.stderr, flush=True)
    for steps, names in as_they_ran.items():
        if names:
            print(f"{len(names)} chunked points measured before {OLDER_STEPS[steps].before}, "
                  f"judged as they ran: " + ", ".join(names), file=sys.stderr, flush=True)
    return finish(Path(args.out) / f"trace-fidelity-{args.gpu}.json", data, table(data))


def main(argv=None) -> int:
    p = bench_parser("trace_fidelity.py", __doc__)
    bench_inputs(p, *MEASURED_ON_H200, by_gpu=True)
    p.add_argument("--traces", type=listed(choice(tuple(TRACES)), "trace"), default=tuple(TRACES))
    p.add_argument("--strategies", type=listed(choice(STRATEGIES), "strategy"),
                   default=STRATEGIES)
    p.add_argument("--count", type=integer(50, 2000), default=COUNT)
    p.add_argument("--rates", type=listed(number(0.0, 1e4), "rate"), default=(),
                   help="also serve every window at these rates (req/s), beside the plan's: "
                        "points near a capacity its rates bracket coarsely; a strategy is "
                        "judged at every rate measured for it")
    p.add_argument("--repeats", type=integer(1, 10), default=2)
    p.add_argument("--offline", action="store_true",
                   help="read the measured points back, simulate beside them (no GPU)")
    p.add_argument("--plan", action="store_true",
                   help="print pd-mux's simulated capacity on each window (no GPU)")
    p.add_argument("--prefill-speed", type=number(0.5, 2.0, above=False), default=1.0,
                   help="simulate on a card that runs prefills this many times as fast as the "
                        "costs' card (decode steps as calibrated): how much of an error a "
                        "card's speed can make")
    p.add_argument("--card-band", metavar="CARD_SPEEDS",
                   help="also simulate every point on the slowest and the fastest card of this "
                        "bench/card_speeds.py file and report each error beyond them and the "
                        "repeats' range")
    p.add_argument("--held-out", action="store_true",
                   help="also judge each window with host costs fitted to the other windows' "
                        "points alone (bench/fit_host_costs.py)")
    return run_script(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
