"""How long a measured run's host took to launch an eager layer (a launch's first) where nothing
else bounded it, against the median over all its launches that the simulator prices the run's
host on (`host_layer_p50_ms`, `Overheads.on_host`).

A launch is the host's alone where its layers' GPU price (the committed calibration, comparison
and host costs, as the simulator prices them; a batch's prompts taken as of one length) is
under GPU_BOUND_S a layer: a prefill-first batch, a chunked round, or a split prefill batch's
first launch (its prefill stream idle until then). Its host time is its span on the GPU less
one layer's GPU price (the last layer runs after the last launch; a chunked round's span
begins before its batch is made: that is in it too); where a point kept no launch spans (a
capacity folder's diagnostics), a prefill-first batch's or chunked round's wall span, which
also holds the batch made and its tokens read back (pd-mux rounds are left out there: their
wall holds the decode round too). That time is read as its first layer's: over its layers, or
in a run since replays (a launch's later layers replay its first's launches) split as the
run's medians of a first and a later layer split a launch, and there GPU_BOUND_S is scaled by
a later layer's share of a first's, since the later layers pace a launch. Per
point: those launches' median, mean, 10th and 90th percentiles against host_layer_p50 (and
host_layer_mean where the point kept it), and a prefill-first batch's own host work (its wall
less its launch span: what the simulator charges as the eager step), moved to the host-costs
file's host. Prints a row per point and the launch-bound median over host_layer_p50 per
strategy; writes <out>/launch-bound-hosts-<gpu>.json with every launch (start, its first
layer's host time).

    python bench/launch_bound_hosts.py --out /tmp/x
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path

import numpy as np
from corun_rounds import Pricer, round_launches
from fit_host_costs import CHUNK, timed_points
from script import MEASURED_ON_H200, finish, points_parser, run_script
from trace_fidelity import prefill_batches

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_host_costs
from pdmux_triton.results import provenance, read_json
from pdmux_triton.serve.metrics import later_layer_s, rows_in_extend_tiles

POINTS = ("bench/results/trace-fidelity/points-h200.jsonl",
          "bench/results/capacity-conv/capacity-diagnostics-h200.jsonl",
          "bench/results/capacity-diagnostics-h200.jsonl")
# a launch whose layers the GPU runs in less than this each is bound by the host: about half
# the fastest host's launch of a layer on the H200 (bench/NOTES.md), measured before replays
# (a run since: scaled by its later layer's share of its first's, `launch_bound`)
GPU_BOUND_S = 0.35e-3
MIN_LAUNCHES = 5  # launch-bound launches a point's figures are read from, at the fewest


class LayerPrice:
    """One eager layer's GPU time as the simulator prices it, by the kind of launch."""

    def __init__(self, pricer: Pricer, overheads: step_cost.Overheads):
        self.pricer, self.model, self.sms = pricer, pricer.model, pricer.gpu.sms
        self.rate, self.decode = pricer.sim.prefill_rate, pricer.sim.decode_rate
        self.tiles = overheads.mixed.tiles if overheads.mixed else None
        self.split_layer_s = overheads.split_prefill_layer_s

    def _flops(self, tokens: int, prompts: int, cached: int) -> float:
        return prompts * step_cost.layer_flops(self.model, tokens // prompts, cached // prompts, 1)

    def whole(self, tokens: int, prompts: int, cached: int) -> float:
        """A whole-GPU prefill batch's layer (`SimExecutor.whole_gpu_prefill_s`)."""
        return self.pricer.sim.whole_gpu_prefill_s(
            [(tokens // prompts, cached // prompts)] * prompts, 1, False)

    def split(self, tokens: int, prompts: int, cached: int, level: int) -> float | None:
        """A split prefill batch's layer at its level's prefill SMs, beside decode (None at a
        whole-GPU level)."""
        sms = self.pricer.sms(level)[0]
        if not sms:
            return None
        slowdown = self.pricer.sim.wave_slowdown([(tokens // prompts, cached // prompts)]
                                                 * prompts, sms)  # part-empty GEMM waves
        return step_cost.compute_s(self._flops(tokens, prompts, cached) * slowdown, self.rate,
                                   sms, True) + self.split_layer_s

    def mixed(self, chunk: int, prefix: int, batch: int, context: int, before: bool) -> float:
        """A chunked round's layer: its mixed step's GPU phases over the layers (`before`: a
        round saved before its decode rows left the extend kernel, priced as it ran, their
        contexts shared evenly)."""
        phases = (step_cost.MixedStepFit(0.0, tiles=self.tiles, decode_rows_in_extend=before)
                  if self.tiles else None)
        return step_cost.mixed_step_s(self.model, self.decode, self.rate, self.sms, context,
                                      batch, chunk, prefix, 0, phases=phases) / self.model.layers


def launch_bound(point: dict, price: LayerPrice, where: str) -> tuple[list, list]:
    """The point's launch-bound launches, (start s, host seconds of its first layer) each, and
    each prefill-first batch's wall less its launch span (s; none without spans)."""
    d = point["diagnostics"]
    # a run since replays launches a launch's later layers in this share of its first's time:
    # they pace it, so only shorter layers leave it to the host, and its host time splits so
    # (1: a run before replays, every layer alike)
    later = later_layer_s(d)
    later_share = 1.0 if later is None else later / (d["host_layer_us"] / 1e6)
    r = d["rounds"]
    labels = [r["labels"][i] for i in r["label"]]
    launches = round_launches(point, where)
    before = rows_in_extend_tiles(point["strategy"], d)
    batches = prefill_batches(d)
    ends = sorted(batches)
    out, own = [], []
    for i, (start, end, label, batch, held, level) in enumerate(zip(
            r["start_us"], r["end_us"], labels, r["decode_bs"], r["decode_context"], r["level"])):
        span = launches[i][1] if launches else None
        layers, layer_s = _layers_and_price(label, batch, held, level, start, end, batches, ends,
                                            price, before)
        if layer_s is None or layer_s >= GPU_BOUND_S * later_share or (
                span is None and label.startswith("layers")):
            continue
        took = (span[1] - span[0] if span else end - start) / 1e6
        host_s = took - layer_s if span else took
        out.append((start / 1e6, host_s / (1 + (layers - 1) * later_share)))
        if span and label == "whole":
            own.append((end - start - (span[1] - span[0])) / 1e6)
    return out, own


def _layers_and_price(label, batch, held, level, start, end, batches, ends, price, before):
    """(layers launched, one layer's GPU price) of a round's prefill launch, or (0, None) where
    it launched none or is not one that this reads (a split batch's later launches)."""
    if label == "whole":
        b = batches.get(end)
        return (price.model.layers, price.whole(*b[1:4])) if b else (0, None)
    if (m := CHUNK.fullmatch(label)) is not None:
        return price.model.layers, price.mixed(int(m.group(2)), int(m.group(1)), batch, held,
                                               before)
    if label.startswith("layers 0-"):  # a batch's first launch: its stream was idle
        i = bisect_right(ends, start)
        if i == len(ends):
            return 0, None
        b = batches[ends[i]]
        return int(label.split("-")[1]), price.split(*b[1:4], level)
    return 0, None


def point_row(point: dict, host_s: float, launches: list, own: list, file_host_s: float) -> dict:
    """A point's launch-bound figures against its host_layer_p50 (ms)."""
    row = {"strategy": point["strategy"], "trace": point.get("trace"),
           "start": point.get("start"), "rate": point.get("rate", point["diagnostics"].get(
               "rate")), "host_layer_p50_ms": host_s * 1e3,
           "host_layer_mean_ms": point.get("host_layer_mean_ms"),
           "launch_spans": "busy_us" in point["diagnostics"], "launch_bound": len(launches),
           "launches": [[round(t, 4), round(s * 1e6, 1)] for t, s in launches]}
    if len(launches) >= MIN_LAUNCHES:
        each = np.array([s for _, s in launches]) * 1e3
        row.update(median_ms=float(np.median(each)), mean_ms=float(each.mean()),
                   p10_ms=float(np.percentile(each, 10)), p90_ms=float(np.percentile(each, 90)),
                   median_over_p50=float(np.median(each)) / (host_s * 1e3))
    if own:  # on the host-costs file's host, as the eager step is
        row["own_host_work_ms"] = float(np.median(own)) * 1e3 * file_host_s / host_s
    return row


def summary(rows: list[dict]) -> dict:
    """Per data set and strategy: points read, and their launch-bound median over
    host_layer_p50 (median, 10th and 90th percentiles over the points)."""
    groups = defaultdict(list)
    for x in rows:
        if "median_over_p50" in x:
            groups[f"{x['source']} {x['strategy']}"].append(x["median_over_p50"])
    out = {k: {"points": len(v), "median": float(np.median(v)), "p10": float(np.percentile(v, 10)),
               "p90": float(np.percentile(v, 90))} for k, v in sorted(groups.items())}
    own = [x["own_host_work_ms"] for x in rows if "own_host_work_ms" in x]
    if own:
        out["prefill_first_own_host_work_ms"] = {"points": len(own),
                                                 "median": float(np.median(own))}
    return out


def table(data: dict) -> str:
    cell = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [f"host time to launch an eager layer (ms): the run's median over all launches "
             f"(p50), over those the GPU priced under {GPU_BOUND_S * 1e3:g} ms a layer "
             f"(launch-bound; from launch spans, else round spans *)",
             f"{'point':<44} {'p50':>6} {'mean':>6} {'n':>4} {'lb p10':>7} {'lb med':>7} "
             f"{'lb mean':>7} {'lb p90':>7} {'med/p50':>8}"]
    for x in data["points"]:
        at = f"@{x['start']}" if x["start"] is not None else ""
        name = f"{x['source']} {x['trace'] or ''}{at} {x['strategy']} {x['rate']:g}"
        lines.append(f"{name[:44]:<44} {cell(x['host_layer_p50_ms']):>6} "
                     f"{cell(x['host_layer_mean_ms']):>6} {x['launch_bound']:>4}"
                     f"{'' if x['launch_spans'] else '*'} {cell(x.get('p10_ms')):>6} "
                     f"{cell(x.get('median_ms')):>7} {cell(x.get('mean_ms')):>7} "
                     f"{cell(x.get('p90_ms')):>7} {cell(x.get('median_over_p50')):>8}")
    lines.append("")
    for k, v in data["summary"].items():
        if k == "prefill_first_own_host_work_ms":
            lines.append(f"prefill-first batch's own host work (wall less launch span, on the "
                         f"host-costs file's host): median over {v['points']} points "
                         f"{v['median']:.2f} ms (the file's eager step: "
                         f"{data['eager_step_ms']:.2f} ms)")
        else:
            lines.append(f"{k}: launch-bound median / p50 {v['median']:.3f} (p10 {v['p10']:.3f},"
                         f" p90 {v['p90']:.3f}) over {v['points']} points")
    return "\n".join(lines)


def run(args) -> int:
    overheads = load_host_costs(args.host_costs)
    gpu = read_json(args.host_costs, "host-costs file").get("gpu", "")
    rows = []
    for path in args.points:
        pricer = Pricer(path, args.calibration, args.compare, overheads, gpu)
        price = LayerPrice(pricer, overheads)
        for point, host_s in timed_points(path):
            if "green" in point["strategy"]:  # its split levels' SMs: another kind's
                continue
            launches, own = launch_bound(point, price, f"{path} {point['strategy']}")
            rows.append({"source": pricer.source, **point_row(point, host_s, launches, own,
                                                              overheads.layer_launch_s)})
    data = {**provenance(pricer.gpu.name),
            "inputs": {"points": list(args.points), "gpu_bound_s": GPU_BOUND_S,
                       "min_launches": MIN_LAUNCHES,
                       **{k: getattr(args, k) for k in MEASURED_ON_H200}},
            "eager_step_ms": overheads.eager_step_s * 1e3, "summary": summary(rows), "points": rows}
    return finish(Path(args.out) / f"launch-bound-hosts-{pricer.gpu.name}.json", data,
                  table(data))


def main(argv=None) -> int:
    parser = points_parser("launch_bound_hosts.py", __doc__, POINTS,
                           "the H200's trace-fidelity points and both steady-state "
                           "capacity folders' diagnostics")
    return run_script(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
