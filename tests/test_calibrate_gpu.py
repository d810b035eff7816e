"""The sweep on the GPU resumes from its store: with every point saved it measures nothing."""

from pdmux_triton.calibrate import SweepPlan, point_store
from pdmux_triton.calibrate_gpu import run_sweep


def test_run_sweep_with_nothing_left_needs_no_gpu(tmp_path):
    plan = SweepPlan(("stream_read",), ("green",), (1,), (8, 132), corun=False)
    store = point_store(tmp_path / "p.jsonl")
    for key in plan.keys():
        store.add(key, ms=1.0, tbps=float(key.sms))
    lines = []
    run_sweep(plan, store, log=lines.append)  # resumes: nothing to measure, no GPU touched
    assert lines == ["calibrate: 0 points to measure (2 already saved)"]
