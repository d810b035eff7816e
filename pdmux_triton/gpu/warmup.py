"""Compile before measuring: every kernel variant a served run can launch eagerly on a side.

Triton compiles per constexpr set (and per specialized argument, which the launchers avoid for
values that change between batches). The layer kernels have one variant per side; the GEMMs
have one per tile config and schedule, which depend on the row count and the SM budget
(`gemm.warm_up_rows` lists a problem for each). Running those once per budget, and one full
prefill batch of the largest size, compiles and allocates what the measured run will need;
decode steps are captured graphs, made up front by `decode_graphs`.
"""

from __future__ import annotations

import torch

from pdmux_triton.gpu.decoder import ExtendBatch, Model
from pdmux_triton.gpu.streams import kernel_args
from pdmux_triton.kernels import linear, swiglu_linear
from pdmux_triton.kernels.gemm import warm_up_rows
from pdmux_triton.multiplex.partition import Budget


def _scratch_batch(model: Model, lens: list[int], scratch_page: int) -> ExtendBatch:
    """A prefill batch of `lens` new tokens whose K/V all land in the scratch page."""
    device, ps = model.w.embed.device, model.cache.page_size
    total = sum(lens)
    tokens = torch.zeros(total, dtype=torch.int64, device=device)
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    slots = scratch_page * ps + positions % ps
    width = -(-max(lens) // ps)
    table = torch.full((len(lens), width), scratch_page, dtype=torch.int32, device=device)
    return ExtendBatch(tokens, positions, slots, table, list(lens), [0] * len(lens))


def compile_prefill_side(model: Model, budget: Budget, max_rows: int, max_seqs: int,
                         scratch_page: int) -> None:
    """Launch every GEMM variant of up to `max_rows` rows (the LM head: `max_seqs`) and one
    whole prefill of `max_rows` tokens over `max_seqs` sequences on this budget, on the
    current stream."""
    w, dev, dtype = model.w, model.w.embed.device, model.w.embed.dtype
    first = w.layers[0]
    problems = [(first[name], first.get(f"{name}_bias"), max_rows)
                for name in ("qkv", "o", "gate_up", "down")] + [(w.lm_head, None, max_seqs)]
    for weight, bias, rows in problems:  # a bias compiles its own variants
        N, K = weight.shape
        for m, _ in warm_up_rows(N, K, dtype, dev, [budget.num_sms], rows):
            # the budget's own launch (a pinned side compiles its PINNED variants); gate_up
            # as the layer launches it, with the SwiGLU epilogue where the plan is skinny
            # (zeros: uninitialized memory can hold values that overflow SwiGLU's exp)
            x = torch.zeros(m, K, dtype=dtype, device=dev)
            if weight is first["gate_up"]:
                swiglu_linear(x, weight, **kernel_args(budget))
            else:
                linear(x, weight, bias=bias, **kernel_args(budget))
    seqs = max(1, min(max_seqs, max_rows))
    lens = [max_rows // seqs + (i < max_rows % seqs) for i in range(seqs)]
    batch = _scratch_batch(model, [n for n in lens if n], scratch_page)
    hidden, residual = model.extend_layers(batch, 0, len(w.layers), budget=budget)
    last = torch.cumsum(torch.tensor(batch.extend_lens, device=dev), 0) - 1
    model.logits(hidden[last], residual[last], budget).argmax(-1)
