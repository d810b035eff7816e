"""Every served decode step against the price the simulator puts on it: at which levels,
batches and contexts the cost model is wrong, and by how much.

Serves a stream (a length preset at each rate) with pd-mux under SGLang's levels and under the
slo policy, on the GPU (or, --simulate, on the cost model's clock: there the only errors are
the guess of which steps ran beside a prefill, and the simulator's ratio for a step beside a
split prefill by how busy that prefill kept the GPU, which this price leaves out). Each
round's decode step, as the executor timed it, is set beside its price: the calibration's
decode TB/s at the round's decode SMs (beside a prefill when the round launched prefill
layers) over the weights and the batch's KV, plus the host-costs file's step extra for the
batch. Writes <out>/step-errors-<gpu>[-simulated].json
with every round and the median measured / predicted ratio by level, by batch band and by
decode SMs x batch band; prints the table.

    python bench/step_errors.py --out bench/results                    # on the GPU
    python bench/step_errors.py --simulate --rates 12 --count 40 --out /tmp/x
    python bench/step_errors.py --reprice bench/results/step-errors-h200.json --out /tmp/x
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from script import bench_inputs, bench_parser, finish, run_script

from pdmux_triton.cli.parsing import integer, number
from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_calibration, load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments.run import Servers, make_requests
from pdmux_triton.experiments.settings import RunSettings
from pdmux_triton.experiments.variants import variant
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.results import provenance, read_json, write_json
from pdmux_triton.spec.gpus import detect_gpu, gpu_preset
from pdmux_triton.spec.models import ModelSpec, model_preset
from pdmux_triton.spec.traffic import LENGTH_PRESETS

STRATEGIES = {"default": "pdmux_grid_cap", "slo": "pdmux_slo_grid_cap"}
BATCH_BANDS = (1, 9, 33, 65, 97)  # band lower edges: 1-8, 9-32, 33-64, 65-96, 97+


def band(batch: int) -> str:
    lo = max(b for b in BATCH_BANDS if b <= batch)
    following = [b for b in BATCH_BANDS if b > lo]
    return f"{lo}-{following[0] - 1}" if following else f"{lo}+"


def policies_arg(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names or any(n not in STRATEGIES for n in names):
        raise argparse.ArgumentTypeError(f"expected names from {', '.join(STRATEGIES)}, "
                                         f"got {text!r}")
    return names


@dataclass(frozen=True)
class Prices:
    """The cost model's price of a served decode round: the settings' model on their GPU's
    pd-mux levels, the calibration's decode curve (grid capping) and the host costs."""

    levels: list
    model: ModelSpec
    curve: step_cost.DecodeRate
    overheads: step_cost.Overheads

    @classmethod
    def of(cls, s: RunSettings, calibration: str, host_costs: str) -> "Prices":
        return cls(s.config.levels(s.gpu.sms, s.gpu.cc_major), s.model,
                   load_calibration(calibration, s.gpu.name).decode_curve("grid_cap"),
                   load_host_costs(host_costs, s.gpu.name))

    def row(self, level: int, batch: int, context: int, measured_ms: float) -> dict:
        """One decode round's measured step beside the price for it."""
        prefill_sms, sms = self.levels[level]
        # pd-mux runs a split level exactly while a prefill is in flight, and the host
        # launches its layers ahead, so the step runs beside queued layers even in a round
        # that launched none (after the last layer, until the prefill's result)
        corun = prefill_sms > 0 and sms > 0
        predicted = step_cost.served_decode_step_s(self.model, self.curve, self.overheads, context,
                                                   sms, corun, batch)
        return {"level": level, "decode_sms": sms, "batch": batch, "context_tokens": context,
                "corun": corun, "measured_ms": measured_ms, "predicted_ms": predicted * 1e3}


def priced_rounds(result, prices: Prices) -> list[dict]:
    """The run's decode rounds, each with its measured step and the cost model's price."""
    rounds = [r for r in result.rounds if r.decode_bs]
    steps = result.activity.decode_step_s
    if len(steps) != len(rounds):
        raise PdmuxError(f"{len(rounds)} decode rounds but {len(steps)} timed decode steps: "
                         "the executor did not time one step per round")
    return [prices.row(r.level, r.decode_bs, r.decode_context, measured * 1e3)
            for r, measured in zip(rounds, steps)]


def _ratio(row: dict) -> float:
    return row["measured_ms"] / row["predicted_ms"]


def ratios(rows: list[dict], key) -> dict:
    groups = defaultdict(list)
    for row in rows:
        groups[key(row)].append(_ratio(row))
    return {k: {"steps": len(v), "measured_over_predicted_p50": float(np.median(v)),
                "p90": float(np.percentile(v, 90))} for k, v in sorted(groups.items())}


def summarize(rows: list[dict]) -> dict:
    corun = [r for r in rows if r["corun"]]
    alone = [r for r in rows if not r["corun"]]
    return {
        "steps": len(rows), "corun_steps": len(corun),
        "measured_over_predicted_p50": {
            state: float(np.median([_ratio(r) for r in some]))
            for state, some in (("all", rows), ("corun", corun), ("alone", alone)) if some},
        "corun_by_decode_sms": ratios(corun, lambda r: str(r["decode_sms"])),
        "corun_by_batch": ratios(corun, lambda r: band(r["batch"])),
        "corun_by_sms_and_batch": ratios(corun, lambda r: f"{r['decode_sms']} SMs, "
                                                          f"{band(r['batch'])}"),
        "alone_by_batch": ratios(alone, lambda r: band(r["batch"])),
    }


def table(data: dict) -> str:
    lines = []
    for name, run in data["runs"].items():
        s = run["summary"]
        p50 = s["measured_over_predicted_p50"]
        lines.append(f"{name}: {s['steps']} steps ({s['corun_steps']} beside a prefill), "
                     "measured / predicted p50: " + ", ".join(f"{k} {v:.2f}" for k, v in p50.items()))
        for k, v in s["corun_by_sms_and_batch"].items():
            lines.append(f"  beside a prefill, {k:<22} {v['steps']:>5} steps  "
                         f"{v['measured_over_predicted_p50']:.2f} (p90 {v['p90']:.2f})")
        for k, v in s["alone_by_batch"].items():
            lines.append(f"  alone, batch {k:<17} {v['steps']:>5} steps  "
                         f"{v['measured_over_predicted_p50']:.2f} (p90 {v['p90']:.2f})")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = bench_parser("step_errors.py", __doc__)
    p.add_argument("--simulate", action="store_true", help="the H200 on the cost model")
    p.add_argument("--lengths", choices=tuple(LENGTH_PRESETS), default="sharegpt")
    p.add_argument("--rates", type=lambda t: tuple(number()(x) for x in t.split(",")),
                   default=(12.0,), help="request rates, comma-separated (default: 12)")
    p.add_argument("--policies", default=tuple(STRATEGIES), type=policies_arg,
                   help=f"level policies among {', '.join(STRATEGIES)} (default: both)")
    p.add_argument("--count", type=integer(1, 100_000), default=100, help="requests per run")
    p.add_argument("--reprice", metavar="FILE",
                   help="price the steps of a step-errors file again with today's cost model "
                        "(no GPU); writes it under --out")
    bench_inputs(p, "calibration", "host_costs", ttft=False)  # TPOT: the slo policy's target
    return run_script(p, run, argv)


def reprice(args) -> int:
    """A step-errors file's measured steps priced again (today's calibration, host costs and
    classification), each run's summary made again from them."""
    data = read_json(args.reprice, "step errors")
    try:  # the settings it was served with: the GPU as detected there, its model and levels
        s = RunSettings.from_dict(data["inputs"]["settings"])
        runs = data["runs"].values()
    except (KeyError, TypeError, AttributeError) as missing:
        raise PdmuxError(f"{args.reprice} is not a step-errors file (no {missing})") from None
    prices = Prices.of(s, args.calibration, args.host_costs)
    for run in runs:
        try:
            run["rounds"] = [prices.row(r["level"], r["batch"], r["context_tokens"],
                                        r["measured_ms"]) for r in run["rounds"]]
        except (KeyError, TypeError, IndexError) as bad:
            raise PdmuxError(f"{args.reprice} holds a round without its level, batch, context "
                             f"or measured step ({bad})") from None
        run["summary"] = summarize(run["rounds"])
    data["repriced"] = {**provenance(s.gpu.name), "calibration": args.calibration,
                        "host_costs": args.host_costs}
    path = Path(args.out) / Path(args.reprice).name
    return finish(path, data, table(data))


def run(args) -> int:
    if args.reprice:
        if args.simulate:
            raise PdmuxError("--reprice reads a file's steps; --simulate serves new ones: pick one")
        return reprice(args)
    gpu = gpu_preset("h200") if args.simulate else detect_gpu()
    model = model_preset("qwen3-8b")
    config = sglang_rules.PDMuxConfig()
    s = RunSettings(gpu=gpu, model=model, workload="stream", simulate=args.simulate,
                    count=args.count, lengths=args.lengths, chunks=(2048,), kinds=("grid_cap",),
                    config=config, level_policies=("sglang", "slo"), slo_ttft_ms=2000.0,
                    slo_tpot_ms=args.slo_tpot_ms, calibration=args.calibration,
                    host_costs=args.host_costs)
    prices = Prices.of(s, args.calibration, args.host_costs)
    data = {**provenance(gpu.name), "mode": "simulated" if args.simulate else "gpu",
            "inputs": {**vars(args), "settings": s.as_dict()}, "runs": {}}
    path = Path(args.out) / f"step-errors-{gpu.name}{'-simulated' if args.simulate else ''}.json"
    servers = Servers(s, make_requests(s))
    try:
        for rate in args.rates:
            for name in args.policies:
                v = variant(STRATEGIES[name])
                row, result = servers.serve(v, make_requests(s, rate))
                rows = priced_rounds(result, prices)
                data["runs"][f"{name} at {rate:g} req/s"] = {
                    "strategy": v.name, "rate": rate, "summary": summarize(rows),
                    "served": {k: row.get(k) for k in (
                        "requests_served", "tpot_p99_ms", "slo_attainment",
                        "compiles_during_measurement", "captures_during_measurement")},
                    "rounds": rows}
                write_json(path, data)  # a save point after each run
                print(f"served {name} at {rate:g} req/s: {len(rows)} decode steps", flush=True)
    finally:
        servers.close()
    return finish(path, data, table(data))


if __name__ == "__main__":
    sys.exit(main())
