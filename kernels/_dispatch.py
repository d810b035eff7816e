"""Launching a compiled Triton kernel without `JITFunction.run`'s per-call work.

`kernel[grid](...)` binds and specializes every argument, then on every launch builds a cache
key from a string of the options, reads its knobs, fetches the device and stream and checks the
kernel's globals: more host time than the driver's launch (bench/host_profile.py). An eager
layer is a handful of launches, so that work decides whether a chunked round is launch-bound.

`run_kernel` keeps Triton's own binding and specialization (the argument types, alignments
and integer properties Triton compiles for), so it tells specializations apart exactly as
Triton does. A specialization seen for the first time goes through Triton, which compiles or
finds its kernel (and counts as a compile where one happens); later launches of it call that
compiled kernel's launcher directly. Launches go through Triton whole under the interpreter,
while a launch hook is registered (a profiler sees every launch as Triton makes it) and when a
global the kernel reads has changed (Triton then raises its error).
"""

from __future__ import annotations

import contextlib

import torch
from triton import knobs
from triton.runtime.jit import JITFunction

FAST = True  # off: every launch through `JITFunction.run` (host_profile's baseline)

# (kernel's id, device, its specialization, its options) -> the kernel Triton compiled for them
# (an id, not the kernel: a JITFunction hashes under a lock; the kernels live as long as their
# modules)
_COMPILED: dict = {}
_MISSING = object()


@contextlib.contextmanager
def through_triton():
    """Within the block every launch goes through `JITFunction.run` (`FAST` off)."""
    global FAST
    before, FAST = FAST, False
    try:
        yield
    finally:
        FAST = before


def run_kernel(kernel, grid: int, *args, **kwargs) -> None:
    """Launch `kernel` on `grid` programs with `args` and `kwargs` (its constexprs and launch
    options) on the current stream: `kernel[(grid,)](*args, **kwargs)`, with Triton's dispatch
    skipped once this specialization has been launched."""
    # (the interpreter's kernels are not JITFunctions: no environment read a launch)
    if not FAST or not isinstance(kernel, JITFunction) or _hooked():
        kernel[(grid,)](*args, **kwargs)
        return
    device = torch.cuda.current_device()
    caches = kernel.device_caches.get(device)
    if caches is None:  # the first launch on this device makes Triton's binder
        _first_launch(kernel, grid, None, args, kwargs)
        return
    params, specialization, options = caches[4](*args, **kwargs)
    key = (id(kernel), device, tuple(specialization), tuple(options.items()))
    compiled = _COMPILED.get(key)
    if compiled is None or not _globals_unchanged(kernel):
        _first_launch(kernel, grid, key, args, kwargs)
        return
    compiled.run(grid, 1, 1, torch._C._cuda_getCurrentRawStream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *params.values())


def _first_launch(kernel, grid: int, key, args, kwargs) -> None:
    compiled = kernel[(grid,)](*args, **kwargs)
    if key is not None and compiled is not None:
        _COMPILED[key] = compiled.result() if hasattr(compiled, "result") else compiled


def _hooked() -> bool:
    rt = knobs.runtime
    return bool(rt.launch_enter_hook.calls or rt.launch_exit_hook.calls)


# kernel id -> ((globals dict, name, the object found there when last seen equal), ...)
_SEEN_GLOBALS: dict = {}


def _globals_unchanged(kernel) -> bool:
    """Triton's own check before a launch: the globals the kernel read when it compiled still
    hold the values it compiled with. The objects last found equal are remembered, so a launch
    compares identities (a constexpr's == runs in Python); any other object is compared by
    value, as Triton does."""
    seen = _SEEN_GLOBALS.get(id(kernel))
    if seen is not None:
        for globals_dict, name, obj in seen:
            if globals_dict.get(name, _MISSING) is not obj:
                break
        else:
            return True
    found = []
    for (name, _), (val, globals_dict) in kernel.used_global_vals.items():
        obj = globals_dict.get(name, _MISSING)
        if obj != val:
            return False
        found.append((globals_dict, name, obj))
    _SEEN_GLOBALS[id(kernel)] = tuple(found)
    return True
