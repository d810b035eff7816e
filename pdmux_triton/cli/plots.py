"""Plots of calibrations, comparisons and served runs (matplotlib, headless). Each says in its
title what it shows, on which GPU and model, measured or simulated; axes are linear with plain
tick labels, and every point lies inside them."""

from __future__ import annotations

from pathlib import Path

from pdmux_triton.cost.measured_inputs import at_own_settings
from pdmux_triton.errors import PdmuxError
from pdmux_triton.measure.comparison_errors import EMULATIONS
from pdmux_triton.serve import metrics


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PdmuxError("plots need matplotlib: pip install 'pdmux-triton[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _plain(ax, top: float) -> None:
    """Linear y from 0 to just above the highest point, ticks as plain numbers."""
    ax.set_ylim(0, top * 1.08 if top > 0 else 1)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.grid(alpha=0.3)


def _save(fig, plt, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def calibration(points: list[dict], gpu: str, model: str, path: Path) -> None:
    """Bandwidth vs SMs: a panel per workload, a line per (kind, state, CTAs per SM)."""
    plt = _pyplot()
    points = [p for p in points if at_own_settings(p)]
    workloads = sorted({p["workload"] for p in points})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 4.3), squeeze=False)
    styles = {("grid_cap", "alone"): ("tab:blue", "-"), ("grid_cap", "corun"): ("tab:blue", "--"),
              ("green", "alone"): ("tab:green", "-"), ("green", "corun"): ("tab:green", "--")}
    for ax, wl in zip(axes[0], workloads):
        curves: dict[tuple, list] = {}
        for p in points:
            if p["workload"] == wl:
                curves.setdefault((p["kind"], p["state"], p["ctas_per_sm"]), []).append(
                    (p["sms"], p["tbps"]))
        for (kind, state, ctas), pts in sorted(curves.items()):
            color, style = styles[(kind, state)]
            pts.sort()
            ax.plot([b for b, _ in pts], [r for _, r in pts], color=color, linestyle=style,
                    linewidth=2.0 if ctas == 1 else 0.8, alpha=1.0 if ctas == 1 else 0.6,
                    label=f"{kind} {state}" + ("" if ctas == 1 else f" x{ctas} CTAs/SM"))
        ax.set_title(wl)
        ax.set_xlabel("SMs")
        ax.set_ylabel("TB/s")
        _plain(ax, max(p["tbps"] for p in points if p["workload"] == wl))
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Decode bandwidth vs SM budget, measured on {gpu} ({model}); dashed: beside a "
                 f"prefill", fontsize=10)
    fig.tight_layout()
    _save(fig, plt, path)


def compare(levels: list[dict], gpu: str, model: str, path: Path) -> None:
    """Per level: each emulation's error against green contexts, each side, co-running and
    alone (compare measures green and at least one emulation)."""
    if not levels:
        raise PdmuxError("no level was measured: nothing to plot")
    plt = _pyplot()
    labels = [f"{e['prefill_sms']}/{e['decode_sms']}" for e in levels]
    x = range(len(levels))
    fig, ax = plt.subplots(figsize=(1.2 * len(levels) + 3, 4.3))
    series = [(f"{prefix}{key}", f"{kind.replace('_', ' ')}: {label}")
              for kind, prefix in EMULATIONS.items() if f"{prefix}decode_error_pct" in levels[0]
              for key, label in (("decode_error_pct", "decode, co-running"),
                                 ("prefill_error_pct", "prefill, co-running"),
                                 ("decode_alone_error_pct", "decode, alone"),
                                 ("prefill_alone_error_pct", "prefill, alone"))]
    width = 0.8 / len(series)
    for i, (key, label) in enumerate(series):
        ax.bar([xi + (i - (len(series) - 1) / 2) * width for xi in x], [e[key] for e in levels],
               width, label=label)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("level (prefill/decode SMs)")
    ax.set_ylabel("emulation vs green context, %")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"Emulated partitions vs green contexts, measured on {gpu} ({model})",
                 fontsize=10)
    fig.tight_layout()
    _save(fig, plt, path)


def timeline(results: dict, title: str, path: Path) -> None:
    """Every token's ITL against time, a panel per strategy, prefill windows shaded."""
    plt = _pyplot()
    names = list(results)
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 1.8 * len(names) + 1.0), sharex=True,
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        res = results[name]
        pts = metrics.intervals(res)
        ax.plot([t for t, _ in pts], [d * 1e3 for _, d in pts], ".", markersize=2)
        for a, b in metrics.prefill_windows(res):
            ax.axvspan(a, b, color="orange", alpha=0.15)
        ax.set_ylabel("ITL ms")
        ax.set_title(name, fontsize=9, loc="left")
        _plain(ax, max((d * 1e3 for _, d in pts), default=1.0))
    axes[-1, 0].set_xlabel("time, s (shaded: a prompt being prefilled)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, plt, path)


def capacity(result: dict, title: str, path: Path) -> None:
    """SLO attainment against request rate, a line per strategy (measured solid, simulated
    dashed), the attainment asked for as a line and each goodput capacity as a dot on it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    target = result["criteria"]["attainment"]
    summary = result["summary"]["strategies"]
    colors = dict(zip(summary, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4))
    top = 0.0
    for mode, style in (("gpu", "-"), ("simulated", "--")):
        for name in summary:
            pts = sorted((p["rate"], p["slo_attainment"]) for p in result["points"]
                         if p["mode"] == mode and p["strategy"] == name
                         and p.get("slo_attainment") is not None)
            if not pts:
                continue
            top = max(top, pts[-1][0])
            ax.plot(*zip(*pts), style, marker="o", markersize=3, color=colors[name],
                    label=f"{name} ({'measured' if mode == 'gpu' else 'simulated'})")
            key = "goodput_capacity_rps" if mode == result["mode"] else "simulated_goodput_capacity_rps"
            cap = summary[name].get(key)
            if cap:
                ax.plot([cap], [target], "D" if mode == "gpu" else "s", color=colors[name],
                        markersize=7, markerfacecolor="white" if mode == "simulated" else None)
    ax.axhline(target, color="black", linewidth=0.8, linestyle=":")
    ax.set_xlim(0, top * 1.05 if top else 1)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("request rate, req/s (markers on the dotted line: goodput capacity)")
    ax.set_ylabel("share of requests meeting both SLOs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    _save(fig, plt, path)
