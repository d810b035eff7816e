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


def wide_offsets(k_cache: torch.Tensor) -> bool:
    """Whether cache offsets need 64 bits (attend_range's WIDE)."""
    return k_cache.numel() >= 2**31


@triton.jit
def attend_range(q, acc, m_i, l_i, kc_ptr, vc_ptr, page_row_ptr, PAGE_SIZE: tl.constexpr, start,
                 end, slot_stride, head_offset, scale_log2, BLOCK_N: tl.constexpr,
                 D: tl.constexpr, MASKED: tl.constexpr, EARLY_V: tl.constexpr,
                 WIDE: tl.constexpr):
    """Fold KV positions [start, end) into (acc, m_i, l_i) for the query rows `q` [M, D].

    Scores are kept in base 2 (scale_log2 = softmax scale * log2(e)). Without MASKED the range
    must be whole blocks; with it, keys at `end` and past it are masked off. Every query row
    sees the whole range (decode; prefill's prefix, whose new tokens are masked causally in
    prefill_attention).
    The first block folded into a fresh state (m_i = -inf) must hold a valid key for every row.
    EARLY_V issues the V load with the K load (memory-bound decode: twice the bytes in flight);
    compute-bound prefill loads V after the softmax, keeping registers for the tiles.
    WIDE computes cache offsets in 64 bits (caches of 2^31 elements or more).

    The loop is lean because its instruction count, not memory, bounded decode at one program
    per SM (SASS, 4 warps, 128 keys: 926 instructions per warp per block before these): the
    page size is a compile-time constant and positions unsigned, so page and offset are a
    shift and a mask, not a division; positions past `end` re-read the last key instead of
    predicating every 16-byte copy; offsets are 32-bit unless WIDE.
    The software pipeline spends two stages per block (page ids, then K/V): num_stages 2s + 1
    keeps s K/V blocks in flight (bench/profile_decode.py --offline shows the buffers).
    """
    d = tl.arange(0, D)
    for n in range(start, end, BLOCK_N):
        pos = n + tl.arange(0, BLOCK_N)
        upos = (tl.minimum(pos, end - 1) if MASKED else pos).to(tl.uint32)
        page = tl.load(page_row_ptr + upos // PAGE_SIZE)
        slot = page * PAGE_SIZE + (upos % PAGE_SIZE).to(tl.int32)
        if WIDE:
            slot = slot.to(tl.int64)
        offs = slot[:, None] * slot_stride + head_offset + d[None, :]
        k = tl.load(kc_ptr + offs)
        if EARLY_V:
            v = tl.load(vc_ptr + offs)
        qk = tl.dot(q, tl.trans(k))
        p, alpha, m_i, l_i = softmax_step(qk, m_i, l_i, pos[None, :] < end, scale_log2, MASKED)
        if not EARLY_V:
            v = tl.load(vc_ptr + offs)
        # rescale, then accumulate inside the MMA: no second accumulator tile in registers
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_i, l_i


@triton.jit
def softmax_step(qk, m_i, l_i, valid, scale_log2, MASKED: tl.constexpr):
    """One key block's online-softmax update of raw scores qk [M, N]: returns (p, alpha, m, l),
    p the block's unnormalized probabilities and alpha the factor for the running output.

    Scale and max-subtract are one FMA per score; masked scores (`valid` false, read only when
    MASKED) get -1e6, which exp2 takes to 0 because the first block folded into a fresh state
    (m_i = -inf) holds a valid key for every row."""
    if MASKED:
        qk = qk * scale_log2 + tl.where(valid, 0.0, -1.0e6)
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        qk = qk - m_new[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, axis=1) * scale_log2)
        qk = qk * scale_log2 - m_new[:, None]
    p = tl.exp2(qk)
    alpha = tl.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)
