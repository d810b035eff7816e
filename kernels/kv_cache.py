"""Write new tokens' K and V into a paged KV cache laid out [slots, kv_heads, head_dim].

A token's slot is page_table[request, pos // page_size] * page_size + pos % page_size; the
caller computes slots (the block manager owns pages), this kernel scatters rows to them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._launch import (FLOAT_DTYPES, INDEX_DTYPES, check_tensor, grid_size,
                                          row_piece, telemetry_args)
from pdmux_triton.kernels._pinned import Pinned, pinned_budget, pinned_launch, run_slots


@triton.jit(do_not_specialize=["T", "first_sm", "n_sms", "slots", "programs"])
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, sm_ids_ptr, gate_ptr, place_ptr,
                     first_sm, n_sms, ctas, slots, programs, T, HD, sk_t, sv_t, sc_s,
                     BLOCK: tl.constexpr, RECORD_SM: tl.constexpr, PINNED: tl.constexpr,
                     PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr):
    run_slots(_store_kv_slot, (k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, T, HD, sk_t, sv_t, sc_s,
              BLOCK), sm_ids_ptr, gate_ptr, place_ptr, first_sm, n_sms, ctas, slots, programs,
              RECORD_SM, PINNED, PLACED, BLOCK_SMS)


@triton.jit
def _store_kv_slot(pid, programs, k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, T, HD, sk_t, sv_t, sc_s,
                   BLOCK: tl.constexpr):
    # (`slot_ptr` holds the cache slots the tokens go to, not the launch's work slots)
    for tile in tl.range(pid, T * tl.cdiv(HD, BLOCK), programs):
        t, c, mask = row_piece(tile, HD, BLOCK)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        tl.store(kc_ptr + slot * sc_s + c, tl.load(k_ptr + t * sk_t + c, mask=mask), mask=mask)
        tl.store(vc_ptr + slot * sc_s + c, tl.load(v_ptr + t * sv_t + c, mask=mask), mask=mask)


def _check_heads_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
        raise PdmuxError(f"{name} must hold each token's heads contiguously ([.., H, D] with "
                         f"strides (*, D, 1)), got strides {t.stride()}")


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor, *, num_sms: int | None = None, ctas_per_sm: int = 1,
             sm_ids: torch.Tensor | None = None, pinned: Pinned | None = None) -> None:
    """k_cache[slots[t]] = k[t]; v_cache[slots[t]] = v[t] for k, v of shape [T, kv_heads, head_dim]."""
    check_tensor("k", k, 3, FLOAT_DTYPES)
    check_tensor("v", v, 3, (k.dtype,), k.device)
    check_tensor("k_cache", k_cache, 3, (k.dtype,), k.device)
    check_tensor("v_cache", v_cache, 3, (k.dtype,), k.device)
    check_tensor("slots", slots, 1, INDEX_DTYPES, k.device)
    T, H, D = k.shape
    if v.shape != k.shape or k_cache.shape[1:] != (H, D) or v_cache.shape != k_cache.shape:
        raise PdmuxError(f"k, v must be [T, H, D] and the caches [slots, H, D] with the same H, D; "
                         f"got k {tuple(k.shape)}, v {tuple(v.shape)}, k_cache "
                         f"{tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    if slots.shape[0] != T:
        raise PdmuxError(f"slots has {slots.shape[0]} entries for {T} tokens")
    for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_heads_contiguous(name, t)
    if k_cache.stride(0) != v_cache.stride(0):
        raise PdmuxError("k_cache and v_cache must have the same slot stride")
    if T == 0:
        return
    block = min(1024, triton.next_power_of_2(H * D))
    grid = grid_size(T * triton.cdiv(H * D, block), pinned_budget(pinned, num_sms), ctas_per_sm,
                     k.device)
    launch = pinned_launch(pinned, grid, ctas_per_sm, k.device)
    sm_buf, record = telemetry_args(sm_ids, grid, k.device)
    _store_kv_kernel[(launch.grid,)](k, v, k_cache, v_cache, slots, sm_buf, *launch.args, T, H * D,
                                     k.stride(0), v.stride(0), k_cache.stride(0), BLOCK=block,
                                     RECORD_SM=record, num_warps=4, **launch.constexprs)
