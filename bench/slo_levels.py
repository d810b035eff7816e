"""PD-mux levels by SGLang's rule against levels chosen for an ITL target, on the same traffic.

For each traffic (a length preset, served at fixed request rates), pd-mux with grid capping
runs its levels four ways:

- default: SGLang's rule (the decode batch size, decode_bs_divisor 36);
- advised: the manual divisions `advise --context-dist` writes for this traffic (SGLang can run
  them as they are);
- slo: the slo level policy, switching where SGLang does (a prefill starts or ends);
- slo_relevel: the same, also between layer rounds of a split prefill whose batch changed.

Each is served at the fixed rates (SLO attainment, goodput, TTFT and TPOT p50/p99, level
changes and their drain time) and its goodput capacity is found: simulated for all, measured
on the GPU for default and slo at the traffic's capacity rates (the simulation is served beside
every measured point). Measured points are saved as they are served under
<out>/slo-levels/<traffic>[-advised|-relevel]/ (a rerun resumes them; the simulation is made
again each time); writes <out>/slo-levels-<gpu>.json and prints a table.

    python bench/slo_levels.py --simulate --out bench/results    # the prediction, anywhere
    python bench/slo_levels.py --out bench/results               # measured, on the GPU
    python bench/slo_levels.py --traffic sharegpt:12,16:10,12,14 --traffic arxiv:10 \
        --policies default,slo                                  # a shorter measured run
    python bench/slo_levels.py --offline --out bench/results    # measured points read back

--offline reads the measured points from the folders (a device call can measure one traffic
and the next another), simulates beside them with today's cost model and writes the whole
file anywhere; a policy never measured is simulated only, a rate missing from one that was
is an error.

The simulated run writes slo-levels-<gpu>-simulated.json instead. Offline and simulated, an
advised folder measured with earlier advice is served with the divisions it was measured with
(today's advice beside them, `advised_divisions_today`): the folder is shared.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from script import bench_inputs, bench_parser, finish, run_script

from pdmux_triton.cli.parsing import integer, number
from pdmux_triton.cost.measured_inputs import load_calibration, load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments import capacity
from pdmux_triton.experiments.capacity_search import Criteria
from pdmux_triton.experiments.settings import RunSettings
from pdmux_triton.experiments.variants import variant
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.level_policy import SloLevels, approximate
from pdmux_triton.results import provenance, read_json, write_json
from pdmux_triton.serve.metrics import Slo
from pdmux_triton.spec.gpus import GPUSpec, detect_gpu, gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import LENGTH_PRESETS, decoding_contexts

# traffic: fixed rates (one near pd-mux's goodput capacity, one above), then measured capacity rates
TRAFFIC = {"sharegpt": ((12.0, 16.0), (10.0, 12.0, 14.0, 16.0, 18.0, 20.0)),
           "arxiv": ((10.0, 12.0), (8.0, 10.0, 12.0, 14.0))}
POLICIES = {  # name: (strategy, folder suffix, measured capacity on the GPU)
    "default": ("pdmux_grid_cap", "", True),
    "advised": ("pdmux_grid_cap", "-advised", False),
    "slo": ("pdmux_slo_grid_cap", "", True),
    "slo_relevel": ("pdmux_slo_grid_cap", "-relevel", False),
}
ROW_KEYS = ("slo_attainment", "goodput_rps", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
            "tpot_p99_ms", "level_changes", "level_drain_ms", "requests_served",
            "compiles_during_measurement", "captures_during_measurement",
            "device_allocations_during_measurement")


def traffic_arg(text: str) -> tuple[str, tuple[float, ...], tuple[float, ...]]:
    """PRESET:FIXED_RATES[:CAPACITY_RATES], rates comma-separated."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 3 or parts[0] not in LENGTH_PRESETS:
        raise argparse.ArgumentTypeError(
            f"expected PRESET:RATES[:CAPACITY_RATES] with PRESET one of "
            f"{', '.join(LENGTH_PRESETS)}, got {text!r}")
    try:
        rates = [tuple(float(r) for r in p.split(",")) for p in parts[1:]]
    except ValueError:
        raise argparse.ArgumentTypeError(f"rates must be numbers, got {text!r}") from None
    if any(not (0 < r < 1e4) for rs in rates for r in rs):
        raise argparse.ArgumentTypeError(f"rates must be in (0, 10000) req/s, got {text!r}")
    return parts[0], rates[0], rates[1] if len(rates) > 1 else ()


def measured_gpu(out: Path, presets: list[str]) -> GPUSpec:
    """The GPU the measured points in `out` came from, as detected there."""
    return capacity.measured_gpu(Path(out) / "slo-levels" / presets[0], "h200")


def simulated_gpu(out: Path):
    """The H200 as `capacity` measured it in `out` (the device's memory, which sizes the KV
    cache), so simulated and measured points share folders; else the preset."""
    try:
        return capacity.measured_gpu(out, "h200")
    except PdmuxError:
        return gpu_preset("h200")


def policies_arg(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in POLICIES]
    if not names or unknown or "default" not in names:
        raise argparse.ArgumentTypeError(
            f"expected names from {', '.join(POLICIES)}, default among them, got {text!r}")
    return names


def settings_for(args, gpu, preset: str, name: str, config: sglang_rules.PDMuxConfig) -> RunSettings:
    strategy = POLICIES[name][0]
    # as `capacity` makes them for pd-mux strategies alone, so its folders can be shared
    return RunSettings(
        gpu=gpu, model=model_preset("qwen3-8b"), workload="stream", simulate=args.simulate,
        count=args.count, seed=args.seed, lengths=preset, chunks=(2048,), kinds=("grid_cap",), config=config,
        level_policies=(variant(strategy).levels,), itl_slo_ms=args.itl_ms,
        relevel_at_layers=name == "slo_relevel", slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms, calibration=args.calibration, compare=args.compare,
        host_costs=args.host_costs)


def advised_config(args, gpu, preset: str) -> tuple[sglang_rules.PDMuxConfig, float]:
    """The manual divisions that follow the slo policy on this traffic, and how often not."""
    base = sglang_rules.PDMuxConfig()
    levels = base.levels(gpu.sms, gpu.cc_major)
    curve = load_calibration(args.calibration, gpu.name).decode_curve("grid_cap")
    slo = SloLevels(model_preset("qwen3-8b"), curve, args.itl_ms or args.slo_tpot_ms,
                    overheads=load_host_costs(args.host_costs, gpu.name))  # as the runs have it
    approx = approximate(slo, levels, decoding_contexts(LENGTH_PRESETS[preset]), 128, base)
    return approx.config, approx.disagreement


def measured_config(out, preset: str, gpu: str) -> sglang_rules.PDMuxConfig | None:
    """The advised divisions a folder's points were served with, if it has any: read back
    offline, they are what was measured (today's cost model may advise others)."""
    path = Path(out) / "slo-levels" / f"{preset}{POLICIES['advised'][1]}" / \
        f"capacity-settings-{gpu}.json"
    if not path.exists():
        return None
    return sglang_rules.parse_config(read_json(path, "capacity settings")["config"],
                                     f"{path}'s config")


def one_policy(args, gpu, preset, name, config, fixed, capacity_rates, criteria) -> dict:
    strategy, suffix, measure_capacity = POLICIES[name]
    s = settings_for(args, gpu, preset, name, config)
    store = capacity.open_folder(Path(args.out) / "slo-levels" / f"{preset}{suffix}", s)
    # cheap: always today's cost model (default and slo share a folder: only this one's)
    store.forget(capacity.simulated_for((strategy,)))
    if args.offline and not any(p["mode"] == "gpu" and p["strategy"] == strategy
                                for p in store.points.values()):
        print(f"{preset} {name}: never measured, simulated only", flush=True)
        s = replace(s, simulate=True)
    measured = bool(measure_capacity and capacity_rates and not s.simulate)
    # simulated: searched; measured: at the capacity rates, or only at the fixed ones
    rates = None if s.simulate else (capacity_rates if measured else ())
    result = capacity.run_capacity(s, (strategy,), criteria, store, rates, also=fixed,
                                   log=print, offline=args.offline)
    row = result["summary"]["strategies"][strategy]
    points = {(p["mode"], p["rate"]): p for p in result["points"] if p["strategy"] == strategy}
    modes = ("simulated",) if s.simulate else ("gpu", "simulated")
    return {
        "strategy": strategy, "measured": not s.simulate, "relevel_at_layers": s.relevel_at_layers,
        "manual_divisions": config.manual_divisions,
        "goodput_capacity_rps": {
            "measured": row["goodput_capacity_rps"] if measured else None,
            "measured_at_least": row["at_least"]["goodput"] if measured else None,
            "simulated": row["simulated_goodput_capacity_rps"],
            "simulated_at_measured_rates": row.get(
                "simulated_goodput_capacity_at_measured_rates_rps") if measured else None},
        "at_rates": {f"{r:g}": {m: {k: points[(m, r)].get(k) for k in ROW_KEYS} for m in modes}
                     for r in fixed},
        "points": len(points),
    }


def summarize(traffics: dict) -> dict:
    out = {}
    for preset, t in traffics.items():
        cap = {n: p["goodput_capacity_rps"] for n, p in t["policies"].items()}

        def vs(a: str, b: str, mode: str):
            x, y = cap.get(a, {}).get(mode), cap.get(b, {}).get(mode)
            return None if x is None or not y else x / y
        drains = [(row["level_drain_ms"], row["level_changes"])
                  for p in t["policies"].values() for at in p["at_rates"].values()
                  for mode, row in at.items() if mode == "gpu" and row["level_changes"]]
        out[preset] = {
            "slo_vs_default_goodput_capacity": {m: vs("slo", "default", k) for m, k in
                                                (("measured", "measured"),
                                                 ("simulated", "simulated"))},
            "advised_vs_default_goodput_capacity_simulated": vs("advised", "default", "simulated"),
            "relevel_vs_slo_goodput_capacity_simulated": vs("slo_relevel", "slo", "simulated"),
            "measured_drain_ms_per_level_change": (sum(d for d, _ in drains)
                                                   / sum(c for _, c in drains) if drains else None),
        }
    first = out[next(iter(out))]["slo_vs_default_goodput_capacity"]
    return {"per_traffic": out, "slo_vs_default_goodput_capacity":
            first["measured"] if first["measured"] is not None else first["simulated"],
            "slo_vs_default_measured": first["measured"] is not None}


def table(data: dict) -> str:
    lines = [f"{'traffic':<9} {'policy':<12} {'capacity req/s meas / sim':>26}  at rates: "
             "attainment, goodput, TPOT p99 ms, level changes / drain ms"]
    for preset, t in data["traffic"].items():
        for name, p in t["policies"].items():
            c = p["goodput_capacity_rps"]
            cap = f"{_f(c['measured'])} / {_f(c['simulated'])}"
            cells = []
            for rate, at in p["at_rates"].items():
                row = at.get("gpu") or at["simulated"]
                cells.append(f"@{rate}: {row['slo_attainment']:.0%} {_f(row['goodput_rps'])} "
                             f"{_f(row['tpot_p99_ms'], '.1f')} {row['level_changes']}/"
                             f"{_f(row['level_drain_ms'], '.0f')}")
            lines.append(f"{preset:<9} {name:<12} {cap:>26}  {'  '.join(cells)}")
        s = data["summary"]["per_traffic"][preset]["slo_vs_default_goodput_capacity"]
        lines.append(f"{preset:<9} slo / default goodput capacity: measured {_f(s['measured'])}, "
                     f"simulated {_f(s['simulated'])}")
    return "\n".join(lines)


def _f(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    p = bench_parser("slo_levels.py", __doc__)
    p.add_argument("--simulate", action="store_true", help="the H200 on the cost model")
    p.add_argument("--offline", action="store_true",
                   help="read the measured points back (no GPU), simulate beside them")
    p.add_argument("--traffic", type=traffic_arg, action="append",
                   help="PRESET:FIXED_RATES[:CAPACITY_RATES] (default: sharegpt and arxiv)")
    p.add_argument("--policies", type=policies_arg, default=tuple(POLICIES),
                   help=f"which of {', '.join(POLICIES)} (default: all)")
    p.add_argument("--count", type=integer(1, 100_000), default=100, help="requests per point")
    p.add_argument("--seed", type=integer(0, 2**32 - 1), default=0,
                   help="seed of the requests (another folder: another traffic sample)")
    p.add_argument("--itl-ms", type=number(), default=None,
                   help="the slo policy's target (default: the TPOT target)")
    bench_inputs(p, "calibration", "compare", "host_costs")
    return run_script(p, run, argv, interrupted="interrupted (the points measured are kept)")


def run(args) -> int:
    traffic = args.traffic or [(k, *v) for k, v in TRAFFIC.items()]
    if args.simulate and args.offline:
        raise PdmuxError("--offline reads measured points; --simulate makes none: pick one")
    if args.simulate:
        gpu = simulated_gpu(Path(args.out))
    else:
        gpu = measured_gpu(args.out, [t[0] for t in traffic]) if args.offline else detect_gpu()
    criteria = Criteria(Slo(args.slo_ttft_ms, args.slo_tpot_ms))
    data = {**provenance(gpu.name), "mode": "simulated" if args.simulate else "gpu",
            "analysed_offline": args.offline,  # then each measured point names its own commit
            "inputs": {k: v for k, v in vars(args).items() if k != "traffic"},
            "traffic": {}, "summary": {}}
    path = Path(args.out) / f"slo-levels-{gpu.name}{'-simulated' if args.simulate else ''}.json"
    for preset, fixed, capacity_rates in traffic:
        advised, disagreement = advised_config(args, gpu, preset)
        today = advised.manual_divisions
        # offline or simulated beside measured points (they share the folder): the divisions
        # they were served with, where earlier advice differs from today's
        served = None if not (args.offline or args.simulate) else \
            measured_config(args.out, preset, gpu.name)
        if served is not None and served != advised:  # measured with earlier advice
            advised, disagreement = served, None  # (its disagreement was today's advice's)
        t = data["traffic"][preset] = {"fixed_rates": fixed, "capacity_rates": capacity_rates,
                                       "advised_disagreement": disagreement,
                                       "advised_divisions": advised.manual_divisions,
                                       "advised_divisions_today": today,
                                       "policies": {}}
        for name in args.policies:
            config = advised if name == "advised" else sglang_rules.PDMuxConfig()
            print(f"== {preset} {name}", flush=True)
            t["policies"][name] = one_policy(args, gpu, preset, name, config, fixed,
                                             capacity_rates, criteria)
            write_json(path, data)  # a save point after each policy
    data["summary"] = summarize(data["traffic"])
    return finish(path, data, table(data))


if __name__ == "__main__":
    sys.exit(main())
