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
  batch of short prompts runs at against one prompt of their total length;
- `--prefix-tokens` new tokens after each of `--prefixes` cached tokens (a prefix-cache hit, a
  later chunk), and all the layer rows again on `--sms` prefill SMs (a PD-mux level's share,
  grid-capped): with the long prompts, what attention over a long context runs at.
The summary fits each budget's layer times (prompts of at least FIT_TOKENS tokens) as linear
FLOPs at one rate plus attention FLOPs at another (`rate_fit`): the simulator's one MFU per
level holds attention's share at the comparison's prompt (8192 tokens), and served long
prompts ran slower than that price (bench/NOTES.md 000d).

    python bench/prefill_rate.py --out bench/results [--tokens 256,1024,4096] [--sms 132,80]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from common import BF16, LINEARS, MODEL, Results, require_gpu, t_interleaved

from pdmux_triton.cost import step_cost
from pdmux_triton.kernels import linear
from pdmux_triton.measure.timing import time_alone, time_once
from pdmux_triton.measure.workloads import PrefillLayers
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.gpus import detect_gpu

TOKENS = (128, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192, 16384, 32768)
BATCH_TOKENS = (2048, 4096)
PROMPTS = (2, 4, 8)
PREFIX_TOKENS = 4096
PREFIXES = (8192, 16384, 28672)
LAYERS = 2
# the shortest prompt the rate fit reads: below it the GEMMs' waves, not the FLOPs, set the time
FIT_TOKENS = 1024


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


def layers_rate(res: Results, section: str, T: int, gpu, stream, prompts: int = 1,
                prefix: int = 0, sms: int | None = None) -> float:
    """Two layers' MFU on `sms` prefill SMs (None: the whole GPU), against the peak of the
    SMs they ran on; its row holds the linear and attention FLOPs apart."""
    work = PrefillLayers(MODEL, tokens=T, layers=LAYERS, prompts=prompts, prefix=prefix)
    budget = Budget(sms) if sms else Budget()
    ms = time_alone(lambda: work.run(budget), stream, graph=True, repeats=5)
    eager_ms = time_once(lambda: work.run(budget), stream)
    tflops = work.amount / ms / 1e9
    peak_tflops = gpu.bf16_tflops * (sms or gpu.sms) / gpu.sms  # of the SMs it ran on
    attention = sum(step_cost.attention_flops(MODEL, n, prefix, LAYERS)
                    for n in work.batch.extend_lens)
    res.row(section=section, tokens=T, prompts=prompts, prefix=prefix, sms=sms, layers=LAYERS,
            ms=ms, eager_ms=eager_ms, tflops=tflops, mfu=tflops / peak_tflops,
            attention_flops=attention, linear_flops=work.amount - attention)
    return tflops / peak_tflops


def rate_fit(rows: list[dict], peak_tflops: float, total_sms: int) -> dict:
    """Per prefill budget: the layer rows (prompts of at least FIT_TOKENS tokens) fitted as
    ms = linear FLOPs / one rate + attention FLOPs / another (least squares, relative), and
    the fit's worst error; None for a budget with fewer than three rows."""
    out = {}
    budgets = sorted({r["sms"] or total_sms for r in rows})
    for sms in budgets:
        mine = [r for r in rows if (r["sms"] or total_sms) == sms and r["tokens"] >= FIT_TOKENS
                and r["prompts"] == 1]
        if len(mine) < 3:
            out[str(sms)] = None
            continue
        t = np.array([r["ms"] / 1e3 for r in mine])
        a = np.array([[r["linear_flops"], r["attention_flops"]] for r in mine]) / t[:, None]
        inv, *_ = np.linalg.lstsq(a, np.ones(len(mine)), rcond=None)  # each row's error alike
        if min(inv) <= 0:
            out[str(sms)] = None
            continue
        fitted = a @ inv
        peak = peak_tflops * 1e12 * sms / total_sms
        out[str(sms)] = {"linear_tflops": 1 / inv[0] / 1e12, "attention_tflops": 1 / inv[1] / 1e12,
                         "linear_mfu": 1 / inv[0] / peak, "attention_mfu": 1 / inv[1] / peak,
                         "attention_vs_linear": inv[0] / inv[1],
                         "max_fit_error_pct": float(np.max(np.abs(fitted - 1)) * 100),
                         "rows": len(mine)}
    return out


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
    p.add_argument("--prefixes", type=int_list("--prefixes", 32768), default=PREFIXES,
                   help="cached tokens before --prefix-tokens new ones (default: %(default)s)")
    p.add_argument("--prefix-tokens", type=int_list("--prefix-tokens", 32768),
                   default=(PREFIX_TOKENS,), help="new tokens after a cached prefix "
                   "(default: %(default)s)")
    p.add_argument("--sms", type=int_list("--sms", 1024), default=(),
                   help="prefill SMs (grid-capped) to measure the layer rows on besides the "
                   "whole GPU, e.g. 80,112")
    args = p.parse_args(argv)
    if max(args.prompts) > min(args.batch_tokens):
        p.error(f"--prompts {max(args.prompts)} is more than a batch of "
                f"{min(args.batch_tokens)} tokens can hold")
    require_gpu("bench/prefill_rate.py")
    gpu = detect_gpu()
    if max(args.sms, default=0) > gpu.sms:
        p.error(f"--sms {max(args.sms)} is more than the {gpu.sms} SMs of this {gpu.name}")
    res = Results(args.out / f"prefill-rate-{gpu.name}.json", gpu.name)
    res.data["inputs"] = {"model": MODEL.name, "layers": LAYERS, "tokens": list(args.tokens),
                          "batch_tokens": list(args.batch_tokens), "prompts": list(args.prompts),
                          "prefixes": list(args.prefixes),
                          "prefix_tokens": list(args.prefix_tokens), "sms": list(args.sms),
                          "peak_tflops": gpu.bf16_tflops,
                          "layer_flops": {T: step_cost.layer_flops(MODEL, T, 0, 1)
                                          for T in args.tokens}}
    stream = torch.cuda.Stream()
    mfu, vs_cublas = {}, {}
    for T in args.tokens:
        mfu[T] = layers_rate(res, "layers", T, gpu, stream)
        vs_cublas[T] = gemms_against_cublas(res, T)
        res.data["summary"].update(mfu_by_tokens=mfu, gemm_vs_cublas_by_tokens=vs_cublas)
        res.save()
    batch = {}
    for T in args.batch_tokens:
        for n in args.prompts:
            batch[f"{T}/{n}"] = layers_rate(res, "batch", T, gpu, stream, prompts=n)
            res.data["summary"]["mfu_by_batch"] = batch
            res.save()
    for sms in (None, *args.sms):  # the layer rows on each budget, then after each prefix
        for T in (args.tokens if sms else ()):
            layers_rate(res, "layers", T, gpu, stream, sms=sms)
        for T in args.prefix_tokens:
            for prefix in args.prefixes:
                layers_rate(res, "prefix", T, gpu, stream, prefix=prefix,
                            sms=sms)
        fit = rate_fit([r for r in res.data["rows"] if r["section"] in ("layers", "prefix")],
                       gpu.bf16_tflops, gpu.sms)
        res.data["summary"]["rate_fit"] = fit
        res.save()
    print(f"wrote {res.path}")
    print(f"{'tokens':>7} {'MFU':>6} {'GEMMs vs cuBLAS':>16}")
    for T in args.tokens:
        print(f"{T:7d} {mfu[T]:6.3f} {vs_cublas[T]:16.3f}")
    print(f"{'batch (tokens/prompts)':>24} {'MFU':>6}")
    for key, value in batch.items():
        print(f"{key:>24} {value:6.3f}")
    print(f"{'prefill SMs':>11} {'linear TFLOP/s':>15} {'attention TFLOP/s':>18} "
          f"{'attention/linear':>17} {'worst fit error %':>18}")
    for sms, f in res.data["summary"]["rate_fit"].items():
        if f:
            print(f"{sms:>11} {f['linear_tflops']:15.0f} {f['attention_tflops']:18.0f} "
                  f"{f['attention_vs_linear']:17.3f} {f['max_fit_error_pct']:18.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
