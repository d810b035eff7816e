"""`pdmux-triton`: the command line. Each subcommand parses, calls the library, prints.

Bad input raises PdmuxError, printed as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from pdmux_triton import __version__, policy
from pdmux_triton.errors import PdmuxError
from pdmux_triton.hardware import GPUS, MODELS, GPUSpec, model_preset, resolve_gpu


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


def _parse_cc(text: str) -> tuple[int, int]:
    try:
        major, minor = (int(p) for p in text.split("."))
    except ValueError:
        raise PdmuxError(f"compute capability must look like 9.0, got {text!r}") from None
    return major, minor


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


def cmd_advise(args, gpu: GPUSpec, config: policy.PDMuxConfig) -> None:
    """`levels --calibration ... --itl-ms ...`: splits that meet an ITL target."""
    import json
    from pathlib import Path

    from pdmux_triton import advise
    from pdmux_triton.simulate import DecodeCurve

    if args.itl_ms is None:
        raise PdmuxError("--calibration needs --itl-ms, the decode step time to stay under")
    measured_on = json.loads(Path(args.calibration).read_text()).get("gpu")
    if measured_on != gpu.name:
        raise PdmuxError(f"{args.calibration} was measured on {measured_on!r}; levels are asked "
                         f"for {gpu.name!r} (pass --gpu {measured_on})")
    curve = DecodeCurve(args.calibration, args.kind)
    spec = model_preset(args.model)
    advised = advise.advise(lambda d: curve.tbps(d, corun=True), spec, gpu.sms, gpu.cc_major,
                            args.itl_ms, args.context, config.sm_group_num - 2)
    if args.write_config:
        policy.dump_config(advise.as_config(advised, config), args.write_config)
    if args.json:
        print(json.dumps([a.__dict__ for a in advised], indent=2))
        return
    print(f"{spec.name} on {gpu.name} at {args.context} tokens of context, decode step <= "
          f"{args.itl_ms} ms beside a prefill ({args.kind} calibration):")
    print(f"{'prefill SMs':>11} {'decode SMs':>10} {'decode batch':>13} {'ITL ms':>7}")
    for a in advised:
        print(f"{a.prefill_sms:>11} {a.decode_sms:>10} {f'{a.first_batch}-{a.last_batch}':>13} "
              f"{a.itl_ms:>7.1f}")
    print(f"a decode batch above {advised[-1].last_batch} misses the target on every split")
    if args.write_config:
        print(f"wrote {args.write_config}: these levels as SGLang manual_divisions")


def cmd_levels(args) -> None:
    gpu = _gpu_from_args(args)
    config = _config_from_args(args, gpu)
    if args.calibration:
        cmd_advise(args, gpu, config)
        return
    levels = config.levels(gpu.sms, gpu.cc_major)
    manual = config.manual_divisions or None
    ranges = policy.decode_bs_ranges(levels, config.decode_bs_divisor, manual)
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
    min_part, granularity = policy.arch_constraints(gpu.cc_major)
    print(f"{gpu.name}: {gpu.sms} SMs, compute capability {gpu.cc[0]}.{gpu.cc[1]} "
          f"(green-context parts: at least {min_part} SMs, multiples of {granularity})")
    print(f"{'level':>5} {'prefill SMs':>12} {'decode SMs':>11}")
    for i, (p, d) in enumerate(levels):
        note = "  prefill only" if d == 0 else "  decode only" if p == 0 else ""
        print(f"{i:>5} {p:>12} {d:>11}{note}")
    rule = "manual divisions" if manual else f"decode_bs_divisor {config.decode_bs_divisor}"
    print(f"decode batch size while a prefill runs -> level ({rule}):")
    for first, last, level in ranges:
        span = f"{first}+" if last is None else f"{first}" if first == last else f"{first}-{last}"
        p, d = levels[level]
        print(f"  {span:>8}  level {level} ({p}/{d})")
    if args.write_config:
        print(f"wrote {args.write_config}: these levels as SGLang manual_divisions")


def cmd_estimate(args) -> None:
    from pdmux_triton import estimate

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
        print(estimate.format_table(sc, rows))


def _str_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _check_kinds(kinds) -> None:
    """The partition kinds a measurement can compare: grid capping and green contexts."""
    from pdmux_triton.partition import KINDS

    for kind in kinds:
        if kind not in KINDS[:2]:
            raise PdmuxError(f"partition kinds are {' and '.join(KINDS[:2])}, got {kind!r}")


def _gpu_or_error():
    """The local GPU for the measuring commands: a clear error without one."""
    from pdmux_triton.hardware import detect_gpu

    try:
        gpu = detect_gpu()
    except PdmuxError as err:
        raise PdmuxError(f"measuring needs a CUDA GPU: {err}") from None
    policy.arch_constraints(gpu.cc_major)
    return gpu


def cmd_calibrate(args) -> None:
    from pathlib import Path

    from pdmux_triton import calibrate, report
    from pdmux_triton.workloads import DECODE_WORKLOADS

    for name in args.workloads:
        if name not in DECODE_WORKLOADS:
            raise PdmuxError(f"unknown workload {name!r}; known: {', '.join(DECODE_WORKLOADS)}")
    _check_kinds(args.kinds)
    if not args.ctas or any(c < 1 for c in args.ctas):
        raise PdmuxError(f"--ctas takes CTAs per SM >= 1, got {args.ctas}")
    gpu = _gpu_or_error()
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
        print(f"calibrate: forgot {dropped} saved points of {', '.join(plan.workloads)}",
              file=sys.stderr)
    calibrate.run_sweep(plan, store)
    points = list(store.points.values())
    summary = calibrate.summarize(points)
    path = calibrate.write_results(out / f"calibrate-{gpu.name}.json", gpu.name, settings,
                                   points, summary)
    report.plot_calibration(points, out / f"calibrate-{gpu.name}.png")
    print(report.calibration_table(summary))
    print(f"wrote {path} and calibrate-{gpu.name}.png")


def cmd_compare(args) -> None:
    from pathlib import Path

    from pdmux_triton import compare, report

    gpu = _gpu_or_error()
    out = Path(args.out)
    result = compare.run_compare(args.model, args.batch, args.context, args.prefill_tokens,
                                 out / f"compare-{gpu.name}.json")
    levels = result["summary"]["levels"]
    report.plot_compare(levels, out / f"compare-{gpu.name}.png")
    print(report.compare_table(levels))
    print(f"wrote {out / f'compare-{gpu.name}.json'} and compare-{gpu.name}.png")


def cmd_run(args) -> None:
    import datetime
    import json
    from pathlib import Path

    from pdmux_triton import estimate, experiment, metrics, report, traffic
    from pdmux_triton.simulate import DecodeCurve, SimExecutor

    spec = model_preset(args.model)
    _check_kinds(args.kinds)
    simulate = args.simulate
    if not simulate:
        try:
            gpu = _gpu_or_error()
        except PdmuxError as err:
            print(f"no GPU here ({err}): running the simulated executor on the {args.gpu} preset",
                  file=sys.stderr)
            simulate = True
    if simulate:
        gpu = _gpu_from_args(args)
    config = _config_from_args(args, gpu)
    if args.workload == "chapter":
        requests = traffic.chapter_scenario(spec.vocab, args.batch, args.context, args.prompt,
                                            args.decode_tokens, seed=args.seed)
    else:
        requests = traffic.poisson(spec.vocab, args.rate, args.count, args.prompt_mean,
                                   args.prompt_max, args.output_mean, args.output_max, args.seed)
    # estimates first: a bad calibration or comparison file fails before minutes of measuring
    estimates = []
    if args.workload == "chapter":
        sc = estimate.Scenario(gpu=gpu, model=spec, decode_batch=args.batch, context=args.context,
                               prompt=args.prompt, chunk_sizes=args.chunks, s_sat=(args.s_sat,),
                               bw_efficiency=args.bw_eff, mfu=args.mfu, pdmux=config)
        estimates.append(("the chapter's estimate", sc))
        if args.calibration:
            cal = json.loads(Path(args.calibration).read_text())
            levels_measured = (json.loads(Path(args.compare).read_text())["summary"]["levels"]
                               if args.compare else None)
            estimates.append(("the estimate with calibrated bandwidth, S_SAT and prefill rate"
                              if args.compare else "the estimate with calibrated bandwidth and S_SAT",
                              estimate.calibrated(sc, cal, args.kinds[0], levels_measured)))
        estimates = [(title, s, estimate.estimate(s)) for title, s in estimates]
    if simulate:
        curves = {k: DecodeCurve(args.calibration, k) for k in args.kinds} if args.calibration else {}

        def make_executor(v):
            return SimExecutor(gpu, spec, args.bw_eff, args.mfu, args.s_sat,
                               curves.get(v.kind if v.strategy == "pdmux" else "grid_cap"))
    else:
        from pdmux_triton.execute import ModelExecutor

        def make_executor(v):
            return ModelExecutor.shared(spec, gpu, v.kind, page_size=16)
    try:
        rows, results = experiment.run_all(requests, make_executor, config, args.chunks,
                                           args.kinds, log=lambda msg: print(msg, file=sys.stderr),
                                           warmup=not simulate)
    finally:
        if not simulate:
            ModelExecutor.release_shared()  # green contexts and graphs
    levels = config.levels(gpu.sms, gpu.cc_major)
    level = policy.choose_group(levels, args.batch, True, config.decode_bs_divisor,
                                config.manual_divisions or None)
    out = {"mode": "simulated" if simulate else "gpu", "gpu": gpu.name, "model": spec.name,
           "workload": args.workload, "date": datetime.date.today().isoformat(), "rows": rows,
           "details": {name: metrics.details(res) for name, res in results.items()}}
    if not simulate:
        import torch
        import triton

        out.update(torch=torch.__version__, triton=triton.__version__)
    if estimates:
        out["estimate"] = {title: [r.as_dict() for r in est] for title, _, est in estimates}
    # errors against the last estimate: the calibrated one when a calibration is given
    out["summary"] = experiment.summary(rows, gpu.sms, levels[level][0],
                                        out["estimate"][estimates[-1][0]] if estimates else None)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"run-{gpu.name}.json").write_text(json.dumps(out, indent=1))
        report.plot_timeline(results, folder / f"run-{gpu.name}.png")
    if args.json:
        print(json.dumps(out, indent=1))
        return
    mode = "simulated on the cost model" if simulate else "measured"
    print(f"{spec.name} on {gpu.name}, {args.workload} workload, {mode}:")
    print(report.strategy_table(rows))
    for title, s, est in estimates:
        print(f"\n{title} for the same scenario:")
        print(estimate.format_table(s, est))
    if args.out:
        print(f"wrote {Path(args.out) / f'run-{gpu.name}.json'} and run-{gpu.name}.png")


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="pdmux-results", help="folder for JSON, points and plots")
    p.add_argument("--model", default="qwen3-8b", help=f"model preset ({', '.join(MODELS)})")
    p.add_argument("--batch", type=int, default=32, help="decode batch size")
    p.add_argument("--context", type=int, default=2048, help="context of each decoding request")
    p.add_argument("--prefill-tokens", type=int, default=8192,
                   help="prompt length of the prefill running beside decode")


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
    p.add_argument("--calibration", help="calibrate-<gpu>.json: advise levels for --itl-ms")
    p.add_argument("--itl-ms", type=float, help="with --calibration: the decode step target")
    p.add_argument("--model", default="qwen3-8b", help="with --calibration: the model preset")
    p.add_argument("--context", type=int, default=2048,
                   help="with --calibration: context of the decoding requests")
    p.add_argument("--kind", choices=("grid_cap", "green"), default="green",
                   help="with --calibration: which measured curve to trust")
    p.set_defaults(func=cmd_levels)

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
    p.add_argument("--kinds", type=_str_list, default=("grid_cap", "green"))
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
    p.add_argument("--kinds", type=_str_list, default=("grid_cap", "green"),
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
