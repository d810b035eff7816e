"""A prefill's rate by prompt length on the whole GPU, against cuBLAS on the same GEMMs
(bench/results/prefill-rate-<gpu>.json).

The simulator prices a prefill as its FLOPs at the bf16 peak times one MFU fitted to served
runs (`host-costs-<gpu>.json`'s whole-GPU MFU); steady ShareGPT prefills ran 9-20% slower
than that price and short prompts are where the simulator errs most (bench/NOTES.md). Measured
here in one process, for each prompt length T:
- two layers of the Qwen3-8B preset's prefill (GEMMs, attention, norms, rotary), captured as a
  CUDA graph so the host's launches are out of the number: TFLOP/s and MFU against the GPU's
  bf16 peak; and one eager call beside it (the host's launches in: what a served prefill
  of that length waits on, the simulator's layer launch cost);
- one layer's four GEMMs at M = T, ours (`linear`) and cuBLAS (`torch.matmul`), timed in
  turns: what the GEMM tiles' waves cost at short M against a library that picks its own;
- batches of several equal prompts (`--batch-tokens` in `--prompts` prompts each): what a
  batch of short prompts runs at against one prompt of their total length.

    python bench/prefill_rate.py --out bench/results [--tokens 256,1024,4096]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import BF16, LINEARS, MODEL, Results, require_gpu, t_interleaved

from pdmux_triton.cost import step_cost
from pdmux_triton.kernels import linear
from pdmux_triton.measure.timing import time_alone, time_once
from pdmux_triton.measure.workloads import PrefillLayers
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.gpus import detect_gpu

TOKENS = (128, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192)
BATCH_TOKENS = (2048, 4096)
PROMPTS = (2, 4, 8)
LAYERS = 2


def int_list(flag: str, high: int):
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} takes integers separated by commas, got {text!r}") from None
        if not values or min(values) < 1 or max(values) > high:
            raise argparse.ArgumentTypeError(f"{flag} values must be in 1..{high}, got {text!r}")
        return values
    return parse


def layers_rate(res: Results, T: int, peak_tflops: float, stream, prompts: int = 1) -> float:
    work = PrefillLayers(MODEL, tokens=T, layers=LAYERS, prompts=prompts)
    ms = time_alone(lambda: work.run(Budget()), stream, graph=True, repeats=5)
    eager_ms = time_once(lambda: work.run(Budget()), stream)
    tflops = work.amount / ms / 1e9
    res.row(section="layers" if prompts == 1 else "batch", tokens=T, prompts=prompts,
            layers=LAYERS, ms=ms, eager_ms=eager_ms, tflops=tflops, mfu=tflops / peak_tflops)
    return tflops / peak_tflops


def gemms_against_cublas(res: Results, T: int) -> float:
    ours_ms = cublas_ms = 0.0
    for name, (N, K) in LINEARS.items():
        x = torch.randn(T, K, dtype=BF16, device="cuda")
        w = torch.randn(N, K, dtype=BF16, device="cuda") / K ** 0.5
        ref, ms = t_interleaved(lambda: torch.matmul(x, w.T), lambda: linear(x, w))
        res.row(section="gemm", tokens=T, shape=name, ms=ms, cublas_ms=ref,
                tflops=2 * T * N * K / ms / 1e9, cublas_tflops=2 * T * N * K / ref / 1e9)
        ours_ms += ms
        cublas_ms += ref
    res.row(section="gemm layer", tokens=T, ms=ours_ms, cublas_ms=cublas_ms,
            vs_cublas=cublas_ms / ours_ms)
    return cublas_ms / ours_ms


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--tokens", type=int_list("--tokens", 32768), default=TOKENS,
                   help="prompt lengths, comma-separated (default: %(default)s)")
    p.add_argument("--batch-tokens", type=int_list("--batch-tokens", 32768),
                   default=BATCH_TOKENS, help="a batch's total tokens (default: %(default)s)")
    p.add_argument("--prompts", type=int_list("--prompts", 64), default=PROMPTS,
                   help="prompts in a batch (default: %(default)s)")
    args = p.parse_args(argv)
    if max(args.prompts) > min(args.batch_tokens):
        p.error(f"--prompts {max(args.prompts)} is more than a batch of "
                f"{min(args.batch_tokens)} tokens can hold")
    require_gpu("bench/prefill_rate.py")
    gpu = detect_gpu()
    res = Results(args.out / f"prefill-rate-{gpu.name}.json", gpu.name)
    res.data["inputs"] = {"model": MODEL.name, "layers": LAYERS, "tokens": list(args.tokens),
                          "batch_tokens": list(args.batch_tokens), "prompts": list(args.prompts),
                          "peak_tflops": gpu.bf16_tflops,
                          "layer_flops": {T: step_cost.layer_flops(MODEL, T, 0, 1)
                                          for T in args.tokens}}
    stream = torch.cuda.Stream()
    mfu, vs_cublas = {}, {}
    for T in args.tokens:
        mfu[T] = layers_rate(res, T, gpu.bf16_tflops, stream)
        vs_cublas[T] = gemms_against_cublas(res, T)
        res.data["summary"].update(mfu_by_tokens=mfu, gemm_vs_cublas_by_tokens=vs_cublas)
        res.save()
    batch = {}
    for T in args.batch_tokens:
        for n in args.prompts:
            batch[f"{T}/{n}"] = layers_rate(res, T, gpu.bf16_tflops, stream, prompts=n)
            res.data["summary"]["mfu_by_batch"] = batch
            res.save()
    print(f"wrote {res.path}")
    print(f"{'tokens':>7} {'MFU':>6} {'GEMMs vs cuBLAS':>16}")
    for T in args.tokens:
        print(f"{T:7d} {mfu[T]:6.3f} {vs_cublas[T]:16.3f}")
    print(f"{'batch (tokens/prompts)':>24} {'MFU':>6}")
    for key, value in batch.items():
        print(f"{key:>24} {value:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
