"""Tensor parallelism over torch.distributed: what rank r of N holds, and its collectives.

A rank's weights are slices of the whole model's (`shard_weights`), in the kernels' fused
layout: its query heads and KV heads of the q/k/v rows (column-parallel; with fewer KV heads
than ranks each rank keeps the one its query heads read), its half of gate and of up, the
matching columns of o and down (row-parallel: each rank's output is a partial sum), and its
slice of the vocabulary's LM-head rows. Norms and the embedding are whole on every rank. A
`Model` of the shard, called with a `Budget` whose `comm` is a `DistCollectives`, sums the
partial o and down outputs (all-reduce) and gathers the logits, so every rank holds the same
hidden states and tokens as one GPU. Each side of a split has its own group: the executor
gives the decode and the prefill side's budgets their own (`ModelExecutor.shared(rank=)`).

The shard's shape is `parallel.shard`'s, the one the simulator prices.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pdmux_triton.cost.parallel import shard
from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.decoder import Weights


def _kv_heads_of(rank: int, tp: int, kv_heads: int) -> range:
    if kv_heads >= tp:
        per = kv_heads // tp
        return range(rank * per, (rank + 1) * per)
    one = rank * kv_heads // tp  # replicated: the KV head this rank's query heads share
    return range(one, one + 1)


def shard_weights(w: Weights, rank: int, tp: int) -> Weights:
    """Rank `rank`'s slices of `w` (copies, contiguous, on w's device)."""
    spec = w.spec
    part = shard(spec, tp)
    if not 0 <= rank < tp:
        raise PdmuxError(f"rank {rank} is not one of the {tp} ranks 0..{tp - 1}")
    hd, qd, kvd = spec.head_dim, spec.q_dim, spec.kv_dim
    q_rows = torch.arange(rank * part.q_dim, (rank + 1) * part.q_dim)
    kv = _kv_heads_of(rank, tp, spec.kv_heads)
    kv_rows = torch.arange(kv.start * hd, kv.stop * hd)
    qkv_rows = torch.cat([q_rows, qd + kv_rows, qd + kvd + kv_rows]).to(w.embed.device)
    inter = torch.arange(rank * part.intermediate, (rank + 1) * part.intermediate)
    gate_up_rows = torch.cat([inter, spec.intermediate + inter]).to(w.embed.device)
    vocab = slice(rank * part.vocab, (rank + 1) * part.vocab)
    layers = []
    for lw in w.layers:
        out = {k: v.clone() for k, v in lw.items() if k in ("in_norm", "post_norm", "q_norm",
                                                            "k_norm")}
        out["qkv"] = lw["qkv"][qkv_rows].contiguous()
        if "qkv_bias" in lw:
            out["qkv_bias"] = lw["qkv_bias"][qkv_rows].contiguous()
        out["o"] = lw["o"][:, rank * part.q_dim:(rank + 1) * part.q_dim].contiguous()
        out["gate_up"] = lw["gate_up"][gate_up_rows].contiguous()
        out["down"] = lw["down"][:, inter.to(w.embed.device)].contiguous()
        layers.append(out)
    return Weights(part, w.embed, w.lm_head[vocab].contiguous(), w.final_norm, layers)


class DistCollectives:
    """A rank's collectives on a torch.distributed process group (gloo on CPUs, NCCL on GPUs);
    `calls` counts those issued (a side's work must issue them on its own group)."""

    def __init__(self, group=None):
        self.group = group
        self.size = dist.get_world_size(group)
        self.calls = 0

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        dist.all_reduce(partial, group=self.group)
        return partial

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        dist.all_gather(parts, logits.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


class AgreedExecutor:
    """One rank's executor whose loop decides as every rank's does, as SGLang's TP ranks do.

    Each rank runs the same scheduler loop on its own executor; what the loop decides from
    must be the same on every rank or they diverge (one admits a request or takes a level the
    others do not, and their collectives stop matching). The clock the loop reads is the
    slowest rank's, and a prefill counts as finished only once it has finished on every rank
    (the vote SGLang casts before it merges a finished prefill into the batch): both are CPU
    all-reduces on `group` (gloo), each rank's tokens being the same already."""

    def __init__(self, executor, group=None):
        self.x, self.group = executor, group

    def __getattr__(self, name):  # everything the loop does not decide from
        return getattr(self.x, name)

    def _agree(self, value: float, op) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=op, group=self.group)
        return float(t)

    def now(self) -> float:
        return self._agree(self.x.now(), dist.ReduceOp.MAX)

    def wait_decode(self, pending):
        t, tokens = self.x.wait_decode(pending)
        return self._agree(t, dist.ReduceOp.MAX), tokens

    def prefill_result(self, carry, wait: bool):
        mine = self.x.prefill_result(carry, wait)
        if not wait and self._agree(float(mine is not None), dist.ReduceOp.MIN) == 0.0:
            return None  # not finished everywhere: looked at again next round
        t, tokens = mine
        return self._agree(t, dist.ReduceOp.MAX), tokens

    def mixed(self, decoding, prompt, start, n):
        t, tokens, first = self.x.mixed(decoding, prompt, start, n)
        return self._agree(t, dist.ReduceOp.MAX), tokens, first
