"""Timing on a stream: how many back-to-back calls a target needs (pure), and on the GPU the
repeated calls (eager or one captured graph), a call timed alone, and a call timed while a
background runs on another stream (with how much of the window it covered)."""

import pytest

from pdmux_triton.measure.timing import runs_for


@pytest.mark.parametrize("ms_each,target_ms,cap,runs", [
    (0.1, 15.0, 400, 150),
    (7.0, 15.0, 400, 3),  # 2.14 rounds up
    (5.0, 15.0, 400, 3),  # exactly 3
    (100.0, 15.0, 400, 1),  # longer than the target: still one run
    (0.01, 15.0, 400, 400),  # capped
    (0.01, 15.0, 2000, 1500),
    (0.0, 15.0, 400, 400),  # no time measured: as if 1 us, then capped
    (0.0, 0.5, 2000, 500),
])
def test_runs_for(ms_each, target_ms, cap, runs):
    assert runs_for(ms_each, target_ms, cap) == runs


def _counting():
    """A function adding 1 to a device counter, and the streams of its host calls."""
    import torch

    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    calls = []

    def fn():
        calls.append(torch.cuda.current_stream())
        counter.add_(1)
    return fn, counter, calls


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("runs,expect", [(0, 1), (1, 1), (7, 7)])
def test_repeated_runs_the_function_runs_times_on_its_stream(graph, runs, expect):
    import torch

    from pdmux_triton.measure.timing import Repeated

    stream = torch.cuda.Stream()
    fn, counter, calls = _counting()
    rep = Repeated(fn, stream, runs, graph)
    assert rep.runs == expect and (rep.graph is not None) == graph
    assert int(counter) == 1  # the warm-up call ran; a capture runs nothing
    for n in (1, 2):
        rep.launch()
        stream.synchronize()
        assert int(counter) == 1 + n * expect
    # captured once (the warm-up and `runs` calls), or called again at every launch
    assert len(calls) == 1 + expect * (1 if graph else 2)
    assert all(s == stream for s in calls)


@pytest.mark.gpu
def test_a_longer_call_times_longer_alone_and_once():
    import torch

    from pdmux_triton.measure.timing import time_alone, time_once

    stream = torch.cuda.Stream()
    short = time_alone(lambda: torch.cuda._sleep(1_000_000), stream, graph=False)
    long = time_alone(lambda: torch.cuda._sleep(4_000_000), stream, graph=False)
    assert 0 < short and 3 < long / short < 5
    once = time_once(lambda: torch.cuda._sleep(4_000_000), stream)
    assert 0.7 < once / long < 1.3


@pytest.mark.gpu
def test_time_alone_of_a_graph_replays_its_calls():
    import torch

    from pdmux_triton.measure.timing import time_alone

    stream = torch.cuda.Stream()
    x = torch.randn(1 << 24, device="cuda")
    ms = time_alone(lambda: x.mul_(1.0), stream, graph=True)
    y = torch.randn(1 << 26, device="cuda")
    assert 2 < time_alone(lambda: y.mul_(1.0), stream, graph=True) / ms < 6  # 4x the bytes


@pytest.mark.gpu
def test_a_corun_reports_how_much_of_the_window_the_background_covered():
    import torch

    from pdmux_triton.measure.timing import time_alone, time_corun

    fg, bg = torch.cuda.Stream(), torch.cuda.Stream()

    def work():
        torch.cuda._sleep(1_000_000)  # one block spinning: neither slows the other

    alone = time_alone(work, fg, graph=False)
    co = time_corun(work, fg, False, alone, work, bg, False, alone)
    assert co.covered > 0.9 and 0.8 < co.ms / alone < 1.25
    # a background said to take a second runs once, and ends long before the window does
    co = time_corun(work, fg, False, alone, lambda: torch.cuda._sleep(1000), bg, False, 1000.0)
    assert co.covered < 0.05


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_the_timed_stream_waits_for_inputs_made_on_the_callers(graph):
    """An input still being written on the caller's stream (behind a 25 ms sleep) is read
    whole by the timed work on its own stream."""
    import torch

    from pdmux_triton.measure.timing import Repeated, time_once

    stream = torch.cuda.Stream()
    for start in (lambda fn: time_once(fn, stream), lambda fn: Repeated(fn, stream, 1, graph)):
        x = torch.zeros(1 << 20, device="cuda")
        out = torch.full_like(x, float("nan"))
        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)
        x.fill_(3.0)
        start(lambda: out.copy_(x))
        torch.cuda.synchronize()
        assert (out == 3).all()
