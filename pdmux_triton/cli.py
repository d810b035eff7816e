"""`pdmux-triton`: the command line. Each subcommand parses its arguments, calls the library
and prints; the work lives in the library (`experiment` runs `run`).

Bad input raises PdmuxError, printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from pdmux_triton import __version__, advise, estimate, policy, report
from pdmux_triton.errors import PdmuxError
from pdmux_triton.hardware import GPUS, MODELS, GPUSpec, detect_gpu, model_preset, resolve_gpu
from pdmux_triton.partition import SPLIT_KINDS
from pdmux_triton.results import load_calibration, write_json


# --- argument types ------------------------------------------------------------------------

def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _str_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _parse_cc(text: str) -> tuple[int, int]:
    try:
        major, minor = (int(p) for p in text.split("."))
    except ValueError:
        raise PdmuxError(f"compute capability must look like 9.0, got {text!r}") from None
    return major, minor


# --- shared pieces -------------------------------------------------------------------------

def _add_gpu_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default="h100-sxm",
                   help=f"GPU preset ({', '.join(GPUS)}) or 'local' for the GPU torch sees")
    p.add_argument("--sms", type=int, help="override the GPU's SM count")
    p.add_argument("--cc", help="override the compute capability, e.g. 9.0")
    p.add_argument("--config", help="SGLang pdmux YAML (--pdmux-config-path) to take levels from")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _gpu_from_args(args) -> GPUSpec:
    gpu = resolve_gpu(args.gpu)
    if args.sms is not None:
        gpu = dataclasses.replace(gpu, name=f"{gpu.name} ({args.sms} SMs)", sms=args.sms)
    if args.cc is not None:
        gpu = dataclasses.replace(gpu, cc=_parse_cc(args.cc))
    policy.arch_constraints(gpu.cc_major)  # reject an unknown compute capability up front
    return gpu


def _config_from_args(args, gpu: GPUSpec) -> policy.PDMuxConfig:
    if args.config:
        return policy.load_config(args.config, gpu.sms, gpu.cc_major)
    return policy.PDMuxConfig(sm_group_num=getattr(args, "sm_group_num", policy.DEFAULT_SM_GROUP_NUM))


def _measuring_gpu() -> GPUSpec:
    """The local GPU for the measuring commands: a clear error without one."""
    try:
        gpu = detect_gpu()
    except PdmuxError as err:
        raise PdmuxError(f"measuring needs a CUDA GPU: {err}") from None
    policy.arch_constraints(gpu.cc_major)
    return gpu


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


# --- subcommands ---------------------------------------------------------------------------

def cmd_levels(args) -> None:
    if args.calibration:  # kept as an alias of `advise`
        cmd_advise(args)
        return
    gpu = _gpu_from_args(args)
    config = _config_from_args(args, gpu)
    levels = config.levels(gpu.sms, gpu.cc_major)
    ranges = config.batch_ranges(levels)
    if args.write_config:
        written = policy.PDMuxConfig(
            sm_group_num=len(levels),  # a small GPU can have fewer levels than asked for
            manual_divisions=policy.manual_divisions_for(levels, ranges),
            split_forward_token_budget=config.split_forward_token_budget,
            decode_bs_divisor=config.decode_bs_divisor,
        )
        policy.dump_config(written, args.write_config)
    if args.json:
        print(json.dumps({
            "gpu": gpu.name, "sms": gpu.sms, "cc": f"{gpu.cc[0]}.{gpu.cc[1]}",
            "sm_group_num": config.sm_group_num,
            "levels": [{"index": i, "prefill_sms": p, "decode_sms": d}
                       for i, (p, d) in enumerate(levels)],
            "decode_bs_to_level": [{"first": a, "last": b, "level": lv} for a, b, lv in ranges],
        }, indent=2))
        return
    print(report.levels_table(gpu, config, levels, ranges))
    if args.write_config:
        print(f"wrote {args.write_config}: these levels as SGLang manual_divisions")


def cmd_advise(args) -> None:
    """Splits that keep a decode step beside a prefill under an ITL target."""
    if args.itl_ms is None:
        raise PdmuxError("--calibration needs --itl-ms, the decode step time to stay under")
    gpu = _gpu_from_args(args)
    config = _config_from_args(args, gpu)
    curve = load_calibration(args.calibration, gpu.name).decode_curve(args.kind)
    spec = model_preset(args.model)
    advised = advise.advise(curve, spec, gpu.sms, gpu.cc_major, args.itl_ms, args.context,
                            config.sm_group_num - 2)
    if args.write_config:
        policy.dump_config(advise.as_config(advised, config), args.write_config)
    if args.json:
        print(json.dumps([a.__dict__ for a in advised], indent=2))
        return
    print(report.advice_table(spec, gpu, args.context, args.itl_ms, args.kind, advised))
    if args.write_config:
        print(f"wrote {args.write_config}: these levels as SGLang manual_divisions")


def cmd_estimate(args) -> None:
    gpu = _gpu_from_args(args)
    if args.bandwidth_tbps is not None:
        gpu = dataclasses.replace(gpu, hbm_tbps=args.bandwidth_tbps)
    if args.tflops is not None:
        gpu = dataclasses.replace(gpu, bf16_tflops=args.tflops)
    sc = estimate.Scenario(
        gpu=gpu, model=model_preset(args.model), decode_batch=args.batch, context=args.context,
        prompt=args.prompt, chunk_sizes=args.chunks, s_sat=args.s_sat,
        bw_efficiency=args.bw_eff, mfu=args.mfu, pdmux=_config_from_args(args, gpu),
    )
    rows = estimate.estimate(sc)
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        print(report.estimate_table(sc, rows))


def cmd_calibrate(args) -> None:
    from pdmux_triton import calibrate
    from pdmux_triton.workloads import DECODE_WORKLOADS

    for name in args.workloads:
        if name not in DECODE_WORKLOADS:
            raise PdmuxError(f"unknown workload {name!r}; known: {', '.join(DECODE_WORKLOADS)}")
    _check_kinds(args.kinds)
    if not args.ctas or any(c < 1 for c in args.ctas):
        raise PdmuxError(f"--ctas takes CTAs per SM >= 1, got {args.ctas}")
    gpu = _measuring_gpu()
    # torch is needed only where a GPU measures
    from pdmux_triton import plots
    from pdmux_triton.calibrate_gpu import run_sweep

    _, granularity = policy.arch_constraints(gpu.cc_major)
    budgets = args.budgets or calibrate.default_budgets(gpu.sms, granularity)
    for b in budgets:
        if not 0 < b <= gpu.sms or ("green" in args.kinds and b < gpu.sms and b % granularity):
            raise PdmuxError(f"budget {b} SMs: budgets must be in 1..{gpu.sms}, and multiples of "
                             f"{granularity} for green contexts")
    plan = calibrate.SweepPlan(tuple(args.workloads), tuple(args.kinds), tuple(args.ctas),
                               tuple(sorted(set(budgets))), not args.no_corun, args.model,
                               args.batch, args.context, args.prefill_tokens)
    out = Path(args.out)
    settings = {"model": plan.model, "batch": plan.batch, "context": plan.context,
                "prefill_tokens": plan.prefill_tokens}
    calibrate.check_settings(out / f"calibrate-settings-{gpu.name}.json", settings)
    store = calibrate.PointStore(out / f"calibrate-points-{gpu.name}.jsonl")
    if args.remeasure:
        dropped = store.forget(plan.workloads)
        _log(f"calibrate: forgot {dropped} saved points of {', '.join(plan.workloads)}")
    run_sweep(plan, store, log=_log)
    points = list(store.points.values())
    summary = calibrate.summarize(points)
    path = calibrate.write_results(out / f"calibrate-{gpu.name}.json", gpu.name, settings,
                                   points, summary)
    plots.calibration(points, gpu.name, plan.model, out / f"calibrate-{gpu.name}.png")
    print(report.calibration_table(summary))
    print(f"wrote {path} and calibrate-{gpu.name}.png")


def cmd_compare(args) -> None:
    gpu = _measuring_gpu()
    from pdmux_triton import plots
    from pdmux_triton.compare_gpu import run_compare

    out = Path(args.out)
    result = run_compare(args.model, args.batch, args.context, args.prefill_tokens,
                         out / f"compare-{gpu.name}.json", log=_log)
    levels = result["summary"]["levels"]
    plots.compare(levels, gpu.name, args.model, out / f"compare-{gpu.name}.png")
    print(report.compare_table(levels))
    print(f"wrote {out / f'compare-{gpu.name}.json'} and compare-{gpu.name}.png")


def _check_kinds(kinds) -> None:
    for kind in kinds:
        if kind not in SPLIT_KINDS:
            raise PdmuxError(f"partition kinds are {' and '.join(SPLIT_KINDS)}, got {kind!r}")


def cmd_run(args) -> None:
    from pdmux_triton import experiment, plots

    simulate, no_gpu = args.simulate, None
    if not simulate:
        try:
            gpu = _measuring_gpu()
        except PdmuxError as err:
            simulate, no_gpu = True, err
    if simulate:
        gpu = _gpu_from_args(args)
    settings = experiment.RunSettings(
        gpu=gpu, model=model_preset(args.model), workload=args.workload, simulate=simulate,
        seed=args.seed, batch=args.batch, context=args.context, prompt=args.prompt,
        decode_tokens=args.decode_tokens, rate=args.rate, count=args.count,
        prompt_mean=args.prompt_mean, prompt_max=args.prompt_max, output_mean=args.output_mean,
        output_max=args.output_max, chunks=args.chunks, kinds=args.kinds,
        config=_config_from_args(args, gpu), s_sat=args.s_sat, bw_eff=args.bw_eff, mfu=args.mfu,
        calibration=args.calibration, compare=args.compare)
    if no_gpu is not None:
        _log(f"no GPU here ({no_gpu}): running the simulated executor on the {gpu.name} preset")
    out, results, estimates = experiment.run_experiment(settings, log=_log)
    if args.out:
        folder = Path(args.out)
        write_json(folder / f"run-{gpu.name}.json", out)
        plots.timeline(results, f"ITL of every token: {settings.model.name} on {gpu.name}, "
                       f"{settings.workload} workload, {out['mode']}", folder / f"run-{gpu.name}.png")
    if args.json:
        print(json.dumps(out, indent=1))
        return
    mode = "simulated on the cost model" if simulate else "measured"
    print(f"{settings.model.name} on {gpu.name}, {settings.workload} workload, {mode}:")
    print(report.strategy_table(out["rows"]))
    for title, s, est in estimates:
        print(f"\n{title} for the same scenario:")
        print(report.estimate_table(s, est))
    if args.out:
        print(f"wrote {Path(args.out) / f'run-{gpu.name}.json'} and run-{gpu.name}.png")


# --- the parser ----------------------------------------------------------------------------

def _add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="pdmux-results", help="folder for JSON, points and plots")
    p.add_argument("--model", default="qwen3-8b", help=f"model preset ({', '.join(MODELS)})")
    p.add_argument("--batch", type=int, default=32, help="decode batch size")
    p.add_argument("--context", type=int, default=2048, help="context of each decoding request")
    p.add_argument("--prefill-tokens", type=int, default=8192,
                   help="prompt length of the prefill running beside decode")


def _add_advise_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--calibration", required=required,
                   help="calibrate-<gpu>.json: advise levels for --itl-ms")
    p.add_argument("--itl-ms", type=float, help="the decode step time to stay under")
    p.add_argument("--model", default="qwen3-8b", help="the model preset")
    p.add_argument("--context", type=int, default=2048, help="context of the decoding requests")
    p.add_argument("--kind", choices=SPLIT_KINDS, default="green",
                   help="which measured curve to trust")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pdmux-triton",
        description="Measure and tune PD multiplexing: prefill and decode on split SMs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("levels", help="SGLang's PD-mux levels and which decode batch picks which")
    _add_gpu_args(p)
    p.add_argument("--sm-group-num", type=int, default=policy.DEFAULT_SM_GROUP_NUM,
                   help="number of levels, SGLang's sm_group_num (default 8)")
    p.add_argument("--write-config", metavar="FILE",
                   help="write these levels as an SGLang pdmux YAML with manual_divisions")
    _add_advise_args(p, required=False)
    p.set_defaults(func=cmd_levels)

    p = sub.add_parser("advise", help="levels whose decode step beside a prefill meets an ITL "
                       "target, from a calibration")
    _add_gpu_args(p)
    p.add_argument("--sm-group-num", type=int, default=policy.DEFAULT_SM_GROUP_NUM,
                   help="levels at most, SGLang's sm_group_num (default 8)")
    p.add_argument("--write-config", metavar="FILE",
                   help="write the advised levels as an SGLang pdmux YAML")
    _add_advise_args(p, required=True)
    p.set_defaults(func=cmd_advise)

    p = sub.add_parser("estimate", help="the chapter's cost model: ITL and prefill time by approach")
    _add_gpu_args(p)
    p.add_argument("--model", default="qwen3-8b", help=f"model preset ({', '.join(MODELS)})")
    p.add_argument("--batch", type=int, default=32, help="requests decoding")
    p.add_argument("--context", type=int, default=2048, help="context of each decoding request")
    p.add_argument("--prompt", type=int, default=8192, help="tokens of the arriving prompt")
    p.add_argument("--chunks", type=_int_list, default=(2048, 512), help="chunk sizes, e.g. 2048,512")
    p.add_argument("--s-sat", type=_float_list, default=(44, 66, 88),
                   help="S_SAT values to try, e.g. 44,66,88")
    p.add_argument("--bw-eff", type=float, default=0.85, help="achieved fraction of HBM bandwidth")
    p.add_argument("--mfu", type=float, default=0.5, help="achieved fraction of bf16 FLOP/s")
    p.add_argument("--bandwidth-tbps", type=float, help="override the GPU's HBM TB/s")
    p.add_argument("--tflops", type=float, help="override the GPU's dense bf16 TFLOP/s")
    p.add_argument("--sm-group-num", type=int, default=policy.DEFAULT_SM_GROUP_NUM)
    p.set_defaults(func=cmd_estimate)

    p = sub.add_parser("calibrate", help="measure decode bandwidth vs SMs and S_SAT (needs a GPU)")
    _add_workload_args(p)
    p.add_argument("--workloads", type=_str_list,
                   default=("stream_read", "decode_attention", "decode_linear", "decode_step"))
    p.add_argument("--kinds", type=_str_list, default=SPLIT_KINDS)
    p.add_argument("--ctas", type=_int_list, default=(1, 2, 4), help="CTAs per SM to sweep")
    p.add_argument("--budgets", type=_int_list, help="SM budgets (default: every granularity step)")
    p.add_argument("--no-corun", action="store_true", help="skip the runs beside a prefill")
    p.add_argument("--remeasure", action="store_true",
                   help="forget the saved points of these workloads first (after a kernel change)")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("run", help="serve a workload with every strategy: ITL and TTFT")
    _add_gpu_args(p)
    p.add_argument("--model", default="qwen3-8b", help=f"model preset ({', '.join(MODELS)})")
    p.add_argument("--workload", choices=("chapter", "poisson"), default="chapter")
    p.add_argument("--simulate", action="store_true",
                   help="use the cost-model clock even when a GPU is present")
    p.add_argument("--batch", type=int, default=32, help="chapter: requests decoding")
    p.add_argument("--context", type=int, default=2048, help="chapter: their context")
    p.add_argument("--prompt", type=int, default=8192, help="chapter: the arriving prompt")
    p.add_argument("--decode-tokens", type=int, default=96, help="chapter: tokens each decodes")
    p.add_argument("--rate", type=float, default=2.0, help="poisson: requests per second")
    p.add_argument("--count", type=int, default=64, help="poisson: requests")
    p.add_argument("--prompt-mean", type=int, default=1024)
    p.add_argument("--prompt-max", type=int, default=8192)
    p.add_argument("--output-mean", type=int, default=128)
    p.add_argument("--output-max", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunks", type=_int_list, default=(2048, 512), help="chunked prefill sizes")
    p.add_argument("--kinds", type=_str_list, default=SPLIT_KINDS,
                   help="partition kinds for pd-mux")
    p.add_argument("--s-sat", type=float, default=66.0, help="simulation: decode S_SAT")
    p.add_argument("--bw-eff", type=float, default=0.85)
    p.add_argument("--mfu", type=float, default=0.5)
    p.add_argument("--calibration", help="calibrate-<gpu>.json: simulate with measured curves")
    p.add_argument("--compare", help="compare-<gpu>.json: calibrate the estimate's prefill rate")
    p.add_argument("--out", help="folder for run-<gpu>.json and the ITL timeline plot")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("compare", help="grid capping vs green contexts at every level (needs a GPU)")
    _add_workload_args(p)
    p.set_defaults(func=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except PdmuxError as err:
        print(f"pdmux-triton: error: {err}", file=sys.stderr)
        return 2
    return 0
