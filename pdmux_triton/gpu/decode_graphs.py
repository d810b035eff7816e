"""Decode steps captured as CUDA graphs, as SGLang captures its decode graphs at start-up: one
per (stream, budget, padded batch size), each with static input buffers that a step copies its
inputs into before the replay.

The static page table is as wide as the longest request the runtime serves, and the attention
kernel reads each request's length from device memory, so one graph serves every context up
to that bound. Graphs share one memory pool (decode steps never run concurrently with each
other), captured largest first so the smaller ones fit in the memory the larger one left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pdmux_triton.cost.step_cost import padded_batch
from pdmux_triton.gpu.decoder import DecodeBatch, Model
from pdmux_triton.multiplex.partition import Budget


def padded_sizes(max_batch: int) -> list[int]:
    """Every captured size a batch of 1..max_batch requests can need."""
    return sorted({padded_batch(n) for n in range(1, max_batch + 1)})


@dataclass
class CapturedStep:
    batch: DecodeBatch  # the static inputs the graph reads
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor  # the static output: greedy token ids of every padded row

    def replay(self, inputs: list[torch.Tensor], rows: int) -> torch.Tensor:
        """Copy device inputs (DecodeBatch's field order; a page table as wide as this step
        needs) into the static buffers and replay; the first `rows` tokens, copied out before
        the next replay overwrites them."""
        tokens, positions, slots, table, lens = inputs
        self.batch.tokens.copy_(tokens)
        self.batch.positions.copy_(positions)
        self.batch.slots.copy_(slots)
        # columns past this step's width keep older page ids: no length reaches them
        self.batch.page_table[:, :table.shape[1]].copy_(table)
        self.batch.seq_lens.copy_(lens)
        self.graph.replay()
        return self.out[:rows].clone()


class DecodeGraphs:
    def __init__(self, model: Model, width: int):
        self.model = model
        self.width = width  # page-table columns of every static batch
        self._steps: dict[tuple, CapturedStep] = {}
        self._pool = None
        self.captures = 0  # graphs captured so far: a measured run should add none

    def get(self, stream, budget: Budget, rows: int,
            static_batch: Callable[[int, int], DecodeBatch]) -> CapturedStep:
        """The captured step of `rows` padded requests on this stream and budget, captured on
        first use from `static_batch(rows, width)` (inputs that point at the scratch page)."""
        key = (id(stream), budget, rows)
        if key not in self._steps:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                # made on this stream: its uploads are ordered before the warm-up step reads
                # them (made on another, the step could read tokens and slots not yet copied)
                batch = static_batch(rows, self.width)
                self.model.decode_step(batch, budget).argmax(-1)  # compile and warm up
                stream.synchronize()
                with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                    out = self.model.decode_step(batch, budget).argmax(-1)
            self._pool = self._pool or graph.pool()
            self._steps[key] = CapturedStep(batch, graph, out)
            self.captures += 1
        return self._steps[key]

    def clear(self) -> None:
        self._steps.clear()
        self._pool = None
