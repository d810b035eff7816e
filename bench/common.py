"""What the benchmark scripts share: the results file they save after every section, the
timers, inputs sized past L2, and the decode attention cases. Shapes come from the model
presets (`models.MODELS`), bytes and FLOPs from `cost`."""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

from pdmux_triton.cost import step_cost
from pdmux_triton.kernels import _pinned, stream_read
from pdmux_triton.measure.random_kv import PagedKV
from pdmux_triton.measure.timing import time_alone
from pdmux_triton.results import provenance, write_json
from pdmux_triton.spec.gpus import GPUSpec, detect_gpu
from pdmux_triton.spec.models import MODELS

BF16 = torch.bfloat16
MODEL = MODELS["qwen3-8b"]
# (N, K) of each linear of one layer: the fused q/k/v and gate/up rows, as the model lays them
LINEARS = {"qkv": (MODEL.q_dim + 2 * MODEL.kv_dim, MODEL.hidden), "o": (MODEL.hidden, MODEL.q_dim),
           "gate_up": (2 * MODEL.intermediate, MODEL.hidden), "down": (MODEL.hidden, MODEL.intermediate)}
PAGE_SIZE = 16


def require_gpu(script: str) -> None:
    """Benchmarks measure a GPU: without one, say so in one line and exit 2."""
    if not torch.cuda.is_available():
        print(f"{script} measures kernels on a CUDA GPU; torch sees none", file=sys.stderr)
        raise SystemExit(2)


def gpu_results(script: str, doc: str, stem: str, argv=None) -> tuple["Results", GPUSpec]:
    """A GPU script's start: its one flag (--out), the GPU it measures (exit 2 without one)
    and its results, kept in <out>/<stem>-<gpu>.json."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)
    require_gpu(script)
    gpu = detect_gpu()
    return Results(args.out / f"{stem}-{gpu.name}.json", gpu.name), gpu


class Results:
    """Rows and curves, saved as JSON after each section (a crash loses little)."""

    def __init__(self, path: Path, gpu: str):
        self.path = Path(path)
        self.data = {**provenance(gpu), "device": torch.cuda.get_device_name(), "rows": [],
                     "curves": {}, "summary": {}}
        self.t0 = time.time()

    def row(self, **row):
        self.data["rows"].append(row)
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}
        print(f"[{time.time() - self.t0:6.1f}s] {shown}", flush=True)
        return row

    def save(self):
        write_json(self.path, self.data)


@contextlib.contextmanager
def sites_headed_by(first: list[int], head: int | None = None):
    """Inside the block, pinned launches index a site order (kernels/_pinned.site_order, of
    `head`) whose first sites are the SM ids `first`, the rest in the measured order: a pinned
    partition put on SMs of the caller's choosing."""
    dev = torch.device("cuda", torch.cuda.current_device())
    measured = _pinned.site_order(dev, head)
    order = list(first) + [sm for sm in measured[0] if sm not in first]
    _pinned._SITES[(dev, head)] = order, _pinned.site_table(order, dev)
    try:
        yield
    finally:
        _pinned._SITES[(dev, head)] = measured


@functools.cache
def _bench_stream() -> torch.cuda.Stream:
    return torch.cuda.Stream()


def t_graph(fn) -> float:
    """Median ms of one call, replayed from a CUDA graph of back-to-back calls (launch gaps out
    of the number). Warm-up and capture share one stream, as in the executor: the kernels'
    per-stream arrival counters are then made before the capture, not zeroed inside it."""
    return time_alone(fn, _bench_stream(), graph=True, target_ms=40.0, repeats=5)


def t_eager(fn) -> float:
    return do_bench(fn, warmup=20, rep=80, return_mode="median")


def t_interleaved(*fns, rounds: int = 3) -> list[float]:
    """Median ms of each fn, timed in turns (a, b, a, b, ...). Compute-bound kernels move the
    GPU's clock with its power draw; timing one side after the other would hand that drift to
    one side of a ratio."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for t, fn in zip(times, fns):
            t.append(t_eager(fn))
    return [statistics.median(t) for t in times]


def rotating(make, nbytes_each: int, l2_bytes: int):
    """Enough copies of an input that cycling through them never hits in L2."""
    copies = max(2, math.ceil(3 * l2_bytes / max(1, nbytes_each)) + 1)
    return [make() for _ in range(copies)]


def cycle(items):
    state = {"i": 0}

    def next_item():
        state["i"] = (state["i"] + 1) % len(items)
        return items[state["i"]]
    return next_item


def same_bytes_buffers(nbytes: int, l2: int):
    """Random buffers of `nbytes`, enough of them to cycle past L2."""
    return cycle(rotating(lambda: torch.randint(-2**31, 2**31 - 1, (nbytes // 4,),
                                                dtype=torch.int32, device="cuda"), nbytes, l2))


def stream_same_bytes(bufs, nbytes: int, sms: int, **stream_config) -> float:
    """TB/s of the streaming read over buffers of `nbytes` (from `same_bytes_buffers`): the
    ceiling of one kernel that reads that much, launch ramp and tail included."""
    return nbytes / t_graph(lambda: stream_read(bufs(), num_sms=sms, **stream_config)) / 1e9


def decode_cases() -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(1)
    ragged = torch.randint(100, 16001, (32,), generator=g).tolist()
    return {"32x2048": [2048] * 32, "32x8192": [8192] * 32, "8x32768": [32768] * 8,
            "ragged32_100_16000": ragged}


def decode_inputs(lens, seed: int = 0):
    """Paged bf16 K/V of the model's shape on shuffled pages and one query token per request."""
    kv = PagedKV(lens, MODEL.kv_heads, MODEL.head_dim, PAGE_SIZE, BF16, "cuda", spare_pages=0,
                 seed=seed)
    q = torch.randn(len(lens), MODEL.q_heads, MODEL.head_dim, dtype=BF16, device="cuda")
    return kv, q


def attention_flops(tokens: int) -> float:
    """One layer's causal attention over a fresh prompt."""
    return step_cost.attention_flops(MODEL, tokens, 0, layers=1)
