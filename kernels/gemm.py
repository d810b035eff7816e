"""Persistent GEMM `y = x @ W^T` (W stored [N, K] like torch Linear), grid capped to an SM budget.

One kernel serves prefill (M = thousands of tokens: big tiles, grouped order for L2 reuse) and
decode (M = batch: a skinny tile and split-K, so even a small M spreads the weight read over
every program of the budget). Tiles are read through TMA descriptors; with split-K each split
writes fp32 partials and the last split of a tile to finish adds them (one launch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._launch import (arrival_counters, check_tensor, grid_size, interpreting,
                                          record_sm, telemetry_args)

GEMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    split_k: int = 1
    # stream-K: every (tile, K-slab) unit split evenly between the programs (split_k unused)
    stream_k: bool = False


def decode_tile(M: int, elem: int, small_budget: bool) -> GemmConfig:
    """The tile for a skinny (decode) GEMM, M <= 64.

    A small SM budget cannot saturate HBM, so what counts is each program's own bandwidth:
    on the H200 at 16 and 52 SMs, 128-wide slabs with 8 warps (M <= 16) and 64-row tiles that
    run on Hopper's warpgroup MMA (M <= 64) stream 1.15-1.85x faster than the small tiles.
    With the whole GPU the small tiles win (10-13%): more of them even out the waves.
    """
    bk = 256 if elem < 4 else 64
    if M <= 16:
        return GemmConfig(16, 128, bk, 8, 3) if small_budget else GemmConfig(16, 64, bk, 4, 4)
    # a deeper pipeline of shorter slabs keeps the larger x tile in shared memory
    block_m = 64 if small_budget or M > 32 else 32
    return GemmConfig(block_m, 64, bk // 2 if elem < 4 else bk, 4, 6)


def default_config(M: int, N: int, K: int, programs: int, dtype: torch.dtype,
                   device_programs: int | None = None) -> GemmConfig:
    """A tile shape for this problem; split-K when there are too few output tiles to go round.

    Large M: 128x256 tiles, the best of bench/kernels.py's sweep on the H200 (~1.0x cuBLAS).
    Skinny M (decode): see `decode_tile`; a budget of at most half the GPU's programs counts
    as small.
    """
    elem = torch.finfo(dtype).bits // 8
    if interpreting():
        return GemmConfig(16, 16, 16, 4, 1, split_k=2 if M <= 16 and K >= 64 else 1)
    if M > 1024:
        return _fit_shared_memory(GemmConfig(128, 256, 64, 8, 3, group_m=16), elem)
    if M <= 64:
        cfg = decode_tile(M, elem, device_programs is not None and 2 * programs <= device_programs)
    else:
        cfg = GemmConfig(64 if M <= 256 else 128, 128, 64, 4, 4)
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    k_tiles = triton.cdiv(K, cfg.block_k)
    split = 1
    # Split only when tiles would leave half the programs idle (split-K adds partial traffic),
    # and keep each split a few K-tiles long.
    while tiles * split < programs // 2 and k_tiles // (split * 2) >= 2:
        split *= 2
    return _fit_shared_memory(GemmConfig(cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps,
                                         cfg.num_stages, cfg.group_m, split), elem)


SHARED_MEMORY_LIMIT = 227 * 1024  # per block on Hopper


def _fit_shared_memory(cfg: GemmConfig, elem_bytes: int) -> GemmConfig:
    """Fewer pipeline stages until the staged x and W tiles plus the epilogue tile (converted
    through shared memory; fp32 when split-K writes partials) fit."""
    per_stage = (cfg.block_m + cfg.block_n) * cfg.block_k * elem_bytes
    epilogue = cfg.block_m * cfg.block_n * (4 if cfg.split_k > 1 else elem_bytes)
    stages = max(1, min(cfg.num_stages, (SHARED_MEMORY_LIMIT - epilogue) // per_stage))
    return GemmConfig(cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, stages, cfg.group_m,
                      cfg.split_k)


@triton.jit
def _tile_coords(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Grouped order: consecutive tiles share a band of GROUP_M rows of x (L2 reuse)."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % rows
    pid_n = (tile % per_group) // rows
    return pid_m, pid_n


@triton.jit
def _gemm_kernel(x_desc, w_desc, y_ptr, part_ptr, count_ptr, sm_ids_ptr, M, N, k_per_split,
                 stride_ym, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, RECORD_SM: tl.constexpr):
    pid = tl.program_id(0)
    record_sm(sm_ids_ptr, RECORD_SM)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_mn = tiles_m * tiles_n
    k_tiles = tl.cdiv(k_per_split, BLOCK_K)
    # flattened: the pipeline runs on across tiles. Not with split-K: the compiler's loop
    # fusion fails on the finisher's branch (triton 3.6), and decode GEMMs have ~1 tile each
    for tile in tl.range(pid, tiles_mn * SPLIT_K, tl.num_programs(0), flatten=SPLIT_K == 1):
        split = tile // tiles_mn
        pid_m, pid_n = _tile_coords(tile % tiles_mn, tiles_m, tiles_n, GROUP_M)
        k0 = split * k_per_split
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = x_desc.load([pid_m * BLOCK_M, k0 + ki * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, k0 + ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        y = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        if SPLIT_K == 1:
            tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask)
        else:
            # each split leaves fp32 partials; the tile's last split to finish (a counter per
            # output tile, nobody waits) adds them up and resets the counter
            part = part_ptr + offs_m[:, None] * N + offs_n[None, :]
            tl.store(part + split * M * N, acc, mask=mask)
            tl.debug_barrier()  # every thread's partial is written before the count
            if tl.atomic_add(count_ptr + tile % tiles_mn, 1) == SPLIT_K - 1:
                # .cg: from L2, where the other programs' stores landed, not a stale L1 line
                total = tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
                for s in tl.static_range(1, SPLIT_K):
                    total += tl.load(part + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(y, total.to(y_ptr.dtype.element_ty), mask=mask)
                tl.store(count_ptr + tile % tiles_mn, 0)  # ready for the next call


@triton.jit
def _stream_k_kernel(x_desc, w_desc, y_ptr, part_ptr, count_ptr, sm_ids_ptr, M, N, K, stride_ym,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     RECORD_SM: tl.constexpr):
    # The work is every output tile's K-slabs back to back; program p takes units
    # [p*T//P, (p+1)*T//P), so all programs read the same bytes (within one slab) whatever the
    # tile count. A tile cut between programs leaves fp32 partials at row (tile + program),
    # unique as in decode attention; its last program to finish (a counter per tile, nobody
    # waits) adds them and resets the counter.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    record_sm(sm_ids_ptr, RECORD_SM)
    tiles_m = tl.cdiv(M, BLOCK_M)
    k_tiles = tl.cdiv(K, BLOCK_K)
    total = tiles_m * tl.cdiv(N, BLOCK_N) * k_tiles
    lo = pid * total // programs
    hi = (pid + 1) * total // programs
    if lo < hi:
        for tile in range(lo // k_tiles, (hi - 1) // k_tiles + 1):
            pid_m = tile % tiles_m  # the M tiles of one weight slab run back to back (L2)
            pid_n = tile // tiles_m
            k_lo = tl.maximum(lo, tile * k_tiles) - tile * k_tiles
            k_hi = tl.minimum(hi, (tile + 1) * k_tiles) - tile * k_tiles
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_lo, k_hi):
                a = x_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
                b = w_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
                acc = tl.dot(a, b.T, acc)
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            y = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
            # the programs holding this tile's first and last unit (the largest q whose range
            # starts at or before unit x is ((x + 1) * P - 1) // T)
            first = ((tile * k_tiles + 1) * programs - 1) // total
            last = (((tile + 1) * k_tiles) * programs - 1) // total
            if first == last:
                tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask)
            else:
                tile_elems = BLOCK_M * BLOCK_N
                rows = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                tl.store(part_ptr + (tile + pid) * tile_elems + rows, acc)
                tl.debug_barrier()  # every thread's partial is written before the count
                if tl.atomic_add(count_ptr + tile, 1) == last - first:
                    total_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                    for q in range(first, last + 1):
                        # .cg: from L2, where the other programs' stores landed
                        total_acc += tl.load(part_ptr + (tile + q) * tile_elems + rows,
                                             cache_modifier=".cg")
                    tl.store(y, total_acc.to(y_ptr.dtype.element_ty), mask=mask)
                    tl.store(count_ptr + tile, 0)  # ready for the next call


def _check_tma_operand(name: str, t: torch.Tensor) -> None:
    if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
        raise PdmuxError(
            f"{name} must start on a 16-byte boundary with 16-byte-aligned rows for TMA loads "
            f"(row stride {t.stride(0)} elements of {t.element_size()} bytes); "
            f"for bf16/fp16 that means K a multiple of 8"
        )


def linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, *,
           num_sms: int | None = None, ctas_per_sm: int = 1, config: GemmConfig | None = None,
           sm_ids: torch.Tensor | None = None) -> torch.Tensor:
    """y[M, N] = x[M, K] @ weight[N, K]^T with fp32 accumulation, on at most num_sms*ctas_per_sm programs."""
    check_tensor("x", x, 2, GEMM_DTYPES)
    check_tensor("weight", weight, 2, (x.dtype,), x.device)
    M, K = x.shape
    N, Kw = weight.shape
    if K != Kw:
        raise PdmuxError(f"x has K={K} columns but weight [N, K] has K={Kw}")
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    else:
        check_tensor("out", out, 2, (x.dtype,), x.device)
        if tuple(out.shape) != (M, N):
            raise PdmuxError(f"out must have shape {(M, N)}, got {tuple(out.shape)}")
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    _check_tma_operand("x", x)
    _check_tma_operand("weight", weight)
    cfg = config
    if cfg is None:  # the budget and the whole GPU are only needed to choose a tile
        programs = grid_size(1 << 30, num_sms, ctas_per_sm, x.device)
        whole_gpu = grid_size(1 << 30, None, ctas_per_sm, x.device)
        cfg = default_config(M, N, K, programs, x.dtype, whole_gpu)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k])
    if cfg.stream_k:
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        grid = grid_size(tiles * triton.cdiv(K, cfg.block_k), num_sms, ctas_per_sm, x.device)
        sm_buf, record = telemetry_args(sm_ids, grid, x.device)
        part = torch.empty((tiles + grid, cfg.block_m * cfg.block_n), dtype=torch.float32,
                           device=x.device)
        _stream_k_kernel[(grid,)](
            x_desc, w_desc, out, part, arrival_counters(tiles, x.device), sm_buf, M, N, K,
            out.stride(0), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            RECORD_SM=record, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return out
    k_per_split = triton.cdiv(triton.cdiv(K, cfg.split_k), cfg.block_k) * cfg.block_k
    split_k = triton.cdiv(K, k_per_split)  # rounding the split up to BLOCK_K can drop a split
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n) * split_k
    grid = grid_size(tiles, num_sms, ctas_per_sm, x.device)
    sm_buf, record = telemetry_args(sm_ids, grid, x.device)
    part = (torch.empty((split_k, M, N), dtype=torch.float32, device=x.device) if split_k > 1
            else out)
    # without split-K nothing counts arrivals: any int32 buffer fills the argument
    counters = arrival_counters(tiles // split_k, x.device) if split_k > 1 else sm_buf
    _gemm_kernel[(grid,)](
        x_desc, w_desc, out, part, counters, sm_buf, M, N, k_per_split, out.stride(0),
        SPLIT_K=split_k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, RECORD_SM=record, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
