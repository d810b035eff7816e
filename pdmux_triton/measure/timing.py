"""Timing GPU work on a given stream, alone or while other work runs on another stream.

Decode-side work is replayed from CUDA graphs (a decode step is hundreds of short kernels:
launched one by one from Python it would measure the host, not the GPU). Prefill-side work is
launched eagerly, as the served run launches it: its kernels are long enough that the host
keeps ahead (bench/prefill_rate.py captures short prompts' prefills, where it would not).

The timed stream first waits for the caller's: inputs made there before the call (random
weights, token ids) are ready before the timed work reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


class Repeated:
    """`runs` back-to-back calls of `fn` on `stream`, captured once as a graph when `graph`."""

    def __init__(self, fn, stream, runs: int, graph: bool):
        self.fn, self.stream, self.runs = fn, stream, max(1, runs)
        self.graph = None
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # compile, allocate, warm caches
        stream.synchronize()
        if graph:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=stream):
                for _ in range(self.runs):
                    fn()
            stream.synchronize()

    def launch(self) -> None:
        with torch.cuda.stream(self.stream):
            if self.graph is not None:
                self.graph.replay()
            else:
                for _ in range(self.runs):
                    self.fn()


def _events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def time_once(fn, stream) -> float:
    """ms of a single eager call (after a warm-up call): the scale for choosing repeat counts."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        start, end = _events()
        start.record(stream)
        fn()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


def runs_for(ms_each: float, target_ms: float, cap: int = 400) -> int:
    return max(1, min(cap, math.ceil(target_ms / max(ms_each, 1e-3))))


def time_alone(fn, stream, graph: bool, target_ms: float = 15.0, repeats: int = 3) -> float:
    """Median ms per call of `fn` on `stream` with nothing else running."""
    rep = Repeated(fn, stream, runs_for(time_once(fn, stream), target_ms), graph)
    samples = []
    for _ in range(repeats):
        start, end = _events()
        start.record(stream)
        rep.launch()
        end.record(stream)
        end.synchronize()
        samples.append(start.elapsed_time(end) / rep.runs)
    return sorted(samples)[len(samples) // 2]


@dataclass
class CoRun:
    ms: float  # per call of the measured function while the background ran
    covered: float  # fraction of the measured window during which the background was running


def time_corun(fn, stream, graph: bool, fn_alone_ms: float, background, bg_stream, bg_graph: bool,
               bg_alone_ms: float, target_ms: float = 25.0) -> CoRun:
    """ms per call of `fn` on `stream` while `background` runs on `bg_stream`.

    The background is queued for longer than the measured work should take even if slowed
    3x, and started first; `covered` reports how much of the measured window it overlapped.
    """
    measured = Repeated(fn, stream, runs_for(fn_alone_ms, target_ms), graph)
    window = measured.runs * fn_alone_ms
    bg = Repeated(background, bg_stream, runs_for(bg_alone_ms, 3 * window + 20, cap=2000),
                  bg_graph)
    torch.cuda.synchronize()
    bg_start, bg_end = _events()
    start, end = _events()
    bg_start.record(bg_stream)
    bg.launch()
    bg_end.record(bg_stream)
    start.record(stream)
    measured.launch()
    end.record(stream)
    torch.cuda.synchronize()
    window = start.elapsed_time(end)
    overlap = min(bg_start.elapsed_time(bg_end), bg_start.elapsed_time(end)) - max(
        0.0, bg_start.elapsed_time(start))
    return CoRun(window / measured.runs, max(0.0, min(1.0, overlap / window)))
