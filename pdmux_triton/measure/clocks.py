"""NVML's SM clock, power draw and clock-event reasons sampled while the GPU is timed: a GPU
under sustained power runs its SMs slower than after an idle spell, so a timing is read with
the clocks it ran at."""

from __future__ import annotations

import statistics
import threading
import time

import torch

SAMPLE_S = 0.02  # NVML's sampling period


class Clocks:
    """NVML's SM clock (MHz), power draw (W) and clock-event reasons, sampled on a thread
    while in use; `samples` is empty (and `why` says so) where NVML cannot be read."""

    def __init__(self):
        self.samples: list[tuple[float, int, float, int]] = []
        self.why = None
        try:
            import pynvml
            pynvml.nvmlInit()
            index = torch.cuda.current_device()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
            self._reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        except Exception as err:  # no nvidia-ml-py, no driver library: timed without clocks
            self._nvml, self.why = None, f"NVML not readable: {err}"
        self._stop = threading.Event()

    def __enter__(self):
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._nvml is not None:
            self._thread.join()

    def _run(self):
        nvml, h = self._nvml, self._handle
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(),
                                 nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                                 nvml.nvmlDeviceGetPowerUsage(h) / 1e3, int(self._reasons(h))))
            time.sleep(SAMPLE_S)

    def between(self, t0: float, t1: float) -> dict:
        """The samples taken between two host times: SM clock median and min, power median,
        the reasons seen (bitwise or)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if not inside:
            return {"sm_clock_mhz_median": None, "why": self.why or "no sample in the window"}
        reasons = 0
        for s in inside:
            reasons |= s[3]
        return {"sm_clock_mhz_median": statistics.median(s[1] for s in inside),
                "sm_clock_mhz_min": min(s[1] for s in inside),
                "power_w_median": statistics.median(s[2] for s in inside),
                "clock_event_reasons": reasons, "samples": len(inside)}
