"""The GPU work calibration and comparison measure, each for a given SM budget.

A workload enqueues its kernels on the current stream (`run(budget)`) and says how much it
moves (`step_cost` counts it): bytes for decode-side work (rates in TB/s), FLOPs for prefill-side
work (TFLOP/s). Inputs are random (never zeros) and sized past the L2 cache, so rates are HBM
rates.
"""

from __future__ import annotations

import torch

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.decoder import (DecodeBatch, ExtendBatch, KVCache, Model, Weights,
                                      table_width)
from pdmux_triton.gpu.streams import kernel_args
from pdmux_triton.kernels import decode_attention, linear, stream_read
from pdmux_triton.measure.calibration_sweep import DECODE_WORKLOADS
from pdmux_triton.measure.random_kv import PagedKV, page_table
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.models import ModelSpec


class Workload:
    name = ""
    unit = "TB/s"  # or TFLOP/s
    amount = 0.0  # bytes or FLOPs per run

    def run(self, budget: Budget) -> None:
        raise NotImplementedError

    def rate(self, ms: float) -> float:
        """TB/s or TFLOP/s of one run taking `ms`."""
        return self.amount / ms / 1e9


class StreamRead(Workload):
    name = "stream_read"

    def __init__(self, nbytes: int = 1 << 30):
        self.buf = torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device="cuda")
        self.amount = float(nbytes)

    def run(self, budget: Budget) -> None:
        stream_read(self.buf, **kernel_args(budget))


class DecodeAttention(Workload):
    """One layer's decode attention: `batch` requests of `context` tokens, page size 16."""

    name = "decode_attention"

    def __init__(self, spec: ModelSpec, batch: int = 32, context: int = 4096, page_size: int = 16):
        self.kv = PagedKV([context] * batch, spec.kv_heads, spec.head_dim, page_size,
                          torch.bfloat16, "cuda", shuffle=False, spare_pages=0)
        self.q = torch.randn(batch, spec.q_heads, spec.head_dim, dtype=torch.bfloat16, device="cuda")
        self.context, self.page_size = context, page_size
        self.amount = step_cost.kv_bytes(spec, batch * context) / spec.layers

    def run(self, budget: Budget) -> None:
        kv = self.kv
        decode_attention(self.q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens,
                         self.page_size, self.context, **kernel_args(budget))


class DecodeLinear(Workload):
    """The four linears of a layer at decode batch size, over two layers' weights (so no run
    finds its weights in L2)."""

    name = "decode_linear"

    def __init__(self, spec: ModelSpec, batch: int = 32, layers: int = 2):
        h, qd, kvd, inter = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate
        shapes = [(qd + 2 * kvd, h), (h, qd), (2 * inter, h), (h, inter)]
        self.weights = [[torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * k ** -0.5
                         for n, k in shapes] for _ in range(layers)]
        self.x = {k: torch.randn(batch, k, dtype=torch.bfloat16, device="cuda")
                  for k in {k for _, k in shapes}}
        self.amount = float(sum(n * k * step_cost.DTYPE_BYTES for n, k in shapes))  # one layer's
        self._next = 0

    def run(self, budget: Budget) -> None:
        layer = self.weights[self._next]
        self._next = (self._next + 1) % len(self.weights)
        for w in layer:
            linear(self.x[w.shape[1]], w, **kernel_args(budget))


class DecodeStep(Workload):
    """A whole decode step of a model preset: `batch` requests at `context` tokens."""

    name = "decode_step"

    def __init__(self, spec: ModelSpec, batch: int = 32, context: int = 2048, page_size: int = 16,
                 seed: int = 0):
        lens = [context + 1] * batch
        table, pages = page_table(lens, page_size, "cuda", shuffle=False)
        self.model = Model(Weights.random(spec, "cuda", seed=seed),
                           KVCache(spec, pages, page_size, "cuda"),
                           max_positions=context + 1)
        for k, v in zip(self.model.cache.k, self.model.cache.v):  # a filled cache, not zeros
            k.normal_()
            v.normal_()
        pos = torch.full((batch,), context, dtype=torch.int64, device="cuda")
        slots = (table[:, context // page_size].long() * page_size + context % page_size)
        self.batch = DecodeBatch(
            tokens=torch.randint(0, spec.vocab, (batch,), device="cuda"), positions=pos,
            slots=slots, page_table=table, seq_lens=torch.tensor(lens, dtype=torch.int32,
                                                                  device="cuda"),
            max_seq_len=context + 1)
        self.amount = step_cost.decode_step_bytes(spec, batch * context)

    def run(self, budget: Budget) -> None:
        self.model.decode_step(self.batch, budget)


class PrefillLayers(Workload):
    """`layers` layers of the prefill of `tokens` new tokens in `prompts` prompts of (nearly)
    equal length, in one batch: GEMMs and causal attention within each prompt, each prompt's
    new tokens after `prefix` tokens already in the cache (random K/V there: a cached prefix
    the new tokens attend over, as a prefix-cache hit or a later chunk computes). With
    `decode_rows`, a chunked-prefill step as the executor runs it: that many requests decoding
    one token each after `decode_context` cached tokens lead the batch (`ExtendBatch`'s decode
    rows, attending as a decode step does)."""

    name = "prefill"
    unit = "TFLOP/s"

    def __init__(self, spec: ModelSpec, tokens: int = 8192, layers: int = 4, page_size: int = 16,
                 seed: int = 1, prompts: int = 1, prefix: int = 0, decode_rows: int = 0,
                 decode_context: int = 0):
        if isinstance(prompts, bool) or not isinstance(prompts, int) or not 1 <= prompts <= tokens:
            raise PdmuxError(f"a prefill of {tokens} tokens takes 1..{tokens} prompts, "
                             f"got {prompts!r}")
        if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
            raise PdmuxError(f"a prefill's cached prefix is 0 or more tokens, got {prefix!r}")
        for name, value in (("decode_rows", decode_rows), ("decode_context", decode_context)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PdmuxError(f"{name} is an integer of 0 or more, got {value!r}")
        if bool(decode_rows) != bool(decode_context):
            raise PdmuxError(f"decode rows need a context of 1 or more tokens and a context needs "
                             f"decode rows, got {decode_rows} rows of {decode_context} tokens")
        lens = [tokens // prompts + (i < tokens % prompts) for i in range(prompts)]
        rows, context = decode_rows, decode_context
        table, pages = page_table([context + 1] * rows + [prefix + n for n in lens], page_size,
                                  "cuda", shuffle=False)
        table = torch.nn.functional.pad(table, (0, table_width(table.shape[1]) - table.shape[1]))
        cache = KVCache(spec, pages, page_size, "cuda", layers=layers)
        if prefix or rows:  # not zeros: attention over a zero prefix or context reads nothing
            g = torch.Generator(device="cuda").manual_seed(seed)
            for kv in (*cache.k, *cache.v):
                kv.normal_(generator=g)
        self.model = Model(Weights.random(spec, "cuda", seed=seed, layers=layers), cache,
                           max_positions=max(prefix + max(lens), context + 1))
        # the decode rows' new tokens first, then each prompt's, as the executor packs them
        pos = torch.cat([torch.full((rows,), context, device="cuda")]
                        + [torch.arange(prefix, prefix + n, device="cuda") for n in lens])
        seq = torch.repeat_interleave(torch.arange(rows + prompts, device="cuda"),
                                      torch.tensor([1] * rows + lens, device="cuda"))
        slots = table[seq, pos // page_size].long() * page_size + pos % page_size
        self.batch = ExtendBatch(
            tokens=torch.randint(0, spec.vocab, (rows + tokens,), device="cuda"), positions=pos,
            slots=slots, page_table=table, extend_lens=[1] * rows + lens,
            prefix_lens=[context] * rows + [prefix] * prompts, decode_rows=rows,
            decode_seq_lens=(torch.full((rows,), context + 1, dtype=torch.int32, device="cuda")
                             if rows else None))
        self.layers = layers
        self.amount = step_cost.batch_flops(spec, [(1, context)] * rows
                                            + [(n, prefix) for n in lens], layers, samples=False)

    def run(self, budget: Budget) -> None:
        self.model.extend_layers(self.batch, 0, self.layers, budget=budget)


def make_decode_workload(name: str, spec: ModelSpec, batch: int, context: int) -> Workload:
    if name == "stream_read":
        return StreamRead()
    if name == "decode_attention":
        return DecodeAttention(spec, batch, context)
    if name == "decode_linear":
        return DecodeLinear(spec, batch)
    if name == "decode_step":
        return DecodeStep(spec, batch, context)
    raise PdmuxError(f"unknown workload {name!r}; known: {', '.join(DECODE_WORKLOADS)}")
