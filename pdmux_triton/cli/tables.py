"""Every table the tool prints: columns sized to their contents, two spaces apart, units in
the headers, "-" where a figure does not apply. Plots are in `plots`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pdmux_triton.experiments import capacity_search
from pdmux_triton.experiments.capacity import ON_TWO_EXECUTORS
from pdmux_triton.measure.comparison_errors import EMULATIONS
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.results import SHIPPED_PREFIX


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """Text columns, left- ('l') or right-aligned ('r') by `align`; by default the first
    column left, the rest (figures) right."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    align = align or "l" + "r" * (len(headers) - 1)

    def line(cells):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w)
                         for c, w, a in zip(cells, widths, align)).rstrip()
    return "\n".join([line(headers), *(line(r) for r in rows)])


def cell(value, fmt: str = ".1f") -> str:
    """A figure, "-" for None; a fixed-point figure too small for its decimals keeps two
    significant digits (a tiny model's steps are microseconds, not 0.0 ms)."""
    if value is None:
        return "-"
    if fmt.endswith("f") and fmt[-2:-1].isdigit() and 0 < abs(value) < 10 ** (1 - int(fmt[-2])):
        return format(value, f"{fmt[:-3]}.{1 - math.floor(math.log10(abs(value)))}f")
    return format(value, fmt)


def _columns(spec: Sequence[tuple[str, Callable[[dict], str]]], records: Sequence[dict]) -> str:
    return table([title for title, _ in spec], [[f(r) for _, f in spec] for r in records])


# --- estimate ------------------------------------------------------------------------------

def estimate_table(sc, rows) -> str:
    """`estimate`'s rows for a scenario (estimate.Scenario, estimate.Row)."""
    head = (f"{sc.model.name} on {sc.gpu.name} ({sc.gpu.sms} SMs, {sc.gpu.hbm_tbps:g} TB/s, "
            f"{sc.gpu.bf16_tflops:g} bf16 TFLOP/s): {sc.decode_batch} requests decoding at "
            f"{sc.context} tokens of context, one {sc.prompt}-token prompt arrives")
    spec = [("approach", lambda r: r.approach),
            ("SMs prefill/decode", lambda r: "-" if r.prefill_sms is None
             else f"{r.prefill_sms}/{r.decode_sms}"),
            ("ITL ms", lambda r: cell(r.itl_ms)),
            ("prefill ms", lambda r: cell(r.prefill_ms)),
            ("tokens during prefill", lambda r: cell(r.tokens_during_prefill, "d")),
            ("steps", lambda r: cell(r.steps, "d"))]
    return head + "\n" + _columns(spec, rows)


# --- levels and advice ---------------------------------------------------------------------

def levels_table(gpu, config: sglang_rules.PDMuxConfig, levels, ranges) -> str:
    min_part, granularity = sglang_rules.arch_constraints(gpu.cc_major)
    lines = [f"{gpu.name}: {gpu.sms} SMs, compute capability {gpu.cc[0]}.{gpu.cc[1]} "
             f"(green-context parts: at least {min_part} SMs, multiples of {granularity})"]
    notes = {0: "prefill only", len(levels) - 1: "decode only"}
    lines.append(table(["level", "prefill SMs", "decode SMs", ""],
                       [[str(i), str(p), str(d), notes.get(i, "")]
                        for i, (p, d) in enumerate(levels)], align="rrrl"))
    rule = ("manual divisions" if config.manual_divisions
            else f"decode_bs_divisor {config.decode_bs_divisor}")
    lines.append(f"decode batch size while a prefill runs -> level ({rule}):")
    rows = []
    for first, last, level in ranges:
        span = f"{first}+" if last is None else f"{first}" if first == last else f"{first}-{last}"
        p, d = levels[level]
        rows.append([span, f"level {level} ({p}/{d})"])
    lines.append(table(["decode batch", "level (prefill/decode SMs)"], rows, align="ll"))
    return "\n".join(lines)


def advice_table(spec, gpu, context: int, itl_ms: float, kind: str, advised) -> str:
    lines = [f"{spec.name} on {gpu.name} at {context} tokens of context, decode step <= "
             f"{itl_ms:g} ms beside a prefill ({kind} calibration):",
             table(["prefill SMs", "decode SMs", "decode batch", "predicted step ms"],
                   [[str(a.prefill_sms), str(a.decode_sms), f"{a.first_batch}-{a.last_batch}",
                     f"{a.itl_ms:.1f}"] for a in advised]),
             f"a decode batch above {advised[-1].last_batch} misses the target on every split"]
    return "\n".join(lines)


# --- served runs ---------------------------------------------------------------------------

def cost_model_line(inputs: dict) -> str:
    """What priced a simulated run's steps (from its settings, `RunSettings.as_dict()`), and
    how far its figures can be trusted."""
    files = [k for k in ("calibration", "compare", "host_costs") if inputs.get(k)]
    if len(files) == 3 and all(str(inputs[k]).startswith(SHIPPED_PREFIX) for k in files):
        return (f"cost model: the {inputs['gpu']['name']}'s calibration, comparison and host "
                f"costs shipped with the tool (measured there; README, 'How far a simulation "
                f"sits from a measurement', gives its error)")
    if len(files) == 3:
        return ("cost model: the calibration, comparison and host costs given (its error is "
                "known only where it was measured beside the GPU, as `capacity` on a GPU does)")
    lacking = {"calibration": f"decode at min(1, SMs / S_SAT {inputs['s_sat']:g}) of "
                              f"{inputs['bw_eff']:g} x HBM bandwidth",
               "compare": f"prefill at {inputs['mfu']:g} of the bf16 rate on its SMs",
               "host_costs": "no host time between kernels"}
    missing = "; ".join(v for k, v in lacking.items() if k not in files)
    kinds = ("; pdmux_grid_cap and pdmux_green are priced alike without a calibration"
             if "calibration" not in files and len(inputs.get("kinds", ())) > 1 else "")
    what = "partly calibrated" if files else "first-order and uncalibrated"
    return (f"cost model: {what} ({missing}{kinds}): it can rank strategies wrongly; measure, "
            f"or pass --calibration, --compare and --host-costs measured on this GPU")


def strategy_table(rows: list[dict], idle_known: bool = True) -> str:
    """`run`'s row per strategy; `idle_known` false where the run had no time between kernels
    to count (a simulation without host costs and without arrival gaps): its GPU idle is "-"."""
    spec = [("strategy", lambda r: r["strategy"]),
            ("ITL p50 ms", lambda r: cell(r.get("itl_p50_ms"))),
            ("ITL p99 ms", lambda r: cell(r.get("itl_p99_ms"))),
            ("ITL in prefill p50 ms", lambda r: cell(r.get("itl_during_prefill_p50_ms"))),
            ("decode step p50 ms", lambda r: cell(r.get("decode_gpu_p50_ms"))),
            ("prefill p50 ms", lambda r: cell(r.get("prefill_ms"), ".0f")),
            ("tokens in prefill mean", lambda r: cell(r.get("tokens_during_prefill"))),
            ("TTFT p50 ms", lambda r: cell(r.get("ttft_p50_ms"), ".0f")),
            ("GPU idle", lambda r: cell(r.get("gpu_idle_frac") if idle_known else None, ".1%"))]
    return _columns(spec, rows)


# --- calibration and comparison ------------------------------------------------------------

def calibration_table(summary: dict) -> str:
    rows = []
    for wl, kinds in summary.items():
        for kind, states in kinds.items():
            for state, fit in states.items():
                rows.append([wl, kind, state, f"{fit['peak_tbps']:.2f}", f"{fit['s_sat_fit']:.1f}",
                             str(fit["s_sat_95"])])
    return table(["workload", "kind", "state", "peak TB/s", "S_SAT fit (SMs)",
                  "S_SAT 95% (SMs)"], rows)


def compare_table(levels: list[dict]) -> str:
    """Per level and measured kind: the decode step alone and co-running, prefill's co-running
    rate, each emulation's error against green contexts, and the SMs both sides used."""
    kinds = list(levels[0]["decode"]) if levels else []
    emulations = [(k, p) for k, p in EMULATIONS.items() if k in kinds and "green" in kinds]
    names = {k: k.replace("_", " ") for k in kinds}
    rows = []
    for e in levels:
        d, p = e["decode"], e["prefill"]
        rows.append([str(e["level"]), f"{e['prefill_sms']}/{e['decode_sms']}",
                     *(f"{d[k]['alone_ms']:.2f} -> {d[k]['corun_ms']:.2f}" for k in kinds),
                     *(f"{p[k]['corun_tflops']:.0f}" for k in kinds),
                     *(f"{e[f'{pre}{side}_error_pct']:.1f}" for _, pre in emulations
                       for side in ("decode", "prefill")),
                     *(str(e["telemetry"][k]["shared_sms"]) for k in kinds if k != "green")])
    return table(["level", "SMs p/d",
                  *(f"decode ms {names[k]} (alone -> corun)" for k in kinds),
                  *(f"prefill TFLOP/s {names[k]}" for k in kinds),
                  *(f"{names[k]} {side} err %" for k, _ in emulations
                    for side in ("decode", "prefill")),
                  *(f"SMs both sides used ({names[k]})" for k in kinds if k != "green")], rows)


def serving_table(rows: list[dict]) -> str:
    """What a serving benchmark reports, per strategy: latencies, throughput, SLO attainment."""
    spec = [("strategy", lambda r: r["strategy"]),
            ("TTFT p50/p99 ms", lambda r: f"{cell(r.get('ttft_p50_ms'), '.0f')} / "
                                          f"{cell(r.get('ttft_p99_ms'), '.0f')}"),
            ("TPOT p50/p99 ms", lambda r: f"{cell(r.get('tpot_p50_ms'))} / "
                                          f"{cell(r.get('tpot_p99_ms'))}"),
            ("ITL p99 ms", lambda r: cell(r.get("itl_p99_ms"))),
            ("E2E p50/p99 s", lambda r: f"{cell(_s(r.get('e2e_p50_ms')))} / "
                                        f"{cell(_s(r.get('e2e_p99_ms')))}"),
            ("queue p50 s", lambda r: cell(r.get("sched_delay_p50_s"), ".2f")),
            ("served req/s", lambda r: cell(r.get("request_throughput_rps"), ".2f")),
            ("tok/s", lambda r: cell(r.get("output_throughput_tps"), ".0f")),
            ("SLO met", lambda r: cell(r.get("slo_attainment"), ".0%")),
            ("goodput req/s", lambda r: cell(r.get("goodput_rps"), ".2f")),
            ("level changes / drain ms", lambda r: f"{cell(r.get('level_changes'), 'd')} / "
                                                   f"{cell(r.get('level_drain_ms'), '.0f')}"),
            ("prefix hit / blocks evicted",
             lambda r: f"{cell(r.get('prefix_hit_rate'), '.0%')} / "
                       f"{cell(r.get('prefix_evicted_blocks'), '.0f')}"),
            ("lost", lambda r: cell(r.get("requests_lost"), "d"))]
    return _columns(spec, [r for r in rows if r.get("requests_served")])


def _s(ms):
    return None if ms is None else ms / 1e3


def _median(row: dict, key: str):
    found = (row.get("latency_sim_error_pct") or {}).get(key)
    return None if found is None else found["median"]


def capacity_table(result: dict) -> str:
    """Each strategy's capacities (req/s), and the simulation's beside a measurement."""
    measured = result["mode"] == "gpu"
    c = result["criteria"]
    inputs = result["inputs"]
    traffic = (f"trace {inputs['trace']} ({result['trace_rate_rps']:.3g} req/s as recorded)"
               if "trace_rate_rps" in result
               else f"{inputs['lengths']} lengths, {inputs['count']} requests a point")
    head = (f"capacity, {result['model']} on {result['gpu']} ({'measured' if measured else 'simulated'}"
            f", {traffic}): TTFT <= "
            f"{c['slo_ttft_ms']:g} ms and TPOT <= {c['slo_tpot_ms']:g} ms for "
            f"{c['attainment']:.0%} of requests (goodput); P99 TBT <= {c['slo_tpot_ms']:g} ms and "
            f"median queueing <= {c['max_sched_delay_s']:g} s (Sarathi-Serve); prefix cache "
            f"{inputs.get('prefix_cache', 'off')}\n"
            f"{'the simulation beside it, ' if measured else ''}{cost_model_line(inputs)}")
    limit = "highest rate served" if measured else "search limit"

    def capacity(n: str, criterion: str) -> str:
        row = rows[n]
        below = row.get("below_rps", {}).get(criterion)
        if below is not None:  # it failed at every rate served
            return f"< {below:.2f} (lowest rate served)"
        figure = cell(row[f"{criterion}_capacity_rps"], ".2f")
        each = row.get("capacity_by_repeat_rps", {}).get(criterion)
        if each and None not in each:  # the median of the repeats: their range beside it
            figure += f" [{min(each):.2f}-{max(each):.2f}]"
        if "x_trace_rate" in row and row["x_trace_rate"][criterion] is not None:
            figure += f" ({row['x_trace_rate'][criterion]:.2f}x)"
        if row.get("steady", {}).get(criterion) is False:
            figure += " burst"
        return f">= {figure} ({limit})" if row["at_least"][criterion] else figure
    spec = [("strategy", lambda n: n),
            ("goodput capacity req/s", lambda n: capacity(n, "goodput")),
            ("Sarathi capacity req/s", lambda n: capacity(n, "sarathi"))]
    if any(row.get("prefix_hit_rate") is not None
           for row in result["summary"]["strategies"].values()):
        spec.append(("prefix hit at goodput capacity",
                     lambda n: cell(rows[n].get("prefix_hit_rate"), ".1%")))
    if measured:
        spec += [("simulated at those rates",
                  lambda n: " / ".join(_compared(rows[n], c) for c in ("goodput", "sarathi"))),
                 ("sim error % goodput / Sarathi",
                  lambda n: " / ".join(_sim_error(rows[n], c) for c in ("goodput", "sarathi"))),
                 ("sim error % TTFT / TPOT p99 (median)",
                  lambda n: " / ".join(cell(_median(rows[n], k), "+.0f")
                                       for k in ("ttft_p99_ms", "tpot_p99_ms"))),
                 ("compiles", lambda n: cell(rows[n]["compiles_during_measurement"], "d")),
                 ("lost", lambda n: cell(rows[n]["requests_lost"], "d"))]
    spec.append(("points", lambda n: cell(rows[n]["points"], "d")))
    rows = result["summary"]["strategies"]
    return head + "\n" + table([t for t, _ in spec], [[f(n) for _, f in spec] for n in rows])


def _from_all_rates(row: dict, criterion: str) -> bool:
    return row.get("sim_error_read_from", {}).get(criterion) == "all simulated rates"


def _compared(row: dict, criterion: str) -> str:
    """The simulated capacity the error is read against: at the measured rates, or, marked
    `*`, the crossing over every simulated rate (`capacity_notes`)."""
    if _from_all_rates(row, criterion):
        return f"{cell(row[f'simulated_{criterion}_capacity_compared_rps'], '.2f')}*"
    return cell(row[f"simulated_{criterion}_capacity_at_measured_rates_rps"], ".2f")


def _sim_error(row: dict, criterion: str) -> str:
    """The simulation's capacity error: at most the figure where the measured capacity is
    only a bound (it met the criterion at every rate served), marked `*` where the simulated
    capacity was read from every simulated rate."""
    error = row["sim_error_pct"][criterion]
    if error is None:
        return cell(error)
    return (f"{'<= ' if row.get('at_least', {}).get(criterion) else ''}{cell(error, '+.0f')}"
            f"{'*' if _from_all_rates(row, criterion) else ''}")


def capacity_notes(result: dict, count: int) -> list[str]:
    """What the capacity table's marks mean: a "burst" label, and what to do about it; a
    starred simulation error."""
    rows = result["summary"]["strategies"]
    notes = []
    bursts = sorted({n for n, row in rows.items() for c, ok in row.get("steady", {}).items()
                     if ok is False})
    if bursts:
        notes.append(
            f"burst: {', '.join(bursts)} met the criterion on a stream too short for its rate "
            f"(the SLO attainment of the later half of its {count} requests by arrival was more "
            f"than {capacity_search.STEADY_POINTS * 100:g} points from the whole's): not a "
            f"steady state (a later half below the whole: the queue was still building, and "
            f"the capacity reads higher than the GPU sustains; above it: the earlier arrivals "
            f"came denser); serve more requests a point (--count "
            f"{2 * count} or more"
            f"{', a longer --trace-count' if 'trace_rate_rps' in result else ''})")
    if any(_from_all_rates(row, c) for row in rows.values()
           for c in row.get("sim_error_pct", {})):
        notes.append("*: the simulation met the criterion at every measured rate or at none, so "
                     "those rates only bound it; it is read from its crossing over all its "
                     "simulated rates instead")
    if any(row.get("sim_error_read_from", {}).get(c) == ON_TWO_EXECUTORS
           for row in rows.values() for c in row.get("sim_error_pct", {})):
        notes.append("-: the simulation met the criterion at every measured rate or at none, "
                     "and the measured points were served on more than one executor (some "
                     "before today's chunked steps), so no one simulated crossing compares "
                     "with them: measure the stale ones again")
    if any(row.get("simulated_on_run_hosts") for row in rows.values()):
        notes.append("simulated at those rates: each measured point priced on the host its run "
                     "timed (an eager layer's launch, `host_layer_p50_ms`), as `Overheads.on_host` "
                     "moves the cost model's host costs")
    stale = {n: row["stale_mixed_step_points"] for n, row in rows.items()
             if row.get("stale_mixed_step_points")}
    if stale:
        notes.append(
            f"stale: {', '.join(f'{n} ({k} points)' for n, k in sorted(stale.items()))} read "
            f"from points served before today's chunked steps (decode rows in the extend "
            f"kernel's tiles, or the whole chunk beside them where SGLang's mixed chunk counts "
            f"them in it): the simulation beside them prices the executor they ran on; the "
            f"simulated capacity prices today's; measure them again (drop --offline)")
    if any(row["at_least"][c] and row.get("sim_error_pct", {}).get(c) is not None
           for row in rows.values() for c in row["at_least"]):
        notes.append("<=: the measured capacity is only a bound (the strategy met the criterion "
                     "at every rate served), so the simulation's error is at most the figure")
    return notes


def host_costs_table(data: dict) -> str:
    """calibrate --host-costs' cases: a prefill's first eager layer's launch time and its later
    layers' (a file from before replays has none: '-') by tokens, a decode round's wall time by
    batch, each beside its GPU time."""
    lines = [f"{'tokens':>7} {'layer host ms':>14} {'later layers':>13} {'layer GPU ms':>13}"]
    lines += [f"{r['tokens']:>7} {r['host_s'] * 1e3:>14.3f} "
              f"{cell(r['later_layer_s'] * 1e3 if 'later_layer_s' in r else None, '.3f'):>13} "
              f"{r['gpu_s'] * 1e3:>13.3f}"
              for r in data["eager_layer"]]
    lines.append(f"{'batch':>7} {'round wall ms':>14} {'step GPU ms':>13}")
    lines += [f"{r['batch']:>7} {r['wall_s'] * 1e3:>14.3f} {r['gpu_s'] * 1e3:>13.3f}"
              for r in data["decode_round"]]
    return "\n".join(lines)
