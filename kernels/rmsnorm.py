"""RMSNorm over the last dimension of [T, H, D] rows, optionally adding a residual first.

Serves the layer norms (H = 1, D = hidden, residual fused: residual += x, then normalize) and
Qwen3's per-head q/k norms (H = heads, D = head dim, on strided views of the QKV output).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._dispatch import run_kernel
from pdmux_triton.kernels._launch import FLOAT_DTYPES, cdiv, check_tensor, next_power_of_2
from pdmux_triton.kernels._pinned import Pinned, budget_launch, run_slots


@triton.jit(do_not_specialize=["rows", "first_site", "n_sms", "slots", "programs"])
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms,
                    ctas, slots, programs, rows, H, D, sx_t, sx_h, sr_t, sr_h, sy_t, sy_h, eps,
                    HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                    RECORD_SM: tl.constexpr, PINNED: tl.constexpr, PLACED: tl.constexpr,
                    BLOCK_SMS: tl.constexpr, PDL: tl.constexpr):
    run_slots(_rmsnorm_slot, (x_ptr, res_ptr, w_ptr, y_ptr, rows, H, D, sx_t, sx_h, sr_t, sr_h,
              sy_t, sy_h, eps, HAS_RESIDUAL, ROWS, BLOCK_D), sm_ids_ptr, gate_ptr, place_ptr,
              first_site, n_sms, ctas, slots, programs, RECORD_SM, PINNED, PLACED, BLOCK_SMS, PDL)


@triton.jit
def _rmsnorm_slot(pid, programs, x_ptr, res_ptr, w_ptr, y_ptr, rows, H, D, sx_t, sx_h, sr_t, sr_h,
                  sy_t, sy_h, eps, HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    w = tl.load(w_ptr + d, mask=d < D, other=0.0).to(tl.float32)
    for start in tl.range(pid * ROWS, rows, programs * ROWS):
        r = start + tl.arange(0, ROWS)
        t = r // H
        h = r % H
        mask = (r < rows)[:, None] & (d < D)[None, :]
        x = tl.load(x_ptr + (t * sx_t + h * sx_h)[:, None] + d[None, :], mask=mask, other=0.0)
        if HAS_RESIDUAL:
            res = res_ptr + (t * sr_t + h * sr_h)[:, None] + d[None, :]
            # round the sum to the residual's dtype first, as a bf16 model would hold it
            x = (x.to(tl.float32) + tl.load(res, mask=mask, other=0.0).to(tl.float32)).to(
                res_ptr.dtype.element_ty)
            tl.store(res, x, mask=mask)
        x = x.to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        y = x * inv[:, None] * w[None, :]
        tl.store(y_ptr + (t * sy_t + h * sy_h)[:, None] + d[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=mask)


def _as_3d(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 2:
        return t.unsqueeze(1)
    if t.dim() != 3:
        raise PdmuxError(f"{name} must be [T, D] or [T, H, D], got shape {tuple(t.shape)}")
    return t


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
            residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
            num_sms: int | None = None, ctas_per_sm: int = 1,
            sm_ids: torch.Tensor | None = None, pinned: Pinned | None = None,
            pdl: bool = False) -> torch.Tensor:
    """out = rmsnorm(x [+ residual]) * weight; with a residual, it is updated to x + residual.

    x is [T, D] or [T, H, D] (any strides, last dim contiguous); `out` may be `x` (in place).
    """
    x3 = _as_3d("x", x)
    check_tensor("x", x3, 3, FLOAT_DTYPES)
    T, H, D = x3.shape
    check_tensor("weight", weight, 1, FLOAT_DTYPES, x.device)
    if weight.shape[0] != D:
        raise PdmuxError(f"weight has {weight.shape[0]} entries but rows have D={D}")
    given = out is not None  # (one made here like x needs no check)
    out = out if given else torch.empty_like(x)
    y3 = _as_3d("out", out)
    if given:
        check_tensor("out", y3, 3, FLOAT_DTYPES, x.device)
        if tuple(y3.shape) != (T, H, D):
            raise PdmuxError(f"out must have the shape of x {tuple(x.shape)}, got "
                             f"{tuple(out.shape)}")
    r3 = y3 if residual is None else _as_3d("residual", residual)
    if residual is not None:
        check_tensor("residual", r3, 3, FLOAT_DTYPES, x.device)
        if tuple(r3.shape) != (T, H, D):
            raise PdmuxError(f"residual must have the shape of x {tuple(x.shape)}, got "
                             f"{tuple(residual.shape)}")
    rows = T * H
    if rows == 0:
        return out
    block_d = next_power_of_2(D)
    row_block = max(1, min(16, 2048 // block_d))
    launch, sm_buf, record = budget_launch(cdiv(rows, row_block), num_sms, ctas_per_sm,
                                           x.device, pinned, pdl, sm_ids)
    run_kernel(_rmsnorm_kernel, launch.grid,
        x3, r3, weight, y3, sm_buf, *launch.args, rows, H, D, x3.stride(0), x3.stride(1),
        r3.stride(0), r3.stride(1), y3.stride(0), y3.stride(1), eps,
        HAS_RESIDUAL=residual is not None, ROWS=row_block, BLOCK_D=block_d, RECORD_SM=record,
        num_warps=4 if block_d <= 1024 else 8, **launch.kwargs)
    return out
