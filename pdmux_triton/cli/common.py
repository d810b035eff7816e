"""What the command line's subcommands share: notes on stderr, refusing flags that would do
nothing, the GPU and the pdmux config the flags name, output folders, plots that may be
missing."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.spec.gpus import GPUSpec, detect_gpu, resolve_gpu

NOTES: list[str] = []


def note(msg: str) -> None:
    """Progress and results on stderr, now."""
    print(msg, file=sys.stderr)


def note_later(msg: str) -> None:
    """A note on how an input was read, shown once the command succeeded (bad input gets its
    one error line and nothing else)."""
    NOTES.append(f"note: {msg}")


def refuse(given: set[str], flags, reason: str) -> None:
    """Flags that would do nothing here are an error, not silently dropped."""
    extra = [f for f in flags if f in given]
    if extra:
        names = ", ".join("--" + f.replace("_", "-") for f in extra)
        raise PdmuxError(f"{names} {'does' if len(extra) == 1 else 'do'} nothing {reason}")


# --- GPU, levels and output folders --------------------------------------------------------

def gpu_from_args(args) -> GPUSpec:
    gpu = resolve_gpu(args.gpu)
    if args.sms is not None and args.sms != gpu.sms:
        note_later(f"the {gpu.name} preset with {args.sms} SMs instead of {gpu.sms}; its "
                   f"{gpu.hbm_tbps} TB/s and {gpu.bf16_tflops:g} TFLOP/s stay as they are")
        gpu = dataclasses.replace(gpu, name=f"{gpu.name}-{args.sms}sm", sms=args.sms)
    if args.cc is not None:
        gpu = dataclasses.replace(gpu, cc=args.cc)
    sglang_rules.arch_constraints(gpu.cc_major)  # reject an unknown compute capability up front
    return gpu


def config_from_args(args, given: set[str], gpu: GPUSpec) -> sglang_rules.PDMuxConfig:
    if args.config:
        if "sm_group_num" in given:
            raise PdmuxError("--sm-group-num conflicts with --config, whose sm_group_num rules")
        config = sglang_rules.load_config(args.config, gpu.sms, gpu.cc_major)
    else:
        config = sglang_rules.PDMuxConfig(sm_group_num=getattr(args, "sm_group_num",
                                                               sglang_rules.DEFAULT_SM_GROUP_NUM))
    levels = config.levels(gpu.sms, gpu.cc_major)
    if len(levels) < config.sm_group_num:
        note_later(f"{gpu.sms} SMs at compute capability {gpu.cc[0]}.x allow "
                   f"{len(levels) - 2} splits, so {len(levels)} levels, not the "
                   f"{config.sm_group_num} asked for (SGLang makes the same)")
    return config


def check_s_sat(args, given: set[str], gpu: GPUSpec) -> None:
    """S_SAT is a number of SMs: a value given past the GPU's own would do nothing (the
    defaults are clipped to a small GPU)."""
    if "s_sat" not in given:
        return
    for value in args.s_sat if isinstance(args.s_sat, tuple) else (args.s_sat,):
        if value > gpu.sms:
            raise PdmuxError(f"--s-sat {value:g}: S_SAT is a number of SMs, at most the "
                             f"{gpu.name}'s {gpu.sms}")


def measuring_gpu() -> GPUSpec:
    """The local GPU for the measuring commands: a clear error without one."""
    try:
        gpu = detect_gpu()
    except PdmuxError as err:
        raise PdmuxError(f"measuring needs a CUDA GPU: {err}") from None
    sglang_rules.arch_constraints(gpu.cc_major)
    return gpu


def out_folder(path: str) -> Path:
    """An output folder, made now: a bad one fails before minutes of work, not after."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise PdmuxError(f"--out {folder} is a file; it must be a folder (made if missing)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PdmuxError(f"cannot make the output folder {folder}: {err.strerror}") from None
    return folder


def plot(draw, *args) -> bool:
    """Draw a plot; without matplotlib say so and go on (the JSON is what counts)."""
    try:
        draw(*args)
    except PdmuxError as err:
        note(f"no plot: {err}")
        return False
    return True


# --- subcommands ---------------------------------------------------------------------------
