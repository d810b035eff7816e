"""Launching a compiled Triton kernel without `JITFunction.run`'s per-call work.

`kernel[grid](...)` binds and specializes every argument, then on every launch builds a cache
key from a string of the options, reads its knobs, fetches the device and stream and checks the
kernel's globals: more host time than the driver's launch (bench/host_profile.py). An eager
layer is a handful of launches, so that work decides whether a chunked round is launch-bound.

`run_kernel` binds the arguments with Triton's own binder and the options Triton adds (debug,
instrumentation), so it tells specializations apart as Triton does: a specialization seen for
the first time goes through Triton, which compiles or finds its kernel (and counts as a compile
where one happens); later launches of it call that compiled kernel's launcher directly.
Launches go through Triton whole under the interpreter, while a launch, pre-run or pipeline
hook is registered (a profiler sees every launch as Triton makes it) and when a global the
kernel reads has changed (Triton then raises its error).
"""

from __future__ import annotations

import contextlib
import types

from triton import knobs
from triton.language import constexpr, dtype
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

SKIP_TRITON_DISPATCH = True  # off: every launch through `JITFunction.run` (a baseline)
# while a `_replay.recording` block runs: its `LaunchRecord`, handed every launch (one
# recording at a time in a process: the executors launch from one thread)
RECORDER = None

# on a kernel: {(device, its specialization, its options): the kernel Triton compiled for them}
# and the globals it read as last found equal (`_globals_unchanged`)
COMPILED, SEEN_GLOBALS = "_pdmux_compiled", "_pdmux_seen_globals"
# globals compared by identity once found equal: objects that cannot change in place
IMMUTABLE = (constexpr, dtype, int, float, bool, str, types.NoneType)
_MISSING = object()
_NONE_YET = types.MappingProxyType({})  # a kernel's compiled kernels before any is kept


@contextlib.contextmanager
def through_triton():
    """Within the block every launch goes through `JITFunction.run`."""
    global SKIP_TRITON_DISPATCH
    before, SKIP_TRITON_DISPATCH = SKIP_TRITON_DISPATCH, False
    try:
        yield
    finally:
        SKIP_TRITON_DISPATCH = before


def run_kernel(kernel, grid: int, *args, **kwargs) -> None:
    """Launch `kernel` on `grid` programs with `args` and `kwargs` (its constexprs and launch
    options) on the current stream: `kernel[(grid,)](*args, **kwargs)`, with Triton's dispatch
    skipped once this specialization has been launched."""
    if RECORDER is None:
        _launch(kernel, grid, args, kwargs)
        return
    with RECORDER.launching():  # (what the launch itself does with torch is no layer's op)
        _launch(kernel, grid, args, kwargs)


def _launch(kernel, grid: int, args: tuple, kwargs: dict) -> None:
    # (the interpreter's kernels are not JITFunctions: no environment read a launch)
    if (not SKIP_TRITON_DISPATCH or not isinstance(kernel, JITFunction) or kernel.pre_run_hooks
            or _hooked()):
        _launch_through_triton(kernel, grid, None, args, kwargs)
        return
    device = driver.active.get_current_device()
    caches = kernel.device_caches.get(device)
    if caches is None:  # the first launch on this device makes Triton's binder
        _launch_through_triton(kernel, grid, None, args, kwargs)
        return
    # the options Triton's run adds before it binds, so that they key the kernel as there
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    params, specialization, options = caches[-1](*args, **kwargs)
    # (the options' types too: Triton keys them by their string, where 0 is not False)
    key = (device, tuple(specialization), tuple(options.items()),
           tuple(map(type, options.values())))
    compiled = kernel.__dict__.get(COMPILED, _NONE_YET).get(key)
    if compiled is None or not _globals_unchanged(kernel):
        _launch_through_triton(kernel, grid, key, args, kwargs)
        return
    stream = driver.active.get_current_stream(device)
    if RECORDER is not None:
        RECORDER.add_compiled(compiled, grid, stream, list(params.values()))
    compiled.run(grid, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None,
                 None, *params.values())


def _launch_through_triton(kernel, grid: int, key, args, kwargs) -> None:
    """Triton's launch, and the kernel it launched kept under `key` (None: not kept)."""
    if RECORDER is not None:
        RECORDER.add_kernel(kernel, grid, args, kwargs)
    compiled = kernel[(grid,)](*args, **kwargs)
    if key is not None and compiled is not None:
        # (a future where Triton compiles asynchronously)
        kernel.__dict__.setdefault(COMPILED, {})[key] = (
            compiled.result() if hasattr(compiled, "result") else compiled)


def _hooked() -> bool:
    rt = knobs.runtime
    return bool(rt.launch_enter_hook.calls or rt.launch_exit_hook.calls
                or getattr(rt, "add_stages_inspection_hook", None))


def _globals_unchanged(kernel) -> bool:
    """Triton's own check before a launch: the globals the kernel read when it compiled still
    hold the values it compiled with. Immutable objects last found equal are remembered, so a
    launch compares their identities (a constexpr's == runs in Python); any other object is
    compared by value every launch, as Triton does."""
    seen = kernel.__dict__.get(SEEN_GLOBALS)
    if seen is not None and all(globals_dict.get(name, _MISSING) is obj
                                for globals_dict, name, obj in seen):
        return True
    found = []
    for (name, _), (val, globals_dict) in kernel.used_global_vals.items():
        obj = globals_dict.get(name, _MISSING)
        if obj != val:
            return False
        found.append((globals_dict, name, obj))
    if all(isinstance(obj, IMMUTABLE) for _, _, obj in found):
        kernel.__dict__[SEEN_GLOBALS] = tuple(found)
    return True
