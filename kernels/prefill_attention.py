"""Prefill (extend) attention: new tokens of a batch of sequences attend causally to their
earlier tokens in the paged KV cache (the prefix) and to each other.

Serves whole prefills (prefix 0), chunked prefill (each chunk after the earlier chunks) and
layer-split prefill alike. The prefix is gathered from the cache page by page; the new tokens'
K/V come from the contiguous tensors the QKV projection produced, read through TMA, as SGLang's
extend attention reads k_extend (fewer instructions per key block than a paged gather, which
matters here: the loop is compute-bound). A tile is (query block of one sequence, query head);
tiles are ordered longest first so the persistent programs finish together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._dispatch import run_kernel
from pdmux_triton.kernels._launch import cdiv, check_tensor, check_tma_rows, interpreting
from pdmux_triton.kernels._pinned import Pinned, budget_launch, run_slots
from pdmux_triton.kernels._paged import (AttnConfig, attend_range, check_paged_inputs, softmax_step,
                                         wide_offsets)

LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["num_blocks", "B", "spt_b", "first_site", "n_sms", "slots",
                               "programs"])
def _extend_kernel(q_desc, k_desc, v_desc, kc_ptr, vc_ptr, pt_ptr, meta_ptr, o_ptr, sm_ids_ptr,
                   gate_ptr, place_ptr, first_site, n_sms, ctas, slots, programs, num_blocks, B,
                   Q_HEADS, scale_log2, so_t, so_h, sc_s, sc_h, spt_b, PAGE_SIZE: tl.constexpr,
                   GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   D: tl.constexpr, WIDE: tl.constexpr, RECORD_SM: tl.constexpr,
                   PINNED: tl.constexpr, PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr,
                   PDL: tl.constexpr):
    run_slots(_extend_slot, (q_desc, k_desc, v_desc, kc_ptr, vc_ptr, pt_ptr, meta_ptr, o_ptr,
              num_blocks, B, Q_HEADS, scale_log2, so_t, so_h, sc_s, sc_h, spt_b, PAGE_SIZE, GROUP,
              BLOCK_M, BLOCK_N, D, WIDE), sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms, ctas,
              slots, programs, RECORD_SM, PINNED, PLACED, BLOCK_SMS, PDL)


@triton.jit
def _extend_slot(pid, programs, q_desc, k_desc, v_desc, kc_ptr, vc_ptr, pt_ptr, meta_ptr, o_ptr,
                 num_blocks, B, Q_HEADS, scale_log2, so_t, so_h, sc_s, sc_h, spt_b,
                 PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, D: tl.constexpr, WIDE: tl.constexpr):
    # What program `pid` of `programs` does. meta (int32): q_start[B], extend_len[B],
    # prefix_len[B], then (seq, q block) per block
    tiles = num_blocks * Q_HEADS
    # tiles come longest first; taking them in a zigzag (program p gets the p-th tile of even
    # rounds and the p-th from the end of odd ones) pairs long with short
    for rnd in tl.range(0, tl.cdiv(tiles, programs)):
        tile = rnd * programs + tl.where(rnd % 2 == 0, pid, programs - 1 - pid)
        if tile < tiles:
            _extend_tile(tile, q_desc, k_desc, v_desc, kc_ptr, vc_ptr, pt_ptr, meta_ptr, o_ptr, B,
                         Q_HEADS, scale_log2, so_t, so_h, sc_s, sc_h, spt_b,
                         PAGE_SIZE, GROUP, BLOCK_M, BLOCK_N, D, WIDE)


@triton.jit
def _extend_tile(tile, q_desc, k_desc, v_desc, kc_ptr, vc_ptr, pt_ptr, meta_ptr, o_ptr, B, Q_HEADS,
                 scale_log2, so_t, so_h, sc_s, sc_h, spt_b, PAGE_SIZE: tl.constexpr,
                 GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 D: tl.constexpr, WIDE: tl.constexpr):
    d = tl.arange(0, D)
    entry = tile // Q_HEADS
    hq = tile % Q_HEADS
    b = tl.load(meta_ptr + 3 * B + 2 * entry)
    qb = tl.load(meta_ptr + 3 * B + 2 * entry + 1)
    q_start = tl.load(meta_ptr + b)
    ext = tl.load(meta_ptr + B + b)
    prefix = tl.load(meta_ptr + 2 * B + b)
    rows = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < ext
    tok = (q_start + rows).to(tl.int64)
    q = q_desc.load([q_start + qb * BLOCK_M, hq * D])  # rows past the sequence: not stored
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    kv_head = hq // GROUP
    # the prefix, from the cache: visible to every row, so only its last part-block is masked;
    # skipped as a whole when empty (whole prefills): even empty, the pipelined loops cost time
    if prefix > 0:
        page_row = pt_ptr + b * spt_b
        whole = prefix // BLOCK_N * BLOCK_N
        acc, m_i, l_i = attend_range(q, acc, m_i, l_i, kc_ptr, vc_ptr, page_row, PAGE_SIZE, 0,
                                     whole, sc_s, kv_head * sc_h, scale_log2, BLOCK_N, D,
                                     MASKED=False, EARLY_V=False, WIDE=WIDE)
        acc, m_i, l_i = attend_range(q, acc, m_i, l_i, kc_ptr, vc_ptr, page_row, PAGE_SIZE, whole,
                                     prefix, sc_s, kv_head * sc_h, scale_log2, BLOCK_N, D,
                                     MASKED=True, EARLY_V=False, WIDE=WIDE)
    # the new tokens (index i within the sequence's new ones): keys before the block's first
    # query are visible to every row, whole blocks unmasked; the rest causally masked
    lo = qb * BLOCK_M // BLOCK_N * BLOCK_N
    hi = tl.minimum((qb + 1) * BLOCK_M, ext)
    acc, m_i, l_i = _attend_new(q, acc, m_i, l_i, k_desc, v_desc, q_start, kv_head * D, 0, lo,
                                rows, scale_log2, BLOCK_N, MASKED=False)
    acc, m_i, l_i = _attend_new(q, acc, m_i, l_i, k_desc, v_desc, q_start, kv_head * D, lo, hi,
                                rows, scale_log2, BLOCK_N, MASKED=True)
    out = acc / l_i[:, None]
    tl.store(o_ptr + tok[:, None] * so_t + hq * so_h + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=rmask[:, None])


@triton.jit
def _attend_new(q, acc, m_i, l_i, k_desc, v_desc, row0, col, start, end, q_idx, scale_log2,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """Fold new keys [start, end) (rows row0 + i of the [tokens, kv_heads * D] K/V views) into
    (acc, m_i, l_i); with MASKED, key i counts where i < end and i <= the row's q_idx. Rows
    past the sequence (the next one's, or TMA's zero fill past the tensor) are masked off."""
    for n in range(start, end, BLOCK_N):
        k = k_desc.load([row0 + n, col])
        qk = tl.dot(q, tl.trans(k))
        i = n + tl.arange(0, BLOCK_N)
        valid = (i[None, :] < end) & (i[None, :] <= q_idx[:, None])
        p, alpha, m_i, l_i = softmax_step(qk, m_i, l_i, valid, scale_log2, MASKED)
        v = v_desc.load([row0 + n, col])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_i, l_i


# the best of the H200 sweep (bench/NOTES.md): 128x128 tiles, 8 warps, 3 stages; made once, not
# per launch
GPU_CONFIG = AttnConfig(128, 128, 8, 3)
INTERPRETER_CONFIG = AttnConfig(16, 16, 1, 1)


def default_config() -> AttnConfig:
    return INTERPRETER_CONFIG if interpreting() else GPU_CONFIG


@dataclass(frozen=True)
class ExtendPlan:
    """Per-sequence offsets and the longest-first list of query blocks, on the device.

    Made once per batch and reused by every layer: building it copies host data to the GPU.
    """

    meta: torch.Tensor  # int32: q_start[B], extend_len[B], prefix_len[B], (seq, block) pairs
    num_blocks: int
    block_m: int
    extend_lens: tuple[int, ...]
    prefix_lens: tuple[int, ...]


def plan_extend(extend_lens: Sequence[int], prefix_lens: Sequence[int], device,
                block_m: int | None = None) -> ExtendPlan:
    if len(extend_lens) != len(prefix_lens):
        raise PdmuxError(f"{len(extend_lens)} extend lengths but {len(prefix_lens)} prefix lengths")
    if any(e < 0 for e in extend_lens) or any(p < 0 for p in prefix_lens):
        raise PdmuxError("extend and prefix lengths must be >= 0")
    block_m = block_m or default_config().block_m
    starts, total = [], 0
    for e in extend_lens:
        starts.append(total)
        total += e
    blocks = [(b, qb) for b, e in enumerate(extend_lens) for qb in range(cdiv(e, block_m))]
    # a block's work grows with the keys it sees: prefix plus its end within the sequence
    blocks.sort(key=lambda x: -(prefix_lens[x[0]] + min((x[1] + 1) * block_m, extend_lens[x[0]])))
    flat = torch.tensor([*starts, *extend_lens, *prefix_lens, *(v for blk in blocks for v in blk)],
                        dtype=torch.int32)
    device = torch.device(device)
    if device.type == "cuda":
        flat = flat.pin_memory()  # an async copy: a pageable one would wait for the stream
    return ExtendPlan(flat.to(device, non_blocking=True), len(blocks), block_m,
                      tuple(extend_lens), tuple(prefix_lens))


def extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, page_table: torch.Tensor, extend_lens: Sequence[int],
                     prefix_lens: Sequence[int], page_size: int, sm_scale: float | None = None,
                     out: torch.Tensor | None = None, *, num_sms: int | None = None,
                     ctas_per_sm: int = 1, config: AttnConfig | None = None,
                     plan: ExtendPlan | None = None, sm_ids: torch.Tensor | None = None,
                     pinned: Pinned | None = None,
                     pdl: bool = False) -> torch.Tensor:
    """Causal attention of q [sum(extend_lens), Hq, D] (sequences packed back to back) over each
    sequence's prefix_lens[b] cached tokens and its extend_lens[b] new ones, whose keys and
    values k, v [sum(extend_lens), Hkv, D] are read from those tensors (views of the QKV output
    do: rows may be strided, each row's heads contiguous).

    Pass a `plan` from `plan_extend` to reuse the batch's device metadata across layers."""
    out = check_paged_inputs(q, k_cache, v_cache, page_table, out)
    dev = q.device
    T, HQ, D = q.shape
    HKV = k_cache.shape[1]
    B = len(extend_lens)
    for name, t, heads in (("q", q, HQ), ("k", k, HKV), ("v", v, HKV)):
        check_tensor(name, t, 3, (q.dtype,), dev)
        if t.shape != (T, heads, D) or (heads > 1 and t.stride(1) != D):
            raise PdmuxError(f"{name} must be [{T}, {heads}, {D}] with each row's heads "
                             f"contiguous, got shape {tuple(t.shape)} strides {t.stride()}")
        check_tma_rows(name, t)
    if sum(extend_lens) != T:
        raise PdmuxError(f"q has {T} tokens but extend_lens sum to {sum(extend_lens)}")
    if page_table.shape[0] < B:
        raise PdmuxError(f"page_table has {page_table.shape[0]} rows for {B} sequences")
    longest = max((e + p for e, p in zip(extend_lens, prefix_lens)), default=0)
    if longest > page_table.shape[1] * page_size:
        raise PdmuxError(f"a sequence of {longest} tokens does not fit the page table: "
                         f"{page_table.shape[1]} pages of {page_size}")
    if T == 0:
        return out
    cfg = config or default_config()
    if plan is None:
        plan = plan_extend(extend_lens, prefix_lens, dev, cfg.block_m)
    elif (plan.block_m, plan.extend_lens, plan.prefix_lens) != (cfg.block_m, tuple(extend_lens),
                                                               tuple(prefix_lens)):
        raise PdmuxError("the extend plan was made for other lengths or another block_m")
    meta, num_blocks = plan.meta, plan.num_blocks
    launch, sm_buf, record = budget_launch(num_blocks * HQ, num_sms, ctas_per_sm, dev, pinned,
                                           pdl, sm_ids)
    scale = (sm_scale if sm_scale is not None else D ** -0.5) * LOG2E
    q_desc = TensorDescriptor(q, [T, HQ * D], [q.stride(0), 1], [cfg.block_m, D])
    k_desc, v_desc = (TensorDescriptor(t, [T, HKV * D], [t.stride(0), 1], [cfg.block_n, D])
                      for t in (k, v))
    run_kernel(_extend_kernel, launch.grid,
        q_desc, k_desc, v_desc, k_cache, v_cache, page_table, meta, out, sm_buf, *launch.args,
        num_blocks, B, HQ, scale, out.stride(0), out.stride(1), k_cache.stride(0),
        k_cache.stride(1), page_table.stride(0), PAGE_SIZE=page_size, GROUP=HQ // HKV,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, D=D, WIDE=wide_offsets(k_cache),
        RECORD_SM=record, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch.kwargs)
    return out
