"""Rotary position embedding (NeoX half-split layout, as Qwen3 and Llama use), in place, and
attention's prologue in one launch.

With a norm weight the rows are RMS-normalized first (Qwen3's per-head q/k norm), so q and k are
read and written once for both steps. `rope_store_kv` does a fused QKV output's whole prologue:
q and k normalized and rotated in place, the new k and v written to the paged cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._dispatch import run_kernel
from pdmux_triton.kernels._launch import (FLOAT_DTYPES, INDEX_DTYPES, cdiv, check_tensor,
                                          next_power_of_2)
from pdmux_triton.kernels._pinned import Pinned, budget_launch, run_slots


def rope_cache(max_positions: int, head_dim: int, theta: float,
               device: torch.device | str = "cpu",
               inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """[max_positions, head_dim] fp32: cos in the first half of each row, sin in the second;
    `inv_freq` (head_dim / 2 frequencies) replaces theta's where a model scales them."""
    if inv_freq is None:
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    elif tuple(inv_freq.shape) != (head_dim // 2,):
        raise PdmuxError(f"inv_freq must hold head_dim / 2 = {head_dim // 2} frequencies, got "
                         f"{tuple(inv_freq.shape)}")
    inv_freq = inv_freq.to(torch.float64)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).to(torch.float32).to(device)


@triton.jit(do_not_specialize=["rows", "first_site", "n_sms", "slots", "programs"])
def _rope_kernel(x_ptr, pos_ptr, cs_ptr, wq_ptr, wk_ptr, kc_ptr, vc_ptr, slot_ptr, sm_ids_ptr,
                 gate_ptr, place_ptr, first_site, n_sms, ctas, slots, programs, rows, H, HQ, HKV,
                 sx_t, sx_h, sc_s, eps, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 ROWS: tl.constexpr, NORM: tl.constexpr, STORE: tl.constexpr,
                 RECORD_SM: tl.constexpr, PINNED: tl.constexpr, PLACED: tl.constexpr,
                 BLOCK_SMS: tl.constexpr, PDL: tl.constexpr):
    run_slots(_rope_slot, (x_ptr, pos_ptr, cs_ptr, wq_ptr, wk_ptr, kc_ptr, vc_ptr, slot_ptr, rows,
              H, HQ, HKV, sx_t, sx_h, sc_s, eps, HALF, BLOCK_HALF, ROWS, NORM, STORE),
              sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms, ctas, slots, programs, RECORD_SM,
              PINNED, PLACED, BLOCK_SMS, PDL)


@triton.jit
def _rope_slot(pid, programs, x_ptr, pos_ptr, cs_ptr, wq_ptr, wk_ptr, kc_ptr, vc_ptr, slot_ptr,
               rows, H, HQ, HKV, sx_t, sx_h, sc_s, eps, HALF: tl.constexpr,
               BLOCK_HALF: tl.constexpr, ROWS: tl.constexpr, NORM: tl.constexpr,
               STORE: tl.constexpr):
    # each token's H heads: HQ query heads (normalized by wq), HKV key heads (by wk), both
    # rotated in place; with STORE, HKV value heads follow, and the key and value heads are
    # written to the cache at the token's slot as well
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    if NORM:
        wq1 = tl.load(wq_ptr + d, mask=dmask, other=0.0).to(tl.float32)
        wq2 = tl.load(wq_ptr + HALF + d, mask=dmask, other=0.0).to(tl.float32)
        wk1 = tl.load(wk_ptr + d, mask=dmask, other=0.0).to(tl.float32)
        wk2 = tl.load(wk_ptr + HALF + d, mask=dmask, other=0.0).to(tl.float32)
    for start in tl.range(pid * ROWS, rows, programs * ROWS):
        r = start + tl.arange(0, ROWS)
        rmask = r < rows
        t = r // H
        h = r % H
        is_q = (h < HQ)[:, None]
        rotated = (h < HQ + HKV)[:, None]
        mask = rmask[:, None] & dmask[None, :]
        base = x_ptr + (t * sx_t + h * sx_h)[:, None] + d[None, :]
        x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)
        n1, n2 = x1, x2
        if NORM:
            inv = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
            n1 = x1 * inv[:, None] * tl.where(is_q, wq1[None, :], wk1[None, :])
            n2 = x2 * inv[:, None] * tl.where(is_q, wq2[None, :], wk2[None, :])
        pos = tl.load(pos_ptr + t, mask=rmask, other=0)
        cs = cs_ptr + (pos * (2 * HALF))[:, None] + d[None, :]
        cos = tl.load(cs, mask=mask, other=1.0)
        sin = tl.load(cs + HALF, mask=mask, other=0.0)
        y1 = (n1 * cos - n2 * sin).to(x_ptr.dtype.element_ty)
        y2 = (n2 * cos + n1 * sin).to(x_ptr.dtype.element_ty)
        tl.store(base, y1, mask=mask & rotated)
        tl.store(base + HALF, y2, mask=mask & rotated)
        if STORE:
            slot = tl.load(slot_ptr + t, mask=rmask, other=0).to(tl.int64)
            is_k = rotated & ~is_q
            is_v = ~rotated
            kv_head = tl.where(h < HQ + HKV, h - HQ, h - HQ - HKV)
            at = (slot * sc_s + kv_head * (2 * HALF))[:, None] + d[None, :]
            tl.store(kc_ptr + at, y1, mask=mask & is_k)
            tl.store(kc_ptr + at + HALF, y2, mask=mask & is_k)
            tl.store(vc_ptr + at, x1.to(vc_ptr.dtype.element_ty), mask=mask & is_v)
            tl.store(vc_ptr + at + HALF, x2.to(vc_ptr.dtype.element_ty), mask=mask & is_v)


def _check_heads_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
        raise PdmuxError(f"{name} must hold each token's heads contiguously ([.., H, D] with "
                         f"strides (*, D, 1)), got strides {t.stride()}")


def _check_rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                norms: tuple) -> None:
    T, _, D = x.shape
    if D % 2:
        raise PdmuxError(f"rotary needs an even head dim, got {D}")
    check_tensor("positions", positions, 1, INDEX_DTYPES, x.device)
    check_tensor("cos_sin", cos_sin, 2, (torch.float32,), x.device)
    if positions.shape[0] != T:
        raise PdmuxError(f"positions has {positions.shape[0]} entries for {T} tokens")
    if cos_sin.shape[1] != D or not cos_sin.is_contiguous():
        raise PdmuxError(f"cos_sin must be a contiguous [max_positions, {D}] table, got "
                         f"{tuple(cos_sin.shape)}")
    for name, w in norms:
        if w is not None:
            check_tensor(name, w, 1, FLOAT_DTYPES, x.device)
            if w.shape[0] != D:
                raise PdmuxError(f"{name} has {w.shape[0]} entries, head dim is {D}")


def _launch_rope(x, positions, cos_sin, wq, wk, eps, heads: tuple[int, int], caches, num_sms,
                 ctas_per_sm, sm_ids, pinned, pdl):
    """One launch over x's rows [T, H, D]: the first heads[0] normalized by wq, the next
    heads[1] by wk, both rotated; with `caches` (k_cache, v_cache, slots) the rest are values."""
    T, H, D = x.shape
    rows = T * H
    if rows == 0:
        return
    half = D // 2
    block_half = next_power_of_2(half)
    row_block = max(1, min(32, 2048 // block_half))
    launch, sm_buf, record = budget_launch(cdiv(rows, row_block), num_sms, ctas_per_sm,
                                           x.device, pinned, pdl, sm_ids)
    kc, vc, slots = caches if caches is not None else (x, x, positions)  # unread unless STORE
    run_kernel(_rope_kernel, launch.grid,
        x, positions, cos_sin, wq if wq is not None else cos_sin,
        wk if wk is not None else cos_sin, kc, vc, slots, sm_buf, *launch.args, rows, H,
        heads[0], heads[1], x.stride(0), x.stride(1), kc.stride(0), eps, HALF=half,
        BLOCK_HALF=block_half, ROWS=row_block, NORM=wq is not None, STORE=caches is not None,
        RECORD_SM=record, num_warps=4, **launch.kwargs)


def rope_(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
          norm_weight: torch.Tensor | None = None, eps: float = 1e-6, *,
          num_sms: int | None = None, ctas_per_sm: int = 1,
          sm_ids: torch.Tensor | None = None, pinned: Pinned | None = None,
          pdl: bool = False) -> torch.Tensor:
    """Rotate x [T, H, D] in place by each token's position; RMS-normalize first if norm_weight."""
    check_tensor("x", x, 3, FLOAT_DTYPES)
    _check_rope(x, positions, cos_sin, (("norm_weight", norm_weight),))
    _launch_rope(x, positions, cos_sin, norm_weight, norm_weight, eps, (x.shape[1], 0), None,
                 num_sms, ctas_per_sm, sm_ids, pinned, pdl)
    return x


def rope_store_kv(qkv: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                  q_heads: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slots: torch.Tensor, q_norm: torch.Tensor | None = None,
                  k_norm: torch.Tensor | None = None, eps: float = 1e-6, *,
                  num_sms: int | None = None, ctas_per_sm: int = 1,
                  sm_ids: torch.Tensor | None = None, pinned: Pinned | None = None,
                  pdl: bool = False) -> None:
    """Attention's prologue in one launch. qkv [T, q_heads + 2 kv_heads, D] (a fused QKV
    output viewed by head, each row's heads contiguous): q and k heads RMS-normalized (Qwen3's
    q_norm, k_norm, both or neither) and rotated in place, then k_cache[slots[t]] = k[t] and
    v_cache[slots[t]] = v[t] (caches [slots, kv_heads, D], heads contiguous)."""
    check_tensor("qkv", qkv, 3, FLOAT_DTYPES)
    T, H, D = qkv.shape
    kv_heads = k_cache.shape[1] if k_cache.dim() == 3 else -1
    if not 0 < q_heads < H or H != q_heads + 2 * kv_heads:
        raise PdmuxError(f"qkv has {H} heads a token; {q_heads} query heads and the cache's "
                         f"{kv_heads} key and value heads make {q_heads + 2 * kv_heads}")
    if (q_norm is None) != (k_norm is None):
        raise PdmuxError("q_norm and k_norm go together (Qwen3 has both, Llama neither)")
    _check_heads_contiguous("qkv", qkv)
    _check_rope(qkv, positions, cos_sin, (("q_norm", q_norm), ("k_norm", k_norm)))
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, c, 3, (qkv.dtype,), qkv.device)
        _check_heads_contiguous(name, c)
        if tuple(c.shape[1:]) != (kv_heads, D):
            raise PdmuxError(f"{name} must be [slots, {kv_heads}, {D}], got {tuple(c.shape)}")
    if k_cache.stride(0) != v_cache.stride(0):
        raise PdmuxError("k_cache and v_cache must have the same slot stride")
    check_tensor("slots", slots, 1, INDEX_DTYPES, qkv.device)
    if slots.shape[0] != T:
        raise PdmuxError(f"slots has {slots.shape[0]} entries for {T} tokens")
    _launch_rope(qkv, positions, cos_sin, q_norm, k_norm, eps, (q_heads, kv_heads),
                 (k_cache, v_cache, slots), num_sms, ctas_per_sm, sm_ids, pinned, pdl)
