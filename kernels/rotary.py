"""Rotary position embedding (NeoX half-split layout, as Qwen3 and Llama use), in place.

With `norm_weight` the rows are RMS-normalized first (Qwen3's per-head q/k norm), so q and k are
read and written once for both steps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._launch import (FLOAT_DTYPES, INDEX_DTYPES, check_tensor, grid_size,
                                          telemetry_args)
from pdmux_triton.kernels._pinned import Pinned, pinned_budget, pinned_launch, run_slots


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


@triton.jit(do_not_specialize=["rows", "first_sm", "n_sms", "slots", "programs"])
def _rope_kernel(x_ptr, pos_ptr, cs_ptr, w_ptr, sm_ids_ptr, gate_ptr, place_ptr, first_sm, n_sms,
                 ctas, slots, programs, rows, H, sx_t, sx_h, eps, HALF: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, ROWS: tl.constexpr, NORM: tl.constexpr,
                 RECORD_SM: tl.constexpr, PINNED: tl.constexpr, PLACED: tl.constexpr,
                 BLOCK_SMS: tl.constexpr):
    run_slots(_rope_slot, (x_ptr, pos_ptr, cs_ptr, w_ptr, rows, H, sx_t, sx_h, eps, HALF,
              BLOCK_HALF, ROWS, NORM), sm_ids_ptr, gate_ptr, place_ptr, first_sm, n_sms, ctas,
              slots, programs, RECORD_SM, PINNED, PLACED, BLOCK_SMS)


@triton.jit
def _rope_slot(pid, programs, x_ptr, pos_ptr, cs_ptr, w_ptr, rows, H, sx_t, sx_h, eps,
               HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, ROWS: tl.constexpr,
               NORM: tl.constexpr):
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    if NORM:
        w1 = tl.load(w_ptr + d, mask=dmask, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + d, mask=dmask, other=0.0).to(tl.float32)
    for start in tl.range(pid * ROWS, rows, programs * ROWS):
        r = start + tl.arange(0, ROWS)
        rmask = r < rows
        t = r // H
        mask = rmask[:, None] & dmask[None, :]
        base = x_ptr + (t * sx_t + (r % H) * sx_h)[:, None] + d[None, :]
        x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF, mask=mask, other=0.0).to(tl.float32)
        if NORM:
            inv = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
            x1 = x1 * inv[:, None] * w1[None, :]
            x2 = x2 * inv[:, None] * w2[None, :]
        pos = tl.load(pos_ptr + t, mask=rmask, other=0)
        cs = cs_ptr + (pos * (2 * HALF))[:, None] + d[None, :]
        cos = tl.load(cs, mask=mask, other=1.0)
        sin = tl.load(cs + HALF, mask=mask, other=0.0)
        tl.store(base, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
        tl.store(base + HALF, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


def rope_(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
          norm_weight: torch.Tensor | None = None, eps: float = 1e-6, *,
          num_sms: int | None = None, ctas_per_sm: int = 1,
          sm_ids: torch.Tensor | None = None, pinned: Pinned | None = None) -> torch.Tensor:
    """Rotate x [T, H, D] in place by each token's position; RMS-normalize first if norm_weight."""
    check_tensor("x", x, 3, FLOAT_DTYPES)
    T, H, D = x.shape
    if D % 2:
        raise PdmuxError(f"rotary needs an even head dim, got {D}")
    check_tensor("positions", positions, 1, INDEX_DTYPES, x.device)
    check_tensor("cos_sin", cos_sin, 2, (torch.float32,), x.device)
    if positions.shape[0] != T:
        raise PdmuxError(f"positions has {positions.shape[0]} entries for {T} tokens")
    if cos_sin.shape[1] != D or not cos_sin.is_contiguous():
        raise PdmuxError(f"cos_sin must be a contiguous [max_positions, {D}] table, got "
                         f"{tuple(cos_sin.shape)}")
    if norm_weight is not None:
        check_tensor("norm_weight", norm_weight, 1, FLOAT_DTYPES, x.device)
        if norm_weight.shape[0] != D:
            raise PdmuxError(f"norm_weight has {norm_weight.shape[0]} entries, head dim is {D}")
    rows = T * H
    if rows == 0:
        return x
    half = D // 2
    block_half = triton.next_power_of_2(half)
    row_block = max(1, min(32, 2048 // block_half))
    grid = grid_size(triton.cdiv(rows, row_block), pinned_budget(pinned, num_sms), ctas_per_sm,
                     x.device)
    launch = pinned_launch(pinned, grid, ctas_per_sm, x.device)
    sm_buf, record = telemetry_args(sm_ids, grid, x.device)
    w = norm_weight if norm_weight is not None else cos_sin
    _rope_kernel[(launch.grid,)](x, positions, cos_sin, w, sm_buf, *launch.args, rows, H,
                                 x.stride(0), x.stride(1), eps, HALF=half, BLOCK_HALF=block_half,
                                 ROWS=row_block, NORM=norm_weight is not None, RECORD_SM=record,
                                 num_warps=4, **launch.constexprs)
    return x
