"""`pdmux-triton`: the command line. Each subcommand checks its arguments, calls the library
and prints; the work lives in the library (`experiment` runs `run`), the flags in `cli_args`.

Bad input raises PdmuxError, printed as one line on stderr with exit code 2; Ctrl-C is one
line and exit code 130; a reader that stops reading (`| head`) ends the output quietly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from pdmux_triton import advise, cost, estimate, policy, report
from pdmux_triton.cli_args import (CHAPTER_FLAGS, EXPONENTIAL_FLAGS, REPLAY_KEEPS, STREAM_FLAGS,
                                   parse)
from pdmux_triton.errors import PdmuxError
from pdmux_triton.hardware import GPUSpec, detect_gpu, model_preset, resolve_gpu
from pdmux_triton.results import (check_settings, load_calibration, provenance, read_json,
                                  write_json)


_NOTES: list[str] = []


def _note(msg: str) -> None:
    """Progress and results on stderr, now."""
    print(msg, file=sys.stderr)


def _warn(msg: str) -> None:
    """A note on how an input was read, shown once the command succeeded (bad input gets its
    one error line and nothing else)."""
    _NOTES.append(f"note: {msg}")


def _refuse(given: set[str], flags, reason: str) -> None:
    """Flags that would do nothing here are an error, not silently dropped."""
    extra = [f for f in flags if f in given]
    if extra:
        names = ", ".join("--" + f.replace("_", "-") for f in extra)
        raise PdmuxError(f"{names} {'does' if len(extra) == 1 else 'do'} nothing {reason}")


# --- GPU, levels and output folders --------------------------------------------------------

def _gpu_from_args(args) -> GPUSpec:
    gpu = resolve_gpu(args.gpu)
    if args.sms is not None and args.sms != gpu.sms:
        _warn(f"the {gpu.name} preset with {args.sms} SMs instead of {gpu.sms}; its "
              f"{gpu.hbm_tbps} TB/s and {gpu.bf16_tflops:g} TFLOP/s stay as they are")
        gpu = dataclasses.replace(gpu, name=f"{gpu.name}-{args.sms}sm", sms=args.sms)
    if args.cc is not None:
        gpu = dataclasses.replace(gpu, cc=args.cc)
    policy.arch_constraints(gpu.cc_major)  # reject an unknown compute capability up front
    return gpu


def _config_from_args(args, given: set[str], gpu: GPUSpec) -> policy.PDMuxConfig:
    if args.config:
        if "sm_group_num" in given:
            raise PdmuxError("--sm-group-num conflicts with --config, whose sm_group_num rules")
        config = policy.load_config(args.config, gpu.sms, gpu.cc_major)
    else:
        config = policy.PDMuxConfig(sm_group_num=getattr(args, "sm_group_num",
                                                         policy.DEFAULT_SM_GROUP_NUM))
    levels = config.levels(gpu.sms, gpu.cc_major)
    if len(levels) < config.sm_group_num:
        _warn(f"{gpu.sms} SMs at compute capability {gpu.cc[0]}.x allow {len(levels) - 2} "
              f"splits, so {len(levels)} levels, not the {config.sm_group_num} asked for (SGLang "
              f"makes the same)")
    return config


def _measuring_gpu() -> GPUSpec:
    """The local GPU for the measuring commands: a clear error without one."""
    try:
        gpu = detect_gpu()
    except PdmuxError as err:
        raise PdmuxError(f"measuring needs a CUDA GPU: {err}") from None
    policy.arch_constraints(gpu.cc_major)
    return gpu


def _out_folder(path: str) -> Path:
    """An output folder, made now: a bad one fails before minutes of work, not after."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise PdmuxError(f"--out {folder} is a file; it must be a folder (made if missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PdmuxError(f"cannot make the output folder {folder}: {err.strerror}") from None
    return folder


def _plot(draw, *args) -> bool:
    """Draw a plot; without matplotlib say so and go on (the JSON is what counts)."""
    try:
        draw(*args)
    except PdmuxError as err:
        _note(f"no plot: {err}")
        return False
    return True


# --- subcommands ---------------------------------------------------------------------------

ADVISE_FLAGS = ("itl_ms", "model", "context", "kind")


def cmd_levels(args, given) -> None:
    if args.calibration:  # kept as an alias of `advise`
        cmd_advise(args, given)
        return
    _refuse(given, ADVISE_FLAGS, "without --calibration")
    gpu = _gpu_from_args(args)
    config = _config_from_args(args, given, gpu)
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


def cmd_advise(args, given) -> None:
    """Splits that keep a decode step beside a prefill under an ITL target."""
    if not args.calibration:
        raise PdmuxError("advise needs --calibration, a calibrate-<gpu>.json")
    if args.itl_ms is None:
        raise PdmuxError("--calibration needs --itl-ms, the decode step time to stay under")
    gpu = _gpu_from_args(args)
    config = _config_from_args(args, given, gpu)
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


def cmd_estimate(args, given) -> None:
    gpu = _gpu_from_args(args)
    if args.bandwidth_tbps is not None:
        gpu = dataclasses.replace(gpu, hbm_tbps=args.bandwidth_tbps)
    if args.tflops is not None:
        gpu = dataclasses.replace(gpu, bf16_tflops=args.tflops)
    sc = estimate.Scenario(
        gpu=gpu, model=model_preset(args.model), decode_batch=args.batch, context=args.context,
        prompt=args.prompt, chunk_sizes=args.chunks, s_sat=args.s_sat,
        bw_efficiency=args.bw_eff, mfu=args.mfu, pdmux=_config_from_args(args, given, gpu),
    )
    rows = estimate.estimate(sc)
    if args.json:
        print(json.dumps({**provenance(gpu.name), "inputs": dataclasses.asdict(sc),
                          "rows": [r.as_dict() for r in rows]}, indent=1))
    else:
        print(report.estimate_table(sc, rows))


def _check_measure_args(args, gpu: GPUSpec) -> None:
    cost.check_fits(gpu, model_preset(args.model), args.batch * args.context + args.prefill_tokens,
                    f"{args.batch} requests at {args.context} tokens beside a "
                    f"{args.prefill_tokens}-token prefill")


def cmd_calibrate(args, given) -> None:
    from pdmux_triton import calibrate

    gpu = _measuring_gpu()
    _check_measure_args(args, gpu)
    _, granularity = policy.arch_constraints(gpu.cc_major)
    budgets = args.budgets or calibrate.default_budgets(gpu.sms, granularity)
    for b in budgets:
        if not 0 < b <= gpu.sms or ("green" in args.kinds and b < gpu.sms and b % granularity):
            raise PdmuxError(f"budget {b} SMs: budgets must be in 1..{gpu.sms}, and multiples of "
                             f"{granularity} for green contexts")
    out = _out_folder(args.out)
    # torch is needed only where a GPU measures
    from pdmux_triton import plots
    from pdmux_triton.calibrate_gpu import run_sweep

    plan = calibrate.SweepPlan(tuple(args.workloads), tuple(args.kinds), tuple(args.ctas),
                               tuple(sorted(set(budgets))), not args.no_corun, args.model,
                               args.batch, args.context, args.prefill_tokens)
    settings = {"model": plan.model, "batch": plan.batch, "context": plan.context,
                "prefill_tokens": plan.prefill_tokens}
    check_settings(out / f"calibrate-settings-{gpu.name}.json", settings)
    store = calibrate.point_store(out / f"calibrate-points-{gpu.name}.jsonl")
    if args.remeasure:
        dropped = calibrate.forget(store, plan.workloads)
        _note(f"calibrate: forgot {dropped} saved points of {', '.join(plan.workloads)}")
    run_sweep(plan, store, log=_note)
    points = list(store.points.values())
    summary = calibrate.summarize(points)
    path = calibrate.write_results(out / f"calibrate-{gpu.name}.json", gpu.name, settings,
                                   points, summary)
    print(report.calibration_table(summary))
    print(f"wrote {path}")
    if _plot(plots.calibration, points, gpu.name, plan.model, out / f"calibrate-{gpu.name}.png"):
        print(f"wrote {out / f'calibrate-{gpu.name}.png'}")


def cmd_compare(args, given) -> None:
    gpu = _measuring_gpu()
    _check_measure_args(args, gpu)
    out = _out_folder(args.out)
    from pdmux_triton import plots
    from pdmux_triton.compare_gpu import run_compare

    result = run_compare(args.model, args.batch, args.context, args.prefill_tokens,
                         out / f"compare-{gpu.name}.json", log=_note)
    levels = result["summary"]["levels"]
    print(report.compare_table(levels))
    print(f"wrote {out / f'compare-{gpu.name}.json'}")
    if _plot(plots.compare, levels, gpu.name, args.model, out / f"compare-{gpu.name}.png"):
        print(f"wrote {out / f'compare-{gpu.name}.png'}")


def _replayed(args, given):
    """The settings saved in --replay's file; measured again only on the same GPU."""
    from pdmux_triton.settings import RunSettings

    _refuse(given, sorted(given - set(REPLAY_KEEPS)), "with --replay, which takes every input "
            "from its file")
    data = read_json(args.replay, "run result")
    if not isinstance(data.get("inputs"), dict):
        raise PdmuxError(f"{args.replay} has no run inputs to replay (made by `run --out` of "
                         f"pdmux-triton 0.1 or later?)")
    settings = RunSettings.from_dict(data["inputs"])
    simulate = settings.simulate or args.simulate
    if not simulate:
        gpu = _measuring_gpu()
        if gpu.name != settings.gpu.name:
            raise PdmuxError(f"{args.replay} was measured on {settings.gpu.name}, this GPU is "
                             f"{gpu.name}: pass --simulate to simulate its inputs")
    return dataclasses.replace(settings, simulate=simulate)


def _where(args, given) -> tuple[GPUSpec, bool, PdmuxError | None]:
    """The GPU a run measures on, or the preset it simulates (and why, when there is no GPU)."""
    if not args.simulate:
        try:
            gpu = _measuring_gpu()
        except PdmuxError as err:
            return _gpu_from_args(args), True, err
        chosen = [f for f in ("gpu", "sms", "cc") if f in given
                  and not (f == "gpu" and args.gpu == "local")]
        _refuse(given, chosen, f"when measuring on the local {gpu.name} (they choose what "
                f"--simulate runs on)")
        return gpu, False, None
    return _gpu_from_args(args), True, None


def _settings(args, given, workload: str):
    """Settings from the flags, refusing the flags this workload would not use."""
    from pdmux_triton.settings import RunSettings

    unused = {"chapter": (*STREAM_FLAGS, *EXPONENTIAL_FLAGS, "trace"),
              "stream": (*CHAPTER_FLAGS, "trace"),
              "trace": (*CHAPTER_FLAGS, *STREAM_FLAGS, *EXPONENTIAL_FLAGS)}[workload]
    _refuse(given, [f for f in unused if hasattr(args, f)], f"with --workload {workload}")
    if getattr(args, "lengths", "exponential") != "exponential":
        _refuse(given, EXPONENTIAL_FLAGS, f"with --lengths {args.lengths} (they shape "
                f"--lengths exponential)")
    gpu, simulate, no_gpu = _where(args, given)
    fields = {f: getattr(args, f) for f in (
        "seed", "batch", "context", "prompt", "decode_tokens", "rate", "count", "burstiness",
        "lengths", "prompt_mean", "prompt_max", "output_mean", "output_max", "trace", "chunks",
        "kinds", "slo_ttft_ms", "slo_tpot_ms", "s_sat", "bw_eff", "mfu", "calibration",
        "compare", "host_costs", "max_running") if hasattr(args, f)}
    settings = RunSettings(gpu=gpu, model=model_preset(args.model), workload=workload,
                           simulate=simulate, config=_config_from_args(args, given, gpu),
                           prefill_tokens=args.max_prefill_tokens, **fields)
    return settings, no_gpu


def _say_why_simulated(settings, no_gpu) -> None:
    """Once every input checked out: a run asked to measure, with no GPU, simulates."""
    if no_gpu is not None:
        _note(f"no GPU here ({no_gpu}): simulating on the {settings.gpu.name} preset")


def cmd_run(args, given) -> None:
    from pdmux_triton import experiment, plots

    settings, no_gpu = ((_replayed(args, given), None) if args.replay
                        else _settings(args, given, args.workload))
    folder = _out_folder(args.out) if args.out else None
    _say_why_simulated(settings, no_gpu)
    out, results, estimates = experiment.run_experiment(settings, log=_note)
    gpu_name = settings.gpu.name
    if folder:
        write_json(folder / f"run-{gpu_name}.json", out)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        mode = ("simulated on the cost model (a prediction: the README's 'How far a simulation "
                "sits from a measurement' gives its error on the H200)" if settings.simulate
                else "measured")
        print(f"{settings.model.name} on {gpu_name}, {settings.workload} workload, {mode}:")
        print(report.strategy_table(out["rows"]))
        if settings.workload != "chapter":
            print()
            print(report.serving_table(out["rows"]))
        for title, s, est in estimates:
            print(f"\n{title} for the same scenario:")
            print(report.estimate_table(s, est))
    for line in out["warnings"]:
        _note(f"warning: {line}")
    if folder:
        _note(f"wrote {folder / f'run-{gpu_name}.json'}")
        title = (f"ITL of every token: {settings.model.name} on {gpu_name}, {settings.workload} "
                 f"workload, {out['mode']}")
        if _plot(plots.timeline, results, title, folder / f"run-{gpu_name}.png"):
            _note(f"wrote {folder / f'run-{gpu_name}.png'}")


def cmd_capacity(args, given) -> None:
    from pdmux_triton import capacity_sweep, plots
    from pdmux_triton.capacity import Criteria
    from pdmux_triton.capacity_sweep import PointKey
    from pdmux_triton.metrics import Slo
    from pdmux_triton.results import PointStore
    from pdmux_triton.settings import MAX_GPU_RUN_S

    for name in args.strategies:
        capacity_sweep.variant(name)  # an unknown name fails before anything runs
    chunks = tuple(capacity_sweep.variant(n).chunk for n in args.strategies
                   if n.startswith("chunked_"))
    kinds = tuple(capacity_sweep.variant(n).kind for n in args.strategies
                  if n.startswith("pdmux_")) or ("grid_cap",)
    args.chunks, args.kinds = chunks or (2048,), kinds
    if args.offline:
        if not args.rates:
            raise PdmuxError("--offline reads measured points at --rates: name them")
        args.simulate = True  # nothing is measured: the flags describe the GPU it was measured on
    settings, no_gpu = _settings(args, given, "stream")
    if args.offline:  # the GPU as it was measured, from the folder's settings
        saved = read_json(Path(args.out) / f"capacity-settings-{settings.gpu.name}.json",
                          "capacity settings")
        try:
            gpu = GPUSpec(**{**saved["gpu"], "cc": tuple(saved["gpu"]["cc"])})
        except (KeyError, TypeError):
            raise PdmuxError(f"{args.out} holds no capacity settings with a GPU") from None
        settings, no_gpu = dataclasses.replace(settings, gpu=gpu, simulate=False), None
    elif settings.simulate:
        _refuse(given, ("rates",), "when simulating (the simulation searches the rate)")
    for rate in args.rates or ():
        if args.count / rate > MAX_GPU_RUN_S:
            raise PdmuxError(f"--rates {rate:g}: {args.count} requests arrive over "
                             f"~{args.count / rate:,.0f} s, longer than a measured point may "
                             f"take ({MAX_GPU_RUN_S} s)")
    criteria = Criteria(Slo(args.slo_ttft_ms, args.slo_tpot_ms), args.attainment,
                        args.max_sched_delay_s)
    out = _out_folder(args.out)
    gpu = settings.gpu.name
    # every point in the folder must come from the same traffic, model, GPU and cost model
    stable = {k: v for k, v in settings.as_dict().items()
              if k not in ("simulate", "rate", "chunks", "kinds")}
    check_settings(out / f"capacity-settings-{gpu}.json", stable)
    _say_why_simulated(settings, no_gpu)
    store = PointStore(out / f"capacity-points-{gpu}.jsonl", PointKey)
    if args.offline:  # the simulation beside the measurement is made again, with today's model
        store.forget(lambda point: point["mode"] == "simulated")
    result = capacity_sweep.run_capacity(settings, tuple(args.strategies), criteria, store,
                                         args.rates, args.start_rate, args.tol, log=_note,
                                         offline=args.offline)
    write_json(out / f"capacity-{gpu}.json", result)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(report.capacity_table(result))
    _note(f"wrote {out / f'capacity-{gpu}.json'}")
    title = (f"SLO attainment vs request rate: {settings.model.name} on {gpu}, "
             f"{settings.lengths} lengths, TTFT <= {args.slo_ttft_ms:g} ms and TPOT <= "
             f"{args.slo_tpot_ms:g} ms")
    if _plot(plots.capacity, result, title, out / f"capacity-{gpu}.png"):
        _note(f"wrote {out / f'capacity-{gpu}.png'}")


COMMANDS = {"levels": cmd_levels, "advise": cmd_advise, "estimate": cmd_estimate,
            "calibrate": cmd_calibrate, "compare": cmd_compare, "run": cmd_run,
            "capacity": cmd_capacity}


def main(argv: list[str] | None = None) -> int:
    _NOTES.clear()
    try:
        args, given = parse(argv)
        COMMANDS[args.command](args, given)
        sys.stdout.flush()
        for note in _NOTES:
            print(note, file=sys.stderr)
    except PdmuxError as err:
        print(f"pdmux-triton: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pdmux-triton: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader stopped reading (`| head`): nothing more to say, and nothing to flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0
