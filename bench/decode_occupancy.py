"""Decode kernels on a small SM budget: bandwidth per SM of tile/pipeline variants.

S_SAT is set by how much bandwidth one SM's programs pull: a decode kernel that streams
40 GB/s per SM needs three times the SMs of one that streams 120. This sweeps the knobs of the
decode attention and decode GEMM at a few budgets (1 CTA per SM, the honest grid cap) and
writes <out>/decode-occupancy-<gpu>.json with a table per kernel, best first.

    python bench/decode_occupancy.py --out bench/results
    python bench/decode_occupancy.py --sections attention --budgets 16,132 --cases 32x8192
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import (LINEARS, PAGE_SIZE, Results, cycle, decode_cases, decode_inputs, require_gpu,
                    rotating, same_bytes_buffers, stream_same_bytes, t_graph)

from pdmux_triton.kernels import AttnConfig, GemmConfig, decode_attention, linear
from pdmux_triton.spec.gpus import detect_gpu

BUDGETS = (16, 52, 132)
# the decode GEMM's steps in bandwidth at 64/96/128 SMs are tile-count quantization: sweep
# budgets finely, with the skinny schedule (whole tiles or stream-K) as the lever
GEMM_BUDGETS = (8, 16, 24, 32, 40, 52, 64, 80, 96, 112, 132)
# the pipeline spends two stages per K/V block (page ids, then K/V), so 2s + 1 stages keep s
# blocks in flight (bench/profile_decode.py --offline); shared memory caps it at 3 of 128 keys
ATTN_VARIANTS = [AttnConfig(16, 128, 4, 3), AttnConfig(16, 128, 4, 5), AttnConfig(16, 128, 4, 7),
                 AttnConfig(16, 128, 8, 5), AttnConfig(16, 64, 4, 9)]
def _skinny(*tiles):
    return [GemmConfig(*t, skinny=True) for t in tiles]


# skinny tiles (x rows, W rows, K slab, warps, stages), against the default and one
# whole-tile TMA schedule without split; 32 W rows a tile: the o projection's 128 whole tiles
# on the whole GPU, where 64-row tiles leave half its SMs idle (no wgmma below 64 rows: mma.sync)
GEMM_VARIANTS = {
    1: [None, GemmConfig(16, 32, 256, 4, 6)] + _skinny(
        (16, 64, 256, 4, 4), (16, 64, 128, 4, 4), (16, 64, 128, 4, 8), (16, 128, 128, 8, 4),
        (16, 128, 128, 4, 4), (16, 128, 64, 4, 8), (16, 64, 64, 4, 8), (16, 32, 256, 4, 6),
        (16, 32, 128, 4, 8)),
    32: [None] + _skinny((32, 64, 256, 4, 4), (32, 64, 128, 4, 4), (32, 128, 128, 8, 4),
                           (32, 128, 64, 4, 6), (32, 64, 64, 4, 8), (32, 32, 256, 4, 4),
                           (32, 32, 128, 4, 6)),
    64: [None, GemmConfig(64, 32, 128, 4, 6)] + _skinny(
        (64, 64, 256, 4, 3), (64, 64, 128, 4, 4), (64, 128, 128, 8, 3), (64, 128, 64, 4, 6),
        (64, 64, 64, 4, 8)),
}
GEMM_VARIANTS[8] = GEMM_VARIANTS[1]
# past 64 rows: 64-row x tiles (two that each read W: TMA tiles, or skinny), against one x tile
# of 128 rows, skinny (the MMA's N = 128) or TMA, that reads W once
GEMM_VARIANTS[72] = GEMM_VARIANTS[96] = GEMM_VARIANTS[128] = [
    None, GemmConfig(64, 128, 64, 4, 4), GemmConfig(64, 128, 64, 4, 4, skinny=True),
    GemmConfig(128, 128, 64, 8, 4), GemmConfig(128, 64, 64, 4, 4)] + _skinny(
    (128, 64, 64, 4, 4), (128, 64, 64, 4, 6), (128, 64, 128, 4, 3), (128, 128, 64, 8, 4),
    (128, 128, 64, 8, 3), (128, 128, 128, 8, 2))
# the streaming read over one weight's bytes, in finer steps than its 2 GiB default
STREAM_VARIANTS = [(4096, 8, 32), (2048, 8, 16), (1024, 8, 8), (2048, 4, 8), (1024, 4, 4)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results")
    p.add_argument("--sections", default="attention,gemm", help="attention and/or gemm")
    p.add_argument("--budgets", help="comma-separated SM budgets (default: each section's own)")
    p.add_argument("--cases", default="32x8192,ragged32_100_16000", help="decode attention cases")
    p.add_argument("--shapes", default="o,gate_up", help="Qwen3-8B weights for the GEMM section")
    p.add_argument("--ms", default="1,32", help="decode batch sizes M for the GEMM section")
    args = p.parse_args(argv)
    sections = set(args.sections.split(","))
    if not sections <= {"attention", "gemm"}:
        p.error(f"--sections takes attention and/or gemm, got {args.sections!r}")
    budgets = tuple(int(b) for b in args.budgets.split(",")) if args.budgets else None
    batches = [int(m) for m in args.ms.split(",")] if "gemm" in sections else []
    if any(m not in GEMM_VARIANTS for m in batches):
        p.error(f"--ms takes batch sizes from {', '.join(map(str, GEMM_VARIANTS))}, "
                f"got {args.ms!r}")
    require_gpu("bench/decode_occupancy.py")
    gpu = detect_gpu()
    res = Results(Path(args.out) / f"decode-occupancy-{gpu.name}.json", gpu.name)
    for case in args.cases.split(",") if "attention" in sections else ():
        lens = decode_cases()[case]
        kv, q = decode_inputs(lens)
        nbytes = kv.kv_bytes()
        for budget in budgets or BUDGETS:
            for cfg in ATTN_VARIANTS:
                try:
                    ms = t_graph(lambda: decode_attention(
                        q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, PAGE_SIZE,
                        max(lens), num_sms=budget, config=cfg))
                except Exception as err:  # a variant that does not fit: record why
                    res.row(kernel="decode_attention", case=case, sms=budget, config=str(cfg),
                            error=str(err)[:160])
                    continue
                res.row(kernel="decode_attention", case=case, sms=budget, config=str(cfg),
                        tbps=nbytes / ms / 1e9, gbps_per_sm=nbytes / ms / 1e6 / budget)
        res.save()
    l2 = int(gpu.l2_mib * 2**20)
    shapes = args.shapes.split(",") if "gemm" in sections else []
    for name in shapes:
        N, K = LINEARS[name]
        bufs = same_bytes_buffers(N * K * 2, l2)
        for budget in budgets or GEMM_BUDGETS:
            for block, unroll, warps in STREAM_VARIANTS:
                tbps = stream_same_bytes(bufs, N * K * 2, budget, block=block, unroll=unroll,
                                         num_warps=warps)
                res.row(kernel="stream_read_same_bytes", shape=name, M=0, sms=budget,
                        config=f"block {block} unroll {unroll} warps {warps}", tbps=tbps,
                        gbps_per_sm=tbps * 1e3 / budget)
        del bufs
    for M in batches:
        variants = GEMM_VARIANTS[M]
        for name in shapes:
            N, K = LINEARS[name]
            next_w = cycle(rotating(lambda: torch.randn(N, K, dtype=torch.bfloat16, device="cuda"),
                                    N * K * 2, l2))
            x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
            for budget in budgets or GEMM_BUDGETS:
                for cfg in variants:
                    try:
                        ms = t_graph(lambda: linear(x, next_w(), num_sms=budget, config=cfg))
                    except Exception as err:
                        res.row(kernel="decode_linear", shape=name, M=M, sms=budget,
                                config=str(cfg), error=str(err)[:160])
                        continue
                    res.row(kernel="decode_linear", shape=name, M=M, sms=budget,
                            config=str(cfg or "default"), tbps=N * K * 2 / ms / 1e9,
                            gbps_per_sm=N * K * 2 / ms / 1e6 / budget,
                            tflops=2 * M * N * K / ms / 1e9)
            res.save()
    print("\nbest per (kernel, case/shape, budget):")
    best: dict = {}
    for r in res.data["rows"]:
        if "tbps" not in r:
            continue
        key = (r["kernel"], r.get("case") or f"{r['shape']} M={r['M']}", r["sms"])
        if key not in best or r["tbps"] > best[key]["tbps"]:
            best[key] = r
    for key, r in sorted(best.items()):
        print(f"{key[0]:<22} {key[1]:<20} {key[2]:>4} SMs {r['tbps']:6.2f} TB/s "
              f"{r['gbps_per_sm']:6.1f} GB/s/SM  {r['config']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
