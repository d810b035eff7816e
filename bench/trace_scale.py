"""How long a long trace takes to simulate, and in how much memory: a generated trace served by
one strategy on the H200 preset's first-order cost model (no measured inputs: the
simulator's own work is what is timed), with the run's progress lines and peak RSS.

The trace has the Splitwise conversation lengths (prompts ~1K tokens, log-normal; outputs ~200
on average) and Poisson arrivals at --rate. Each progress line carries the process's peak RSS
so far. The summary's `bytes_per_request` is what serving and its figures added to the peak
once the requests were read, per request: a list entry per token would cost 16 bytes a token
at the least. Writes <out>/trace-scale-h200-simulated.json (rows, times, peak RSS, the run's
serving figures) and prints a one-line table; the trace itself goes to --trace (a temporary
file by default).

    python bench/trace_scale.py --rows 1000000 --rate 20 --out bench/results
    python bench/trace_scale.py --rows 20000 --strategy chunked_512 --out /tmp/ts
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from script import bench_parser, finish, run_script

from pdmux_triton.cli.parsing import choice, integer, number
from pdmux_triton.experiments.run import Servers
from pdmux_triton.experiments.settings import RunSettings, make_requests
from pdmux_triton.experiments.variants import variants
from pdmux_triton.results import provenance
from pdmux_triton.serve import metrics, scheduler
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traces import TRACE_COLUMNS
from pdmux_triton.spec.traffic import LENGTH_PRESETS

STRATEGIES = ("prefill_first", "chunked_512", "chunked_2048", "pdmux_grid_cap")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def write_trace(path: Path, rows: int, rate: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    preset = LENGTH_PRESETS["conv"]
    arrivals = np.cumsum(rng.exponential(1 / rate, rows))
    prompts, outputs = preset.prompt.sample(rng, rows), preset.output.sample(rng, rows)
    table = np.column_stack([arrivals, prompts, outputs])
    np.savetxt(path, table, fmt=("%.6f", "%d", "%d"), delimiter=",",
               header=",".join(TRACE_COLUMNS), comments="")


def run(args) -> int:
    if args.trace:
        trace = Path(args.trace)
    else:  # a temporary file, removed once read
        handle, name = tempfile.mkstemp(suffix=".csv")
        os.close(handle)
        trace = Path(name)
    write_trace(trace, args.rows, args.rate, args.seed)
    started = time.perf_counter()
    s = RunSettings(gpu=gpu_preset("h200"), model=model_preset("qwen3-8b"), workload="trace",
                    trace=str(trace), simulate=True, chunks=(512, 2048), kinds=("grid_cap",),
                    slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms)
    requests = make_requests(s)
    if not args.trace:
        trace.unlink()
    read_s, read_mb = time.perf_counter() - started, peak_rss_mb()
    v = next(v for v in variants(s.chunks, s.kinds) if v.name == args.strategy)
    servers = Servers(s, requests)
    progress = []

    def say(line: str) -> None:
        progress.append(f"{line}, peak RSS {peak_rss_mb():,.0f} MB")
        print(progress[-1], flush=True)
    result = scheduler.run(v.loop, servers.executor(v), requests, chunk=v.chunk,
                           levels_by=servers.level_policy(v), progress=say)
    served_s = time.perf_counter() - started
    row = metrics.summarize(result, s.slo)
    wall = time.perf_counter() - started
    summary = {"rows": args.rows, "rate": args.rate, "strategy": v.name, "wall_s": wall,
               "read_s": read_s, "serve_s": served_s - read_s, "metrics_s": wall - served_s,
               "rounds": row["rounds"], "requests_served": row["requests_served"],
               "tokens_per_request": sum(r.output_len for r in requests) / args.rows,
               "peak_rss_read_mb": read_mb, "peak_rss_mb": peak_rss_mb(),
               "bytes_per_request": (peak_rss_mb() - read_mb) * 2**20 / args.rows}
    data = {**provenance("h200"), "mode": "simulated", "model": "qwen3-8b",
            "inputs": {k: value for k, value in vars(args).items() if k != "trace"},
            "rows": [row],
            "progress": progress, "summary": summary}
    table = (f"{args.rows:,} requests at {args.rate:g}/s, {v.name}: {wall:,.0f} s wall (read "
             f"{read_s:.0f}, served {served_s - read_s:,.0f}, figures {wall - served_s:.0f}), "
             f"{row['rounds']:,} rounds, peak RSS {summary['peak_rss_mb']:,.0f} MB")
    return finish(Path(args.out) / "trace-scale-h200-simulated.json", data, table)


def main(argv=None) -> int:
    p = bench_parser("trace_scale.py", __doc__)
    p.add_argument("--rows", type=integer(1, 10_000_000), default=1_000_000)
    p.add_argument("--rate", type=number(), default=20.0, help="arrivals per second")
    p.add_argument("--seed", type=integer(0, 2**32 - 1), default=0)
    p.add_argument("--strategy", type=choice(STRATEGIES), default="pdmux_grid_cap")
    p.add_argument("--slo-ttft-ms", type=number(), default=2000.0)
    p.add_argument("--slo-tpot-ms", type=number(), default=50.0)
    p.add_argument("--trace", default=None, help="where the generated trace goes")
    return run_script(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
