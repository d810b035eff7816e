"""A Qwen3/Llama/Qwen2/Mistral decoder made only of the project's kernels, with seeded random
weights or a checkpoint's.

Every kernel is launched with an SM budget (`partition.Budget`), so the same forward runs on
the whole GPU, on a grid-capped share or inside a green context. Layers are the unit of work: a
decode step runs all of them for a batch of one token per request; a prefill can run any range
of layers of a token batch (SGLang's split prefill), carrying hidden states and residual, its
layers after the first in a call replaying the first's launches (kernels/_replay.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import cached_property

import torch

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.streams import kernel_args
from pdmux_triton.kernels import (decode_attention, extend_attention, linear, rmsnorm, rope_cache,
                                  rope_store_kv, swiglu_linear)
from pdmux_triton.kernels._replay import recording
from pdmux_triton.kernels.gemm import normalizes_rows
from pdmux_triton.kernels.prefill_attention import plan_extend
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.models import ModelSpec


@dataclass
class Weights:
    """Every weight of the decoder in the kernels' layout: per layer the fused q/k/v rows and
    gate/up rows, the q/k/v bias where the model has one (Qwen2), q/k norms (used by Qwen3).
    `lm_head` is the embedding table itself where the model ties them. Made by `random` or
    read from a Hugging Face checkpoint (`checkpoint.load_weights`), both of which fold the
    layer norms' gains into the GEMMs after them (`fold_norm_gains`)."""

    spec: ModelSpec
    embed: torch.Tensor
    lm_head: torch.Tensor
    final_norm: torch.Tensor
    layers: list[dict[str, torch.Tensor]]

    @classmethod
    def random(cls, spec: ModelSpec, device, dtype=torch.bfloat16, seed: int = 0,
               layers: int | None = None) -> "Weights":
        """Seeded random weights (no downloads; a step's time does not depend on values),
        scaled so activations stay bounded (1/sqrt(fan-in)) and greedy decoding is
        reproducible."""
        device = torch.device(device)
        g = torch.Generator(device=device).manual_seed(seed)  # draw on the GPU: 8B values

        def rand(*shape, scale):
            return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

        def near_one(n):
            return (1 + 0.1 * torch.randn(n, generator=g, device=device)).to(dtype)

        h, qd, kvd, inter = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate
        embed = rand(spec.vocab, h, scale=h ** -0.5 if spec.tie_embeddings else 1.0)
        lm_head = embed if spec.tie_embeddings else rand(spec.vocab, h, scale=h ** -0.5)
        out = []
        for _ in range(spec.layers if layers is None else layers):
            layer = {
                "in_norm": near_one(h),
                "post_norm": near_one(h),
                "qkv": rand(qd + 2 * kvd, h, scale=h ** -0.5),
                "o": rand(h, qd, scale=qd ** -0.5),
                "gate_up": rand(2 * inter, h, scale=h ** -0.5),
                "down": rand(h, inter, scale=inter ** -0.5),
                "q_norm": torch.ones(spec.head_dim, device=device, dtype=dtype),
                "k_norm": torch.ones(spec.head_dim, device=device, dtype=dtype),
            }
            if spec.qkv_bias:
                layer["qkv_bias"] = rand(qd + 2 * kvd, scale=0.1)
            out.append(layer)
        weights = cls(spec, embed, lm_head, torch.ones(h, device=device, dtype=dtype), out)
        weights.fold_norm_gains()
        return weights

    def fold_norm_gains(self) -> None:
        """rmsnorm(x) * g @ W^T = rmsnorm(x) @ (W * g)^T: each layer's input and post-attention
        norm gains move into the columns of the QKV and gate-up weights after them (in place),
        and the norms keep gains of one. A decode step's GEMMs then normalize their own rows
        (`linear(..., rms_eps=)`), and everything else normalizes with the unit gain. Run once:
        a second call finds unit gains and changes nothing."""
        for layer in self.layers:
            for norm, weight in (("in_norm", "qkv"), ("post_norm", "gate_up")):
                # in place, each product rounded once (no fp32 copy of an 8B model's weight)
                layer[weight].mul_(layer[norm])
                layer[norm].fill_(1)


def rope_frequencies(spec: ModelSpec) -> torch.Tensor | None:
    """The rotary frequencies of a model that scales them (Llama 3's rope scaling, as
    transformers computes it); None for plain rope_theta ones."""
    scaling = spec.rope_scaling
    if scaling is None:
        return None
    dim = spec.head_dim
    inv_freq = 1.0 / spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    wavelen = 2 * math.pi / inv_freq
    old = scaling.original_max_positions
    low_wavelen, high_wavelen = old / scaling.low_freq_factor, old / scaling.high_freq_factor
    # long wavelengths stretched by the factor, short ones kept, those between blended
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((old / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    between = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(between, blended, scaled)


def allocatable_bytes(device: torch.device) -> int:
    """What this process can still allocate on a CUDA device: the driver's free memory and
    what torch's allocator holds unused (an earlier run's cache, freed but not returned)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


class KVCache:
    """Paged KV cache: per layer K and V of shape [pages * page_size, kv_heads, head_dim]."""

    def __init__(self, spec: ModelSpec, num_pages: int, page_size: int, device,
                 dtype=torch.bfloat16, layers: int | None = None):
        if num_pages < 1 or page_size < 1:
            raise PdmuxError(f"a KV cache needs pages >= 1 and page size >= 1, got {num_pages} "
                             f"and {page_size}")
        self.page_size = page_size
        self.num_pages = num_pages
        slots = num_pages * page_size
        n = spec.layers if layers is None else layers
        shape = (slots, spec.kv_heads, spec.head_dim)
        need = 2 * n * slots * spec.kv_dim * torch.finfo(dtype).bits // 8
        if torch.device(device).type == "cuda":
            free = allocatable_bytes(torch.device(device))
            if need > free:
                raise PdmuxError(f"a KV cache of {num_pages} pages x {page_size} tokens needs "
                                 f"{need / 2**30:.1f} GiB; the GPU has {free / 2**30:.1f} GiB free")
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n)]


@dataclass
class DecodeBatch:
    """Device tensors of one decode step: a token per request at its position."""

    tokens: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64: where the new token goes (its context before it)
    slots: torch.Tensor  # [B] int64: cache slot of the new token
    page_table: torch.Tensor  # [B, pages] int32
    seq_lens: torch.Tensor  # [B] int32: context including the new token
    max_seq_len: int  # host bound on seq_lens (fixed for a captured graph)


def table_width(pages: int) -> int:
    """An extend batch's page-table width for rows of up to `pages` pages: a multiple of 4, so
    the int32 table's rows past a mixed step's decode rows start on a 16-byte boundary, as
    warm-up's do (Triton specializes a pointer's alignment)."""
    return -(-pages // 4) * 4


@dataclass
class ExtendBatch:
    """A prefill (or chunk of one) of several sequences packed back to back."""

    tokens: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slots: torch.Tensor  # [T] int64
    page_table: torch.Tensor  # [B, pages] int32
    extend_lens: list[int]
    prefix_lens: list[int]
    # a mixed step's leading decode rows (one new token each after its context): their
    # attention runs as a decode step's, each row's context read once for its group of query
    # heads, where the extend kernel would give each a query tile a head; their contexts with
    # the new token ([decode_rows] int32), uploaded with the batch
    decode_rows: int = 0
    decode_seq_lens: torch.Tensor | None = None

    def __post_init__(self):
        n = self.decode_rows
        if n and (self.decode_seq_lens is None or len(self.decode_seq_lens) != n
                  or any(k != 1 for k in self.extend_lens[:n]) or n > len(self.extend_lens)):
            raise PdmuxError(f"a batch's {n} decode rows need one new token each and their "
                             f"{n} context lengths")

    @cached_property
    def plan(self):
        """The extend attention's block plan for the sequences past the decode rows (None: there
        are none), made and uploaded once: a split prefill runs extend_layers every round on
        the same batch."""
        n = self.decode_rows
        if n == len(self.extend_lens):
            return None
        return plan_extend(self.extend_lens[n:], self.prefix_lens[n:], self.tokens.device)


class OneGpu:
    """Collectives on one GPU: nothing to reduce or gather (a rank's: tensor_parallel)."""

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return partial

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


ONE_GPU = OneGpu()


class Model:
    def __init__(self, weights: Weights, cache: KVCache, max_positions: int = 131072):
        """On a tensor-parallel rank `weights` is its shard, and each call's `Budget.comm`
        sums the row-parallel o and down projections and gathers the logits."""
        self.w = weights
        self.spec = weights.spec
        self.cache = cache
        self.cos_sin = rope_cache(max_positions, self.spec.head_dim, self.spec.rope_theta,
                                  weights.embed.device, rope_frequencies(self.spec))
        # off: every prefill layer through its launchers (a baseline: bench/host_profile.py)
        self.replays_layers = True
        # why the last prefill's record could not be replayed (None: it could, or one layer;
        # a later layer of another layout still runs through its launchers)
        self.unreplayable: str | None = None
        # when (time.perf_counter) the last prefill's first layer was launched: the host's
        # time for the first layer and for the later ones (bench/host_profile.py, the timeline)
        self.first_launched_at = 0.0

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        # a gather, not a GEMM: its cost is a few rows per token on either side of the split
        return self.w.embed[tokens]

    def residual_stream(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) before the first layer: the embeddings and a zero sum, so that
        every layer adds its input to the residual alike (+0 is exact) and launches alike."""
        hidden = self.embed(tokens)
        return hidden, torch.zeros_like(hidden)

    def layer(self, i: int, hidden: torch.Tensor, residual: torch.Tensor,
              positions: torch.Tensor, slots: torch.Tensor, attend, budget: Budget):
        """One transformer layer; `attend(q, k, v, k_cache, v_cache)` is decode or extend
        attention (k, v: this call's new keys and values, already in the cache too).
        `residual` is the running sum before `hidden` is added to it (zeros at the first
        layer: `residual_stream`).

        Returns (hidden, residual) for the next layer: the MLP output and the running sum.
        """
        s, lw, kw = self.spec, self.w.layers[i], kernel_args(budget)
        x = rmsnorm(hidden, lw["in_norm"], s.rms_eps, residual=residual, **kw)
        attn = self._attention(i, linear(x, lw["qkv"], bias=lw.get("qkv_bias"), **kw), positions,
                               slots, attend, kw)
        comm = budget.comm or ONE_GPU
        o = comm.reduce(linear(attn, lw["o"], **kw))
        x = rmsnorm(o, lw["post_norm"], s.rms_eps, residual=residual, **kw)
        mlp = comm.reduce(linear(swiglu_linear(x, lw["gate_up"], **kw), lw["down"], **kw))
        return mlp, residual

    def fused_layer(self, i: int, residual: torch.Tensor, positions: torch.Tensor,
                    slots: torch.Tensor, attend, budget: Budget) -> None:
        """One layer of a decode-sized batch on one GPU (`fuses_norms`), with the norms and
        residual adds inside the GEMMs: the QKV and gate-up GEMMs normalize the residual
        stream's rows themselves (the gains are in their weights: `Weights.fold_norm_gains`)
        and the o and down GEMMs add into it, which is updated in place. Six launches, where
        `layer` makes eight."""
        s, lw, kw = self.spec, self.w.layers[i], kernel_args(budget)
        qkv = linear(residual, lw["qkv"], bias=lw.get("qkv_bias"), rms_eps=s.rms_eps, **kw)
        attn = self._attention(i, qkv, positions, slots, attend, kw)
        linear(attn, lw["o"], residual, accumulate=True, **kw)
        mlp_in = swiglu_linear(residual, lw["gate_up"], rms_eps=s.rms_eps, **kw)
        linear(mlp_in, lw["down"], residual, accumulate=True, **kw)

    def fuses_norms(self, rows: int, budget: Budget) -> bool:
        """Whether a batch of `rows` tokens runs `fused_layer`: one GPU (a tensor-parallel
        rank's o and down outputs are partial sums until reduced) and QKV and gate-up GEMMs
        that normalize their own rows on this budget (`gemm.normalizes_rows`)."""
        if budget.comm is not None:
            return False
        kw, lw = kernel_args(budget), self.w.layers[0]
        return all(normalizes_rows(rows, lw[name], **kw) for name in ("qkv", "gate_up"))

    def _attention(self, i: int, qkv: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                   attend, kw: dict) -> torch.Tensor:
        """Layer i's attention from its QKV projection: q and k normed and rotated, k and v
        into the cache, then `attend`; [T, q_dim]."""
        s, lw = self.spec, self.w.layers[i]
        T = qkv.shape[0]
        heads = qkv.view(T, s.q_heads + 2 * s.kv_heads, s.head_dim)
        q, k, v = heads.split_with_sizes([s.q_heads, s.kv_heads, s.kv_heads], dim=1)
        rope_store_kv(heads, positions, self.cos_sin, s.q_heads, self.cache.k[i], self.cache.v[i],
                      slots, lw["q_norm"] if s.qk_norm else None,
                      lw["k_norm"] if s.qk_norm else None, s.rms_eps, **kw)
        return attend(q, k, v, self.cache.k[i], self.cache.v[i]).view(T, s.q_dim)

    def logits(self, hidden: torch.Tensor | None, residual: torch.Tensor,
               budget: Budget) -> torch.Tensor:
        """Logits of the last layer's output (hidden None: already added into the residual
        stream, as `fused_layer` leaves it)."""
        kw = kernel_args(budget)
        if hidden is None:
            x = rmsnorm(residual, self.w.final_norm, self.spec.rms_eps, **kw)
        else:
            x = rmsnorm(hidden, self.w.final_norm, self.spec.rms_eps, residual=residual, **kw)
        return (budget.comm or ONE_GPU).gather_vocab(linear(x, self.w.lm_head, **kw))

    def decode_step(self, batch: DecodeBatch, budget: Budget = Budget()) -> torch.Tensor:
        """Logits [B, vocab] of one new token per request (its K/V enter the cache)."""
        ps = self.cache.page_size

        def attend(q, k, v, kc, vc):
            return decode_attention(q, kc, vc, batch.page_table, batch.seq_lens, ps,
                                    batch.max_seq_len, **kernel_args(budget, attention=True))
        if self.fuses_norms(batch.tokens.shape[0], budget):
            # the gather's own tensor: the residual stream, updated in place
            residual = self.embed(batch.tokens)
            for i in range(len(self.w.layers)):
                self.fused_layer(i, residual, batch.positions, batch.slots, attend, budget)
            return self.logits(None, residual, budget)
        hidden, residual = self.residual_stream(batch.tokens)
        for i in range(len(self.w.layers)):
            hidden, residual = self.layer(i, hidden, residual, batch.positions, batch.slots,
                                          attend, budget)
        return self.logits(hidden, residual, budget)

    def extend_layers(self, batch: ExtendBatch, start: int, end: int, hidden=None, residual=None,
                      budget: Budget = Budget()):
        """Layers [start, end) of a prefill batch; embeds at 0. Returns (hidden, residual)."""
        if not 0 <= start <= end <= len(self.w.layers):
            raise PdmuxError(f"layer range [{start}, {end}) is outside 0..{len(self.w.layers)}")
        if start == 0:
            hidden, residual = self.residual_stream(batch.tokens)
        elif hidden is None or residual is None:
            raise PdmuxError(f"a prefill resumed at layer {start} needs the hidden states and "
                             f"the residual stream")
        ps, plan, n = self.cache.page_size, batch.plan, batch.decode_rows
        longest = max(batch.prefix_lens[:n]) + 1 if n else 0

        def attend(q, k, v, kc, vc):
            if not n:
                return extend_attention(q, k, v, kc, vc, batch.page_table, batch.extend_lens,
                                        batch.prefix_lens, ps, plan=plan, **kernel_args(budget))
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (q: a strided view)
            # (the decode kernel's variant for n rows is a decode step's of n's padded size,
            # which warm-up compiles when it captures the decode graphs: none compiles here)
            decode_attention(q[:n], kc, vc, batch.page_table[:n], batch.decode_seq_lens, ps,
                             longest, out=out[:n], **kernel_args(budget, attention=True))
            if n < len(batch.extend_lens):
                extend_attention(q[n:], k[n:], v[n:], kc, vc, batch.page_table[n:],
                                 batch.extend_lens[n:], batch.prefix_lens[n:], ps, plan=plan,
                                 out=out[n:], **kernel_args(budget))
            return out

        def run(i, hidden, residual):
            return self.layer(i, hidden, residual, batch.positions, batch.slots, attend, budget)
        hidden, residual = self._layers(range(start, end), hidden, residual, run,
                                        replays=budget.comm is None and self.replays_layers)
        if budget.comm is not None:  # (its all-reduces are no launches a record keeps)
            self.unreplayable = "a tensor-parallel rank's layers reduce between their launches"
        elif not self.replays_layers:
            self.unreplayable = "replays are off"
        return hidden, residual

    def _layers(self, layers: range, hidden, residual, run, replays: bool):
        """`run(i, hidden, residual)` (layer i's launches) for the first of `layers`,
        recorded where `replays`; for each later one its launches again, with the layer's
        own weights, KV cache and input swapped in (kernels/_replay.py): the host's time of
        an eager layer is mostly its launchers' checks and Triton's binding, the same for
        every layer. A layer the record cannot serve runs as the first did. Stamps
        `first_launched_at` once the first layer's launches are made."""
        self.unreplayable = record = output = None
        for i in layers:
            if not replays or len(layers) == 1:  # (one layer: nothing to replay)
                hidden, residual = run(i, hidden, residual)
            elif record is None:
                with recording(self._layer_tensors(i, hidden)) as record:
                    hidden, residual = run(i, hidden, residual)
                self.unreplayable, output = record.unreplayable, hidden
            elif not record.unreplayable and record.replay(self._layer_tensors(i, hidden)):
                hidden = output  # (every replay writes where the recorded layer wrote)
            else:
                hidden, residual = run(i, hidden, residual)
            if i == layers.start:
                self.first_launched_at = time.perf_counter()
        return hidden, residual

    def _layer_tensors(self, i: int, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        """What layer i's launches read that another layer's do not: its weights, its KV
        cache, its input."""
        return {**self.w.layers[i], "k_cache": self.cache.k[i], "v_cache": self.cache.v[i],
                "hidden": hidden}
