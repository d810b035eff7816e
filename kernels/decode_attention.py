"""Decode attention over a paged KV cache: one query token per request, GQA, split-KV.

A unit is (request, KV head): it streams that request's K/V once for all the query heads
sharing the KV head. The programs split the units' K/V blocks evenly between them on the
device, from the lengths in device memory (so a CUDA graph can capture the launch), which
keeps even a small SM budget streaming: every program reads the same number of blocks in ~2
long runs. Units cut between programs are merged by their last program (log-sum-exp weights).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._dispatch import run_kernel
from pdmux_triton.kernels._launch import (arrival_counters, cdiv, check_tensor, interpreting,
                                          next_power_of_2, prefetch_l2)
from pdmux_triton.kernels._paged import AttnConfig, attend_range, check_paged_inputs, wide_offsets
from pdmux_triton.kernels._pinned import Pinned, budget_launch, run_slots

LOG2E = 1.4426950408889634


# A unit's fixed cost (loading q and the first page ids and K/V, writing the result) in
# blocks' worth of streaming. Counted as 0, a batch padded with length-1 rows left one program
# dozens of one-block units; the value was swept on ragged, padded and uniform batches
# (bench/NOTES.md has what each gave)
UNIT_COST = 2

# With programmatic dependent launch, the K/V blocks (a power of two; 0: none) at the head of a
# program's first segment that it fetches into L2 while the kernel before it drains: the
# segment's first blocks would otherwise wait in the memory queue as its pipeline starts
# (more blocks, or later segments' heads, measured no better: bench/NOTES.md). Read before the
# wait: the lengths and page table, which a caller writes before the step's kernels, never one
# of them (`decode_attention`); the K/V a kernel before it writes (the new token's) lands in
# L2, where the hint reads it
PDL_PREFETCH_BLOCKS = 1


@triton.jit
def _request_slots(b, work, bi):
    """(slots of one unit of the requests before b, slots of one unit of request b)."""
    return tl.sum(tl.where(bi < b, work, 0), axis=0), tl.sum(tl.where(bi == b, work, 0), axis=0)


@triton.jit
def _program_range(pid, programs, len_ptr, B, KV_HEADS, BLOCK_N: tl.constexpr,
                   BLOCK_B: tl.constexpr, UNIT_COST: tl.constexpr):
    """(slots per unit of each request, request ids, slots per program, this program's first
    slot, the end of its slots). The work is every unit's K/V blocks back to back, each unit
    led by UNIT_COST slots for its fixed cost; each program takes an equal contiguous range."""
    bi = tl.arange(0, BLOCK_B)
    nb = tl.cdiv(tl.load(len_ptr + bi, mask=bi < B, other=0), BLOCK_N)
    work = tl.where(nb > 0, nb + UNIT_COST, 0)
    total = tl.sum(work, axis=0) * KV_HEADS
    per_program = tl.maximum(1, tl.cdiv(total, programs))
    lo = pid * per_program
    return work, bi, per_program, lo, tl.minimum(lo + per_program, total)


@triton.jit
def _segment(u, lo, hi, work, bi, KV_HEADS, UNIT_COST: tl.constexpr):
    """Unit u's part of the slots [lo, hi): (request, KV head, the unit's end slot, the slot of
    its first block, the part's first and end slots; empty where the part holds only the
    unit's fixed-cost slots)."""
    b = u // KV_HEADS
    h = u % KV_HEADS
    before, size = _request_slots(b, work, bi)
    u_end = before * KV_HEADS + (h + 1) * size
    first_block = u_end - size + UNIT_COST
    return b, h, u_end, first_block, tl.maximum(lo, first_block), tl.minimum(hi, u_end)


@triton.jit
def first_segment_head(VISIT: tl.constexpr, visit_args, pid, programs, pt_ptr, len_ptr, B,
                       KV_HEADS, sc_s, sc_h, spt_b, PAGE_SIZE: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, UNIT_COST: tl.constexpr,
                       KEYS: tl.constexpr, D: tl.constexpr, LINES: tl.constexpr,
                       WIDE: tl.constexpr):
    """`VISIT(offsets, *visit_args)` for program pid's first segment, where it reads any K/V:
    offsets [KEYS, LINES] into the caches of the segment's first KEYS keys' rows of its head
    (past the segment's end, its last key again), one per 128-byte line of a row. That segment
    is the unit holding the program's first slot (units of empty requests hold none); if the
    program's range ends inside that unit's fixed-cost slots it reads no K/V at all. Reads only
    what no earlier kernel of a decode step writes (lengths, pages)."""
    work, bi, _, lo, hi = _program_range(pid, programs, len_ptr, B, KV_HEADS, BLOCK_N, BLOCK_B,
                                         UNIT_COST)
    if lo < hi:
        b, h, _, first_block, seg_lo, seg_hi = _segment(_unit_at(lo, work, bi, KV_HEADS), lo, hi,
                                                        work, bi, KV_HEADS, UNIT_COST)
        if seg_lo < seg_hi:
            start = (seg_lo - first_block) * BLOCK_N
            end = tl.minimum(tl.load(len_ptr + b), (seg_hi - first_block) * BLOCK_N)
            pos = tl.minimum(start + tl.arange(0, KEYS), end - 1).to(tl.uint32)
            page = tl.load(pt_ptr + b * spt_b + pos // PAGE_SIZE)
            slot = page * PAGE_SIZE + (pos % PAGE_SIZE).to(tl.int32)
            if WIDE:
                slot = slot.to(tl.int64)
            line = tl.arange(0, LINES) * (D // LINES)
            VISIT(slot[:, None] * sc_s + h * sc_h + line[None, :], *visit_args)


@triton.jit
def _prefetch_kv(offsets, kc_ptr, vc_ptr):
    prefetch_l2(kc_ptr + offsets)
    prefetch_l2(vc_ptr + offsets)


@triton.jit
def _unit_at(pos, work, bi, KV_HEADS):
    """The unit (request * KV_HEADS + head) holding work slot `pos`; each unit of request b
    holds work[b] slots, back to back."""
    b = tl.sum((tl.cumsum(work, axis=0) * KV_HEADS <= pos).to(tl.int32), axis=0)
    before, size = _request_slots(b, work, bi)
    return b * KV_HEADS + (pos - before * KV_HEADS) // size


@triton.jit(do_not_specialize=["B", "spt_b", "first_site", "n_sms", "slots", "programs"])
def decode_kernel(q_ptr, kc_ptr, vc_ptr, pt_ptr, len_ptr, o_ptr, part_o_ptr, part_lse_ptr,
                   count_ptr, sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms, ctas, slots,
                   programs, B, KV_HEADS, scale_log2, sq_b, sq_h, so_b, so_h, sc_s, sc_h, spt_b,
                   PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, UNIT_COST: tl.constexpr,
                   D: tl.constexpr, WIDE: tl.constexpr, RECORD_SM: tl.constexpr,
                   PINNED: tl.constexpr, PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr,
                   PDL: tl.constexpr, APART: tl.constexpr, PREFETCH_KEYS: tl.constexpr,
                   LINES: tl.constexpr):
    if PREFETCH_KEYS > 0:  # before run_slots' wait for the kernel before (PDL, plain launch)
        gdc_launch_dependents()  # the next kernel first: the prefetch waits on two reads
        first_segment_head(_prefetch_kv, (kc_ptr, vc_ptr), tl.program_id(0), tl.num_programs(0),
                           pt_ptr, len_ptr, B, KV_HEADS, sc_s, sc_h, spt_b, PAGE_SIZE, BLOCK_N,
                           BLOCK_B, UNIT_COST, PREFETCH_KEYS, D, LINES, WIDE)
    run_slots(_decode_slot_apart if APART else _decode_slot,
              (q_ptr, kc_ptr, vc_ptr, pt_ptr, len_ptr, o_ptr, part_o_ptr, part_lse_ptr, count_ptr,
               B, KV_HEADS, scale_log2, sq_b, sq_h, so_b, so_h, sc_s, sc_h, spt_b, PAGE_SIZE,
               GROUP, BLOCK_G, BLOCK_N, BLOCK_B, UNIT_COST, D, WIDE), sm_ids_ptr,
              gate_ptr, place_ptr, first_site, n_sms, ctas, slots, programs, RECORD_SM, PINNED,
              PLACED, BLOCK_SMS, PDL)


@triton.jit
def _decode_slot(pid, programs, q_ptr, kc_ptr, vc_ptr, pt_ptr, len_ptr, o_ptr, part_o_ptr,
                 part_lse_ptr, count_ptr, B, KV_HEADS, scale_log2, sq_b, sq_h, so_b, so_h, sc_s,
                 sc_h, spt_b, PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, UNIT_COST: tl.constexpr,
                 D: tl.constexpr, WIDE: tl.constexpr):
    # What program `pid` of `programs` does: its equal range of the work (`_program_range`),
    # whatever the lengths, so ragged and uniform batches stream alike and a program restarts
    # its pipeline only at unit edges (~2 per program). A unit cut between programs leaves
    # partials; the last of its programs to finish (a counter per unit, no waiting) merges them
    # and resets the counter.
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    gmask = g < GROUP
    work, bi, per_program, lo, hi = _program_range(pid, programs, len_ptr, B, KV_HEADS,
                                                   BLOCK_N, BLOCK_B, UNIT_COST)
    for b in range(pid, B, programs):  # an empty request still owns its output rows
        if tl.load(len_ptr + b) == 0:
            for h in range(KV_HEADS):
                o = o_ptr + b * so_b + (h * GROUP + g)[:, None] * so_h + d[None, :]
                tl.store(o, tl.zeros((BLOCK_G, D), dtype=o_ptr.dtype.element_ty),
                         mask=gmask[:, None])
    if lo < hi:
        for u in range(_unit_at(lo, work, bi, KV_HEADS), _unit_at(hi - 1, work, bi, KV_HEADS) + 1):
            b, h, u_end, first_block, seg_lo, seg_hi = _segment(u, lo, hi, work, bi, KV_HEADS,
                                                                UNIT_COST)
            if seg_lo < seg_hi:  # a range may hold only a unit's fixed-cost slots; empty
                #                  requests' units hold none at all
                heads = h * GROUP + g
                q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :],
                            mask=gmask[:, None], other=0.0)
                acc = tl.zeros((BLOCK_G, D), dtype=tl.float32)
                m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
                l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
                end = tl.minimum(tl.load(len_ptr + b), (seg_hi - first_block) * BLOCK_N)
                acc, m_i, l_i = attend_range(q, acc, m_i, l_i, kc_ptr, vc_ptr, pt_ptr + b * spt_b,
                                             PAGE_SIZE, (seg_lo - first_block) * BLOCK_N, end,
                                             sc_s, h * sc_h, scale_log2, BLOCK_N, D,
                                             MASKED=True, EARLY_V=True, WIDE=WIDE)
                o = o_ptr + b * so_b + heads[:, None] * so_h + d[None, :]
                first = first_block // per_program  # the programs holding the unit's blocks
                last = (u_end - 1) // per_program
                if first == last:  # the whole unit was this program's
                    tl.store(o, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty),
                             mask=gmask[:, None])
                else:
                    # partial rows (u + program) are unique: along the work, every new
                    # segment moves to the next unit, the next program, or both
                    row = (u + pid) * GROUP + g
                    tl.store(part_o_ptr + row[:, None] * D + d[None, :], acc / l_i[:, None],
                             mask=gmask[:, None])
                    tl.store(part_lse_ptr + row, m_i + tl.log2(l_i), mask=gmask)
                    tl.debug_barrier()  # every thread's partial is written before the count
                    if tl.atomic_add(count_ptr + u, 1) == last - first:
                        _merge_unit(part_o_ptr, part_lse_ptr, o, u, first, last, g, gmask, d,
                                    GROUP, BLOCK_G, D)
                        tl.store(count_ptr + u, 0)  # ready for the next call


# the body as a function of its own, for pinned launches of several programs an SM (the source
# is `_decode_slot`'s: only the call differs). Never for the GEMMs: a call in their kernel puts
# a warpgroup sync before every wgmma
_decode_slot_apart = triton.jit(_decode_slot.fn, noinline=True)


@triton.jit
def _merge_unit(part_o_ptr, part_lse_ptr, o, u, first, last, g, gmask, d, GROUP: tl.constexpr,
                BLOCK_G: tl.constexpr, D: tl.constexpr):
    """out = the partials of programs first..last, each weighted by its share of exp(lse)."""
    acc = tl.zeros((BLOCK_G, D), dtype=tl.float32)
    top = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((BLOCK_G,), dtype=tl.float32)
    for p in range(first, last + 1):
        row = (u + p) * GROUP + g
        # .cg: read from L2, where the other programs' stores landed, never a stale L1 line
        lse = tl.load(part_lse_ptr + row, mask=gmask, other=0.0, cache_modifier=".cg")
        part = tl.load(part_o_ptr + row[:, None] * D + d[None, :], mask=gmask[:, None],
                       other=0.0, cache_modifier=".cg")
        new_top = tl.maximum(top, lse)
        scale = tl.exp2(top - new_top)
        w = tl.exp2(lse - new_top)
        acc = acc * scale[:, None] + w[:, None] * part
        total = total * scale + w
        top = new_top
    tl.store(o, (acc / total[:, None]).to(o.dtype.element_ty), mask=gmask[:, None])


def cache_lines(k_cache: torch.Tensor) -> int:
    """128-byte lines in one head's K (or V) row of a cache [slots, heads, D] (at least 1)."""
    return max(1, k_cache.shape[2] * k_cache.element_size() // 128)


def default_decode_config(ctas_per_sm: int) -> AttnConfig:
    """128 keys per step, 4 warps (block_m is unused: a tile's query rows are the GQA group,
    padded to 16 for tl.dot). One program per SM: 5 stages; the pipeline spends two per block
    (page ids, then K/V), so two blocks of K/V are in flight. Several per SM (green contexts,
    where a grid larger than the budget stays on the partition's SMs): 3 stages, ~70 KB of
    shared memory each, so three fit an SM and each warp scheduler issues from three programs'
    warps, which hides the stalls one program leaves (bench/results/kernels-<gpu>.json rows
    `placement: green` measure the gain)."""
    if interpreting():
        return AttnConfig(16, 16, 4, 1)
    return AttnConfig(16, 128, 4, 5 if ctas_per_sm == 1 else 3)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                     max_seq_len: int, sm_scale: float | None = None,
                     out: torch.Tensor | None = None, *, num_sms: int | None = None,
                     ctas_per_sm: int = 1, config: AttnConfig | None = None,
                     sm_ids: torch.Tensor | None = None,
                     pinned: Pinned | None = None,
                     pdl: bool = False) -> torch.Tensor:
    """out[b, h] = softmax(q[b, h] . K_b^T * scale) V_b over the first seq_lens[b] cached tokens.

    q [B, Hq, D]; caches [slots, Hkv, D]; page_table [B, pages] int32 (page ids); seq_lens [B]
    int32 on the device, at most `max_seq_len` (a host bound, so the launch needs no sync and
    can be captured in a CUDA graph: the kernel splits the work by the lengths it reads). A
    request of length 0 gets zeros. With `pdl`, seq_lens and page_table are read before the
    wait for the kernel before (`PDL_PREFETCH_BLOCKS`): write them before the launches that
    overlap, never in a kernel launched just before this one. Calls on one stream run in
    order; calls on concurrent streams each get their own counters. `pinned`: run on those
    SMs (kernels/_pinned.py).
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
    cfg = config or default_decode_config(ctas_per_sm)
    prefetch_blocks = PDL_PREFETCH_BLOCKS
    if prefetch_blocks & (prefetch_blocks - 1):
        raise PdmuxError(f"PDL_PREFETCH_BLOCKS must be 0 or a power of two, got {prefetch_blocks}")
    units = B * HKV
    launch, sm_buf, record = budget_launch(units * max(1, cdiv(max_seq_len, cfg.block_n)),
                                           num_sms, ctas_per_sm, dev, pinned, pdl, sm_ids)
    grid = launch.slots
    # pinned programs several to an SM call the body as a function of its own: inlined in the
    # gate's slot loop it takes more registers than c programs an SM leave it, and capped to
    # fit it spills; called apart it fits uncapped and runs faster (bench/NOTES.md, sessions
    # 47-48)
    apart = pinned is not None and ctas_per_sm > 1
    # a program's range cuts at most one unit at each end: units + programs partial rows
    part_o = torch.empty(((units + grid) * group, D), dtype=torch.float32, device=dev)
    part_lse = torch.empty(((units + grid) * group,), dtype=torch.float32, device=dev)
    scale = (sm_scale if sm_scale is not None else D ** -0.5) * LOG2E
    run_kernel(decode_kernel, launch.grid,
        q, k_cache, v_cache, page_table, seq_lens, out, part_o, part_lse,
        arrival_counters(units, dev), sm_buf, *launch.args, B, HKV, scale, q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1), page_table.stride(0),
        PAGE_SIZE=page_size, GROUP=group, BLOCK_G=max(16, next_power_of_2(group)),
        BLOCK_N=cfg.block_n, BLOCK_B=next_power_of_2(B), UNIT_COST=UNIT_COST, D=D,
        WIDE=wide_offsets(k_cache), RECORD_SM=record, APART=apart,
        # (one program an SM, where it was timed; several an SM read more in flight already)
        PREFETCH_KEYS=prefetch_blocks * cfg.block_n if pdl and ctas_per_sm == 1 else 0,
        LINES=cache_lines(k_cache),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch.kwargs)
    return out
