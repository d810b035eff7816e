"""Decode attention over a paged KV cache: one query token per request, GQA, split-KV.

A tile is (request, KV head, split): it streams one chunk of that request's K/V for all the
query heads sharing the KV head, so K/V are read once. The chunk size is chosen from the SM
budget and the longest request so that even a small budget has many equal tiles in flight;
partial results (output, log-sum-exp) are merged by a second persistent kernel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._launch import (check_tensor, grid_size, interpreting, record_sm,
                                          telemetry_args)
from pdmux_triton.kernels._paged import AttnConfig, attend_range, check_paged_inputs, wide_offsets

LOG2E = 1.4426950408889634
MIN_CHUNK, MAX_CHUNK, MAX_SPLITS = 256, 1024, 128
TILES_PER_PROGRAM = 2  # few long tiles stream best; MAX_CHUNK bounds the imbalance of ragged batches


def choose_chunk(batch: int, kv_heads: int, max_seq_len: int, programs: int, block_n: int) -> int:
    """KV tokens per split: ~TILES_PER_PROGRAM tiles per program, within [MIN_CHUNK, MAX_CHUNK]."""
    work = batch * kv_heads * max(1, max_seq_len)
    chunk = min(MAX_CHUNK, max(MIN_CHUNK, math.ceil(work / (programs * TILES_PER_PROGRAM))))
    chunk = max(chunk, math.ceil(max_seq_len / MAX_SPLITS))
    return triton.cdiv(chunk, block_n) * block_n


@triton.jit
def _decode_kernel(q_ptr, kc_ptr, vc_ptr, pt_ptr, len_ptr, o_ptr, part_o_ptr, part_lse_ptr,
                   sm_ids_ptr, B, KV_HEADS, num_splits, chunk, scale_log2,
                   sq_b, sq_h, so_b, so_h, sc_s, sc_h, spt_b, PAGE_SIZE: tl.constexpr,
                   GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                   D: tl.constexpr, DIRECT: tl.constexpr, WIDE: tl.constexpr,
                   RECORD_SM: tl.constexpr):
    record_sm(sm_ids_ptr, RECORD_SM)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    gmask = g < GROUP
    heads_total = B * KV_HEADS
    # split-major order: every program meets each split index in turn. Request-major order
    # with a stride can alias with the split count (16 splits, 16 programs: program p gets
    # split p of every request), and a ragged batch's late splits are mostly empty
    for t in tl.range(tl.program_id(0), heads_total * num_splits, tl.num_programs(0)):
        split = t // heads_total
        h = t % KV_HEADS
        b = (t % heads_total) // KV_HEADS
        tile = (t % heads_total) * num_splits + split  # the merge's row order: request-major
        seq_len = tl.load(len_ptr + b)
        start = split * chunk
        end = tl.minimum(seq_len, start + chunk)
        if start < end:
            heads = h * GROUP + g
            q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=gmask[:, None],
                        other=0.0)
            acc = tl.zeros((BLOCK_G, D), dtype=tl.float32)
            m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
            l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
            acc, m_i, l_i = attend_range(q, acc, m_i, l_i, kc_ptr, vc_ptr, pt_ptr + b * spt_b,
                                         PAGE_SIZE, start, end, sc_s, h * sc_h, g, scale_log2,
                                         BLOCK_N, D, MASKED=True, CAUSAL=False, EARLY_V=True,
                                         WIDE=WIDE)
            out = acc / l_i[:, None]
            if DIRECT:
                o = o_ptr + b * so_b + heads[:, None] * so_h + d[None, :]
                tl.store(o, out.to(o_ptr.dtype.element_ty), mask=gmask[:, None])
            else:
                row = tile * GROUP + g
                tl.store(part_o_ptr + row[:, None] * D + d[None, :], out, mask=gmask[:, None])
                tl.store(part_lse_ptr + row, m_i + tl.log2(l_i), mask=gmask)
        elif DIRECT:  # an empty request still owns its output rows
            o = o_ptr + b * so_b + (h * GROUP + g)[:, None] * so_h + d[None, :]
            tl.store(o, tl.zeros((BLOCK_G, D), dtype=o_ptr.dtype.element_ty), mask=gmask[:, None])


@triton.jit
def _merge_kernel(part_o_ptr, part_lse_ptr, len_ptr, o_ptr, sm_ids_ptr, B, Q_HEADS, num_splits,
                  chunk, so_b, so_h, GROUP: tl.constexpr, D: tl.constexpr,
                  BLOCK_S: tl.constexpr, RECORD_SM: tl.constexpr):
    pid = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    for r in tl.range(pid, B * Q_HEADS, tl.num_programs(0)):
        b = r // Q_HEADS
        hq = r % Q_HEADS
        used = tl.cdiv(tl.load(len_ptr + b), chunk)  # splits past the request's end are empty
        smask = s < used
        row = ((b * (Q_HEADS // GROUP) + hq // GROUP) * num_splits + s) * GROUP + hq % GROUP
        lse = tl.load(part_lse_ptr + row, mask=smask, other=float("-inf"))
        top = tl.max(lse, axis=0)
        top = tl.where(top == float("-inf"), 0.0, top)
        w = tl.where(smask, tl.exp2(lse - top), 0.0)
        o = tl.load(part_o_ptr + row[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
        total = tl.sum(w, axis=0)
        out = tl.sum(w[:, None] * o, axis=0) / tl.where(total > 0, total, 1.0)
        tl.store(o_ptr + b * so_b + hq * so_h + d, out.to(o_ptr.dtype.element_ty))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                     max_seq_len: int, sm_scale: float | None = None,
                     out: torch.Tensor | None = None, *, num_sms: int | None = None,
                     ctas_per_sm: int = 1, chunk: int | None = None,
                     config: AttnConfig | None = None,
                     sm_ids: torch.Tensor | None = None) -> torch.Tensor:
    """out[b, h] = softmax(q[b, h] . K_b^T * scale) V_b over the first seq_lens[b] cached tokens.

    q [B, Hq, D]; caches [slots, Hkv, D]; page_table [B, pages] int32 (page ids); seq_lens [B]
    int32 on the device, at most `max_seq_len` (a host bound, so the launch needs no sync and
    can be captured in a CUDA graph). A request of length 0 gets zeros.
    """
    out = check_paged_inputs(q, k_cache, v_cache, page_table, out)
    dev = q.device
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,), dev)
    B, HQ, D = q.shape
    HKV = k_cache.shape[1]
    if page_table.shape[0] != B or seq_lens.shape[0] != B:
        raise PdmuxError(f"page_table and seq_lens need one row per request ({B}), got "
                         f"{page_table.shape[0]} and {seq_lens.shape[0]}")
    if page_size < 1 or max_seq_len < 0 or max_seq_len > page_table.shape[1] * page_size:
        raise PdmuxError(f"max_seq_len {max_seq_len} must fit in the page table: "
                         f"{page_table.shape[1]} pages of {page_size} tokens")
    if B == 0:
        return out
    group = HQ // HKV
    # block_m is unused here: a tile's query rows are the GQA group, padded to 16 for tl.dot
    # 5 stages: the pipeline spends two per block (page ids, then K/V), so two blocks of K/V
    # are in flight; +20-27% over 3 stages on the H200 (bench/NOTES.md)
    cfg = config or (AttnConfig(16, 16, 4, 1) if interpreting() else AttnConfig(16, 128, 4, 5))
    block_n = cfg.block_n
    programs = grid_size(1 << 30, num_sms, ctas_per_sm, dev)
    chunk = chunk or choose_chunk(B, HKV, max_seq_len, programs, block_n)
    if chunk % block_n:
        raise PdmuxError(f"chunk must be a multiple of {block_n} tokens, got {chunk}")
    splits = max(1, triton.cdiv(max_seq_len, chunk))
    direct = splits == 1
    tiles = B * HKV * splits
    grid = grid_size(tiles, num_sms, ctas_per_sm, dev)
    sm_buf, record = telemetry_args(sm_ids, grid, dev)
    if direct:
        part_o = part_lse = out
    else:
        part_o = torch.empty((tiles * group, D), dtype=torch.float32, device=dev)
        part_lse = torch.empty((tiles * group,), dtype=torch.float32, device=dev)
    scale = (sm_scale if sm_scale is not None else D ** -0.5) * LOG2E
    _decode_kernel[(grid,)](
        q, k_cache, v_cache, page_table, seq_lens, out, part_o, part_lse, sm_buf, B, HKV, splits,
        chunk, scale, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), page_table.stride(0),
        PAGE_SIZE=page_size, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n, D=D, DIRECT=direct, WIDE=wide_offsets(k_cache), RECORD_SM=record,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if not direct:
        _merge_kernel[(grid_size(B * HQ, num_sms, ctas_per_sm, dev),)](
            part_o, part_lse, seq_lens, out, sm_buf, B, HQ, splits, chunk, out.stride(0),
            out.stride(1), GROUP=group, D=D, BLOCK_S=triton.next_power_of_2(splits),
            RECORD_SM=False, num_warps=4)
    return out
