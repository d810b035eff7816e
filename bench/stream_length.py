"""How a goodput capacity depends on the stream it is measured on: SGLang's levels against slo
levels by requests a point and traffic sample, simulated.

A short stream ends before the decode batch reaches its steady size, so its capacity is a
burst's. For each count (requests a point) and seed (traffic sample) pd-mux with grid capping
is searched three ways on the H200's calibrated cost model:

- default: SGLang's rule on SGLang's levels (decode gets at most half the GPU beside a prefill);
- slo: the slo level policy on the same levels;
- slo_wide: the slo policy on a level set that also gives decode more than half the SMs beside
  a prefill (WIDE_LEVELS, manual divisions SGLang can run), to see whether the split is what
  holds the steady state back.

Points are kept under <out>/stream-length/<count>-s<seed>[-wide]/ (made again each run: the
simulation follows today's cost model); writes <out>/stream-length-<gpu>-simulated.json with
each sample's capacities and, by count, the median, lowest and highest slo / default ratio;
prints the table. The measured counterparts are bench/slo_levels.py runs at --count and --seed.

    python bench/stream_length.py --out bench/results
    python bench/stream_length.py --counts 100,300 --seeds 0,1 --lengths arxiv --out /tmp/sl
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from script import bench_inputs, bench_parser, finish, run_script

from pdmux_triton.cli.parsing import choice, integer, listed, number
from pdmux_triton.experiments import capacity
from pdmux_triton.experiments.capacity_search import Criteria
from pdmux_triton.experiments.settings import RunSettings
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.results import provenance, write_json
from pdmux_triton.serve.metrics import Slo
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import LENGTH_PRESETS

# SGLang's H200 levels and two more with decode past half the GPU beside a prefill; thresholds
# of the rule are never reached there (only the slo policy, which ignores them, picks those)
UNREACHED = 1_000_000
WIDE_LEVELS = sglang_rules.PDMuxConfig(10, [[112, 20, 1], [104, 28, 12], [96, 36, 18], [88, 44, 24],
                                            [80, 52, 30], [72, 60, 36], [64, 68, UNREACHED],
                                            [48, 84, UNREACHED]])
LEVEL_SETS = {"": sglang_rules.PDMuxConfig(), "-wide": WIDE_LEVELS}  # folder suffix: levels
POLICIES = {  # name: (strategy, level set), each level set searched in its own folder
    "default": ("pdmux_grid_cap", ""),
    "slo": ("pdmux_slo_grid_cap", ""),
    "slo_wide": ("pdmux_slo_grid_cap", "-wide"),
}


def settings_for(args, count: int, seed: int, config: sglang_rules.PDMuxConfig) -> RunSettings:
    return RunSettings(
        gpu=gpu_preset("h200"), model=model_preset("qwen3-8b"), workload="stream",
        simulate=True, count=count, seed=seed, lengths=args.lengths, chunks=(2048,),
        kinds=("grid_cap",), config=config, level_policies=("sglang", "slo"),
        itl_slo_ms=args.itl_ms, slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
        calibration=args.calibration, compare=args.compare, host_costs=args.host_costs)


def one_sample(args, count: int, seed: int) -> dict[str, float]:
    """Each policy's goodput capacity on one traffic sample of `count` requests."""
    criteria = Criteria(Slo(args.slo_ttft_ms, args.slo_tpot_ms))
    caps = {}
    for suffix, config in LEVEL_SETS.items():
        names = [n for n, (_, levels) in POLICIES.items() if levels == suffix]
        s = settings_for(args, count, seed, config)
        store = capacity.open_folder(
            Path(args.out) / "stream-length" / f"{count}-s{seed}{suffix}", s)
        store.forget(lambda p: True)  # simulated: always today's cost model
        result = capacity.run_capacity(s, tuple(POLICIES[n][0] for n in names), criteria,
                                       store, tol=args.tol, log=lambda _: None)
        for n in names:
            caps[n] = result["summary"]["strategies"][POLICIES[n][0]]["goodput_capacity_rps"]
    return caps


def summarize(samples: list[dict]) -> dict:
    """By count: each slo policy's capacity over the rule's (median, lowest, highest over the
    samples) and the rule's median capacity."""
    out = {}
    for count in sorted({r["count"] for r in samples}):
        caps = [r["capacity_rps"] for r in samples if r["count"] == count]
        row = {"default_rps_median": float(np.median([c["default"] for c in caps]))}
        for name in ("slo", "slo_wide"):
            ratios = [c[name] / c["default"] for c in caps]
            row[f"{name}_vs_default"] = {"median": float(np.median(ratios)),
                                         "lowest": min(ratios), "highest": max(ratios)}
        out[str(count)] = row
    return {"by_count": out}


def table(data: dict) -> str:
    lines = [f"{'requests':>8} {'seed':>4}  {'default':>8} {'slo':>8} {'slo_wide':>8}  "
             f"{'slo / default':>13}"]
    for r in data["samples"]:
        c = r["capacity_rps"]
        lines.append(f"{r['count']:>8} {r['seed']:>4}  {c['default']:>8.2f} {c['slo']:>8.2f} "
                     f"{c['slo_wide']:>8.2f}  {c['slo'] / c['default']:>13.2f}")
    for count, s in data["summary"]["by_count"].items():
        v = s["slo_vs_default"]
        lines.append(f"{count} requests: slo / default median {v['median']:.2f} "
                     f"({v['lowest']:.2f}-{v['highest']:.2f})")
    return "\n".join(lines)


def run(args) -> int:
    data = {**provenance("h200"), "mode": "simulated", "inputs": vars(args),
            "wide_levels": WIDE_LEVELS.manual_divisions, "samples": [], "summary": {}}
    path = Path(args.out) / "stream-length-h200-simulated.json"
    jobs = [(count, seed) for count in args.counts for seed in args.seeds]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = [pool.submit(one_sample, args, count, seed) for count, seed in jobs]
        for (count, seed), future in zip(jobs, futures):
            data["samples"].append({"count": count, "seed": seed,
                                    "capacity_rps": future.result()})
            print(f"{count} requests, seed {seed}: {data['samples'][-1]['capacity_rps']}",
                  flush=True)
            write_json(path, data)  # a save point after each sample
    data["summary"] = summarize(data["samples"])
    return finish(path, data, table(data))


def main(argv=None) -> int:
    p = bench_parser("stream_length.py", __doc__)
    p.add_argument("--counts", type=listed(integer(1, 100_000), "count"), default=(100, 300, 1000),
                   help="requests a point")
    p.add_argument("--seeds", type=listed(integer(0, 2**32 - 1), "seed"), default=(0, 1, 2, 3, 4),
                   help="traffic samples")
    p.add_argument("--lengths", default="sharegpt", type=choice(tuple(LENGTH_PRESETS)))
    # finer than capacity's 5%: the ratios compared here are a few % apart
    p.add_argument("--tol", type=number(0.0, 0.5), default=0.02,
                   help="the capacity search's relative tolerance")
    p.add_argument("--itl-ms", type=number(), default=None,
                   help="the slo policy's target (default: the TPOT target)")
    bench_inputs(p, "calibration", "compare", "host_costs")
    return run_script(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
