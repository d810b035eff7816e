"""The GC watch: every collection inside the block is counted with the time it held the host,
none outside it, and the callback leaves on exit, also when the block raises."""

import gc

import pytest

from pdmux_triton.gpu.gc_watch import GcWatch


@pytest.fixture
def _no_automatic_collections():
    """Only the collections a test asks for (gc.collect runs, and calls back, while disabled)."""
    gc.disable()
    yield
    gc.enable()


def test_collections_inside_the_block_are_counted_and_timed(_no_automatic_collections):
    with GcWatch() as watch:
        garbage = []
        garbage.append(garbage)  # a cycle only the collector frees
        del garbage
        gc.collect()
        gc.collect(0)
    assert watch.collections == 2
    assert 0 < watch.pause_s < 10
    gc.collect()
    assert watch.collections == 2  # outside: not counted
    assert watch._callback not in gc.callbacks


def test_the_callback_leaves_when_the_block_raises():
    with pytest.raises(ValueError):
        with GcWatch() as watch:
            raise ValueError("inside")
    assert watch._callback not in gc.callbacks
