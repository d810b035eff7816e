"""`pdmux-triton`: the command line. Each subcommand checks its arguments, calls the library
and prints; the work lives in the library, the flags in `flags`, the serving commands in
`serve`, what they share in `common`.

Bad input raises PdmuxError, printed as one line on stderr with exit code 2; Ctrl-C is one
line and exit code 130; a reader that stops reading (`| head`) ends the output quietly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from pdmux_triton.cli import tables
from pdmux_triton.cli.common import (NOTES, check_s_sat, config_from_args, gpu_from_args,
                                     measuring_gpu, note, out_folder, plot, refuse)
from pdmux_triton.cli.flags import SWEEP_FLAGS, parse
from pdmux_triton.cli.serve import cmd_capacity, cmd_run
from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_calibration
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments import estimate
from pdmux_triton.multiplex import advise, sglang_rules
from pdmux_triton.results import check_settings, provenance, write_json
from pdmux_triton.spec.gpus import GPUSpec, resolve_gpu
from pdmux_triton.spec.models import resolve_model

ADVISE_FLAGS = ("itl_ms", "model", "context", "kind", "context_dist", "max_batch")


def cmd_levels(args, given) -> None:
    if args.calibration:  # kept as an alias of `advise`
        cmd_advise(args, given)
        return
    refuse(given, ADVISE_FLAGS, "without --calibration")
    gpu = gpu_from_args(args)
    config = config_from_args(args, given, gpu)
    levels = config.levels(gpu.sms, gpu.cc_major)
    ranges = config.batch_ranges(levels)
    if args.write_config:
        written = sglang_rules.PDMuxConfig(
            sm_group_num=len(levels),  # a small GPU can have fewer levels than asked for
            manual_divisions=sglang_rules.manual_divisions_for(levels, ranges),
            split_forward_token_budget=config.split_forward_token_budget,
            decode_bs_divisor=config.decode_bs_divisor,
        )
        sglang_rules.dump_config(written, args.write_config)
    if args.json:
        print(json.dumps({
            "gpu": gpu.name, "sms": gpu.sms, "cc": f"{gpu.cc[0]}.{gpu.cc[1]}",
            "sm_group_num": config.sm_group_num,
            "levels": [{"index": i, "prefill_sms": p, "decode_sms": d}
                       for i, (p, d) in enumerate(levels)],
            "decode_bs_to_level": [{"first": a, "last": b, "level": lv} for a, b, lv in ranges],
        }, indent=2))
        return
    print(tables.levels_table(gpu, config, levels, ranges))
    if args.write_config:
        print(f"wrote {args.write_config}: these levels as SGLang manual_divisions")


def cmd_advise(args, given) -> None:
    """Splits that keep a decode step beside a prefill under an ITL target: for one context,
    or (--context-dist) the manual divisions that follow the slo level policy on a traffic."""
    if not args.calibration:
        raise PdmuxError("advise needs --calibration (a calibrate-<gpu>.json)" + (
            " and --itl-ms (the decode step time to stay under)" if args.itl_ms is None else ""))
    if args.itl_ms is None:
        raise PdmuxError("--calibration needs --itl-ms, the decode step time to stay under")
    if args.context_dist:
        refuse(given, ("context",), "with --context-dist, which draws the contexts")
    else:
        refuse(given, ("max_batch",), "without --context-dist")
    gpu = gpu_from_args(args)
    config = config_from_args(args, given, gpu)
    # the calibration's GPU, with --sms or --cc reshaping it: its curve is by SM count
    curve = load_calibration(args.calibration, resolve_gpu(args.gpu).name).decode_curve(args.kind)
    spec = resolve_model(args.model)
    if not args.context_dist:
        step_cost.check_fits(gpu, spec, args.context, f"one request at {args.context} tokens")
    if args.context_dist:
        advise_for_traffic(args, gpu, config, curve, spec)
        return
    advised = advise.advise(curve, spec, gpu.sms, gpu.cc_major, args.itl_ms, args.context,
                            config.sm_group_num - 2)
    if args.write_config:
        sglang_rules.dump_config(advise.as_config(advised, config), args.write_config)
    if args.json:
        print(json.dumps([a.__dict__ for a in advised], indent=2))
        return
    print(tables.advice_table(spec, gpu, args.context, args.itl_ms, args.kind, advised))
    if args.write_config:
        print(f"wrote {args.write_config}: these levels as SGLang manual_divisions")


def advise_for_traffic(args, gpu, config, curve, spec) -> None:
    """SGLang's batch-size thresholds that best follow the slo level policy on a traffic."""
    from pdmux_triton.multiplex.level_policy import SloLevels, approximate
    from pdmux_triton.spec.traffic import LENGTH_PRESETS, decoding_contexts

    # as for one context, any split green contexts allow, unless --config names the levels
    offered = (config.levels(gpu.sms, gpu.cc_major) if args.config
               else advise.split_levels(gpu.sms, gpu.cc_major))
    slo = SloLevels(spec, curve, args.itl_ms)
    draw = decoding_contexts(LENGTH_PRESETS[args.context_dist], seed=0)
    approx = approximate(slo, offered, draw, args.max_batch, config)
    if args.write_config:
        sglang_rules.dump_config(approx.config, args.write_config)
    levels = approx.levels
    ranges = approx.config.batch_ranges(levels)
    if args.json:
        print(json.dumps({"levels": levels, "manual_divisions": approx.config.manual_divisions,
                          "disagreement": approx.disagreement,
                          "decode_bs_to_level": [{"first": a, "last": b, "level": lv}
                                                 for a, b, lv in ranges]}, indent=2))
        return
    print(f"{spec.name} on {gpu.name}, {args.context_dist} contexts, decode step <= "
          f"{args.itl_ms:g} ms beside a prefill ({args.kind} calibration): the slo level policy "
          f"over {'the --config levels' if args.config else 'every green-context split'}, as "
          f"SGLang manual divisions (the splits no batch picks left out)")
    print(tables.levels_table(gpu, approx.config, levels, ranges))
    print(f"they pick another level than the slo policy for {approx.disagreement:.0%} of "
          f"sampled batches (1-{args.max_batch} requests, 64 batches each)")
    if args.write_config:
        print(f"wrote {args.write_config}")


def cmd_estimate(args, given) -> None:
    gpu = gpu_from_args(args)
    check_s_sat(args, given, gpu)
    if args.bandwidth_tbps is not None:
        gpu = dataclasses.replace(gpu, hbm_tbps=args.bandwidth_tbps)
    if args.tflops is not None:
        gpu = dataclasses.replace(gpu, bf16_tflops=args.tflops)
    sc = estimate.Scenario(
        gpu=gpu, model=resolve_model(args.model), decode_batch=args.batch, context=args.context,
        prompt=args.prompt, chunk_sizes=args.chunks, s_sat=args.s_sat,
        bw_efficiency=args.bw_eff, mfu=args.mfu, pdmux=config_from_args(args, given, gpu),
    )
    rows = estimate.estimate(sc)
    if args.json:
        print(json.dumps({**provenance(gpu.name), "inputs": dataclasses.asdict(sc),
                          "rows": [r.as_dict() for r in rows]}, indent=1))
    else:
        print(tables.estimate_table(sc, rows))


def _check_measure_args(args, gpu: GPUSpec) -> None:
    step_cost.check_fits(gpu, resolve_model(args.model),
                         args.batch * args.context + args.prefill_tokens,
                         f"{args.batch} requests at {args.context} tokens beside a "
                         f"{args.prefill_tokens}-token prefill")


def cmd_calibrate(args, given) -> None:
    from pdmux_triton.measure import calibration_sweep

    if args.host_costs:
        refuse(given, SWEEP_FLAGS, "with --host-costs (it times fixed cases, not the sweep)")
        return _calibrate_host_costs(args)
    for flag in ("decode_batches", "decode_contexts"):
        if getattr(args, flag) and ("decode_step" not in args.workloads or 1 not in args.ctas):
            raise PdmuxError(f"--{flag.replace('_', '-')} measures decode_step at one CTA per "
                             f"SM: keep decode_step in --workloads and 1 in --ctas")
    for c in args.decode_contexts:
        if c <= args.context:
            raise PdmuxError(f"--decode-contexts {c}: at or below --context {args.context} a "
                             f"step is priced by the curve itself; name longer contexts")
    gpu = measuring_gpu()
    _check_measure_args(args, gpu)
    other_steps = ([("--decode-batches", b, b, args.context) for b in args.decode_batches]
                   + [("--decode-contexts", c, args.batch, c) for c in args.decode_contexts])
    for flag, value, requests, context in other_steps:
        step_cost.check_fits(gpu, resolve_model(args.model), requests * context + args.prefill_tokens,
                             f"{flag} {value}: {requests} requests at {context} tokens beside a "
                             f"{args.prefill_tokens}-token prefill")
    _, granularity = sglang_rules.arch_constraints(gpu.cc_major)
    budgets = args.budgets or calibration_sweep.default_budgets(gpu.sms, granularity)
    for b in budgets:
        if not 0 < b <= gpu.sms or ("green" in args.kinds and b < gpu.sms and b % granularity):
            raise PdmuxError(f"budget {b} SMs: budgets must be in 1..{gpu.sms}, and multiples of "
                             f"{granularity} for green contexts")
    out = out_folder(args.out)
    # torch is needed only where a GPU measures
    from pdmux_triton.cli import plots
    from pdmux_triton.measure.calibration_run import run_sweep

    plan = calibration_sweep.SweepPlan(tuple(args.workloads), tuple(args.kinds), tuple(args.ctas),
                                       tuple(sorted(set(budgets))), not args.no_corun, args.model,
                                       args.batch, args.context, args.prefill_tokens,
                                       tuple(args.decode_batches), tuple(args.decode_contexts))
    settings = {"model": plan.model, "batch": plan.batch, "context": plan.context,
                "prefill_tokens": plan.prefill_tokens}
    check_settings(out / f"calibrate-settings-{gpu.name}.json", settings)
    store = calibration_sweep.point_store(out / f"calibrate-points-{gpu.name}.jsonl")
    if args.remeasure:
        dropped = calibration_sweep.forget(store, plan)
        note(f"calibrate: forgot {dropped} saved points this sweep measures again")
    run_sweep(plan, store, log=note)
    points = list(store.points.values())
    summary = calibration_sweep.summarize(points)
    path = calibration_sweep.write_results(out / f"calibrate-{gpu.name}.json", gpu.name, settings,
                                           points, summary)
    print(tables.calibration_table(summary))
    print(f"wrote {path}")
    if plot(plots.calibration, points, gpu.name, plan.model, out / f"calibrate-{gpu.name}.png"):
        print(f"wrote {out / f'calibrate-{gpu.name}.png'}")


def _calibrate_host_costs(args) -> None:
    gpu = measuring_gpu()
    spec = resolve_model(args.model)
    out = out_folder(args.out)
    from pdmux_triton.measure.host_costs import measure_host_costs  # torch: only on a GPU

    data = measure_host_costs(gpu, spec, log=note)
    path = write_json(out / f"host-costs-{gpu.name}.json", data)
    print(tables.host_costs_table(data))
    print(f"wrote {path}")


def cmd_compare(args, given) -> None:
    if "green" not in args.kinds or not {"grid_cap", "pinned"} & set(args.kinds):
        raise PdmuxError(f"compare --kinds {','.join(args.kinds)}: compares an emulation "
                         f"(grid_cap, pinned) with green contexts; name green and at least one")
    gpu = measuring_gpu()
    _check_measure_args(args, gpu)
    out = out_folder(args.out)
    from pdmux_triton.cli import plots
    from pdmux_triton.measure.comparison_run import run_compare

    result = run_compare(args.model, args.batch, args.context, args.prefill_tokens,
                         out / f"compare-{gpu.name}.json", log=note, kinds=args.kinds)
    levels = result["summary"]["levels"]
    print(tables.compare_table(levels))
    print(f"wrote {out / f'compare-{gpu.name}.json'}")
    if plot(plots.compare, levels, gpu.name, args.model, out / f"compare-{gpu.name}.png"):
        print(f"wrote {out / f'compare-{gpu.name}.png'}")


COMMANDS = {"levels": cmd_levels, "advise": cmd_advise, "estimate": cmd_estimate,
            "calibrate": cmd_calibrate, "compare": cmd_compare, "run": cmd_run,
            "capacity": cmd_capacity}


class _OutputLost(Exception):
    """Standard output refused a write (`> /dev/full`): its error's text."""


class _GuardedOutput:
    """Standard output whose failed writes raise `_OutputLost`, told apart from the OSErrors
    of anything else (a reader that stopped stays a BrokenPipeError)."""

    def __init__(self, stream):
        self._stream = stream

    def _guarded(self, name, *args):
        try:
            return getattr(self._stream, name)(*args)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise _OutputLost(err.strerror) from None

    def write(self, text):
        return self._guarded("write", text)

    def flush(self):
        return self._guarded("flush")

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _drop_output(stream) -> None:
    """What is left in a failed stdout's buffer goes nowhere (not to a traceback at exit)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError, AttributeError):  # (no descriptor: a test's capture)
        pass


def main(argv: list[str] | None = None) -> int:
    NOTES.clear()
    stdout = sys.stdout
    try:
        if stdout is not None:  # (None: started with its standard output closed)
            sys.stdout = _GuardedOutput(stdout)
        args, given = parse(argv)
        COMMANDS[args.command](args, given)
        if stdout is not None:
            sys.stdout.flush()
        for line in NOTES:
            print(line, file=sys.stderr)
    except _OutputLost as err:
        print(f"pdmux-triton: error: cannot write to its standard output: {err}",
              file=sys.stderr)
        _drop_output(stdout)
        return 2
    except PdmuxError as err:
        print(f"pdmux-triton: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pdmux-triton: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader stopped reading (`| head`): nothing more to say, and nothing to flush
        _drop_output(stdout)
        return 0
    finally:
        sys.stdout = stdout
    return 0
