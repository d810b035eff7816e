"""SwiGLU's SiLU(gate) * up on the fused gate-up projection output [T, 2I] -> [T, I]."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._dispatch import run_kernel
from pdmux_triton.kernels._launch import (FLOAT_DTYPES, cdiv, check_tensor, next_power_of_2,
                                          row_piece)
from pdmux_triton.kernels._pinned import Pinned, budget_launch, run_slots


@triton.jit(do_not_specialize=["T", "first_site", "n_sms", "slots", "programs"])
def _silu_mul_kernel(x_ptr, y_ptr, sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms, ctas, slots,
                     programs, T, I, sx_t, sy_t, BLOCK: tl.constexpr, RECORD_SM: tl.constexpr,
                     PINNED: tl.constexpr, PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr,
                     PDL: tl.constexpr):
    run_slots(_silu_mul_slot, (x_ptr, y_ptr, T, I, sx_t, sy_t, BLOCK), sm_ids_ptr, gate_ptr,
              place_ptr, first_site, n_sms, ctas, slots, programs, RECORD_SM, PINNED, PLACED,
              BLOCK_SMS, PDL)


@triton.jit
def _silu_mul_slot(pid, programs, x_ptr, y_ptr, T, I, sx_t, sy_t, BLOCK: tl.constexpr):
    for tile in tl.range(pid, T * tl.cdiv(I, BLOCK), programs):
        t, c, mask = row_piece(tile, I, BLOCK)
        gate = tl.load(x_ptr + t * sx_t + c, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + t * sx_t + I + c, mask=mask, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(y_ptr + t * sy_t + c, y.to(y_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None, *,
             num_sms: int | None = None, ctas_per_sm: int = 1,
             sm_ids: torch.Tensor | None = None, pinned: Pinned | None = None,
             pdl: bool = False) -> torch.Tensor:
    check_tensor("gate_up", gate_up, 2, FLOAT_DTYPES)
    T, two_i = gate_up.shape
    if two_i % 2:
        raise PdmuxError(f"gate_up must have an even number of columns [gate | up], got {two_i}")
    I = two_i // 2
    if out is None:  # made here: nothing to check
        out = torch.empty((T, I), dtype=gate_up.dtype, device=gate_up.device)
    else:
        check_tensor("out", out, 2, FLOAT_DTYPES, gate_up.device)
        if tuple(out.shape) != (T, I):
            raise PdmuxError(f"out must have shape {(T, I)}, got {tuple(out.shape)}")
    launch_silu_mul(gate_up, out, num_sms, ctas_per_sm, sm_ids, pinned, pdl)
    return out


def launch_silu_mul(gate_up: torch.Tensor, out: torch.Tensor, num_sms: int | None,
                    ctas_per_sm: int, sm_ids: torch.Tensor | None, pinned: Pinned | None,
                    pdl: bool) -> None:
    """`silu_mul`'s launch, for inputs already checked: gate_up [T, 2I] into out [T, I] (a
    launcher that made them itself skips the checks, launches being hot)."""
    T, I = out.shape
    if T == 0 or I == 0:
        return
    block = min(2048, next_power_of_2(I))
    launch, sm_buf, record = budget_launch(T * cdiv(I, block), num_sms, ctas_per_sm,
                                           gate_up.device, pinned, pdl, sm_ids)
    run_kernel(_silu_mul_kernel, launch.grid, gate_up, out, sm_buf, *launch.args, T, I,
               gate_up.stride(0), out.stride(0), BLOCK=block, RECORD_SM=record, num_warps=4,
               **launch.kwargs)
