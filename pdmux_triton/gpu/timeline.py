"""When the GPU was busy: a start and an end mark around every launch, CUDA events on the
launch's stream on a GPU, host clocks without one (the Triton interpreter runs in order)."""

from __future__ import annotations

import time

import torch

from pdmux_triton.serve.executor import Activity


class HostMark:
    """A CPU stand-in for a CUDA event."""

    def __init__(self):
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class LaunchMarks:
    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.launches: list[tuple[object, object]] = []
        self.decode_steps: list[tuple[object, object]] = []
        self.drains: list[float] = []  # host seconds each level switch waited
        # host seconds of each eager launch's first layer (through its launchers, recording
        # them where later layers replay them; the batch's embedding with the first of a
        # prefill) and when each began, on the executor's clock
        self.host_layers: list[float] = []
        self.host_layers_at: list[float] = []
        # and a layer of its later ones (replays, where the decoder could make them)
        self.host_later_layers: list[float] = []

    def mark(self, stream):
        if not self.cuda:
            return HostMark()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def add(self, start, end, decode: bool = False) -> None:
        self.launches.append((start, end))
        if decode:
            self.decode_steps.append((start, end))

    def clear(self) -> None:
        self.launches.clear()
        self.decode_steps.clear()
        self.drains.clear()
        self.host_layers.clear()
        self.host_layers_at.clear()
        self.host_later_layers.clear()

    def launched_layers(self, first_s: float, later_s: float, layers: int, at: float) -> None:
        """The host launched `layers` eager layers from `at` on: the first in `first_s`, the
        others in `later_s`."""
        if layers:
            self.host_layers.append(first_s)
            self.host_layers_at.append(at)
        if layers > 1:
            self.host_later_layers.append(later_s / (layers - 1))

    def _seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b.t - a.t

    def activity(self) -> Activity:
        """Busy spans relative to the first launch (call after the GPU drained)."""
        if not self.launches:
            return Activity([], (0.0, 0.0), [], list(self.drains), list(self.host_layers),
                            list(self.host_layers_at), list(self.host_later_layers))
        base = self.launches[0][0]
        spans = [(self._seconds(base, a), self._seconds(base, b)) for a, b in self.launches]
        window = (min(a for a, _ in spans), max(b for _, b in spans))
        return Activity(spans, window, [self._seconds(a, b) for a, b in self.decode_steps],
                        list(self.drains), list(self.host_layers), list(self.host_layers_at),
                        list(self.host_later_layers))
