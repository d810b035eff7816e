"""Summaries and plots of calibration and comparison results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from pdmux_triton.errors import PdmuxError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PdmuxError("plots need matplotlib: pip install 'pdmux-triton[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def calibration_table(summary: dict) -> str:
    lines = [f"{'workload':<18} {'kind':<9} {'state':<6} {'peak TB/s':>9} {'S_SAT fit':>9} "
             f"{'S_SAT 95%':>9}"]
    for wl, kinds in summary.items():
        for kind, states in kinds.items():
            for state, fit in states.items():
                lines.append(f"{wl:<18} {kind:<9} {state:<6} {fit['peak_tbps']:>9.2f} "
                             f"{fit['s_sat_fit']:>9.1f} {fit['s_sat_95']:>9d}")
    return "\n".join(lines)


def plot_calibration(points: list[dict], path: Path) -> None:
    """Bandwidth vs SMs: a panel per workload, a line per (kind, state, ctas per SM)."""
    plt = _pyplot()
    workloads = sorted({p["workload"] for p in points})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 4), squeeze=False)
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
                    label=f"{kind} {state}" + ("" if ctas == 1 else f" x{ctas}"))
        ax.set_title(wl)
        ax.set_xlabel("SMs")
        ax.set_ylabel("TB/s")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare_table(levels: list[dict]) -> str:
    lines = [f"{'level':>5} {'SMs p/d':>8} {'decode ms gc/green (alone->corun)':>36} "
             f"{'prefill TFLOP/s gc/green':>26} {'dec err%':>8} {'pre err%':>8} {'shared SMs gc':>13}"]
    for e in levels:
        d, p = e["decode"], e["prefill"]
        lines.append(
            f"{e['level']:>5} {e['prefill_sms']:>4}/{e['decode_sms']:<3} "
            f"{d['grid_cap']['alone_ms']:>7.2f}->{d['grid_cap']['corun_ms']:<6.2f} / "
            f"{d['green']['alone_ms']:>6.2f}->{d['green']['corun_ms']:<6.2f} "
            f"{p['grid_cap']['corun_tflops']:>12.0f} / {p['green']['corun_tflops']:<11.0f} "
            f"{e['decode_error_pct']:>8.1f} {e['prefill_error_pct']:>8.1f} "
            f"{e['telemetry']['grid_cap']['shared_sms']:>13}")
    return "\n".join(lines)


def plot_compare(levels: list[dict], path: Path) -> None:
    """Per level: the emulation error of each side, co-running and alone."""
    plt = _pyplot()
    labels = [f"{e['prefill_sms']}/{e['decode_sms']}" for e in levels]
    x = range(len(levels))
    fig, ax = plt.subplots(figsize=(1.2 * len(levels) + 3, 4))
    series = [("decode_error_pct", "decode, co-running"), ("prefill_error_pct", "prefill, co-running"),
              ("decode_alone_error_pct", "decode, alone"), ("prefill_alone_error_pct", "prefill, alone")]
    width = 0.2
    for i, (key, label) in enumerate(series):
        ax.bar([xi + (i - 1.5) * width for xi in x], [e[key] for e in levels], width, label=label)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("level (prefill/decode SMs)")
    ax.set_ylabel("grid cap vs green context, %")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def strategy_table(rows: list[dict]) -> str:
    cols = [("strategy", "strategy", 16, "s"), ("ITL p50", "itl_p50_ms", 8, ".1f"),
            ("ITL p99", "itl_p99_ms", 8, ".1f"), ("ITL in prefill", "itl_during_prefill_p50_ms", 14, ".1f"),
            ("step GPU p50", "decode_gpu_p50_ms", 12, ".1f"),
            ("prefill ms", "prefill_ms", 10, ".0f"), ("tokens in prefill", "tokens_during_prefill", 17, ".1f"),
            ("TTFT p50", "ttft_p50_ms", 9, ".0f"), ("GPU idle", "gpu_idle_frac", 8, ".1%")]
    lines = [" ".join(f"{title:>{w}}" if i else f"{title:<{w}}" for i, (title, _, w, _) in enumerate(cols))]
    for r in rows:
        cells = []
        for i, (_, key, w, fmt) in enumerate(cols):
            v = r.get(key)
            text = "-" if v is None else format(v, fmt)
            cells.append(f"{text:>{w}}" if i else f"{text:<{w}}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def plot_timeline(results: dict, path: Path) -> None:
    """Every token's ITL against time, a panel per strategy, prefill windows shaded."""
    from pdmux_triton import metrics

    plt = _pyplot()
    names = list(results)
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 1.8 * len(names) + 0.6), sharex=True,
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        res = results[name]
        pts = metrics.intervals(res)
        ax.plot([t for t, _ in pts], [d * 1e3 for _, d in pts], ".", markersize=2)
        for a, b in metrics.prefill_windows(res):
            ax.axvspan(a, b, color="orange", alpha=0.15)
        ax.set_ylabel("ITL ms")
        ax.set_yscale("log")
        ax.set_title(name, fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time, s (shaded: a prompt being prefilled)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
