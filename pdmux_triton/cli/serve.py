"""The serving subcommands: `run` (every strategy on one workload) and `capacity` (the highest
rate each serves within SLOs), from flags or from a saved result."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pdmux_triton.cli import tables
from pdmux_triton.cli.common import (check_s_sat, config_from_args, gpu_from_args, measuring_gpu,
                                     note, note_later, out_folder, plot, refuse)
from pdmux_triton.cli.flags import (CHAPTER_FLAGS, EXPONENTIAL_FLAGS, MIN_CAPACITY_COUNT,
                                    REPLAY_KEEPS, STREAM_FLAGS, TRACE_FLAGS)
from pdmux_triton.cost.measured_inputs import shipped_inputs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.results import read_json, write_json
from pdmux_triton.spec.gpus import GPUSpec
from pdmux_triton.spec.models import config_path, resolve_model

MAX_PLOTTED_REQUESTS = 20_000  # an ITL timeline of more is one smear, and holds every run

# what prices a simulated step: the first-order model's knobs and the measured files
COST_MODEL_FLAGS = ("calibration", "compare", "host_costs", "s_sat", "bw_eff", "mfu")


def _replayed(args, given):
    """The settings saved in --replay's file, measured again only on the same GPU, and, when
    simulated, the generation of chunked steps each of its strategies was served with (a run
    saved before today's is simulated as it ran: `metrics.chunked_steps_of`)."""
    from pdmux_triton.experiments.settings import RunSettings

    refuse(given, sorted(given - set(REPLAY_KEEPS)), "with --replay, which takes every input "
            "from its file")
    data = read_json(args.replay, "run result")
    if "criteria" in data:
        raise PdmuxError(f"{args.replay} is a capacity result: --replay serves a run result "
                         f"(run --out); `capacity --offline --out FOLDER` reads a "
                         f"capacity folder's points again")
    if not isinstance(data.get("inputs"), dict):
        raise PdmuxError(f"{args.replay} holds no run inputs to replay: it is not a run result "
                         f"(run --out), or one written before run results saved their inputs")
    settings = RunSettings.from_dict(data["inputs"])
    simulate = settings.simulate or args.simulate
    if not simulate:
        try:
            gpu = measuring_gpu()
        except PdmuxError as err:  # as a run from flags: no GPU here, so simulate it
            return (dataclasses.replace(settings, simulate=True, repeats=1), err,
                    _served(args.replay, data))
        if gpu.name != settings.gpu.name:
            raise PdmuxError(f"{args.replay} was measured on {settings.gpu.name}, this GPU is "
                             f"{gpu.name}: pass --simulate to simulate its inputs")
        return dataclasses.replace(settings, simulate=False), None, None  # today's executor
    return dataclasses.replace(settings, simulate=True), None, _served(args.replay, data)


def _served(path, data: dict) -> dict[str, int]:
    """Each strategy's generation of chunked steps in a saved run, with a note for those
    served before today's."""
    from pdmux_triton.serve import metrics

    details = {name: d for name, d in (data.get("details") or {}).items() if isinstance(d, dict)}
    served = {name: metrics.chunked_steps_of(name, d) for name, d in details.items()}
    older = sorted(name for name, d in details.items() if metrics.stale_steps(name, d))
    if older:
        note_later(f"{', '.join(older)} in {path} ran before today's chunked steps: simulated "
                   f"as they ran")
    return served


def _where(args, given, simulate: bool | None = None) -> tuple[GPUSpec, bool, PdmuxError | None]:
    """The GPU a run measures on, or the preset it simulates (and why, when there is no GPU);
    `simulate` overrides --simulate."""
    if not (args.simulate if simulate is None else simulate):
        try:
            gpu = measuring_gpu()
        except PdmuxError as err:
            return gpu_from_args(args), True, err
        named = args.gpu.strip().lower()
        if "gpu" in given and named not in ("local", gpu.name):
            gpu_from_args(args)  # an unknown name is refused as such
            raise PdmuxError(f"--gpu {args.gpu}: this machine's GPU is the {gpu.name}; to "
                             f"measure, name it (--gpu {gpu.name}) or leave --gpu out; to "
                             f"simulate the {named} preset here, add --simulate")
        refuse(given, [f for f in ("sms", "cc") if f in given],
               f"when measuring on the local {gpu.name} (they reshape the preset --simulate "
               f"runs on)")
        return gpu, False, None
    return gpu_from_args(args), True, None


def _settings(args, given, workload: str, simulate: bool | None = None,
              derived: dict | None = None):
    """Settings from the flags: every RunSettings field the command has a flag of that name
    for, what the flags describe (the GPU, the model, the levels, the workload), and what the
    command `derived` from them (capacity: the chunks, kinds and level policies its strategies
    need); `simulate` True when nothing is measured. The flags this workload would not use
    are refused."""
    from pdmux_triton.experiments.settings import RunSettings

    derived = derived or {}
    level_policies = derived.get("level_policies", getattr(args, "level_policies", ()))

    unused = {"chapter": (*STREAM_FLAGS, *EXPONENTIAL_FLAGS, *TRACE_FLAGS),
              "stream": (*CHAPTER_FLAGS, *TRACE_FLAGS),
              "trace": (*CHAPTER_FLAGS, *STREAM_FLAGS, *EXPONENTIAL_FLAGS)}[workload]
    refuse(given, [f for f in unused if hasattr(args, f)], f"with --workload {workload}")
    if workload == "chapter":
        refuse(given, ("slo_ttft_ms", "slo_tpot_ms", "max_prefill_tokens"),
               "with --workload chapter (its one prompt is prefilled alone, and it reports ITL "
               "and TTFT, not SLO attainment: serve --workload stream or trace)")
    if "slo" not in level_policies:
        refuse(given, ("itl_slo_ms", "hysteresis", "relevel_at_layers"),
               "without the slo level policy (--level-policies slo, or a pdmux_slo_<kind> "
               "strategy)")
    if getattr(args, "lengths", "exponential") != "exponential":
        refuse(given, EXPONENTIAL_FLAGS, f"with --lengths {args.lengths} (they shape "
                f"--lengths exponential)")
    gpu, simulate, no_gpu = _where(args, given, simulate)
    if simulate:
        refuse(given, ("warm_requests",), "when simulating (only a measured run warms the GPU "
               "first)")
    check_s_sat(args, given, gpu)
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunSettings)
              if hasattr(args, f.name)}
    fields.update(derived, gpu=gpu, model=resolve_model(args.model),
                  checkpoint=_checkpoint(args, simulate), workload=workload, simulate=simulate,
                  config=config_from_args(args, given, gpu),
                  prefill_tokens=args.max_prefill_tokens)
    # a GPU with measured inputs shipped is priced by them (not reshaped by --cc: --sms renames)
    if not given & {*COST_MODEL_FLAGS, "cc"}:
        fields.update(shipped_inputs(gpu.name, resolve_model(args.model).name))
    elif fields.get("calibration"):
        measured_with = read_json(fields["calibration"], "calibration").get("settings")
        measured_with = measured_with if isinstance(measured_with, dict) else {}
        if measured_with.get("model") not in (None, resolve_model(args.model).name):
            note_later(f"{fields['calibration']} was measured with {measured_with['model']}: its "
                       f"curves price {resolve_model(args.model).name} by extrapolation")
    uses_link = getattr(args, "tp", 1) > 1 or any(
        name.startswith("disagg_") for name in getattr(args, "strategies", ()))
    if not uses_link:
        refuse(given, ["link", "link_gbps", "link_latency_us"],
               "without --tp 2 or more or a disagg_<P>p<D>d strategy (they price what goes "
               "between GPUs)")
    return RunSettings(**fields), no_gpu


def _checkpoint(args, simulate: bool) -> str | None:
    """The model directory whose weights a measured run reads (--weights hf)."""
    if args.weights == "random":
        return None
    if simulate and not getattr(args, "offline", False):  # offline: as the points were measured
        raise PdmuxError("--weights hf does nothing when simulating (no GPU here, or "
                         "--simulate): a simulated step's time does not depend on weights")
    path = config_path(args.model)
    if path is None:
        raise PdmuxError(f"--weights hf reads a Hugging Face model directory, and --model "
                         f"{args.model} is a preset: pass the directory")
    return str(path.parent)


def _say_why_simulated(settings, no_gpu) -> None:
    """Once every input checked out: a run asked to measure, with no GPU, simulates."""
    if no_gpu is not None:
        note(f"no GPU here ({no_gpu}): simulating on the {settings.gpu.name} preset")


def _saves_as_it_goes(settings) -> bool:
    """A measured run saves its result before each strategy; a simulated one, fast and
    deterministic, only at its end (a large trace's JSON takes seconds to write)."""
    return not settings.simulate


def cmd_run(args, given) -> None:
    from pdmux_triton.cli import plots
    from pdmux_triton.experiments import run

    settings, no_gpu, served = (_replayed(args, given) if args.replay
                                else (*_settings(args, given, args.workload), None))
    folder = out_folder(args.out) if args.out else None
    _say_why_simulated(settings, no_gpu)
    if settings.workload == "trace":
        for line in settings.notes:
            note_later(line)
    # the ITL plot draws every token: only where there is a folder for it and it stays legible
    drawn = folder is not None and _requests_in(settings) <= MAX_PLOTTED_REQUESTS
    gpu_name = settings.gpu.name
    path = folder / f"run-{gpu_name}.json" if folder else None
    if path and args.replay and path.resolve() == Path(args.replay).resolve():
        raise PdmuxError(f"--out {args.out} would overwrite the replayed file {args.replay} "
                         f"as the run goes: name another folder")
    if path:  # an older run's plot must not pass for this one's
        path.with_suffix(".png").unlink(missing_ok=True)

    def save_so_far(partial: dict) -> None:
        # a measured run cut short (a time limit, Ctrl-C) keeps the strategies it served
        write_json(path, partial)
        if partial["rows"]:
            note(f"saved {path} ({', '.join(r['strategy'] for r in partial['rows'])} so far)")
    out, results, estimates = run.run_experiment(
        settings, log=note, keep_runs=drawn,
        saved=save_so_far if path and _saves_as_it_goes(settings) else None, served=served)
    if path:
        write_json(path, out)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        mode = "simulated (a prediction)" if settings.simulate else "measured"
        where = (f"TP-{settings.tp} over {settings.tp} x {gpu_name} ({settings.comm.link.name} "
                 f"{settings.comm.link.busbw_gbps:g} GB/s, {settings.comm.link.latency_us:g} us)"
                 if settings.tp > 1 else gpu_name)
        if settings.replicas > 1:
            where = f"{settings.replicas} servers behind a round-robin router, each {where}"
        repeats = (f", each figure the median of {settings.repeats} repeats (their spread: "
                   f"spread_pct in the JSON)" if settings.repeats > 1 else "")
        print(f"{settings.model.name} on {where}, {settings.workload} workload, {mode}"
              f"{repeats}:")
        if settings.simulate:
            print(tables.cost_model_line(out["inputs"]))
        idle_known = not (settings.simulate and settings.workload == "chapter"
                          and not settings.host_costs)
        print(tables.strategy_table(out["rows"], idle_known))
        if settings.workload != "chapter":
            print()
            print(tables.serving_table(out["rows"]))
        for title, s, est in estimates:
            print(f"\n{title} for the same scenario:")
            print(tables.estimate_table(s, est))
    for line in out["warnings"]:
        note(f"warning: {line}")
    if folder:
        note(f"wrote {path}")
        title = (f"ITL of every token: {settings.model.name} on {gpu_name}, {settings.workload} "
                 f"workload, {out['mode']}")
        if not drawn:
            note(f"no plot: {_requests_in(settings):,} requests are more than an ITL timeline "
                 f"shows (at most {MAX_PLOTTED_REQUESTS:,}); the JSON holds the figures")
        elif plot(plots.timeline, results, title, folder / f"run-{gpu_name}.png"):
            note(f"wrote {folder / f'run-{gpu_name}.png'}")


def _requests_in(s) -> int:
    """How many requests a run's workload serves."""
    if s.workload == "trace":
        return len(s.loaded_trace.arrival)
    return {"chapter": s.batch + 1, "stream": s.count}[s.workload]


def cmd_capacity(args, given) -> None:
    from pdmux_triton.cli import plots
    from pdmux_triton.experiments import capacity
    from pdmux_triton.experiments.capacity_search import Criteria
    from pdmux_triton.experiments.settings import check_measured_span
    from pdmux_triton.experiments.variants import served_by, variant
    from pdmux_triton.serve.metrics import Slo

    # offline, nothing is measured: the flags describe the GPU the points were measured on;
    # a trace is served sped up or slowed down to each rate searched
    derived = served_by(tuple(args.strategies))
    if args.offline:  # repeats are the measured points' own, set on the GPU's settings below
        derived["repeats"] = 1
    settings, no_gpu = _settings(args, given, "trace" if args.trace else "stream",
                                 simulate=args.offline or None, derived=derived)
    count = _requests_in(settings)
    what = f"{count} requests of the trace (--trace-count)" if args.trace else f"--count {count}"
    if count < MIN_CAPACITY_COUNT:
        raise PdmuxError(f"{what}: a capacity needs at least {MIN_CAPACITY_COUNT} "
                         f"requests a point (so few arrive together and fit the GPU at any "
                         f"rate, and attainment moves in steps of 1/count)")
    several = [n for n in args.strategies if variant(n).loop == "disagg"]
    if several and not settings.simulate:
        raise PdmuxError(f"{', '.join(several)} serve on several GPUs; this tool measures one: "
                         f"simulate them with --simulate")
    if args.offline:  # the GPU as it was measured, from the folder's settings
        refuse(given, ("rates",), "with --offline (it reads every point measured in --out)")
        gpu = capacity.measured_gpu(Path(args.out), settings.gpu.name)
        settings = dataclasses.replace(settings, gpu=gpu, simulate=False, repeats=args.repeats)
        no_gpu = None
    elif settings.simulate:
        refuse(given, ("rates",), "when simulating (the simulation searches the rate)")
    for rate in args.rates or ():
        check_measured_span(count, rate, f"--rates {rate:g} is too low for {count} requests")
    criteria = Criteria(Slo(args.slo_ttft_ms, args.slo_tpot_ms), args.attainment,
                        args.max_sched_delay_s)
    out = out_folder(args.out)
    gpu = settings.gpu.name
    store = capacity.open_folder(out, settings)
    _say_why_simulated(settings, no_gpu)
    if args.offline:  # the simulation beside the measurement is made again, with today's model
        store.forget(capacity.simulated_for(args.strategies))
    result = capacity.run_capacity(settings, tuple(args.strategies), criteria, store,
                                   args.rates, args.start_rate, args.tol, log=note,
                                   offline=args.offline,
                                   # (read offline too: a point's host times)
                                   diagnostics=(None if settings.simulate
                                                else capacity.open_diagnostics(out, gpu)))
    write_json(out / f"capacity-{gpu}.json", result)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(tables.capacity_table(result))
    for line in tables.capacity_notes(result, count):
        note(line)
    note(f"wrote {out / f'capacity-{gpu}.json'}")
    traffic = Path(settings.trace).name if args.trace else f"{settings.lengths} lengths"
    title = (f"SLO attainment vs request rate: {settings.model.name} on {gpu}, {traffic}, "
             f"TTFT <= {args.slo_ttft_ms:g} ms and TPOT <= {args.slo_tpot_ms:g} ms")
    if plot(plots.capacity, result, title, out / f"capacity-{gpu}.png"):
        note(f"wrote {out / f'capacity-{gpu}.png'}")
