"""Streaming read: read a large buffer once. The bandwidth reference every other kernel is
measured against, and the simplest probe of how bandwidth grows with the SM budget."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._dispatch import run_kernel
from pdmux_triton.kernels._launch import cdiv, interpreting
from pdmux_triton.kernels._pinned import Pinned, budget_launch, run_slots

# One program per SM must keep enough bytes in flight to cover HBM latency: each step issues
# UNROLL independent loads of BLOCK words before using any, from 32 warps (8 leave HBM idle at
# one program per SM). bench/bench_kernels.py sweeps these.
STREAM_BLOCK = 4096
STREAM_UNROLL = 8
STREAM_WARPS = 32


@triton.jit
def _stream_slot(pid, programs, src_ptr, out_ptr, n, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """What program `pid` of a capped launch of `programs` reads."""
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    step = BLOCK * UNROLL
    for start in tl.range(pid * step, n, programs * step):
        for u in tl.static_range(UNROLL):
            offs = start + u * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(src_ptr + offs, mask=offs < n, other=0)
    # one word per program (a slot, pinned) keeps the loads alive without a write stream
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit(do_not_specialize=["first_site", "n_sms", "slots", "programs"])
def _stream_read_kernel(src_ptr, out_ptr, sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms, ctas,
                        slots, programs, n, BLOCK: tl.constexpr, UNROLL: tl.constexpr,
                        RECORD_SM: tl.constexpr, PINNED: tl.constexpr, PLACED: tl.constexpr,
                        BLOCK_SMS: tl.constexpr, PDL: tl.constexpr):
    run_slots(_stream_slot, (src_ptr, out_ptr, n, BLOCK, UNROLL), sm_ids_ptr, gate_ptr, place_ptr,
              first_site, n_sms, ctas, slots, programs, RECORD_SM, PINNED, PLACED, BLOCK_SMS, PDL)


def stream_read(buf: torch.Tensor, *, num_sms: int | None = None, ctas_per_sm: int = 1,
                block: int | None = None, unroll: int | None = None,
                num_warps: int | None = None, sm_ids: torch.Tensor | None = None,
                pinned: Pinned | None = None,
                pdl: bool = False) -> torch.Tensor:
    """Read every byte of `buf` (contiguous, a multiple of 4 bytes); returns per-program sums
    (per slot when `pinned`: its SMs are the budget, and `num_sms` must be left out)."""
    if not isinstance(buf, torch.Tensor) or not buf.is_contiguous():
        raise PdmuxError("stream_read needs a contiguous torch.Tensor")
    nbytes = buf.numel() * buf.element_size()
    if nbytes % 4:
        raise PdmuxError(f"stream_read reads 4-byte words; the buffer has {nbytes} bytes")
    words = buf.view(-1).view(torch.int32) if nbytes else buf.new_empty(0, dtype=torch.int32)
    block = block or (256 if interpreting() else STREAM_BLOCK)
    unroll = unroll or (2 if interpreting() else STREAM_UNROLL)
    launch, sm_buf, record = budget_launch(max(1, cdiv(words.numel(), block * unroll)),
                                           num_sms, ctas_per_sm, buf.device, pinned, pdl, sm_ids)
    out = torch.empty(launch.slots, dtype=torch.int32, device=buf.device)
    run_kernel(_stream_read_kernel, launch.grid, words, out, sm_buf, *launch.args, words.numel(),
               BLOCK=block, UNROLL=unroll, RECORD_SM=record, num_warps=num_warps or STREAM_WARPS,
               **launch.kwargs)
    return out
