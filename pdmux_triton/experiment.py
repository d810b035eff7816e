"""`pdmux-triton run`: one workload served by every strategy, measured or simulated.

Each strategy gets a fresh copy of the same requests (same seed) and a fresh executor; the
result rows are what the README's table shows, and what bench/results/run-<gpu>.json keeps.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

from pdmux_triton import metrics, policy, scheduler
from pdmux_triton.traffic import Request


@dataclass(frozen=True)
class Variant:
    name: str  # decode_only, prefill_first, chunked_2048, pdmux_grid_cap, ...
    strategy: str
    chunk: int = 0
    kind: str = "grid_cap"  # partition kind of the pd-mux levels


def variants(chunks: tuple[int, ...], kinds: tuple[str, ...]) -> list[Variant]:
    out = [Variant("decode_only", "prefill_first"), Variant("prefill_first", "prefill_first")]
    out += [Variant(f"chunked_{c}", "chunked", chunk=c) for c in chunks]
    out += [Variant(f"pdmux_{k}", "pdmux", kind=k) for k in kinds]
    return out


def run_all(requests: list[Request], make_executor: Callable[[Variant], object],
            config: policy.PDMuxConfig, chunks: tuple[int, ...], kinds: tuple[str, ...],
            log=print, warmup: bool = False) -> tuple[list[dict], dict[str, scheduler.RunResult]]:
    """Serve `requests` once per variant. decode_only serves the requests that are decoding
    from the start without the arriving prompts: the ITL baseline.

    With `warmup` each variant is served once untimed first, so kernel compilation and graph
    capture (once per shape) stay out of the measured run."""
    rows, results = [], {}
    for v in variants(chunks, kinds):
        reqs = copy.deepcopy(requests)
        if v.name == "decode_only":
            reqs = [r for r in reqs if r.warm]
            if not reqs:
                continue
        if warmup:
            log(f"warming up {v.name} ...")
            scheduler.run(v.strategy, make_executor(v), copy.deepcopy(reqs), chunk=v.chunk,
                          config=config)
        log(f"running {v.name} ...")
        result = scheduler.run(v.strategy, make_executor(v), reqs, chunk=v.chunk, config=config)
        summary = metrics.summarize(result)
        summary["strategy"] = v.name
        rows.append(summary)
        results[v.name] = result
    return rows, results


SUMMARY_KEYS = ("itl_p50_ms", "itl_p99_ms", "itl_during_prefill_p50_ms", "decode_gpu_p50_ms",
                "prefill_ms",
                "tokens_during_prefill", "ttft_p50_ms", "gpu_idle_frac")


def summary(rows: list[dict], total_sms: int, prefill_sms: int | None,
            estimate_rows: list[dict] | None = None) -> dict:
    """The run's summary: every strategy's headline figures, the targets' ratios and, when an
    estimate of the same scenario is given, its error against the measurement in percent."""
    out = {"strategies": {r["strategy"]: {k: r.get(k) for k in SUMMARY_KEYS} for r in rows},
           "targets": targets(rows, total_sms, prefill_sms)}
    if estimate_rows:
        est = next((e for e in estimate_rows if e["approach"].startswith("pdmux")), None)
        errors = {}
        for name, r in out["strategies"].items():
            if name.startswith("pdmux") and est and r["itl_during_prefill_p50_ms"]:
                errors[name] = {
                    "itl": (est["itl_ms"] - r["itl_during_prefill_p50_ms"])
                    / r["itl_during_prefill_p50_ms"] * 100,
                    "prefill": (est["prefill_ms"] - r["prefill_ms"]) / r["prefill_ms"] * 100}
        out["estimate_error_pct"] = errors
    return out


def targets(rows: list[dict], total_sms: int, prefill_sms: int | None) -> dict:
    """The issue's ratios: pd-mux ITL during prefill vs decode-only and vs chunked-512, and
    pd-mux prefill time vs prefill-first scaled by the SM share."""
    by = {r["strategy"]: r for r in rows}
    out = {}
    base = by.get("decode_only", {}).get("itl_p50_ms")
    pf = by.get("prefill_first", {}).get("prefill_ms")
    c512 = by.get("chunked_512", {}).get("itl_during_prefill_p50_ms")
    for name, r in by.items():
        if not name.startswith("pdmux"):
            continue
        itl = r.get("itl_during_prefill_p50_ms")
        out[name] = {
            "itl_during_prefill_vs_decode_only": itl / base if itl and base else None,
            "itl_during_prefill_vs_chunked_512": itl / c512 if itl and c512 else None,
            "prefill_vs_prefill_first_scaled": (r["prefill_ms"] / (pf * total_sms / prefill_sms)
                                                if r.get("prefill_ms") and pf and prefill_sms
                                                else None),
        }
    return out
