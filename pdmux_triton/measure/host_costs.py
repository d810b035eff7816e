"""What the host spends per round on the GPU executor: the terms the simulated clock lacks
(`pdmux-triton calibrate --host-costs`, the file run and capacity take as --host-costs).

- an eager layer: the host time to launch a prefill's first transformer layer and each later
  one (which replays the first's launches), at several token counts (the kernels queue faster
  than they run only when the batch is large);
- a decode round: wall time of launch + wait of a captured decode step, less its GPU time
  (CUDA events), at several batch sizes.

bench/fit_host_costs.py adds to the file what only served runs show (an eager step's fixed
cost, a captured step's cost beyond its bytes, the mixed step's fit).
"""

from __future__ import annotations

import statistics
import time

import torch

from pdmux_triton.cost import step_cost
from pdmux_triton.gpu.model_executor import ModelExecutor
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.results import provenance
from pdmux_triton.serve import scheduler
from pdmux_triton.spec.gpus import GPUSpec
from pdmux_triton.spec.models import ModelSpec
from pdmux_triton.spec.traffic import Request

EAGER_TOKENS = (16, 128, 512, 2048)  # tokens of the eager layers timed
DECODE_BATCHES = (1, 8, 32, 64)  # batches of the decode rounds timed
DECODE_PROMPT = 512  # tokens each request of a decode round holds before its steps
CACHE_TOKENS = 200_000  # the executor's KV cache: room for every case at once
MAX_CONTEXT = 4096


def launch_prefill_layers(x: ModelExecutor, carry) -> tuple[float, float]:
    """Launch all of a prefill's layers (nothing waited for): host seconds of its first layer
    (its batch embedded, its launches through the kernels' launchers and recorded) and of
    each later one (replayed: kernels/_replay.py)."""
    t0 = time.perf_counter()
    x.model.extend_layers(carry.batch, 0, x.num_layers, budget=x.prefill_side.budget)
    t1, first = time.perf_counter(), x.model.first_launched_at
    return first - t0, (t1 - first) / max(1, x.num_layers - 1)


def eager_layer_s(x: ModelExecutor, tokens: int, repeats: int = 20) -> dict:
    """Host seconds to launch a prefill's first layer and each of its later layers
    (`launch_prefill_layers`; none for a one-layer model), and the call's span a layer on the
    GPU's clock (its GPU time where the GPU, not the launches, bounds it)."""
    req = Request(10**6, [1] * tokens, 2, 0.0)
    carry = x.begin_prefill([req])
    torch.cuda.synchronize()
    first, later, gpu = [], [], []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        first_s, later_s = launch_prefill_layers(x, carry)
        first.append(first_s)
        later.append(later_s)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) / 1e3 / x.num_layers)
    x.release(req)
    row = {"tokens": tokens, "host_s": statistics.median(first), "gpu_s": statistics.median(gpu)}
    if x.num_layers > 1:
        row["later_layer_s"] = statistics.median(later)
    return row


def decode_round_s(x: ModelExecutor, batch: int, repeats: int = 30) -> dict:
    """Wall seconds of launch + wait of one decode step, and its GPU seconds."""
    reqs = [Request(10**6 + i, [1] * DECODE_PROMPT, 10**6, 0.0, warm=True) for i in range(batch)]
    x.start(reqs)
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.wait_decode(x.launch_decode(reqs))
        walls.append(time.perf_counter() - t0)
        for r in reqs:
            r.context += 1
    steps = x.finish().decode_step_s
    for r in reqs:
        x.release(r)
    return {"batch": batch, "context": DECODE_PROMPT + repeats // 2,
            "wall_s": statistics.median(walls),
            "gpu_s": statistics.median(steps)}


def measure_host_costs(gpu: GPUSpec, spec: ModelSpec, log=print) -> dict:
    """Every case on the local GPU (random weights of `spec`), compiled and captured first;
    returns the host-costs file's contents."""
    step_cost.check_fits(gpu, spec, CACHE_TOKENS, f"a KV cache of {CACHE_TOKENS:,} tokens")
    x = ModelExecutor.shared(spec, gpu, "grid_cap", cache_tokens=CACHE_TOKENS,
                             max_context=MAX_CONTEXT)
    try:
        log("host costs: compiling and capturing ...")
        # every batch and prefill the cases launch, compiled and captured before any is timed
        x.warm_up("prefill_first", sglang_rules.PDMuxConfig(), max(DECODE_BATCHES),
                  2 * max(EAGER_TOKENS), 2048)
        log(f"host costs: eager layers at {', '.join(map(str, EAGER_TOKENS))} tokens ...")
        layers = [eager_layer_s(x, t) for t in EAGER_TOKENS]
        log(f"host costs: decode rounds at batches {', '.join(map(str, DECODE_BATCHES))} ...")
        rounds = [decode_round_s(x, b) for b in DECODE_BATCHES]
    finally:
        ModelExecutor.release_shared()
    return {**provenance(gpu.name), "model": spec.name, "eager_layer": layers,
            "decode_round": rounds, "max_running": scheduler.DEFAULT_MAX_RUNNING}
