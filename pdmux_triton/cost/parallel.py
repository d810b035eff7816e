"""Tensor parallelism on the cost model: what one rank of a TP-N server holds and computes, and
what its collectives cost on the link between the GPUs. Pure Python.

A TP-N rank holds a shard of every linear (column-parallel q/k/v and gate/up, row-parallel o
and down, a vocabulary-parallel LM head): its weights, its KV cache per token and its FLOPs are
those of a model with 1/N of the heads, of the MLP width and of the vocabulary, which `shard`
returns as a `ModelSpec`, so the single-GPU cost model prices a rank's work as it is. What TP
adds is communication: two all-reduces of the hidden states per layer (after o and after down)
and an all-gather of the sampled rows' logits (`TensorParallel`), priced from the link's bus
bandwidth and latency as nccl-tests reports them (busbw = algbw * 2(n-1)/n for an all-reduce).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pdmux_triton.cost.step_cost import DecodeRate
from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec.models import ModelSpec

ACTIVATION_BYTES = 2  # bf16 hidden states and logits


@dataclass(frozen=True)
class Link:
    """How fast GPUs of one server reach each other: a collective's bus bandwidth at large
    sizes, and the fixed time a small one takes."""

    name: str
    busbw_gbps: float
    latency_us: float
    source: str = ""

    def __post_init__(self):
        for field_name, value in (("bus bandwidth (GB/s)", self.busbw_gbps),
                                  ("latency (us)", self.latency_us)):
            if not (math.isfinite(value) and value > 0):
                raise PdmuxError(f"the link's {field_name} must be a finite number > 0, "
                                 f"got {value}")


LINKS = {
    # nccl-tests all_reduce_perf on 8 x H100 SXM over NVLink 4 / NVSwitch reports 460-480 GB/s
    # busbw at large sizes; H200 SXM has the same links. Small all-reduces of a decode step
    # are latency-bound; 10 us is a preset, not a measurement here.
    "nvlink4": Link("nvlink4", 450.0, 10.0,
                    "https://docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests"),
    # H100 PCIe without NVLink: 35-45 GB/s busbw (same source)
    "pcie5": Link("pcie5", 40.0, 20.0,
                  "https://docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests"),
}


def shard(model: ModelSpec, tp: int) -> ModelSpec:
    """The model one of `tp` ranks holds. KV heads are split while there are at least `tp`
    of them, else each rank keeps one (replicated, as SGLang and vLLM do)."""
    if not (isinstance(tp, int) and tp >= 1):
        raise PdmuxError(f"tensor parallelism must be a whole number of GPUs >= 1, got {tp!r}")
    if tp == 1:
        return model
    kv_ok = model.kv_heads % tp == 0 or tp % model.kv_heads == 0
    for what, value in (("query heads", model.q_heads), ("MLP width", model.intermediate),
                        ("vocabulary", model.vocab)):
        if value % tp:
            raise PdmuxError(f"--tp {tp}: {model.name}'s {what} ({value}) does not split into "
                             f"{tp} equal shards")
    if not kv_ok:
        raise PdmuxError(f"--tp {tp}: {model.name}'s {model.kv_heads} KV heads neither split "
                         f"into {tp} shards nor replicate evenly over them")
    return replace(model, name=f"{model.name}/tp{tp}", q_heads=model.q_heads // tp,
                   kv_heads=max(1, model.kv_heads // tp), intermediate=model.intermediate // tp,
                   vocab=model.vocab // tp)


@dataclass(frozen=True)
class TensorParallel:
    """The collectives of a TP-`tp` forward over `link`, for a model of `hidden` width and
    `layers` layers with a `vocab`-wide LM head (the whole model's, not a shard's)."""

    tp: int
    link: Link | None  # None on one GPU
    hidden: int
    layers: int
    vocab: int

    def __post_init__(self):
        if self.tp > 1 and self.link is None:
            raise PdmuxError(f"tensor parallelism over {self.tp} GPUs needs a link to price "
                             f"its collectives")

    @classmethod
    def of(cls, model: ModelSpec, tp: int, link: Link | None = None) -> "TensorParallel":
        return cls(tp, link, model.hidden, model.layers, model.vocab)

    def allreduce_s(self, nbytes: float) -> float:
        n = self.tp
        return self.link.latency_us * 1e-6 + nbytes * 2 * (n - 1) / n / (self.link.busbw_gbps * 1e9)

    def allgather_s(self, nbytes: float) -> float:
        """All-gather of `nbytes` in all (each rank contributes 1/n of it)."""
        n = self.tp
        return self.link.latency_us * 1e-6 + nbytes * (n - 1) / n / (self.link.busbw_gbps * 1e9)

    def layers_s(self, rows: int, layers: int) -> float:
        """`layers` layers over `rows` tokens: two all-reduces of their hidden states each."""
        if self.tp == 1 or rows == 0:
            return 0.0
        return 2 * layers * self.allreduce_s(rows * self.hidden * ACTIVATION_BYTES)

    def logits_s(self, rows: int) -> float:
        """The vocabulary-parallel LM head's logits of `rows` sampled rows, gathered."""
        if self.tp == 1 or rows == 0:
            return 0.0
        return self.allgather_s(rows * self.vocab * ACTIVATION_BYTES)

    def decode_s(self, batch: int) -> float:
        """What a decode step of `batch` requests spends in collectives."""
        return self.layers_s(batch, self.layers) + self.logits_s(batch)


@dataclass(frozen=True)
class RankRate:
    """A decode rate measured on one GPU serving the whole model, for one of `tp` ranks: the
    same bandwidth on the same SMs, and 1/tp of what a batch's rows cost beyond their bytes
    (that term is the linears' MMA work on the rows, and a rank holds 1/tp of the linears)."""

    rate: DecodeRate
    tp: int

    def tbps(self, sms: int, corun: bool) -> float:
        return self.rate.tbps(sms, corun)

    def batch_extra_s(self, sms: int, corun: bool, batch: int) -> float:
        return self.rate.batch_extra_s(sms, corun, batch) / self.tp

    def context_extra_s(self, sms: int, corun: bool, context: float, kv: float) -> float:
        return self.rate.context_extra_s(sms, corun, context, kv)  # `kv`: the rank's bytes


def rank_rate(rate: DecodeRate, tp: int) -> DecodeRate:
    """`rate` as one of `tp` ranks sees it (itself on one GPU)."""
    return rate if tp == 1 else RankRate(rate, tp)
