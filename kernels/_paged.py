"""The inner loop both attention kernels share: online softmax over a range of KV positions
gathered from the paged cache ([slots, kv_heads, head_dim]; slot = page * page_size + offset)."""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._launch import FLOAT_DTYPES, check_tensor


@dataclass(frozen=True)
class AttnConfig:
    """Tile shape of an attention kernel: query rows per tile (prefill), keys per step, warps,
    software-pipeline depth. Launchers pick a default; kernel developers pass their own."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def check_paged_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       page_table: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The checks both attention launchers make; returns `out`, allocated if not given."""
    check_tensor("q", q, 3, FLOAT_DTYPES)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, 3, (q.dtype,), q.device)
    check_tensor("page_table", page_table, 2, (torch.int32,), q.device)
    _, HQ, D = q.shape
    HKV = k_cache.shape[1]
    if k_cache.shape != v_cache.shape or k_cache.shape[2] != D or k_cache.stride() != v_cache.stride():
        raise PdmuxError(f"k_cache and v_cache must both be [slots, kv_heads, {D}] with equal "
                         f"strides, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if HQ % HKV:
        raise PdmuxError(f"{HQ} query heads do not divide into {HKV} KV heads")
    if D & (D - 1) or D < 16:
        raise PdmuxError(f"head dim must be a power of two >= 16, got {D}")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    check_tensor("out", out, 3, (q.dtype,), q.device)
    if out.shape != q.shape:
        raise PdmuxError(f"out must have the shape of q {tuple(q.shape)}, got {tuple(out.shape)}")
    return out


@triton.jit
def _load_rows(ptr, offs, in_range, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptr + offs, mask=in_range[:, None], other=0.0)
    return tl.load(ptr + offs)


@triton.jit
def _load_pages(page_row_ptr, pos, page_size, end, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(page_row_ptr + pos // page_size, mask=pos < end, other=0)
    return tl.load(page_row_ptr + pos // page_size)


@triton.jit
def attend_range(q, acc, m_i, l_i, kc_ptr, vc_ptr, page_row_ptr, page_size, start, end, slot_stride,
                 head_offset, q_pos, scale_log2, BLOCK_N: tl.constexpr, D: tl.constexpr,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, EARLY_V: tl.constexpr):
    """Fold KV positions [start, end) into (acc, m_i, l_i) for the query rows `q` [M, D].

    Scores are kept in base 2 (scale_log2 = softmax scale * log2(e)). Without MASKED the range
    must be whole blocks; with CAUSAL a key counts only where its position <= the row's q_pos.
    The first block folded into a fresh state (m_i = -inf) must hold a valid key for every row.
    EARLY_V issues the V load with the K load (memory-bound decode: twice the bytes in flight);
    compute-bound prefill loads V after the softmax, keeping registers for the tiles.
    The software pipeline spends two stages per block (page ids, then K/V): num_stages 2s + 1
    keeps s K/V blocks in flight (bench/profile_decode.py --offline shows the buffers).
    """
    d = tl.arange(0, D)
    for n in range(start, end, BLOCK_N):
        pos = n + tl.arange(0, BLOCK_N)
        in_range = pos < end
        page = _load_pages(page_row_ptr, pos, page_size, end, MASKED)
        slot = page.to(tl.int64) * page_size + pos % page_size
        offs = slot[:, None] * slot_stride + head_offset + d[None, :]
        k = _load_rows(kc_ptr, offs, in_range, MASKED)
        if EARLY_V:
            v = _load_rows(vc_ptr, offs, in_range, MASKED)
        qk = tl.dot(q, tl.trans(k))
        # scale and max-subtract as one FMA per score; masked scores get -1e6, which exp2
        # takes to 0 because every row meets a valid key in the first block it sees (decode:
        # position `start`; extend: `lo` precedes every query of the block)
        if MASKED:
            valid = in_range[None, :]
            if CAUSAL:
                valid = valid & (pos[None, :] <= q_pos[:, None])
            qk = qk * scale_log2 + tl.where(valid, 0.0, -1.0e6)
            m_new = tl.maximum(m_i, tl.max(qk, axis=1))
            qk = qk - m_new[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(qk, axis=1) * scale_log2)
            qk = qk * scale_log2 - m_new[:, None]
        p = tl.exp2(qk)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if not EARLY_V:
            v = _load_rows(vc_ptr, offs, in_range, MASKED)
        # rescale, then accumulate inside the MMA: no second accumulator tile in registers
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, m_i, l_i
