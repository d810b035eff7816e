"""Plots are written and say what they show."""

import pytest
from test_comparison_errors import level_entry

from pdmux_triton.cli import plots
from pdmux_triton.cost import step_cost
from pdmux_triton.measure import comparison_errors
from pdmux_triton.serve import scheduler
from pdmux_triton.serve.simulated import SimExecutor
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import prompt_during_decode

pytest.importorskip("matplotlib")


def test_calibration_plot(tmp_path):
    points = [{"workload": "decode_step", "kind": k, "state": s, "ctas_per_sm": c, "sms": b,
               "tbps": 4.0 * min(1, b / 66)} for k in ("grid_cap", "green")
              for s in ("alone", "corun") for c in (1, 2) for b in (8, 64, 132)]
    plots.calibration(points, "h200", "qwen3-8b", tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_compare_plot(tmp_path):
    entry = level_entry()
    entry.update(comparison_errors.level_errors(entry))
    plots.compare([entry], "h200", "qwen3-8b", tmp_path / "cmp.png")
    assert (tmp_path / "cmp.png").stat().st_size > 1000


def test_timeline_plot_keeps_every_point_inside_its_axes(tmp_path, monkeypatch):
    import matplotlib.figure

    gpu, model = gpu_preset("h200"), model_preset("qwen3-8b")
    x = SimExecutor(gpu, model, step_cost.SaturationLaw(4.0, 66),
                    step_cost.PrefillRate.fixed(989, 132, 0.5))
    result = scheduler.run("prefill_first", x, prompt_during_decode(model.vocab, decode_tokens=16))
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, *a, **k: figures.append(self))
    plots.timeline({"prefill_first": result}, "ITL of every token: qwen3-8b on h200", tmp_path / "t.png")
    (fig,) = figures
    assert fig._suptitle.get_text() == "ITL of every token: qwen3-8b on h200"
    ax = fig.axes[0]
    top = max(y for line in ax.lines for y in line.get_ydata())
    assert ax.get_yscale() == "linear" and top <= ax.get_ylim()[1]


def test_capacity_plot(tmp_path):
    pts = [{"mode": m, "strategy": "pdmux_grid_cap", "rate": r, "slo_attainment": a}
           for m in ("gpu", "simulated") for r, a in ((1, 1.0), (2, 0.95), (4, 0.5))]
    result = {"mode": "gpu", "criteria": {"attainment": 0.9}, "points": pts,
              "summary": {"strategies": {"pdmux_grid_cap": {"goodput_capacity_rps": 2.2,
                                                            "simulated_goodput_capacity_rps": 2.4}}}}
    plots.capacity(result, "capacity", tmp_path / "cap.png")
    assert (tmp_path / "cap.png").stat().st_size > 1000
