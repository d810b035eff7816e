"""Two GPUs four ways, against the same traffic: goodput capacity at equal GPU count, simulated.

- tp2: one TP-2 server (a shard of the model on each GPU, two all-reduces a layer on the link)
  with prefill-first, chunked prefill and pd-mux (SGLang's levels and slo levels);
- replicas: two independent one-GPU servers behind a round-robin router;
- disagg: one prefill GPU and one decode GPU, KV pages sent layer by layer over the link;
- and one GPU, the reference the others are read against.

Each setup's capacity is searched on the --gpu's calibrated cost model (`--calibration`,
`--compare`, `--host-costs`; bench/results' files of that GPU unless named), its points kept
under <out>/multi-gpu/<setup>/ (the simulation is made again each run); writes
<out>/multi-gpu-<gpu>x2-simulated.json and prints a table.
The measured counterpart needs two GPUs in one host, which this tool does not drive yet.

    python bench/multi_gpu.py --out bench/results
    python bench/multi_gpu.py --link pcie5 --count 800 --out /tmp/mg   # GPUs over PCIe
"""

from __future__ import annotations

import sys
from pathlib import Path

from script import bench_inputs, bench_parser, card_inputs, finish, run_script

from pdmux_triton.cli.parsing import choice, integer
from pdmux_triton.cost.parallel import LINKS
from pdmux_triton.experiments import capacity
from pdmux_triton.experiments.capacity_search import Criteria
from pdmux_triton.experiments.settings import RunSettings
from pdmux_triton.results import provenance, write_json
from pdmux_triton.serve.metrics import Slo
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import LENGTH_PRESETS

PDMUX = ("pdmux_grid_cap", "pdmux_slo_grid_cap")
# setup: (GPUs, the settings it changes, the strategies it serves)
SETUPS = {
    "one_gpu": (1, {}, ("prefill_first", "chunked_512", *PDMUX)),
    "tp2": (2, {"tp": 2}, ("prefill_first", "chunked_512", *PDMUX)),
    "replicas": (2, {"replicas": 2}, ("chunked_512", *PDMUX)),
    "disagg": (2, {}, ("disagg_1p1d",)),
}


def settings_for(args, changes: dict) -> RunSettings:
    return RunSettings(
        gpu=gpu_preset(args.gpu), model=model_preset("qwen3-8b"), workload="stream",
        simulate=True, count=args.count, lengths=args.lengths, chunks=(512,),
        kinds=("grid_cap",), level_policies=("sglang", "slo"), slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms, calibration=args.calibration, compare=args.compare,
        host_costs=args.host_costs, link=args.link, **changes)


def run(args) -> int:
    card_inputs(args, measuring=None)  # the H200 unless named; the files not given: its own
    criteria = Criteria(Slo(args.slo_ttft_ms, args.slo_tpot_ms))
    data = {**provenance(args.gpu), "mode": "simulated", "inputs": vars(args),
            "link": vars(LINKS[args.link]), "setups": {}}
    path = Path(args.out) / f"multi-gpu-{args.gpu}x2-simulated.json"
    for name, (gpus, changes, strategies) in SETUPS.items():
        print(f"== {name}", flush=True)
        s = settings_for(args, changes)
        store = capacity.open_folder(Path(args.out) / "multi-gpu" / name, s)
        store.forget(lambda p: True)  # simulated: always today's cost model
        result = capacity.run_capacity(s, strategies, criteria, store, log=lambda _: None)
        data["setups"][name] = {
            "gpus": gpus, "settings": changes,
            "strategies": {n: {k: row[k] for k in ("goodput_capacity_rps",
                                                    "sarathi_capacity_rps", "at_least")}
                           for n, row in result["summary"]["strategies"].items()}}
        write_json(path, data)  # a save point after each setup
    data["summary"] = summarize(data["setups"])
    return finish(path, data, table(data))


def summarize(setups: dict) -> dict:
    """Each two-GPU row's goodput capacity per GPU against the best one-GPU strategy."""
    one = max(r["goodput_capacity_rps"] for r in setups["one_gpu"]["strategies"].values())
    rows = {f"{name}/{strategy}": r["goodput_capacity_rps"]
            for name, setup in setups.items() if setup["gpus"] == 2
            for strategy, r in setup["strategies"].items()}
    best = max(rows, key=rows.get)
    return {"best_one_gpu_rps": one, "two_gpu_rps": rows, "best_two_gpu": best,
            "best_two_gpu_per_gpu_vs_one_gpu": rows[best] / 2 / one}


def table(data: dict) -> str:
    lines = [f"{'setup':<10} {'GPUs':>4}  {'strategy':<20} {'goodput req/s':>13} "
             f"{'per GPU':>8}"]
    for name, setup in data["setups"].items():
        for strategy, r in setup["strategies"].items():
            cap = r["goodput_capacity_rps"]
            lines.append(f"{name:<10} {setup['gpus']:>4}  {strategy:<20} {cap:>13.2f} "
                         f"{cap / setup['gpus']:>8.2f}")
    s = data["summary"]
    lines.append(f"best on two GPUs: {s['best_two_gpu']}, "
                 f"{s['best_two_gpu_per_gpu_vs_one_gpu']:.2f}x the best one-GPU rate per GPU")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = bench_parser("multi_gpu.py", __doc__)
    p.add_argument("--link", default="nvlink4", type=choice(tuple(LINKS)))
    p.add_argument("--lengths", default="sharegpt", type=choice(tuple(LENGTH_PRESETS)))
    # long enough that two servers' queues reach a steady state (a short stream flatters
    # servers that each see fewer of its requests)
    p.add_argument("--count", type=integer(1, 100_000), default=600, help="requests per point")
    bench_inputs(p, "calibration", "compare", "host_costs", by_gpu=True)
    return run_script(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
