"""Making one eager layer's launches again for the next layers.

The layers of a prefill launch the same kernels on the same batch: what differs from one layer
to the next is its weights, its KV cache and its input. `recording` keeps a layer's launches as
`run_kernel` makes them; `LaunchRecord.replay` launches them again with those tensors swapped
for another layer's, with none of the launchers' checks, allocations and planning, nor
Triton's binding of the arguments (bench/host_profile.py: the host's time of a layer).

What a layer allocates (its activations) is reused by every replay, in stream order. A
recording that cannot be replayed faithfully says why (`LaunchRecord.unreplayable`): a torch op
other than an allocation or a view ran during it (GPU work outside the recorded kernels), or a
kernel read memory of a swapped tensor through a pointer no swap can follow.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.driver import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels import _dispatch
from pdmux_triton.kernels._dispatch import run_kernel

_ALLOCATIONS = (torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided)


def _extent(t: torch.Tensor) -> int:
    """Elements from a tensor's first to one past its last (0 if empty)."""
    return 0 if t.numel() == 0 else 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))


def _layout(t: torch.Tensor) -> tuple:
    """What a kernel compiled for one tensor assumes of another in its place: shape, strides,
    dtype, device, and a 16-byte-aligned start (Triton specializes pointers on it)."""
    return tuple(t.shape), t.stride(), t.dtype, t.device, t.data_ptr() % 16


@dataclasses.dataclass
class _Swap:
    """Argument `at` of a launch: swapped tensor `name`, or a view of it (`view`: shape,
    strides and offset from its start), or a tensor descriptor over either (`descriptor`)."""

    at: int | str
    name: str
    view: tuple | None
    descriptor: TensorDescriptor | None


@dataclasses.dataclass
class _Launch:
    """One recorded launch: `compiled` (Triton's kernel, launched directly with `args`, the
    launcher's own arguments) or, where Triton's dispatch made it, `kernel` launched again
    through `run_kernel` with `args` and `kwargs`."""

    grid: int
    args: list
    kwargs: dict
    swaps: list[_Swap]
    compiled: object = None
    kernel: object = None


class LaunchRecord:
    """The launches `run_kernel` made while recording, with the arguments that are views of
    the swappable tensors (`swappable`: name -> the recorded call's tensor) marked."""

    def __init__(self, swappable: dict[str, torch.Tensor]):
        self.swappable = dict(swappable)
        self._layouts = {name: _layout(t) for name, t in swappable.items()}
        self._names = {id(t): name for name, t in swappable.items()}
        self.unreplayable: str | None = None
        if len(self._names) < len(swappable):  # (a later layer's two tensors would be one)
            self.unreplayable = "two swapped names are one tensor"
        # a swappable tensor's storage -> its name, which a view of it is swapped by (None:
        # several share it, and a view cannot say whose it is)
        self._storages: dict[int, str | None] = {}
        for name, t in swappable.items():
            ptr = t.untyped_storage().data_ptr()
            self._storages[ptr] = None if ptr in self._storages else name
        self.launches: list[_Launch] = []
        self.stream = None
        self._watch = _TorchOpsWatch()

    # -- recording (called by run_kernel) --------------------------------------------------

    def add_compiled(self, compiled, grid: int, stream, params: list) -> None:
        """A launch `run_kernel` made directly: `compiled.run` with these bound arguments."""
        if self.stream is None:
            self.stream = stream
        args = [grid, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None,
                None, *params]
        self.launches.append(_Launch(grid, args, {}, self._swaps(enumerate(args)),
                                     compiled=compiled))

    def add_kernel(self, kernel, grid: int, args: tuple, kwargs: dict) -> None:
        """A launch made through Triton's dispatch (a first specialization, the interpreter)."""
        swaps = self._swaps(enumerate(args)) + self._swaps(kwargs.items())
        self.launches.append(_Launch(grid, list(args), dict(kwargs), swaps, kernel=kernel))

    @contextlib.contextmanager
    def launching(self):
        """Around a launch: the torch ops it makes itself (the interpreter's copies) are the
        kernel's, not work between the launches that a replay would miss."""
        self._watch.paused = True
        try:
            yield
        finally:
            self._watch.paused = False

    def _swaps(self, items) -> list[_Swap]:
        swaps = []
        for at, value in items:
            descriptor = value if isinstance(value, TensorDescriptor) else None
            t = value.base if descriptor is not None else value
            if not isinstance(t, torch.Tensor):
                continue
            name = self._names.get(id(t))
            if name is not None:
                swaps.append(_Swap(at, name, None, descriptor))
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self._storages:
                continue
            name = self._storages[ptr]
            if name is None:
                self.unreplayable = "a kernel read a view of swapped tensors sharing a storage"
                continue
            whole = self.swappable[name]
            if t.dtype != whole.dtype:
                self.unreplayable = f"a kernel read a view of {name} as {t.dtype}"
                continue
            offset = t.storage_offset() - whole.storage_offset()
            if offset < 0 or offset + _extent(t) > _extent(whole):
                self.unreplayable = f"a kernel read memory beside {name} in its storage"
                continue
            swaps.append(_Swap(at, name, (tuple(t.shape), t.stride(), offset), descriptor))
        return swaps

    # -- replaying -------------------------------------------------------------------------

    def replay(self, tensors: dict[str, torch.Tensor]) -> bool:
        """Every recorded launch again, in order, with each swappable tensor replaced by
        `tensors[name]`; False, and nothing launched, where they name other tensors than the
        recorded ones or one's layout (shape, strides, dtype, device, alignment) differs from
        the recorded one's: the kernels were compiled and planned for that."""
        if self.unreplayable:
            raise PdmuxError(f"these launches cannot be replayed: {self.unreplayable}")
        if tensors.keys() != self._layouts.keys():
            return False
        for name, layout in self._layouts.items():
            if _layout(tensors[name]) != layout:
                return False
        if self.stream is not None:
            stream = driver.active.get_current_stream(driver.active.get_current_device())
            if stream != self.stream:
                raise PdmuxError("launches recorded on one stream are replayed on another")
        for launch in self.launches:
            args, kwargs = launch.args, launch.kwargs
            if launch.swaps:
                args, kwargs = list(args), dict(kwargs)
                for s in launch.swaps:
                    value = _swapped(s, tensors[s.name])
                    if isinstance(s.at, int):
                        args[s.at] = value
                    else:
                        kwargs[s.at] = value
            if launch.compiled is not None:  # (as run_kernel's own direct launch: no hooks)
                launch.compiled.run(*args)
            else:
                run_kernel(launch.kernel, launch.grid, *args, **kwargs)
        return True


def _swapped(s: _Swap, t: torch.Tensor):
    if s.view is not None:
        shape, strides, offset = s.view
        t = t.as_strided(shape, strides, t.storage_offset() + offset)
    return t if s.descriptor is None else dataclasses.replace(s.descriptor, base=t)


class _TorchOpsWatch(TorchDispatchMode):
    """Names the first torch op, outside a launch (`paused`), that is neither an allocation
    nor a view."""

    def __init__(self):
        super().__init__()
        self.other: str | None = None
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if (self.other is None and not self.paused and not func.is_view
                and func.overloadpacket not in _ALLOCATIONS):
            self.other = str(func)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def recording(swappable: dict[str, torch.Tensor]):
    """Within the block, `run_kernel`'s launches are made as ever and kept in the
    `LaunchRecord` it yields; `swappable` names the tensors a replay may replace."""
    if _dispatch.RECORDER is not None:
        raise PdmuxError("launches are already being recorded")
    record = LaunchRecord(swappable)
    _dispatch.RECORDER = record
    try:
        with record._watch:
            yield record
    finally:
        _dispatch.RECORDER = None
    if record._watch.other is not None and record.unreplayable is None:
        record.unreplayable = f"the torch op {record._watch.other} ran between the launches"
