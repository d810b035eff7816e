"""The sweep on the GPU resumes from its store (with every point saved it measures nothing)
and holds one decode batch's workloads at a time."""

import weakref
from dataclasses import replace
from unittest import mock

import pytest

from pdmux_triton.measure import calibration_run
from pdmux_triton.measure.calibration_run import run_sweep
from pdmux_triton.measure.calibration_sweep import SweepPlan, point_store
from pdmux_triton.measure.workloads import make_decode_workload


def test_run_sweep_with_nothing_left_needs_no_gpu(tmp_path):
    plan = SweepPlan(("stream_read",), ("green",), (1,), (8, 132), corun=False)
    store = point_store(tmp_path / "p.jsonl")
    for key in plan.keys():
        store.add(key, ms=1.0, tbps=float(key.sms))
    lines = []
    run_sweep(plan, store, log=lines.append)  # resumes: nothing to measure, no GPU touched
    assert lines == ["calibrate: 0 points to measure (2 already saved)"]


@pytest.mark.gpu
def test_run_sweep_holds_one_decode_batch_at_a_time(tmp_path):
    """Each batch's (and context's) decode step holds its own weights and KV cache: the sweep
    frees one's workloads before it makes the next (three large batches together do not
    fit)."""
    made = []

    def tracked(name, spec, batch, context):
        assert all(ref() is None for ref in made), "a workload of the last batch is alive"
        wl = make_decode_workload(name, spec, batch, context)
        made.append(weakref.ref(wl))
        return wl

    plan = SweepPlan(("decode_step",), ("grid_cap",), (1,), (8, 132), corun=True, model="tiny",
                     batch=4, context=64, prefill_tokens=128, decode_batches=(2, 8),
                     decode_contexts=(128,))
    store = point_store(tmp_path / "p.jsonl")
    with mock.patch.object(calibration_run, "make_decode_workload", tracked):
        run_sweep(plan, store, log=lambda line: None)
    assert len(made) == 4 and all(store.has(k) for k in plan.keys())
    # a step at another context keeps the own context's rate its run measured on those SMs
    assert all(store.get(k)["own_context_tbps"] == store.get(replace(k, context=0))["tbps"]
               for k in plan.keys() if k.context)
    assert all(store.get(k)["tbps"] > 0 for k in plan.keys())


def test_a_step_at_another_context_keeps_the_own_rate_measured_beside_it(tmp_path):
    """The own context's point of the same SMs and state, where the store holds it."""
    from pdmux_triton.measure.calibration_sweep import PointKey
    store = point_store(tmp_path / "p.jsonl")
    own = PointKey("decode_step", "grid_cap", 1, "corun", 20)
    store.add(own, ms=10.0, tbps=2.5)
    assert calibration_run._own_context(store, replace(own, context=8192)) == {
        "own_context_tbps": 2.5}
    assert calibration_run._own_context(store, replace(own, context=8192, sms=28)) == {}
    assert calibration_run._own_context(store, own) == {}  # the own context itself
