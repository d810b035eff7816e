"""The comparison run: at every middle level, under each split kind, both sides are timed alone
and beside each other on their partition's streams and budgets, their rates and errors land
in the level's entry, and the JSON is rewritten after each level (a crash keeps the levels
done). On the CPU the GPU's parts are stand-ins with known times; on the GPU the tiny model
is measured at one level."""

import json
import types

import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.measure import comparison_run
from pdmux_triton.measure.timing import CoRun
from pdmux_triton.multiplex.partition import Budget, for_level
from pdmux_triton.spec.gpus import GPUSpec

GPU = GPUSpec("test", 48, (9, 0), 1.0, 100.0, 1.0)  # levels (32, 16) and (24, 24) in the middle
ALONE = {("decode", "grid_cap"): 2.0, ("decode", "green"): 2.5,  # ms of a call
         ("prefill", "grid_cap"): 10.0, ("prefill", "green"): 8.0}
SLOWER, COVERED = 1.5, 0.75  # beside the other side


class Side:
    """A workload that records the budgets it ran under."""

    def __init__(self, amount):
        self.amount, self.budgets = amount, []
        self.model = self.batch = None

    def run(self, budget):
        self.budgets.append(budget)

    def rate(self, ms):
        return self.amount / ms / 1e9


class Fakes:
    def __init__(self, fail_at_level=None):
        self.decode, self.prefill = Side(4e9), Side(6e12)
        self.opened, self.timed, self.corun = [], [], []
        self.fail_at_level = fail_at_level

    def open(self, spec):
        fakes, level = self, 1 + len(self.opened) // 2

        class Part:
            prefill_sms, decode_sms = spec.prefill_sms, spec.decode_sms
            prefill_budget, decode_budget = Budget(spec.prefill_sms), Budget(spec.decode_sms)
            prefill_stream, decode_stream = ("prefill", spec.kind), ("decode", spec.kind)
            closed = False

            def __enter__(self):
                assert all(p.closed for p in fakes.opened), "a partition is still open"
                fakes.opened.append(self)
                return self

            def __exit__(self, *exc):
                self.closed = True

        Part.spec, Part.level = spec, level
        return Part()

    def time_alone(self, fn, stream, graph, repeats=3):
        fn()
        self.timed.append((stream, graph, repeats))
        return ALONE[stream]

    def time_corun(self, fn, stream, graph, fn_alone_ms, background, bg_stream, bg_graph,
                   bg_alone_ms, target_ms=25.0):
        if self.opened[-1].level == self.fail_at_level:
            raise PdmuxError("the GPU fell over")
        assert (fn_alone_ms, bg_alone_ms) == (ALONE[stream], ALONE[bg_stream])
        self.corun.append((stream, graph, bg_stream, bg_graph, target_ms))
        return CoRun(fn_alone_ms * SLOWER, COVERED)

    def install(self, monkeypatch):
        for name, value in (
                ("detect_gpu", lambda: GPU),
                ("DecodeStep", lambda spec, batch, context: self.decode),
                ("PrefillLayers", lambda spec, tokens, layers: self.prefill),
                ("torch", types.SimpleNamespace(randn=lambda *a, **kw: None, bfloat16=None)),
                ("PartitionStreams", types.SimpleNamespace(open=self.open)),
                ("time_alone", self.time_alone), ("time_corun", self.time_corun),
                ("probe", lambda part, pf, df, grid_cap: {
                    "shared_sms": 0 if part.spec.kind == "green" else grid_cap // 4})):
            monkeypatch.setattr(comparison_run, name, value)


def test_every_middle_level_is_measured_under_both_kinds(monkeypatch, tmp_path):
    fakes = Fakes()
    fakes.install(monkeypatch)
    lines = []
    out = tmp_path / "compare.json"
    result = comparison_run.run_compare("tiny", 4, 97, 256, out, log=lines.append)
    levels = result["summary"]["levels"]
    assert [(e["level"], e["prefill_sms"], e["decode_sms"]) for e in levels] == [
        (1, 32, 16), (2, 24, 24)]
    assert [p.spec for p in fakes.opened] == [for_level(lv, k, 48) for lv in ((32, 16), (24, 24))
                                              for k in ("grid_cap", "green")]
    assert all(p.closed for p in fakes.opened)
    # decode replays graphs on the decode stream, prefill launches eagerly on its own
    for kind in ("grid_cap", "green"):
        assert fakes.timed.count((("decode", kind), True, 3)) == 2
        assert fakes.timed.count((("prefill", kind), False, 1)) == 2
        assert fakes.corun.count((("decode", kind), True, ("prefill", kind), False, 25.0)) == 2
        assert fakes.corun.count((("prefill", kind), False, ("decode", kind), True, 60)) == 2
    assert [b.num_sms for b in fakes.decode.budgets] == [16, 16, 24, 24]
    assert [b.num_sms for b in fakes.prefill.budgets] == [32, 32, 24, 24]
    d = levels[0]["decode"]["grid_cap"]
    assert d == {"alone_ms": 2.0, "corun_ms": 3.0, "alone_tbps": 2.0, "corun_tbps": 4 / 3,
                 "covered": COVERED}
    p = levels[1]["prefill"]["green"]
    assert p == {"alone_ms": 8.0, "corun_ms": 12.0, "alone_tflops": 750.0, "corun_tflops": 500.0,
                 "covered": COVERED}
    assert levels[0]["telemetry"] == {"grid_cap": {"shared_sms": 12}, "green": {"shared_sms": 0}}
    # grid cap against green: decode 2.0 vs 1.6 TB/s, prefill 600 vs 750 TFLOP/s
    assert levels[1]["decode_error_pct"] == pytest.approx(25.0)
    assert levels[1]["prefill_alone_error_pct"] == pytest.approx(-20.0)
    assert (result["model"], result["decode_batch"], result["context"],
            result["prefill_tokens"], result["gpu"]) == ("tiny", 4, 97, 256, "test")
    assert json.loads(out.read_text()) == result
    assert len(lines) == 4 and lines[0].startswith("level 1 grid_cap 32/16: decode 2.00 -> 3.00 ms")
    assert lines[0].endswith("shared SMs 12")


def test_a_crash_keeps_the_levels_already_measured(monkeypatch, tmp_path):
    fakes = Fakes(fail_at_level=2)
    fakes.install(monkeypatch)
    out = tmp_path / "compare.json"
    with pytest.raises(PdmuxError, match="the GPU fell over"):
        comparison_run.run_compare("tiny", 4, 97, 256, out, log=lambda line: None)
    saved = json.loads(out.read_text())
    assert [e["level"] for e in saved["summary"]["levels"]] == [1]
    assert "decode_error_pct" in saved["summary"]["levels"][0]
    assert fakes.opened[-1].closed  # the failing level's partition was closed


@pytest.mark.gpu
def test_the_tiny_model_is_measured_at_one_level_on_the_gpu(monkeypatch, tmp_path):
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    level = (sms - 52, 52)
    monkeypatch.setattr(comparison_run, "sglang_rules", types.SimpleNamespace(
        stream_groups=lambda total, major: [(total, 0), level, (0, total)]))
    out = tmp_path / "compare.json"
    result = comparison_run.run_compare("tiny", 4, 64, 128, out, log=lambda line: None)
    (entry,) = result["summary"]["levels"]
    assert (entry["level"], entry["prefill_sms"], entry["decode_sms"]) == (1, *level)
    for kind in ("grid_cap", "green"):
        d, p = entry["decode"][kind], entry["prefill"][kind]
        assert d["alone_ms"] > 0 and d["corun_ms"] > 0 and 0 <= d["covered"] <= 1
        assert p["alone_tflops"] > 0 and p["corun_tflops"] > 0 and 0 <= p["covered"] <= 1
        assert entry["telemetry"][kind]["prefill_sms_used"] > 0
    assert entry["telemetry"]["green"]["shared_sms"] == 0
    assert json.loads(out.read_text()) == result
