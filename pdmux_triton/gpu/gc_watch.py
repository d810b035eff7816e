"""Python's garbage collections counted and timed while a measured run runs: a collection stops
the host mid-launch, so a served run's slow launches may be its pauses (the host's launch tail
prices chunked prefill's launch-bound steps)."""

from __future__ import annotations

import gc
import time


class GcWatch:
    """Within the block, how many collections ran and how long they held the host."""

    def __init__(self):
        self.collections = 0
        self.pause_s = 0.0
        self._began: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.collections += 1
            self.pause_s += time.perf_counter() - self._began
            self._began = None

    def __enter__(self) -> "GcWatch":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)
