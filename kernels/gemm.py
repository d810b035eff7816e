"""Persistent GEMM `y = x @ W^T (+ b)` (W stored [N, K] like torch Linear), grid capped to an SM
budget.

Two kernels. Prefill (M = thousands of tokens): big output tiles read through TMA, grouped
order for L2 reuse, each program looping over whole tiles. Decode (M = batch, few output
tiles): the skinny kernel, operands swapped (W rows are the MMA's M, so even M = 1 runs on
Hopper's warpgroup MMA) and loaded with cp.async; programs take whole tiles while that keeps
most of them busy, else stream-K splits the weight's (tile, K-slab) units evenly between them
and a tile cut between programs is summed by the last of them to finish (one launch, nobody
waits).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._dispatch import run_kernel
from pdmux_triton.kernels._launch import (arrival_counters, cdiv, check_tensor, check_tma_rows,
                                          grid_size, interpreting, next_power_of_2, prefetch_l2,
                                          telemetry_args)
from pdmux_triton.kernels._pinned import Pinned, pinned_budget, pinned_launch, run_slots
from pdmux_triton.kernels.activation import launch_silu_mul

GEMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    # the skinny schedule (`skinny_kernel`): whole tiles or, where too few, stream-K's even
    # split; block_m is then the rows of x per tile (the MMA's N) and block_n the rows of W
    skinny: bool = False


def decode_tile(M: int, elem: int, small_budget: bool) -> GemmConfig:
    """The tile for a decode GEMM: M <= 64, or M <= 128 on a small budget.

    M <= 64: the skinny kernel, x's rows padded to the MMA's N (16-64), 64 rows of W (one
    warpgroup MMA) per tile on the whole GPU, 128 on a small budget, where each program's own
    bandwidth is what counts. 65-128 rows on a small budget: one 128-row tile of x, so W is
    read once, and two warpgroups per 128x128 output tile, which keep the tensor cores busy
    where these rows' MMA work, not W's bytes, sets the time (bench/NOTES.md)."""
    if M > 64:
        return GemmConfig(128, 128, 64, 8, 4)
    block_m = max(16, next_power_of_2(M))
    bk = 128 if elem < 4 else 64
    if small_budget:
        return GemmConfig(block_m, 128, bk, 8, 4, skinny=True)
    return GemmConfig(block_m, 64, bk, 4, 6, skinny=True)


def default_config(M: int, N: int, K: int, programs: int, dtype: torch.dtype,
                   device_programs: int | None = None) -> GemmConfig:
    """A tile shape and schedule for this problem.

    Large M: 128x256 tiles, the best of bench/bench_kernels.py's sweep on the H200.
    Decode M (up to 64, or 128 on a small budget): see `decode_tile`; a budget of at most half
    the GPU's programs counts as small. In between: 64/128x128 tiles, the skinny schedule when
    there are fewer tiles than programs.
    """
    elem = torch.finfo(dtype).bits // 8
    small = device_programs is not None and 2 * programs <= device_programs
    if interpreting():
        cfg = GemmConfig(16, 16, 16, 4, 1)
    elif M > 1024:
        return _fit_shared_memory(GemmConfig(128, 256, 64, 8, 3, group_m=16), elem)
    elif M <= (128 if small else 64):
        return _fit_shared_memory(decode_tile(M, elem, small), elem)
    else:
        cfg = GemmConfig(64 if M <= 256 else 128, 128, 64, 4, 4)
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    return _fit_shared_memory(replace(cfg, skinny=tiles < programs), elem)


SHARED_MEMORY_LIMIT = 227 * 1024  # per block on Hopper


def _fit_shared_memory(cfg: GemmConfig, elem_bytes: int) -> GemmConfig:
    """Fewer pipeline stages until the staged x and W tiles plus the epilogue tile (converted
    through shared memory, in fp32 when the skinny kernel may write partials) fit."""
    per_stage = (cfg.block_m + cfg.block_n) * cfg.block_k * elem_bytes
    epilogue = cfg.block_m * cfg.block_n * (4 if cfg.skinny else elem_bytes)
    stages = max(1, min(cfg.num_stages, (SHARED_MEMORY_LIMIT - epilogue) // per_stage))
    return replace(cfg, num_stages=stages)


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
def _plus_bias(acc, b_ptr, rn, N, HAS_BIAS: tl.constexpr, ALONG_ROWS: tl.constexpr):
    """acc plus bias[n] (fp32): along acc's columns, or its rows when the operands are swapped."""
    if HAS_BIAS:
        b = tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        if ALONG_ROWS:
            acc = acc + b[:, None]
        else:
            acc = acc + b[None, :]
    return acc


@triton.jit(do_not_specialize=["M", "first_site", "n_sms", "slots", "programs"])
def gemm_kernel(x_desc, w_desc, y_ptr, b_ptr, sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms,
                 ctas, slots, programs, M, N, K, stride_ym, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr, RECORD_SM: tl.constexpr,
                 PINNED: tl.constexpr, PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr,
                 PDL: tl.constexpr):
    run_slots(_gemm_slot, (x_desc, w_desc, y_ptr, b_ptr, M, N, K, stride_ym, BLOCK_M, BLOCK_N,
              BLOCK_K, GROUP_M, HAS_BIAS, ACCUMULATE), sm_ids_ptr, gate_ptr, place_ptr, first_site,
              n_sms, ctas, slots, programs, RECORD_SM, PINNED, PLACED, BLOCK_SMS, PDL)


@triton.jit
def _gemm_slot(pid, programs, x_desc, w_desc, y_ptr, b_ptr, M, N, K, stride_ym,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr):
    """What program `pid` of `programs` does: whole tiles, strided by the programs."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # flattened: the pipeline runs on across tiles
    for tile in tl.range(pid, tiles_m * tiles_n, programs, flatten=True):
        pid_m, pid_n = _tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = x_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _plus_bias(acc, b_ptr, offs_n, N, HAS_BIAS, False)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        y = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        if ACCUMULATE:
            acc += tl.load(y, mask=mask, other=0.0).to(tl.float32)
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _w_rows(pid_n, N, BLOCK_N: tl.constexpr, GLU: tl.constexpr):
    """The weight rows of output tile column pid_n (N: the output's columns). GLU: the weight
    is [gate; up] ([2N, K]) and a tile's first half of rows are gate rows, its second half the
    up rows of the same output columns, so its epilogue has both. Rows past the edge are
    clamped, not masked (no predicates in the loop); their results are never stored."""
    r = tl.arange(0, BLOCK_N)
    if GLU:
        HALF: tl.constexpr = BLOCK_N // 2
        cols = tl.minimum(pid_n * HALF + r % HALF, N - 1)
        return (cols + tl.where(r >= HALF, N, 0)).to(tl.int64)
    return tl.minimum(pid_n * BLOCK_N + r, N - 1).to(tl.int64)


@triton.jit
def _swapped_product(x_ptr, w_ptr, tile, tiles_m, k_lo, k_hi, M, N, K, stride_xm, stride_wn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     EVEN_K: tl.constexpr, GLU: tl.constexpr, RMS: tl.constexpr):
    """(acc[n, m] = sum over K-slabs k_lo..k_hi of W[n, k] x[m, k] for one output tile, x's row
    indices, and with RMS the sums of x[m, k]^2 over those slabs): W's rows fill the MMA's M
    (64 per warpgroup on Hopper) however small the batch."""
    pid_m = tile % tiles_m  # the M tiles of one weight slab run back to back (L2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + tl.minimum(rm, M - 1)[:, None] * stride_xm  # clamped as W's rows
    w_rows = w_ptr + _w_rows(tile // tiles_m, N, BLOCK_N, GLU)[:, None] * stride_wn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    # elementwise in the loop, summed across the slab once after it (a reduction a trip is
    # a warp shuffle tree every slab)
    squares = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for ki in range(k_lo, k_hi):
        k = ki * BLOCK_K + rk
        if EVEN_K:
            xt = tl.load(x_rows + k[None, :])
            wt = tl.load(w_rows + k[None, :])
        else:
            xt = tl.load(x_rows + k[None, :], mask=k[None, :] < K, other=0.0)
            wt = tl.load(w_rows + k[None, :], mask=k[None, :] < K, other=0.0)
        acc = tl.dot(wt, tl.trans(xt), acc)
        if RMS:
            xf = xt.to(tl.float32)
            squares += xf * xf
    return acc, rm, tl.sum(squares, axis=1)


@triton.jit
def _rms_scaled(acc, squares, K, eps):
    """A swapped tile acc[n, m] scaled by x's row m's RMS norm, from its squares over all K."""
    return acc * tl.rsqrt(squares / K + eps)[None, :]


@triton.jit
def _store_tile(acc, y_ptr, b_ptr, tile, tiles_m, rm, M, N, stride_ym, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, GLU: tl.constexpr,
                ACCUMULATE: tl.constexpr):
    """A finished swapped tile acc[n, m] into y[m, n] (plus the bias; ACCUMULATE: plus y's
    own values, in fp32 before the rounding). GLU: silu(gate) * up of the tile's gate and up
    halves (`_w_rows`), half as many output columns."""
    if GLU:
        HALF: tl.constexpr = BLOCK_N // 2
        gate, up = tl.split(tl.permute(tl.reshape(acc, (2, HALF, BLOCK_M)), (1, 2, 0)))
        acc = gate / (1.0 + tl.exp(-gate)) * up
        cols = (tile // tiles_m) * HALF + tl.arange(0, HALF)
    else:
        cols = (tile // tiles_m) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _plus_bias(acc, b_ptr, cols, N, HAS_BIAS, True)
    y = y_ptr + rm[None, :] * stride_ym + cols[:, None]
    mask = (rm[None, :] < M) & (cols[:, None] < N)
    if ACCUMULATE:
        acc += tl.load(y, mask=mask, other=0.0).to(tl.float32)
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tiles_n(N, BLOCK_N: tl.constexpr, GLU: tl.constexpr):
    """The skinny kernel's output tile columns: N output columns, BLOCK_N weight rows a tile
    (half of them gate, half up with GLU)."""
    if GLU:
        return tl.cdiv(N, BLOCK_N // 2)
    return tl.cdiv(N, BLOCK_N)


@triton.jit
def _units_of(pid, programs, total):
    """Stream-K's even split: program pid of `programs` takes units [lo, hi) of `total`."""
    lo = (pid.to(tl.int64) * total // programs).to(tl.int32)
    hi = ((pid + 1).to(tl.int64) * total // programs).to(tl.int32)
    return lo, hi


# With programmatic dependent launch, the 128-byte lines of each W row that a skinny program
# fetches into L2 while the kernel before it drains (a weight is never written by a decode step)
PDL_PREFETCH_LINES = 8


@triton.jit
def _prefetch_w(w_ptr, pid, programs, M, N, K, stride_wn, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WHOLE_TILES: tl.constexpr,
                GLU: tl.constexpr, LINES: tl.constexpr):
    """L2 prefetches of the first LINES x 128 bytes of each W row of this program's first
    tile, from its first K-slab on (a plain launch's program: pid is the slot)."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    if WHOLE_TILES:
        tile, k0 = pid, 0
    else:
        k_tiles = tl.cdiv(K, BLOCK_K)
        lo, _ = _units_of(pid, programs, tiles_m * _tiles_n(N, BLOCK_N, GLU) * k_tiles)
        tile, k0 = lo // k_tiles, (lo % k_tiles) * BLOCK_K
    per_line: tl.constexpr = 1024 // w_ptr.dtype.element_ty.primitive_bitwidth
    cols = tl.minimum(k0 + tl.arange(0, LINES) * per_line, K - 1)
    prefetch_l2(w_ptr + _w_rows(tile // tiles_m, N, BLOCK_N, GLU)[:, None] * stride_wn
                + cols[None, :])


@triton.jit(do_not_specialize=["M", "first_site", "n_sms", "slots", "programs"])
def skinny_kernel(x_ptr, w_ptr, y_ptr, b_ptr, part_ptr, count_ptr, sm_ids_ptr, gate_ptr,
                   place_ptr, first_site, n_sms, ctas, slots, programs, M, N, K, stride_xm,
                   stride_wn, stride_ym, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, WHOLE_TILES: tl.constexpr,
                   HAS_BIAS: tl.constexpr, GLU: tl.constexpr, ACCUMULATE: tl.constexpr,
                   RMS: tl.constexpr, RECORD_SM: tl.constexpr,
                   PINNED: tl.constexpr, PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr,
                   PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    if PREFETCH_LINES > 0:  # before run_slots' wait for the kernel before (PDL, plain launch)
        _prefetch_w(w_ptr, tl.program_id(0), programs, M, N, K, stride_wn, BLOCK_M, BLOCK_N,
                    BLOCK_K, WHOLE_TILES, GLU, PREFETCH_LINES)
    run_slots(_skinny_slot, (x_ptr, w_ptr, y_ptr, b_ptr, part_ptr, count_ptr, M, N, K, stride_xm,
              stride_wn, stride_ym, eps, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, WHOLE_TILES,
              HAS_BIAS, GLU, ACCUMULATE, RMS),
              sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms, ctas, slots, programs, RECORD_SM,
              PINNED, PLACED, BLOCK_SMS, PDL)


@triton.jit
def _skinny_slot(pid, programs, x_ptr, w_ptr, y_ptr, b_ptr, part_ptr, count_ptr, M, N, K,
                 stride_xm, stride_wn, stride_ym, eps, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 WHOLE_TILES: tl.constexpr, HAS_BIAS: tl.constexpr, GLU: tl.constexpr,
                 ACCUMULATE: tl.constexpr, RMS: tl.constexpr):
    # What program `pid` of `programs` does. WHOLE_TILES: each program takes whole output
    # tiles, striding by the grid; with RMS it normalizes x's rows by the sums of squares its
    # loop over all of K gathered (an RMSNorm whose gain is in W), scaling acc's columns.
    # Otherwise stream-K: the work is every tile's K-slabs back to back and program p takes
    # units [p*T//P, (p+1)*T//P), so all programs read the same bytes (within one slab). A
    # tile cut between programs leaves fp32 partials at row (tile + program), unique as in
    # decode attention; its last program to finish (a counter per tile, nobody waits) adds
    # them and resets the counter. With RMS each partial's squares (over its own K-slabs) go
    # beside it, after every tile's partials, and the last program scales the summed tile by
    # the summed squares (the norm's scale is per row of x, so it commutes with the sum).
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles = tiles_m * _tiles_n(N, BLOCK_N, GLU)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if WHOLE_TILES:
        for tile in range(pid, tiles, programs):
            acc, rm, squares = _swapped_product(x_ptr, w_ptr, tile, tiles_m, 0, k_tiles, M, N, K,
                                                stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K,
                                                EVEN_K, GLU, RMS)
            if RMS:
                acc = _rms_scaled(acc, squares, K, eps)
            _store_tile(acc, y_ptr, b_ptr, tile, tiles_m, rm, M, N, stride_ym, BLOCK_M, BLOCK_N,
                        HAS_BIAS, GLU, ACCUMULATE)
    else:
        total = tiles * k_tiles
        lo, hi = _units_of(pid, programs, total)
        cell = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        if lo < hi:
            for tile in range(lo // k_tiles, (hi - 1) // k_tiles + 1):
                k_lo = tl.maximum(lo, tile * k_tiles) - tile * k_tiles
                k_hi = tl.minimum(hi, (tile + 1) * k_tiles) - tile * k_tiles
                acc, rm, squares = _swapped_product(x_ptr, w_ptr, tile, tiles_m, k_lo, k_hi, M,
                                                    N, K, stride_xm, stride_wn, BLOCK_M,
                                                    BLOCK_N, BLOCK_K, EVEN_K, GLU, RMS)
                # the programs holding this tile's first and last unit (the largest q whose
                # range starts at or before unit u is ((u + 1) * P - 1) // T)
                first = ((tile * k_tiles + 1).to(tl.int64) * programs - 1) // total
                last = (((tile + 1) * k_tiles).to(tl.int64) * programs - 1) // total
                if first == last:
                    if RMS:
                        acc = _rms_scaled(acc, squares, K, eps)
                    _store_tile(acc, y_ptr, b_ptr, tile, tiles_m, rm, M, N, stride_ym, BLOCK_M,
                                BLOCK_N, HAS_BIAS, GLU, ACCUMULATE)
                else:
                    tile_elems = BLOCK_N * BLOCK_M
                    # (the squares' rows start after every tile's partials: tiles + programs)
                    square_ptr = part_ptr + (tiles + programs) * tile_elems + tl.arange(0, BLOCK_M)
                    tl.store(part_ptr + (tile + pid) * tile_elems + cell, acc)
                    if RMS:
                        tl.store(square_ptr + (tile + pid) * BLOCK_M, squares)
                    tl.debug_barrier()  # every thread's partial is written before the count
                    if tl.atomic_add(count_ptr + tile, 1) == last - first:
                        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                        if RMS:
                            squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
                        for q in range(first, last + 1):
                            # .cg: from L2, where the other programs' stores landed
                            acc += tl.load(part_ptr + (tile + q) * tile_elems + cell,
                                           cache_modifier=".cg")
                            if RMS:
                                squares += tl.load(square_ptr + (tile + q) * BLOCK_M,
                                                   cache_modifier=".cg")
                        if RMS:
                            acc = _rms_scaled(acc, squares, K, eps)
                        # the bias once, in the sum
                        _store_tile(acc, y_ptr, b_ptr, tile, tiles_m, rm, M, N, stride_ym,
                                    BLOCK_M, BLOCK_N, HAS_BIAS, GLU, ACCUMULATE)
                        tl.store(count_ptr + tile, 0)  # ready for the next call


# Where stream-K can cut every tile into the same number of K ranges on at least this share of
# the programs, it runs on that many rather than cut tiles unevenly on all of them (a module
# setting, so a benchmark can time both: > 1 turns it off)
ALIGNED_SPLIT_BUSY = 0.9


def split_grid(tiles: int, programs: int) -> int:
    """Stream-K's programs: a multiple of the tiles that keeps ALIGNED_SPLIT_BUSY of them
    (every tile cut into the same number of K ranges, so none waits on an uneven share), else
    all of them."""
    pieces = programs // tiles
    if pieces >= 2 and tiles * pieces >= ALIGNED_SPLIT_BUSY * programs:
        return tiles * pieces
    return programs


def whole_tiles(tiles: int, programs: int, tile_bytes: int) -> bool:
    """Whether the skinny schedule gives each program whole tiles rather than an even split.

    Stream-K's merges sit at the end of the call, so whole tiles win while they keep 70% of a
    wave busy, and with down to 45% busy while a program's share stays short (<= 1 MB): the
    o-projection's 512 KB tiles at M = 1 stay whole (cut in two on 128 programs they timed
    slower), the down projection's 1.5 MB tiles split (bench/NOTES.md has the measurements
    behind both thresholds)."""
    waves = -(-tiles // programs)
    busy = tiles / (waves * programs)
    return busy >= 0.7 or (busy >= 0.45 and waves * tile_bytes <= 2**20)


@dataclass(frozen=True)
class GemmPlan:
    """How one problem launches: the tile config, the grid, and (skinny) whole tiles or an
    even split. `variant` is what Triton compiles per: two problems with the same variant
    share one compiled kernel."""

    config: GemmConfig
    grid: int
    whole: bool

    def variant(self, K: int) -> tuple:
        cfg = self.config
        return (cfg, self.whole if cfg.skinny else None, K % cfg.block_k == 0)


def plan(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
         num_sms: int | None = None, ctas_per_sm: int = 1,
         config: GemmConfig | None = None) -> GemmPlan:
    """How problem M x N x K launches on this budget. Planned once per problem and setting: an
    eager prefill layer plans each of its GEMMs on every call, and planning costs more host
    time than the launch's other Python (module settings and the interpreter flag are part of
    the key; a test that patches a function `plan` calls runs `forget_plans` first)."""
    key = (M, N, K, dtype, device, num_sms, ctas_per_sm, config, ALIGNED_SPLIT_BUSY,
           interpreting())
    try:
        hash(key)
    except TypeError:  # an unhashable argument: planned afresh, which names what is wrong
        return _plan(M, N, K, dtype, device, num_sms, ctas_per_sm, config)
    return _planned(*key)


@functools.lru_cache(maxsize=4096, typed=True)  # typed: num_sms=True is refused, not 1's plan
def _planned(M, N, K, dtype, device, num_sms, ctas_per_sm, config, aligned_split_busy,
             interpreter) -> GemmPlan:
    return _plan(M, N, K, dtype, device, num_sms, ctas_per_sm, config)


def forget_plans() -> None:
    """Drop the planned problems (for tests that patch what `plan` calls)."""
    _planned.cache_clear()


def _plan(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device,
          num_sms: int | None, ctas_per_sm: int, config: GemmConfig | None) -> GemmPlan:
    cfg = config
    if cfg is None:  # the budget and the whole GPU are only needed to choose a tile
        programs = grid_size(1 << 30, num_sms, ctas_per_sm, device)
        whole_gpu = grid_size(1 << 30, None, ctas_per_sm, device)
        cfg = default_config(M, N, K, programs, dtype, whole_gpu)
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    if not cfg.skinny:
        return GemmPlan(cfg, grid_size(tiles, num_sms, ctas_per_sm, device), False)
    grid = grid_size(tiles * cdiv(K, cfg.block_k), num_sms, ctas_per_sm, device)
    whole = whole_tiles(tiles, grid, cfg.block_n * K * torch.finfo(dtype).bits // 8)
    return GemmPlan(cfg, min(grid, tiles) if whole else split_grid(tiles, grid), whole)


# above this many rows every problem gets the same large-M tile (default_config)
LARGE_M = 1025


def warm_up_rows(N: int, K: int, dtype: torch.dtype, device: torch.device, budgets,
                 max_rows: int) -> list[tuple[int, int]]:
    """(rows, budget) pairs, one for each kernel variant that problems of 1..max_rows rows of
    x against an [N, K] weight compile on these budgets: running each once compiles everything
    such problems can need, so none compiles later (in a measured run)."""
    seen: dict[tuple, tuple[int, int]] = {}
    rows = [*range(1, min(max_rows, LARGE_M - 1) + 1), *([LARGE_M] if max_rows >= LARGE_M else [])]
    for budget in budgets:
        for m in rows:
            seen.setdefault(plan(m, N, K, dtype, device, budget).variant(K), (m, budget))
    return list(seen.values())


def linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, *,
           bias: torch.Tensor | None = None, accumulate: bool = False,
           rms_eps: float | None = None, num_sms: int | None = None, ctas_per_sm: int = 1,
           config: GemmConfig | None = None, sm_ids: torch.Tensor | None = None,
           pinned: Pinned | None = None,
           pdl: bool = False) -> torch.Tensor:
    """y[M, N] = x[M, K] @ weight[N, K]^T (+ bias[N]) with fp32 accumulation, on at most
    num_sms*ctas_per_sm programs (`pinned`: on those SMs, kernels/_pinned.py).

    `accumulate`: out += y, summed in fp32 before the one rounding (a residual add in the
    epilogue; `out` is then required). `rms_eps`: x's rows RMS-normalized first, x /
    sqrt(mean(x^2) + eps), inside the kernel (an RMSNorm whose gain is folded into `weight`);
    only where the problem runs on skinny tiles of a verified form (`normalizes_rows`)."""
    M, N, K = _check_problem(x, weight, bias)
    if accumulate and out is None:
        raise PdmuxError("accumulate adds into out: give out")
    out = _output(out, x, M, N)
    if M == 0 or N == 0:
        return out
    if K == 0:
        if accumulate:
            return out.add_(bias) if bias is not None else out
        return out.copy_(bias.expand(M, N)) if bias is not None else out.zero_()
    p = plan(M, N, K, x.dtype, x.device, pinned_budget(pinned, num_sms), ctas_per_sm, config)
    _launch(p, x, weight, out, bias, False, accumulate, rms_eps, sm_ids, pinned, ctas_per_sm,
            pdl)
    return out


def swiglu_linear(x: torch.Tensor, gate_up: torch.Tensor, out: torch.Tensor | None = None, *,
                  rms_eps: float | None = None, num_sms: int | None = None,
                  ctas_per_sm: int = 1, config: GemmConfig | None = None,
                  sm_ids: torch.Tensor | None = None, pinned: Pinned | None = None,
                  pdl: bool = False) -> torch.Tensor:
    """SwiGLU's y[M, I] = silu(x @ gate^T) * (x @ up^T) for the fused weight gate_up = [gate;
    up] ([2I, K]). Where the problem runs on the skinny kernel (decode), in its epilogue: one
    launch, and the [M, 2I] product is never written. Otherwise the GEMM, then `silu_mul`
    (`sm_ids` then records the GEMM's programs). `rms_eps` as `linear`'s."""
    M, two_i, K = _check_problem(x, gate_up, None)
    if two_i % 2:
        raise PdmuxError(f"gate_up must have an even number of rows [gate; up], got {two_i}")
    out = _output(out, x, M, two_i // 2)
    if M == 0 or two_i == 0:
        return out
    if K == 0:
        return out.zero_()  # silu(0) * 0
    p = plan(M, two_i, K, x.dtype, x.device, pinned_budget(pinned, num_sms), ctas_per_sm, config)
    if not p.config.skinny:  # `linear`'s launch, then `silu_mul`'s, on inputs checked here
        both = torch.empty((M, two_i), dtype=x.dtype, device=x.device)
        _launch(p, x, gate_up, both, None, False, False, rms_eps, sm_ids, pinned, ctas_per_sm,
                pdl)
        launch_silu_mul(both, out, num_sms, ctas_per_sm, None, pinned, pdl)
        return out
    _launch(p, x, gate_up, out, None, True, False, rms_eps, sm_ids, pinned, ctas_per_sm, pdl)
    return out


def normalizes_rows(M: int, weight: torch.Tensor, *, num_sms: int | None = None,
                    ctas_per_sm: int = 1, config: GemmConfig | None = None,
                    pinned: Pinned | None = None, pdl: bool = False) -> bool:
    """Whether `linear(x, weight, rms_eps=...)` (or `swiglu_linear`) normalizes M rows of x
    in the kernel on this budget: the skinny kernel, in a form the GPU verified
    (`_normalizes`). (`pdl` is accepted, and ignored, so a budget's kernel arguments pass as
    they are.)"""
    N, K = weight.shape
    p = plan(M, N, K, weight.dtype, weight.device, pinned_budget(pinned, num_sms), ctas_per_sm,
             config)
    return _normalizes(p)


def _normalizes(p: GemmPlan) -> bool:
    """Skinny tiles of at most 32 rows of x on 4 warps, whole or split between programs (each
    sums its K-slabs' squares in the same loop, merged with the tile's partials): the forms
    whose in-loop squares the GPU verified (whole tiles on the H200; split tiles on an H100,
    the same compiler and sm_90 code). Tiles of 64 rows of x and the small-budget tile's 8
    warps summed them wrongly on the H200 (triton 3.6, x's tile read both by the MMA and in
    registers), and their squares on the tensor cores (the diagonal of x x^T) were right but
    slowed the GEMMs down more than a norm apart costs (bench/NOTES.md)."""
    cfg = p.config
    return cfg.skinny and cfg.block_m <= 32 and cfg.num_warps == 4


def _check_problem(x: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None) -> tuple[int, int, int]:
    """(M, N, K) of x [M, K] against weight [N, K], or a clear error."""
    check_tensor("x", x, 2, GEMM_DTYPES)
    check_tensor("weight", weight, 2, (x.dtype,), x.device)
    M, K = x.shape
    N, Kw = weight.shape
    if K != Kw:
        raise PdmuxError(f"x has K={K} columns but weight [N, K] has K={Kw}")
    if bias is not None:
        check_tensor("bias", bias, 1, (x.dtype,), x.device)
        if bias.shape[0] != N:
            raise PdmuxError(f"bias must have N={N} entries, got {bias.shape[0]}")
    return M, N, K


def _output(out: torch.Tensor | None, x: torch.Tensor, M: int, N: int) -> torch.Tensor:
    if out is None:
        return torch.empty((M, N), dtype=x.dtype, device=x.device)
    check_tensor("out", out, 2, (x.dtype,), x.device)
    if tuple(out.shape) != (M, N):
        raise PdmuxError(f"out must have shape {(M, N)}, got {tuple(out.shape)}")
    return out


def _launch(p: GemmPlan, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
            bias: torch.Tensor | None, glu: bool, accumulate: bool, rms_eps: float | None,
            sm_ids: torch.Tensor | None, pinned: Pinned | None, ctas_per_sm: int,
            pdl: bool) -> None:
    """One launch of planned problem `p` into `out` (glu: the skinny kernel's SwiGLU epilogue,
    `out` has half the weight's rows as columns; accumulate, rms_eps: `linear`'s)."""
    M, K = x.shape
    N = out.shape[1]  # the output's columns: the weight's rows, half of them with glu
    cfg, grid = p.config, p.grid
    if rms_eps is not None:
        if not _normalizes(p):
            how = ("as prefill tiles" if not cfg.skinny
                   else f"on {cfg.block_m}-row tiles with {cfg.num_warps} warps")
            raise PdmuxError(f"a GEMM normalizes x's rows (rms_eps) only on skinny tiles of "
                             f"up to 32 rows on 4 warps; {M} rows against a "
                             f"[{weight.shape[0]}, {K}] weight run {how} here: normalize them "
                             f"first (rmsnorm)")
        if not (rms_eps > 0 and math.isfinite(rms_eps)):
            raise PdmuxError(f"rms_eps must be a positive finite number, got {rms_eps!r}")
    launch = pinned_launch(pinned, grid, ctas_per_sm, x.device, pdl)
    sm_buf, record = telemetry_args(sm_ids, grid, x.device)
    bias_arg = out if bias is None else bias  # any pointer: HAS_BIAS compiles the loads away
    if cfg.skinny:
        if p.whole:
            part = counters = out  # nothing is split: no partials, no counters
        else:
            # a program's range cuts at most one tile at each end: tiles + programs partials,
            # and with rms_eps as many rows of their squares after all of them
            tiles = cdiv(M, cfg.block_m) * cdiv(weight.shape[0], cfg.block_n)
            floats = cfg.block_m * cfg.block_n + (cfg.block_m if rms_eps is not None else 0)
            part = torch.empty((tiles + grid) * floats, dtype=torch.float32, device=x.device)
            counters = arrival_counters(tiles, x.device)
        run_kernel(skinny_kernel, launch.grid,
            x, weight, out, bias_arg, part, counters, sm_buf, *launch.args, M, N, K, x.stride(0),
            weight.stride(0), out.stride(0), rms_eps or 0.0, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=K % cfg.block_k == 0,
            WHOLE_TILES=p.whole, HAS_BIAS=bias is not None, GLU=glu, ACCUMULATE=accumulate,
            RMS=rms_eps is not None, RECORD_SM=record, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, PREFETCH_LINES=PDL_PREFETCH_LINES if pdl else 0,
            **launch.kwargs)
        return
    for name, t in (("x", x), ("weight", weight)):
        check_tma_rows(name, t, "; for bf16/fp16 that means K a multiple of 8")
    run_kernel(gemm_kernel, launch.grid,
        TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k]),
        TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k]), out, bias_arg, sm_buf,
        *launch.args, M, N, K, out.stride(0), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, HAS_BIAS=bias is not None,
        ACCUMULATE=accumulate, RECORD_SM=record, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **launch.kwargs)
