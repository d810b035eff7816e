"""Decode steps captured as CUDA graphs, as SGLang captures its decode graphs at start-up: one
per (stream, budget, padded batch size, page-table width, context bucket), each with static
input buffers that a step copies its inputs into before the replay."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pdmux_triton.model import DecodeBatch, Model
from pdmux_triton.partition import Budget


def padded_batch(n: int) -> int:
    """The captured batch size serving n requests: 1, 2, 4, 8, then multiples of 8."""
    return 1 << (n - 1).bit_length() if n <= 8 else -(-n // 8) * 8


@dataclass
class CapturedStep:
    batch: DecodeBatch  # the static inputs the graph reads
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor  # the static output: greedy token ids of every padded row

    def replay(self, inputs: list[torch.Tensor], rows: int) -> torch.Tensor:
        """Copy device inputs (DecodeBatch's field order) into the static buffers and replay;
        the first `rows` tokens, copied out before the next replay overwrites them."""
        static = (self.batch.tokens, self.batch.positions, self.batch.slots,
                  self.batch.page_table, self.batch.seq_lens)
        for dst, val in zip(static, inputs):
            dst.copy_(val)
        self.graph.replay()
        return self.out[:rows].clone()


class DecodeGraphs:
    def __init__(self, model: Model):
        self.model = model
        self._steps: dict[tuple, CapturedStep] = {}

    def get(self, stream, budget: Budget, rows: int, width: int, bucket: int,
            static_batch: Callable[[], DecodeBatch]) -> CapturedStep:
        """The captured step for this shape, captured on first use on `stream` from the batch
        `static_batch()` makes (inputs that point at the scratch page until a step fills them)."""
        key = (id(stream), budget, rows, width, bucket)
        if key not in self._steps:
            batch = static_batch()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                self.model.decode_step(batch, budget).argmax(-1)  # compile and warm up
                stream.synchronize()
                with torch.cuda.graph(graph, stream=stream):
                    out = self.model.decode_step(batch, budget).argmax(-1)
            self._steps[key] = CapturedStep(batch, graph, out)
        return self._steps[key]

    def clear(self) -> None:
        self._steps.clear()
