"""What the host spends per round on the GPU executor: the terms the simulated clock lacks.

- an eager layer: the host time to launch one transformer layer of a small batch (its kernels
  queue faster than they run only when the batch is large), at several token counts;
- a decode round: wall time of launch + wait of a captured decode step, less its GPU time
  (CUDA events), at several batch sizes.

Writes <out>/host-costs-<gpu>.json and prints a short table.

    python bench/host_costs.py --out bench/results
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from common import require_gpu

from pdmux_triton.gpu.model_executor import ModelExecutor
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.results import provenance, write_json
from pdmux_triton.serve import scheduler
from pdmux_triton.spec.gpus import detect_gpu
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import Request


def eager_layer_s(x: ModelExecutor, tokens: int, repeats: int = 20) -> dict:
    """Host seconds to launch one layer (nothing waited for) and GPU seconds it runs."""
    req = Request(10**6, [1] * tokens, 2, 0.0)
    carry = x.begin_prefill([req])
    torch.cuda.synchronize()
    host, gpu = [], []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        x.model.extend_layers(carry.batch, 0, 1, budget=x.prefill_side.budget)
        host.append(time.perf_counter() - t0)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) / 1e3)
    x.release(req)
    return {"tokens": tokens, "host_s": statistics.median(host), "gpu_s": statistics.median(gpu)}


DECODE_PROMPT = 512  # tokens each request of a decode round holds before its steps


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results")
    args = p.parse_args(argv)
    require_gpu("bench/host_costs.py")
    gpu = detect_gpu()
    spec = model_preset("qwen3-8b")
    x = ModelExecutor.shared(spec, gpu, "grid_cap", cache_tokens=200_000, max_context=4096)
    config = sglang_rules.PDMuxConfig()
    x.warm_up("prefill_first", config, 64, 4096, 2048)
    layers = [eager_layer_s(x, t) for t in (16, 128, 512, 2048)]
    rounds = [decode_round_s(x, b) for b in (1, 8, 32, 64)]
    ModelExecutor.release_shared()
    data = {**provenance(gpu.name), "model": spec.name, "eager_layer": layers,
            "decode_round": rounds, "max_running": scheduler.DEFAULT_MAX_RUNNING}
    path = write_json(Path(args.out) / f"host-costs-{gpu.name}.json", data)
    print(f"{'tokens':>7} {'layer host ms':>14} {'layer GPU ms':>13}")
    for r in layers:
        print(f"{r['tokens']:>7} {r['host_s'] * 1e3:>14.3f} {r['gpu_s'] * 1e3:>13.3f}")
    print(f"{'batch':>7} {'round wall ms':>14} {'step GPU ms':>13}")
    for r in rounds:
        print(f"{r['batch']:>7} {r['wall_s'] * 1e3:>14.3f} {r['gpu_s'] * 1e3:>13.3f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
