"""Prefix caching on Mooncake's traces: each strategy's goodput capacity with the cache on and
off, the hit rates behind them, and an independent count of what a cache could hit.

For each trace window (`--traces`, rows `--window START:COUNT` of the committed Mooncake FAST'25
traces, Qwen3-8B on `--gpu`: measuring, this machine's card; reading the points back or
simulating, the H200 unless named; priced by that card's bench/results files)
`pdmux-triton capacity` runs twice, `--prefix-cache on` and `off`,
each into its own folder under <out>/prefix-cache/ (its points resume). Without a GPU it
simulates (the search); on one it measures at `--rates` with the simulation beside, as
`capacity` does. Beside them, the window's hit rates counted without the serving loop, prompt
by prompt in arrival order: a cache that never evicts, and one that keeps the most recently
used blocks up to the card's KV cache for the model (what one GPU can hold, if no request
reserved any).

The SLOs default to TTFT <= 10 s and TPOT <= 50 ms: the conversation trace's prompts average
12K tokens and reach 40K, whose prefill alone takes seconds, so 2 s would fail every strategy
at any rate. Writes <out>/prefix-cache-<gpu>[-simulated].json; prints the table.

    python bench/prefix_cache.py                                    # simulated, both traces
    python bench/prefix_cache.py --traces conv --rates 1.5,2 --strategies pdmux_grid_cap,chunked_512
    python bench/prefix_cache.py --traces conv --rates 0.6 --strategies prefill_first --cache on
    python bench/prefix_cache.py --traces conv --window 3000:200 --offline   # those points again
    python bench/prefix_cache.py --traces conv --window 3000:200 --offline --gpu h100-sxm
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

from script import MEASURED_ON_H200, bench_inputs, bench_parser, card_inputs, finish, run_script

from pdmux_triton.cli.main import main as cli
from pdmux_triton.cli.parsing import choice, integer, listed, number
from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments.capacity import PointKey
from pdmux_triton.experiments.settings import MAX_WARM, RunSettings
from pdmux_triton.experiments.variants import DEFAULT_STRATEGIES
from pdmux_triton.results import PointStore, provenance, read_json, write_json
from pdmux_triton.serve.prefix_cache import BLOCK_TOKENS
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traces import load_trace

TRACES = {"conv": "bench/data/mooncake-fast25/conversation_trace.jsonl",
          "syn": "bench/data/mooncake-fast25/synthetic_trace.jsonl"}
WARM_REQUESTS = RunSettings.warm_requests  # capacity's default
PUBLISHED_GAIN = 3.06  # PD-mux's goodput over chunked prefill, Mooncake Tool&Agent, cache on


def window(text: str) -> tuple[int, int]:
    start, _, count = text.partition(":")
    try:
        return integer(0)(start), integer(50)(count)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r}: START:COUNT, rows of the trace (COUNT >= "
                                         f"50)") from None


def counted_hit_rates(path: str, start: int, count: int, kv_tokens: int,
                      max_tokens: int) -> dict:
    """The window's hit rates counted from its hash ids alone, prompt by prompt in arrival
    order (each reads its cached whole blocks short of its last token, then adds its own):
    with no eviction, and with the least recently used blocks evicted past `kv_tokens`."""
    trace = load_trace(path, max_tokens, "the model's context").replayed(start, count)
    rows = [json.loads(line) for line in open(path)]
    rows = [rows[line - 1] for line in trace.line.tolist()]
    out = {}
    for name, blocks in (("unbounded", None), ("lru_at_kv_capacity", kv_tokens // BLOCK_TOKENS)):
        cached: OrderedDict = OrderedDict()
        hit = total = 0
        for row in rows:
            ids, n = row["hash_ids"], row["input_length"]
            total += n
            k = 0
            while k < (n - 1) // BLOCK_TOKENS and tuple(ids[:k + 1]) in cached:
                k += 1
            hit += BLOCK_TOKENS * k
            for j in reversed(range(n // BLOCK_TOKENS)):  # the deepest first: evicted first,
                key = tuple(ids[:j + 1])                  # so no block outlives its parent
                cached[key] = None
                cached.move_to_end(key)
            while blocks is not None and len(cached) > blocks:
                cached.popitem(last=False)
        out[name] = hit / total
    return out


def measured_strategies(folder: Path, strategies, gpu: str) -> list[str]:
    """Those of `strategies` with a point measured on the `gpu` in `folder` (its point store)."""
    store = PointStore(folder / f"capacity-points-{gpu}.jsonl", PointKey)
    served = {p["strategy"] for p in store.points.values() if p["mode"] == "gpu"}
    return [s for s in strategies if s in served]


def capacity_run(args, path: str, start: int, count: int, cache: str, folder: Path,
                 strategies) -> dict:
    """`pdmux-triton capacity` on the window with the cache on or off: its result JSON."""
    argv = ["capacity", "--gpu", args.gpu, "--trace", path, "--trace-start", str(start),
            "--trace-count", str(count), "--prefix-cache", cache,
            "--strategies", ",".join(strategies), "--slo-ttft-ms", str(args.slo_ttft_ms),
            "--slo-tpot-ms", str(args.slo_tpot_ms), "--calibration", args.calibration,
            "--compare", args.compare, "--host-costs", args.host_costs, "--out", str(folder),
            "--json"]
    argv += (["--offline"] if args.offline else ["--rates", ",".join(map(str, args.rates)),
                                                   "--warm-requests", str(args.warm_requests)]
             if args.rates else ["--simulate"])
    with redirect_stdout(StringIO()):  # its JSON: read from the file it writes
        code = cli(argv)
    if code:
        raise PdmuxError(f"capacity on {path} rows {start}+{count} (cache {cache}) exited {code}")
    return read_json(folder / f"capacity-{args.gpu}.json", "capacity result")


def _ratio(top: float | None, bottom: float | None, bottom_below: float | None,
           key: str, top_at_least: bool = False, bottom_at_least: bool = False) -> dict:
    """{key: top / bottom, key_at_least: whether that is only a lower bound}: where the bottom
    capacity failed at every rate served, the ratio over the lowest rate is a lower bound, as it
    is where the top met the SLOs at every rate served (at least its highest); where the bottom
    did (a lower bound under the ratio), the ratio is not bounded from below: none."""
    if bottom_at_least:
        return {key: None, f"{key}_at_least": False}
    if top and bottom:
        return {key: top / bottom, f"{key}_at_least": top_at_least}
    if top and bottom_below:
        return {key: top / bottom_below, f"{key}_at_least": True}
    return {key: None, f"{key}_at_least": False}


def summarize(traces: dict) -> dict:
    """Per trace: each strategy's goodput capacity on and off and their ratio, and PD-mux's
    over the best chunked prefill with the cache on (beside the published gain)."""
    out = {}
    for name, t in traces.items():
        # offline, a side lists only the strategies measured with it (None: none were)
        sides = {c: (t["capacity"][c] or {"summary": {"strategies": {}}})["summary"]["strategies"]
                 for c in ("on", "off")}
        rows = {}
        for strategy in dict.fromkeys([*sides["on"], *sides["off"]]):
            got = {c: sides[c].get(strategy) or {} for c in ("on", "off")}
            caps = {c: r.get("goodput_capacity_rps") for c, r in got.items()}
            # read on a stream too short for its rate: a burst's capacity (`capacity`'s label)
            bursts = {c: r.get("steady", {}).get("goodput") is False for c, r in got.items()}
            # failed at every rate served: below the lowest (`capacity`'s bound)
            below = {c: r.get("below_rps", {}).get("goodput") for c, r in got.items()}
            # met the SLOs at every rate served: at least the highest (`capacity`'s bound)
            above = {c: bool(r.get("at_least", {}).get("goodput")) for c, r in got.items()}
            rows[strategy] = {**{f"goodput_capacity_{c}_rps": v for c, v in caps.items()},
                              **{f"below_{c}_rps": v for c, v in below.items()},
                              **{f"at_least_{c}": a for c, a in above.items()},
                              **{f"burst_{c}": b for c, b in bursts.items()},
                              # read from a chunked point served before today's chunked
                              # steps (offline only: `capacity`'s mark; a summary made before
                              # it marks any stale point)
                              **{f"stale_{c}": bool(r.get("stale_capacity", {}).get(
                                  "goodput", r.get("stale_mixed_step_points")))
                                 for c, r in got.items()},
                              **{f"measured_{c}": bool(got[c]) for c in got},
                              **_ratio(caps["on"], caps["off"], below["off"], "on_vs_off",
                                       above["on"], above["off"]),
                              # at the point its goodput capacity is read from (`capacity`)
                              "hit_rate_at_capacity": got["on"].get("prefix_hit_rate")}
        pdmux = rows.get("pdmux_grid_cap", {}).get("goodput_capacity_on_rps")
        chunked = [r for n, r in rows.items() if n.startswith("chunked")]
        best = max(chunked, key=lambda r: r["goodput_capacity_on_rps"] or 0.0, default={})
        out[name] = {"strategies": rows, "counted_hit_rates": t["counted_hit_rates"],
                     **_ratio(pdmux, best.get("goodput_capacity_on_rps"),
                              best.get("below_on_rps"), "pdmux_vs_best_chunked_cache_on",
                              rows.get("pdmux_grid_cap", {}).get("at_least_on", False),
                              best.get("at_least_on", False)),
                     "published_pdmux_vs_chunked": PUBLISHED_GAIN,
                     "measured": any((t["capacity"][c] or {}).get("mode") == "gpu"
                                     for c in ("on", "off"))}
    return out


def table(summary: dict, gpu: str) -> str:
    lines = []
    for name, s in summary.items():
        c = s["counted_hit_rates"]
        gain = s["pdmux_vs_best_chunked_cache_on"]
        lines.append(f"{name}: hit rate counted from its hash ids {c['unbounded']:.1%} "
                     f"unbounded, {c['lru_at_kv_capacity']:.1%} in the {gpu}'s KV cache; PD-mux "
                     f"over the best chunked prefill, cache on: "
                     f"{_bound(s, 'pdmux_vs_best_chunked_cache_on')}"
                     f"{'-' if gain is None else format(gain, '.2f')}x (published "
                     f"{PUBLISHED_GAIN}x, Tool&Agent, 8xA100, 70B)")
        lines.append(f"  {'strategy':<16} {'on req/s':>18} {'off req/s':>18} {'on/off':>7} "
                     f"{'hit at cap':>10}")
        for strategy, r in s["strategies"].items():
            fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
            cap = {c: ("not measured" if not r[f"measured_{c}"]
                       else f"< {r[f'below_{c}_rps']:.2f}" if r[f"below_{c}_rps"] is not None
                       else (">= " if r[f"at_least_{c}"] else "")
                       + fmt(r[f"goodput_capacity_{c}_rps"], ".2f")
                       + (" burst" if r[f"burst_{c}"] else "")
                       + (" stale" if r[f"stale_{c}"] else "")) for c in ("on", "off")}
            hit = fmt(r["hit_rate_at_capacity"], ".1%")
            ratio = _bound(r, "on_vs_off") + fmt(r["on_vs_off"], ".2f")
            lines.append(f"  {strategy:<16} {cap['on']:>18} {cap['off']:>18} "
                         f"{ratio:>7} {hit:>10}")
    lines.append("burst: read on a stream too short for its rate (the later half's attainment "
                 "more than 5 points from the whole's): not a steady state; below the whole, "
                 "more than the GPU sustains")
    if any(r[f"stale_{c}"] for s in summary.values() for r in s["strategies"].values()
           for c in ("on", "off")):
        lines.append("stale: read from points served before today's chunked steps (simulated "
                     "beside them as they ran; today's chunk counts its decode rows, as "
                     "SGLang's mixed chunk does): measure them again")
    lines.append("< X: failed the SLOs at every rate served, X the lowest; a ratio over it is "
                 "a lower bound (>=); >= X: met them at every rate served, X the highest")
    return "\n".join(lines)


def _bound(row: dict, key: str) -> str:
    return ">=" if row[f"{key}_at_least"] else ""


def run(args) -> int:
    if args.offline and args.rates:
        raise PdmuxError("--offline reads the points measured before and --rates measures new "
                         "ones: give one of them")
    if args.warm_requests != WARM_REQUESTS and not args.rates:
        raise PdmuxError(f"--warm-requests {args.warm_requests} does nothing without --rates "
                         f"(only a measured point is warmed first)")
    if args.cache != "both" and not args.rates:
        raise PdmuxError(f"--cache {args.cache} does nothing without --rates (the summary "
                         f"compares both sides: simulate or read them offline together)")
    args.cache = ("on", "off") if args.cache == "both" else (args.cache,)
    start, count = args.window
    card_inputs(args, measuring="without a GPU, drop --rates to simulate or read the points "
                "back with --offline" if args.rates else None)
    model, gpu = model_preset("qwen3-8b"), gpu_preset(args.gpu)
    kv_tokens = step_cost.kv_capacity_tokens(gpu, model)
    measured = bool(args.rates) or args.offline
    data = {**provenance(args.gpu), "mode": "gpu" if measured else "simulated",
            "inputs": {**vars(args), "window": [start, count]}, "traces": {}}
    path = Path(args.out) / f"prefix-cache-{args.gpu}{'' if measured else '-simulated'}.json"
    for name in args.traces:
        trace = TRACES[name]
        t = data["traces"][name] = {
            "path": trace, "counted_hit_rates": counted_hit_rates(
                trace, start, count, kv_tokens, model.max_context), "capacity": {}}
        for cache in ("on", "off"):
            if cache not in args.cache:  # a side left out keeps no result here (None)
                t["capacity"][cache] = None
                continue
            folder = Path(args.out) / "prefix-cache" / f"{name}-{start}-{count}-{cache}"
            strategies = (measured_strategies(folder, args.strategies, args.gpu) if args.offline
                          else args.strategies)
            print(f"{name} rows {start}+{count}, prefix cache {cache} ...", flush=True)
            t["capacity"][cache] = (capacity_run(args, trace, start, count, cache, folder,
                                                 strategies) if strategies else None)
        if not any(t["capacity"].values()):
            raise PdmuxError(f"none of {', '.join(args.strategies)} was measured on the "
                             f"{args.gpu} on {name} rows {start}+{count} (under "
                             f"{Path(args.out) / 'prefix-cache'}): measure them on the GPU "
                             f"(--rates), or name the card they were measured on (--gpu)")
        write_json(path, data)  # a save point after each trace
    data["summary"] = summarize(data["traces"])
    return finish(path, data, table(data["summary"], args.gpu))


def main(argv=None) -> int:
    p = bench_parser("prefix_cache.py", __doc__)
    p.add_argument("--traces", type=listed(choice(tuple(TRACES)), "trace"), default=("conv", "syn"))
    p.add_argument("--window", type=window, default=(3000, 500),
                   help="START:COUNT, the rows served (in arrival order)")
    p.add_argument("--strategies", type=listed(choice(DEFAULT_STRATEGIES), "strategy"),
                   default=DEFAULT_STRATEGIES)
    p.add_argument("--rates", type=listed(number(0.0, 1e4), "rate"), default=(),
                   help="measured on the GPU at these rates (req/s); none: simulated")
    p.add_argument("--warm-requests", type=integer(0, MAX_WARM), default=WARM_REQUESTS,
                   help="measured: each strategy's first requests served untimed first (fewer "
                        "fit a slow point into one device call; `capacity --warm-requests`)")
    p.add_argument("--offline", action="store_true",
                   help="read the points measured before under <out>/prefix-cache/ (no GPU): "
                        "each cache side's summary holds the strategies measured with it")
    p.add_argument("--cache", type=choice(("on", "off", "both")), default="both",
                   help="the cache sides served: a measured point at a slow rate fills a device "
                        "call, so one side a call keeps the other from being cut half-way")
    bench_inputs(p, *MEASURED_ON_H200, by_gpu=True)
    p.set_defaults(slo_ttft_ms=10000.0, slo_tpot_ms=50.0)
    return run_script(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
