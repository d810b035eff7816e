"""Launch marks: busy spans relative to the first launch, the decode steps' own times and the
level switches' drains, from host clocks without CUDA and from CUDA events on a GPU."""

import pytest

from pdmux_triton.gpu.timeline import HostMark, LaunchMarks


def at(t: float) -> HostMark:
    mark = HostMark()
    mark.t = t
    return mark


def test_no_launch_gives_an_empty_activity_that_keeps_the_drains():
    marks = LaunchMarks(cuda=False)
    marks.drains += [0.25, 0.5]
    a = marks.activity()
    assert (a.busy, a.window, a.decode_step_s, a.drain_s) == ([], (0.0, 0.0), [], [0.25, 0.5])


@pytest.mark.parametrize("launches,busy,window,decode", [
    # (start, end, decode) on the host clock -> spans from the first start, window, decode times
    ([(10.0, 11.0, False)], [(0.0, 1.0)], (0.0, 1.0), []),
    ([(10.0, 11.0, True), (10.5, 12.0, False), (13.0, 13.25, True)],
     [(0.0, 1.0), (0.5, 2.0), (3.0, 3.25)], (0.0, 3.25), [1.0, 0.25]),
    # a later launch on the other side may start before the first one: the window reaches back
    ([(5.0, 6.0, True), (4.5, 7.0, False)], [(0.0, 1.0), (-0.5, 2.0)], (-0.5, 2.0), [1.0]),
])
def test_spans_are_relative_to_the_first_launch(launches, busy, window, decode):
    marks = LaunchMarks(cuda=False)
    for start, end, is_decode in launches:
        marks.add(at(start), at(end), decode=is_decode)
    a = marks.activity()  # times in halves and quarters: exact in binary
    assert (a.busy, a.window, a.decode_step_s) == (busy, window, decode)


def test_the_activity_holds_a_copy_of_the_drains_and_clear_forgets_everything():
    marks = LaunchMarks(cuda=False)
    marks.add(at(1.0), at(2.0), decode=True)
    marks.drains.append(0.125)
    a = marks.activity()
    marks.drains.append(9.0)
    assert a.drain_s == [0.125]
    marks.launched_layers(0.5, 0.75, 4, at=3.0)  # the first layer, then three at 0.25 s
    marks.launched_layers(0.375, 0.0, 1, at=3.5)  # one layer: no later ones
    marks.launched_layers(0.25, 0.0, 0, at=4.0)  # nothing launched: nothing to count
    a = marks.activity()
    assert (a.host_layer_s, a.host_layer_at_s, a.host_later_layer_s) == ([0.5, 0.375],
                                                                          [3.0, 3.5], [0.25])
    marks.clear()
    assert (marks.launches, marks.decode_steps, marks.drains, marks.host_layers,
            marks.host_layers_at, marks.host_later_layers) == ([], [], [], [], [], [])
    assert marks.activity().busy == []


def test_host_marks_read_the_host_clock_in_order():
    marks = LaunchMarks(cuda=False)
    first = marks.mark(None)
    second = marks.mark(None)
    assert isinstance(first, HostMark) and first.query() is True
    assert first.synchronize() is None
    assert second.t >= first.t
    marks.add(first, second)
    (span,) = marks.activity().busy
    assert span[0] == 0.0 and span[1] == second.t - first.t


@pytest.mark.gpu
def test_cuda_marks_time_launches_on_their_stream():
    import torch

    marks = LaunchMarks(cuda=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for cycles, decode in ((20_000_000, True), (2_000_000, False)):
            start = marks.mark(stream)
            torch.cuda._sleep(cycles)
            end = marks.mark(stream)
            marks.add(start, end, decode=decode)
    assert isinstance(start, torch.cuda.Event)
    stream.synchronize()
    a = marks.activity()
    (s0, e0), (s1, e1) = a.busy
    assert s0 == 0.0 and 0.0 < e0 <= s1 < e1  # one stream: in launch order
    assert e0 - s0 > 5 * (e1 - s1)  # ten times the cycles
    assert a.window == (0.0, e1)
    assert a.decode_step_s == pytest.approx([e0 - s0], rel=1e-3)
