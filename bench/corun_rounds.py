"""Served PD-mux decode steps beside a split prefill against the simulator's price, by how busy
the prefill kept the GPU before each: what `SimExecutor.wait_decode`'s busy-share term (the
host-costs file's `decode_beside_prefill`, which bench/fit_host_costs.py fits from these rounds)
should be on top of the calibration's co-run price, and whether it holds.

Every decode round of measured points (bench/trace_fidelity.py's, capacity folders' diagnostics)
is priced as the simulator prices it (`step_cost.served_decode_step_s`, the committed inputs),
its measured GPU step set over that price without the busy term and with it. The split
prefill's busy share over the `SUSTAINED_WINDOW_S` before the step: from its launches' spans on
the GPU where the point kept them (then also the share of the step they covered), else from its
prompt batches' spans. Prints medians by busy share, prefill SMs and coverage per data set and
pooled, and, to check the calibration, split rounds with the prefill idle and whole-GPU decode
rounds; writes <out>/corun-rounds-<gpu>.json.

    python bench/corun_rounds.py --out /tmp/x
"""

from __future__ import annotations

import glob
import sys
from bisect import bisect_left
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import numpy as np
from fit_host_costs import CAPACITY_DIAGNOSTICS, capacity_settings, timed_points
from script import MEASURED_ON_H200, finish, points_parser, run_script
from trace_fidelity import MODEL, prefill_batches

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_calibration, load_compare, load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex.partition import for_level
from pdmux_triton.multiplex.sglang_rules import PDMuxConfig
from pdmux_triton.results import provenance, read_json
from pdmux_triton.serve.simulated import SUSTAINED_WINDOW_S, SimExecutor
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset

POINTS = ("bench/results/trace-fidelity/points-h200.jsonl",
          "bench/results/capacity-conv/capacity-diagnostics-h200.jsonl",
          "bench/results/capacity-diagnostics-h200.jsonl",
          *sorted(glob.glob("bench/results/prefix-cache/*/capacity-diagnostics-h200.jsonl")))
BUSY = (0.3, 0.6, 0.8, 0.95)  # busy-share bin edges: <0.3, 0.3-0.6, ..., >=0.95
COVERED = (0.5, 0.9)  # the step's share its prefill's launches covered: <0.5, 0.5-0.9, >=0.9
# what POINTS are, as the scripts reading them say it
POINTS_SAID = "the H200's trace-fidelity points, capacity diagnostics and prefix-cache folders"
# the pd-mux strategies whose split levels run on each partition kind: at SGLang's levels
# first, then at the slo policy's
PDMUX_KIND_STRATEGIES = {kind: (f"pdmux_{kind}", f"pdmux_slo_{kind}")
                         for kind in ("grid_cap", "green")}


class Pricer:
    """A points file's GPU, model and pd-mux levels, and the simulator's price of a decode step
    (`SimExecutor.decode_price_s`, without and with its busy ratio), from the calibration,
    comparison and overheads given (`gpu`: the GPU that bench/trace_fidelity.py's points ran
    on; a capacity folder names its own), for the partition `kind` its split levels ran on."""

    def __init__(self, path: str, calibration: str, compare: str, overheads: step_cost.Overheads,
                 gpu: str, kind: str = "grid_cap"):
        p = Path(path)
        if not p.is_file():
            raise PdmuxError(f"{path}: no such points file")
        if p.name.startswith(CAPACITY_DIAGNOSTICS):  # a capacity folder: as its settings say
            self.gpu, self.model, saved = capacity_settings(p)
            config = PDMuxConfig(**saved["config"])
            self.source = "capacity" if p.parent.name == "results" else p.parent.name
        else:  # bench/trace_fidelity.py's points: its model
            self.gpu, self.model = gpu_preset(gpu), model_preset(MODEL)
            self.source, config = p.parent.name, PDMuxConfig()
        self.levels = config.levels(self.gpu.sms, self.gpu.cc_major)
        decode = load_calibration(calibration, self.gpu.name).decode_curve(kind)
        prefill = load_compare(compare, self.gpu.name).prefill_rate(
            kind, self.gpu.bf16_tflops, self.gpu.sms)
        self.kind = kind
        self.sim = SimExecutor(self.gpu, self.model, decode, prefill, kind, overheads)

    def sms(self, level: int) -> tuple[int, int]:
        """(prefill SMs, decode SMs) of a round's level (-1: a whole-GPU loop's); 0 prefill SMs
        where the decode has the whole GPU."""
        if level < 0:
            return 0, self.gpu.sms
        spec = for_level(self.levels[level], self.kind, self.gpu.sms)
        return (0 if spec.whole_gpu else spec.prefill_sms), spec.decode_sms

    def price_s(self, x: dict) -> tuple[float, float]:
        """A round's decode step as the simulator prices it: without and with its busy ratio."""
        return tuple(self.sim.decode_price_s(x["context"], x["decode_sms"], x["corun"],
                                             x["batch"], busy)
                     for busy in (None, x.get("busy")))


def covered_s(spans: np.ndarray, a: float, b: float) -> float:
    """Seconds of [a, b] that sorted, disjoint (start, end) spans cover."""
    part = spans[np.searchsorted(spans[:, 1], a):np.searchsorted(spans[:, 0], b)]
    return float(np.clip(np.minimum(part[:, 1], b) - np.maximum(part[:, 0], a), 0, None).sum())


def round_launches(point: dict, where: str) -> list[tuple] | None:
    """Each round's launches on the GPU's clock, (its decode step's span, its prefill launch's
    span), None for what it did not launch: a round launches its decode step (a chunked round:
    its mixed step instead), then its prefill's layers, a whole prefill or a mixed step, in
    that order among the point's launch spans. None where the point kept no spans; refused
    where they do not add up to its rounds."""
    d = point["diagnostics"]
    r, launches = d["rounds"], d.get("busy_us")
    if launches is None:
        return None
    labels = [r["labels"][i] for i in r["label"]]
    decodes = [b > 0 and not label.startswith("chunk") for b, label in zip(r["decode_bs"], labels)]
    if len(launches) != sum(decodes) + sum(map(bool, labels)):
        raise PdmuxError(f"{where}: its launch spans do not match its rounds")
    launched = iter(launches)
    return [(next(launched) if decode else None, next(launched) if label else None)
            for decode, label in zip(decodes, labels)]


def decode_rounds(point: dict, pricer: Pricer, where: str) -> list[dict]:
    """Each decode round of a point: its SMs, batch, context, measured step and prices and, at a
    split level, its prefill's busy share before it and whether (how much) it ran beside it."""
    d, r = point["diagnostics"], point["diagnostics"]["rounds"]
    labels = [r["labels"][i] for i in r["label"]]
    decodes = [b > 0 and not label.startswith("chunk") for b, label in zip(r["decode_bs"], labels)]
    if sum(decodes) != len(d["decode_step_us"]):
        raise PdmuxError(f"{where}: its rounds do not match its timed decode steps")
    launches = round_launches(point, where)
    steps = iter(d["decode_step_us"])
    rounds, spans = [], []
    for i, (start, level, batch, held, decode) in enumerate(zip(
            r["start_us"], r["level"], r["decode_bs"], r["decode_context"], decodes)):
        prefill_sms, decode_sms = pricer.sms(level)
        step_span, prefill_span = launches[i] if launches else (None, None)
        if decode:  # on the GPU's clock where the launches are kept, else the rounds'
            began = step_span[0] if launches else start
            rounds.append({"prefill_sms": prefill_sms, "decode_sms": decode_sms, "batch": batch,
                           "context": held, "span": (began / 1e6, (began + next(steps)) / 1e6)})
        if prefill_span and prefill_sms:  # a split prefill's layers
            spans.append(prefill_span)
    if launches is None:  # each prompt batch at a split level, from its start to its first token
        spans = [[a, end] for end, (a, *_) in sorted(prefill_batches(d).items())
                 if pricer.sms(r["level"][bisect_left(r["start_us"], a)])[0]]
    spans = np.array(spans, dtype=float).reshape(-1, 2) / 1e6
    for x in rounds:
        a, b = x.pop("span")
        x["measured_ms"], x["corun"] = (b - a) * 1e3, False
        if x["prefill_sms"]:
            x["busy"] = covered_s(spans, a - SUSTAINED_WINDOW_S, a) / SUSTAINED_WINDOW_S
            # launch spans: the share of the step they covered; batches: in flight as it began
            x["coverage"] = covered_s(spans, a, b) / (b - a) if launches else None
            x["corun"] = covered_s(spans, a, b if launches else a + 1e-6) > 0
        x["price_ms"], x["price_with_ratio_ms"] = (s * 1e3 for s in pricer.price_s(x))
    return rounds


def medians(rows: list[dict], key, names=None) -> dict:
    """Rounds and median measured / price (without the busy ratio, with it) by `key` (an
    index into `names` where given)."""
    groups = defaultdict(list)
    for x in rows:
        groups[key(x)].append(x)
    ratio = lambda g, price: float(np.median([x["measured_ms"] / x[price] for x in g]))
    return {str(k if names is None else names[k]): {
        "rounds": len(g), "without_ratio": ratio(g, "price_ms"),
        "with_ratio": ratio(g, "price_with_ratio_ms")} for k, g in sorted(groups.items())}


def bins(edges) -> list[str]:
    return [f"<{edges[0]:g}", *(f"{a:g}-{b:g}" for a, b in pairwise(edges)),
            f">={edges[-1]:g}"]


def summary(rows: list[dict]) -> dict:
    corun = [x for x in rows if x["corun"]]
    sms = lambda x: x["prefill_sms"]
    busy = lambda x: int(np.digitize(x["busy"], BUSY))
    return {"corun_by_busy": medians(corun, busy, bins(BUSY)),
            "corun_by_prefill_sms": medians(corun, sms),
            "corun_busy_over_0.95_by_prefill_sms": medians(
                [x for x in corun if x["busy"] >= BUSY[-1]], sms),
            "corun_busy_over_0.8_by_coverage": medians(
                [x for x in corun if x["coverage"] is not None and x["busy"] >= BUSY[2]],
                lambda x: int(np.digitize(x["coverage"], COVERED)), bins(COVERED)),
            "split_prefill_idle": medians([x for x in rows if x["prefill_sms"] and not x["corun"]],
                                          lambda x: "all"),
            "whole_gpu": medians([x for x in rows if not x["prefill_sms"]], lambda x: "all")}


def ratio_by_busy(paths, calibration: str, compare: str, overheads: step_cost.Overheads,
                  gpu: str, min_rounds: int = 30, kind: str = "grid_cap") -> dict:
    """The served decode step beside a split prefill on partition `kind` over its co-run price
    without the busy ratio, by busy share: (median busy share, median ratio) in each `BUSY` bin
    holding at least `min_rounds` rounds (`ratio_by_busy_share`), over the pd-mux points that
    kept their launches' spans (the busy share on the GPU's clock; a round counts as beside the
    prefill where any launch of it overlaps, as the simulator counts a step whose prefill queue
    ends after it starts); with the rounds it rests on, those in bins too thin to keep, and
    the files that held such points."""
    rows, used = [], []
    for path in paths:
        pricer = Pricer(path, calibration, compare, overheads, gpu, kind)
        for point, _ in timed_points(path):
            if "busy_us" in point["diagnostics"] and point["strategy"] in \
                    PDMUX_KIND_STRATEGIES[kind]:
                rows += [x for x in decode_rounds(point, pricer, f"{path} {point['strategy']}")
                         if x["corun"]]
                used += [] if path in used else [path]
    groups = defaultdict(list)
    for x in rows:
        groups[int(np.digitize(x["busy"], BUSY))].append(x)
    kept = [g for _, g in sorted(groups.items()) if len(g) >= min_rounds]
    return {"ratio_by_busy_share": [[float(np.median([x["busy"] for x in g])),
                                     float(np.median([x["measured_ms"] / x["price_ms"]
                                                      for x in g]))] for g in kept],
            "rounds": sum(map(len, kept)), "rounds_in_thin_bins": len(rows) - sum(map(len, kept)),
            "files": used}


def table(data: dict) -> str:
    cell = lambda g, which: f"{g[which]:.3f} ({g['rounds']})" if g else "-"
    lines = [f"measured GPU step / price without the busy term [with it] (rounds); busy: the "
             f"split prefill's share of the {SUSTAINED_WINDOW_S:g} s before the step"]
    for name, s in data["sets"].items():
        rates = ", ".join(f"{r:g}" for r in s["rates"])
        lines += ["", f"{name} ({s['points']} points at {rates} req/s)"]
        if busy := s["summary"]["corun_by_busy"]:
            lines.append(f"{'  busy':<22}" + "".join(f"{b:>17}" for b in bins(BUSY)))
            for which in ("without_ratio", "with_ratio"):
                lines.append(f"{'  ' + which:<22}" + "".join(f"{cell(busy.get(b), which):>17}"
                                                             for b in bins(BUSY)))
            for e in s.get("each_point", ()):  # each point's, without the ratio
                at = f"{e['rate']:g}" + (f" @{e['start']}" if e["start"] is not None else "")
                lines.append(f"{'    ' + at:<22}" + "".join(
                    f"{cell(e['summary']['corun_by_busy'].get(b), 'without_ratio'):>17}"
                    for b in bins(BUSY)))
        for key, g in s["summary"].items():
            if key != "corun_by_busy" and g:
                lines.append(f"  {key.replace('_', ' ')}: " + "  ".join(
                    f"{n} {v['without_ratio']:.3f} [{v['with_ratio']:.3f}] ({v['rounds']})"
                    for n, v in g.items()))
    return "\n".join(lines)


def run(args) -> int:
    points, rows = defaultdict(list), defaultdict(list)  # by data set: each point, every round
    overheads = load_host_costs(args.host_costs)
    gpu = read_json(args.host_costs, "host-costs file").get("gpu", "")
    for path in args.points:
        # each point priced on its partition kind's curves, levels and served ratios
        pricers = {kind: Pricer(path, args.calibration, args.compare, overheads, gpu, kind)
                   for kind in PDMUX_KIND_STRATEGIES}
        for point, _ in timed_points(path):
            pricer = pricers["green" if point["strategy"] in PDMUX_KIND_STRATEGIES["green"]
                             else "grid_cap"]
            d = point["diagnostics"]
            rate = point.get("rate", d.get("rate"))
            name = " ".join(filter(None, (pricer.source, point.get("trace"), point["strategy"])))
            more = decode_rounds(point, pricer, f"{name} at {rate:g} req/s")
            rows[name] += more
            points[name].append({"rate": rate, "start": point.get("start"),
                                 "host_layer_us": d["host_layer_us"],
                                 "launch_spans": "busy_us" in d, "summary": summary(more)})
    sets = {name: {"points": len(points[name]), "rates": sorted({p["rate"] for p in points[name]}),
                   "summary": summary(rows[name]),
                   **({"each_point": points[name]} if len(points[name]) > 1 else {})}
            for name in points}
    for pooled, pick in (("pooled PD-mux, launch spans", lambda n: "pdmux" in n and all(
                             p["launch_spans"] for p in points[n])),
                         ("pooled PD-mux", lambda n: "pdmux" in n),
                         ("pooled whole-GPU loops", lambda n: "pdmux" not in n)):
        names = [n for n in points if pick(n)]
        sets[pooled] = {"points": sum(sets[n]["points"] for n in names),
                        "rates": sorted({r for n in names for r in sets[n]["rates"]}),
                        "summary": summary([x for n in names for x in rows[n]])}
    data = {**provenance(pricer.gpu.name),
            "inputs": {"points": list(args.points), "busy_window_s": SUSTAINED_WINDOW_S,
                       **{k: getattr(args, k) for k in MEASURED_ON_H200}}, "sets": sets}
    return finish(Path(args.out) / f"corun-rounds-{pricer.gpu.name}.json", data, table(data))


def main(argv=None) -> int:
    parser = points_parser("corun_rounds.py", __doc__, POINTS, POINTS_SAID)
    return run_script(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
