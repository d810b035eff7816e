"""Served PD-mux prefill batches at split levels against their co-run price: what each level's
prefill keeps of the comparison's burst rate as served, the rate the simulator slows a busy
split prefill toward (the host-costs file's `split_prefill_served`, or `by_kind.green`'s for
green contexts, which bench/fit_host_costs.py fits from these batches).

A batch counts where it was served by a pd-mux point at SGLang's levels on the partition kind
asked for (`--kind`: grid-capped, the default, or green contexts), all its layers at one split
level, with at least MIN_TOKENS prompt tokens (bound by its GPU: its upload and its wait for a
round are a small part of its span), none read from a prefix cache, after split batches kept
the prefill busy at least MIN_BUSY of the half second before it. The busy share is the
simulator's (`SimExecutor._prefill_busy`: the split prefill's GPU spans before its GPU work
starts), read from the split batches' compute spans (below), which every points file keeps;
their host spans also hold each batch's upload and its first token's wait, and read busier.
Its prompts: a batch takes the waiting requests in arrival order, so the run's requests, made
again from the point's settings, name each batch's prompts (a point whose batches do not add
up to its requests is left out and counted). Its price: its FLOPs at the comparison's co-run
rate on its prefill SMs, slowed by its part-empty GEMM waves as the simulator slows it
(`SimExecutor.wave_slowdown`); its compute span: taken to first token, less its upload on its
run's host and half the round its first token came at the end of; its ratio: price over span.
Besides its rate, each layer of a split prefill takes a fixed GPU time (its kernels' ramps and
tails on the level's SMs), which a large batch hardly shows and a short one pays in full: the
batches under MIN_TOKENS fit it (`layer_time`: their span less their price at their busy share,
a layer), the large ones the ratios with it taken off their spans, the two in turns until they
settle (`joint_fit`); another kind takes the grid cap's time (the host-costs file's).
Prints the median ratio by points file and prefill SMs, pooled, and the levels the host-costs
file's fit keeps (`served_levels`: the layer time taken off, a thin kind's scaled from the grid
cap's) with that time; writes <out>/split-batches-<gpu>.json (split-batches-green-<gpu>.json
with `--kind green`).

    python bench/split_batches.py --out /tmp/x
    python bench/split_batches.py --kind green --out /tmp/x
"""

from __future__ import annotations

import functools
import sys
from bisect import bisect_left
from collections import defaultdict
from pathlib import Path

import numpy as np
from corun_rounds import PDMUX_KIND_STRATEGIES, POINTS, POINTS_SAID, Pricer, covered_s
from fit_host_costs import CAPACITY_DIAGNOSTICS, timed_points
from script import MEASURED_ON_H200, finish, points_parser, run_script
from trace_fidelity import COUNT, MODEL, TRACES, batch_prompts

from pdmux_triton.cli.parsing import choice
from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments.settings import RunSettings, make_requests
from pdmux_triton.results import provenance, read_json
from pdmux_triton.serve.simulated import SUSTAINED_WINDOW_S, busy_curve
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import Request

MIN_TOKENS = 4096  # a batch's prompt tokens, at the fewest
MIN_BUSY = 0.9  # its level's prefill busy this share of the window before it, at the least
MIN_BATCHES = 10  # batches a level's ratio (or the layer time) is read from, at the fewest
JOINT_ROUNDS = 20  # the joint fit's turns at the most
SETTLED_S = 1e-6  # a turn that moves the layer time less than this has settled
# the pd-mux strategy served at SGLang's levels on each partition kind, whose split levels
# that kind's comparison rate prices
PDMUX_OF_KIND = {kind: names[0] for kind, names in PDMUX_KIND_STRATEGIES.items()}


def point_requests(path: str, point: dict, gpu: str) -> list[Request]:
    """The requests a measured point of `path` served on the `gpu`, made again from its
    settings (`run_settings`)."""
    rate = point.get("rate", point["diagnostics"].get("rate"))
    return make_requests(run_settings(path, gpu, point.get("trace"), point.get("start")), rate)


@functools.lru_cache(maxsize=None)
def run_settings(path: str, gpu: str, trace: str | None, start: int | None) -> RunSettings:
    """The settings a points file's runs were served with: a capacity folder's saved ones, or
    bench/trace_fidelity.py's window of its trace; made once a folder or window, so its trace
    is read once (a run's requests are its window's, sped up to its rate)."""
    if Path(path).name.startswith(CAPACITY_DIAGNOSTICS):
        saved = read_json(Path(path).with_name(f"capacity-settings-{gpu}.json"),
                          "capacity settings")
        defaults = {k: v for k, v in RunSettings.defaults().items() if k != "model"}
        # a folder keeps no context length (it only refuses requests); the run served its
        # preset's, which leaves a trace's longest prompts out
        model = {**saved["model"], "max_context": model_preset(saved["model"]["name"]).max_context}
        return RunSettings.from_dict({**defaults, **saved, "model": model})
    return RunSettings(gpu=gpu_preset(gpu), model=model_preset(MODEL), workload="trace",
                       trace=str(TRACES[trace]), trace_start=start, trace_count=COUNT,
                       simulate=True)


def split_batches(point: dict, requests: list[Request], pricer: Pricer,
                  upload_s: float) -> list[dict] | None:
    """Each uncached prompt batch of a pd-mux point whose layers all ran at one split level: its
    prefill SMs, prompts, tokens, the split prefill's busy share before its compute span (from
    the split batches' compute spans, as the simulator reads its own), its compute span and its
    co-run price. The span runs from the batch taken to its first token, which the host
    sees at the end of the round its last layer ended in: less `upload_s` and half that round
    (where in it the layer ended is not kept; the simulator adds that wait itself). None where
    its batches, taken in arrival order, do not add up to `requests`."""
    d = point["diagnostics"]
    r = d["rounds"]
    layers = [(start, level) for start, label, level in zip(r["start_us"], r["label"], r["level"])
              if r["labels"][label].startswith("layers ")]
    starts = [start for start, _ in layers]
    prefills = sorted(d["prefills"])
    taken = batch_prompts([(prompts, tokens + (cached[0] if cached else 0))
                           for _, _, tokens, prompts, *cached in prefills], requests)
    if taken is None:
        return None
    batches = []
    for (start, end, tokens, prompts, *cached), mine in zip(prefills, taken):
        cached = cached[0] if cached else 0
        levels = {level for _, level in layers[bisect_left(starts, start):bisect_left(starts, end)]}
        last = r["start_us"][max(0, bisect_left(r["start_us"], end) - 1)]
        batches.append({"start": start / 1e6, "end": end / 1e6, "tail": (end - last) / 2e6,
                        "prefill_sms": pricer.sms(levels.pop())[0] if len(levels) == 1 else 0,
                        "prompts": prompts, "tokens": tokens, "cached": cached,
                        "layers": pricer.model.layers, "prompt_lens": [q.prompt_len for q in mine]})
    split = [b for b in batches if b["prefill_sms"]]
    for b in split:  # its compute span: where the simulator's busy share reads its GPU work
        b["seconds"] = b["end"] - b["start"] - upload_s - b.pop("tail")
    spans = np.array([(b["start"] + upload_s, b["start"] + upload_s + max(0.0, b["seconds"]))
                      for b in split], dtype=float).reshape(-1, 2)
    rows = []
    for b in split:
        if b["cached"]:  # which prompt read how much of the cache is not kept
            continue
        lens, sms, began = b.pop("prompt_lens"), b["prefill_sms"], b["start"] + upload_s
        # as the simulator prices it: its FLOPs slowed by its part-empty GEMM waves
        seqs = [(n, 0) for n in lens]
        flops = step_cost.batch_flops(pricer.model, seqs) * pricer.sim.wave_slowdown(seqs, sms)
        rows.append({**b, "busy": covered_s(spans, began - SUSTAINED_WINDOW_S, began)
                     / SUSTAINED_WINDOW_S,
                     "corun_s": step_cost.compute_s(flops, pricer.sim.prefill_rate, sms, True)})
    return rows


def counted(row: dict) -> bool:
    """Whether a batch's span reads its level's rate at a busy GPU's clocks (module doc)."""
    return row["tokens"] >= MIN_TOKENS and not row["cached"] and row["busy"] >= MIN_BUSY


def served_batches(paths, calibration: str, compare: str, overheads: step_cost.Overheads,
                   gpu: str, kind: str = "grid_cap") -> tuple[dict[str, list[dict]], list[str]]:
    """Every pd-mux point's split batches (`split_batches`) on partition `kind`, by file, and
    the points left out (their batches and requests disagree)."""
    by_file, left_out = {}, []
    for path in paths:
        pricer = Pricer(path, calibration, compare, overheads, gpu, kind)
        for point, host_s in timed_points(path):
            if point["strategy"] != PDMUX_OF_KIND[kind]:
                continue
            upload_s = overheads.on_host(host_s).split_prefill_batch_s()
            rows = split_batches(point, point_requests(path, point, pricer.gpu.name), pricer,
                                  upload_s)
            rate = point.get("rate", point["diagnostics"].get("rate"))
            where = f"{pricer.source} {point.get('trace', '')}@{point.get('start', '')} {rate:g}"
            if rows is None:
                left_out.append(where)
            else:
                by_file.setdefault(path, []).extend({**row, "point": where} for row in rows)
    return by_file, left_out


def _span(row: dict, layer_s: float) -> float:
    """A batch's compute span less its layers' fixed time (`layer_s` a layer)."""
    return row["seconds"] - layer_s * row["layers"]


def ratio_by_prefill_sms(rows: list[dict], min_batches: int = MIN_BATCHES,
                         layer_s: float = 0.0) -> list[list]:
    """[prefill SMs, median co-run price over compute span, batches] of each level holding at
    least `min_batches` counted batches, each span less its layers' fixed time (`layer_s` a
    layer)."""
    by_sms = defaultdict(list)
    for row in rows:
        span = _span(row, layer_s)
        if counted(row) and span > 0:
            by_sms[row["prefill_sms"]].append(row["corun_s"] / span)
    return [[sms, float(np.median(r)), len(r)] for sms, r in sorted(by_sms.items())
            if len(r) >= min_batches]


def fits_layer_time(row: dict) -> bool:
    """Whether a batch fits the layers' fixed time: under MIN_TOKENS, read from no cache."""
    return row["tokens"] < MIN_TOKENS and not row["cached"] and row["seconds"] > 0


def layer_time(rows: list[dict], levels: list[list],
               slowdown: tuple[tuple[float, float], ...]) -> tuple[float, int] | None:
    """A split prefill layer's fixed GPU time: the median over the short batches
    (`fits_layer_time`) of each one's span less its price a layer, priced from its burst co-run
    price toward its level's served rate (`levels`, [prefill SMs, ratio]) as far as its busy
    share says (`slowdown`, the host-costs file's curve); at least 0. With the batches it
    rests on; None where fewer than MIN_BATCHES or no levels. Two ways the simulator prices
    otherwise: it runs the part of a batch left while the decode side waits for the host's
    launches at the rate alone (`SimExecutor._split_prefill_s`), and its busy share counts
    whole-GPU prefills too; a short batch, whose launches weigh most, runs a little faster
    there than priced here. And a launch-bound batch's GPU work ends near the start of the
    round its first token ends, so its span keeps more than the half round taken off: on the
    H200 that, not GPU time, is what the pooled time reads (bench/NOTES.md, session 63)."""
    picked = [row for row in rows if fits_layer_time(row)]
    if len(picked) < MIN_BATCHES or not levels:
        return None
    sms, ratios = [s for s, *_ in levels], [r for _, r, *_ in levels]
    curve = busy_curve(slowdown)
    excess = []
    for row in picked:
        toward = float(np.interp(row["busy"], *curve))
        served = row["corun_s"] / float(np.interp(row["prefill_sms"], sms, ratios))
        excess.append((row["seconds"] - row["corun_s"] - toward * (served - row["corun_s"]))
                      / row["layers"])
    return max(0.0, float(np.median(excess))), len(picked)


def joint_fit(rows: list[dict], slowdown: tuple[tuple[float, float], ...]
              ) -> tuple[list[list], tuple[float, int] | None]:
    """Each level's ratio (`ratio_by_prefill_sms`) and a layer's fixed time (`layer_time`),
    fitted in turns: the ratios with the time taken off the large batches' spans, the time
    against the short batches' prices at those ratios, until a turn moves the time less than
    SETTLED_S; no time (and the plain ratios) where too few short batches or levels. A fit
    that does not settle in JOINT_ROUNDS turns is refused in one line."""
    layer_s = 0.0
    for _ in range(JOINT_ROUNDS):
        layer = layer_time(rows, ratio_by_prefill_sms(rows, layer_s=layer_s), slowdown)
        if layer is None:
            return ratio_by_prefill_sms(rows), None
        settled, layer_s = abs(layer[0] - layer_s) < SETTLED_S, layer[0]
        if settled:
            return ratio_by_prefill_sms(rows, layer_s=layer_s), layer
    raise PdmuxError(f"a split prefill's layer time and its levels did not settle in "
                     f"{JOINT_ROUNDS} turns (the last {layer_s * 1e6:.1f} us a layer)")


def scaled_levels(rows: list[dict], base: list[list], min_batches: int = MIN_BATCHES,
                  layer_s: float = 0.0) -> tuple[list[list], float, int] | None:
    """A kind's ratios where its counted batches are too few to read two levels apart: the
    `base` kind's [prefill SMs, ratio] levels times the median over those batches of each
    one's ratio over the base's at its SMs (interpolated between the base's levels, held
    beyond them; each span less its layers' fixed time, `layer_s` a layer), where at least
    `min_batches` count over all its levels and the base has two; else None. Returns (the
    levels, that factor, the batches it rests on)."""
    if len(base) < 2:
        return None
    sms, ratios = [s for s, _ in base], [r for _, r in base]
    relative = [row["corun_s"] / _span(row, layer_s)
                / float(np.interp(row["prefill_sms"], sms, ratios))
                for row in rows if counted(row) and _span(row, layer_s) > 0]
    if len(relative) < min_batches:
        return None
    factor = float(np.median(relative))
    return [[s, r * factor] for s, r in base], factor, len(relative)


def served_levels(rows: list[dict], slowdown: tuple[tuple[float, float], ...],
                  base: list[list] | None = None, layer_s: float | None = None) -> dict:
    """The levels a kind's batches (`rows`) price its split prefill at, and a layer's fixed
    time: both fitted (`joint_fit`), or the levels with a given `layer_s` taken off (the grid
    cap's, which prices every kind); where fewer than two levels hold enough batches and a
    `base` kind's levels are given (the grid cap's), those scaled by these batches
    (`scaled_levels`, its factor kept as `scaled_from_base_by`), rather than pricing this kind
    at the base's own ratios. `short_batches`: those the time was fitted on (0: given)."""
    if layer_s is None:
        levels, layer = joint_fit(rows, slowdown)
        layer_s, short_batches = layer if layer else (0.0, 0)
    else:
        levels, short_batches = ratio_by_prefill_sms(rows, layer_s=layer_s), 0
    kept = {"ratio_by_prefill_sms": [[sms, ratio] for sms, ratio, _ in levels],
            "batches": sum(n for *_, n in levels), "layer_s": layer_s,
            "short_batches": short_batches}
    scaled = scaled_levels(rows, base, layer_s=layer_s) if len(levels) < 2 and base else None
    if scaled is not None:
        kept.update(ratio_by_prefill_sms=scaled[0], batches=scaled[2],
                    scaled_from_base_by=scaled[1])
    return kept


def served_sustained(paths, calibration: str, compare: str, overheads: step_cost.Overheads,
                     gpu: str, kind: str = "grid_cap", base: list[list] | None = None,
                     layer_s: float | None = None) -> dict:
    """The host-costs file's `split_prefill_served` for partition `kind` over the points
    files' batches, pooled (`served_levels`, at `overheads`' busy curve), with the thresholds
    its batches were counted by and the points left out."""
    by_file, left_out = served_batches(paths, calibration, compare, overheads, gpu, kind)
    kept = served_levels([row for rows in by_file.values() for row in rows],
                         overheads.split_prefill_slowdown, base, layer_s)
    return {**kept, "min_tokens": MIN_TOKENS, "min_busy": MIN_BUSY, "points_left_out": left_out,
            "files": [f"{Path(p).parent.name}/{Path(p).name}" for p in by_file]}


def table(data: dict) -> str:
    sms = sorted({s for levels in data["by_file"].values() for s, *_ in levels})
    cell = lambda levels, s: next((f"{r:.3f} ({n})" for x, r, n in levels if x == s), "-")
    lines = [f"served split prefill batches (>= {MIN_TOKENS} tokens, busy >= {MIN_BUSY:.0%}): "
             f"co-run price / compute span (batches), by prefill SMs",
             f"{'':<48}" + "".join(f"{s:>14}" for s in sms)]
    for name, levels in [*data["by_file"].items(), ("pooled", data["pooled"])]:
        lines.append(f"{name:<48}" + "".join(f"{cell(levels, s):>14}" for s in sms))
    fitted = data["fitted"]
    kept = dict(fitted["ratio_by_prefill_sms"])
    lines.append(f"{'as the host-costs fit keeps them':<48}" + "".join(
        f"{kept[s]:>14.3f}" if s in kept else f"{'-':>14}" for s in sms))
    lines.append("a layer's fixed time beyond them: " + (
        f"{fitted['layer_s'] * 1e6:.0f} us over {fitted['short_batches']} batches under "
        f"{MIN_TOKENS} tokens" if fitted["short_batches"] else
        f"{fitted['layer_s'] * 1e6:.0f} us, the host-costs file's (the grid cap's)"
        if data["inputs"]["kind"] != "grid_cap" else
        f"not fitted (fewer than {MIN_BATCHES} batches under {MIN_TOKENS} tokens)"))
    if data["points_left_out"]:
        lines.append("left out (batches and requests disagree): "
                     + ", ".join(data["points_left_out"]))
    return "\n".join(lines)


def run(args) -> int:
    overheads = load_host_costs(args.host_costs)
    gpu = read_json(args.host_costs, "host-costs file").get("gpu", "")
    by_file, left_out = served_batches(args.points, args.calibration, args.compare, overheads,
                                       gpu, args.kind)
    if not by_file:
        raise PdmuxError(f"{', '.join(args.points)} hold no {PDMUX_OF_KIND[args.kind]} point "
                         f"whose batches add up to its requests ({len(left_out)} left out): "
                         f"measure it (bench/trace_fidelity.py, `pdmux-triton capacity`)")
    label = lambda p: f"{Path(p).parent.name}/{Path(p).name}"
    data = {**provenance(gpu),
            "inputs": {"points": list(args.points), "kind": args.kind, "min_tokens": MIN_TOKENS,
                       "min_busy": MIN_BUSY, **{k: getattr(args, k) for k in MEASURED_ON_H200}},
            "by_file": {label(p): ratio_by_prefill_sms(rows, 1) for p, rows in by_file.items()},
            "pooled": ratio_by_prefill_sms([x for rows in by_file.values() for x in rows], 1),
            "points_left_out": left_out}
    # as bench/fit_host_costs.py fits them: another kind at the grid cap's layer time, scaled
    # from the grid cap's levels (the host-costs file's) where its own are too few
    grid = args.kind == "grid_cap"
    data["fitted"] = served_levels(
        [x for rows in by_file.values() for x in rows], overheads.split_prefill_slowdown,
        None if grid else [list(p) for p in overheads.split_prefill_sustained],
        None if grid else overheads.split_prefill_layer_s)
    name = "split-batches" + ("" if args.kind == "grid_cap" else f"-{args.kind}")
    return finish(Path(args.out) / f"{name}-{gpu}.json", data, table(data))


def main(argv=None) -> int:
    parser = points_parser("split_batches.py", __doc__, POINTS, POINTS_SAID)
    parser.add_argument("--kind", type=choice(tuple(PDMUX_OF_KIND)), default="grid_cap",
                        help="the partition kind whose pd-mux points are read")
    return run_script(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
