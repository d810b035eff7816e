"""Real executors for a served run: one model sized for the run's requests, warmed up once per
strategy, and each measured run watched for what must not happen inside it (a Triton
compile, a graph capture, a new device allocation)."""

from __future__ import annotations

import contextlib
import sys

from pdmux_triton.cost import step_cost
from pdmux_triton.gpu.alloc_watch import AllocWatch
from pdmux_triton.gpu.compile_watch import CompileWatch
from pdmux_triton.gpu.gc_watch import GcWatch
from pdmux_triton.gpu.model_executor import ModelExecutor
from pdmux_triton.multiplex.level_policy import LevelPolicy
from pdmux_triton.multiplex.sglang_rules import Level, PDMuxConfig
from pdmux_triton.serve.scheduler import kv_need
from pdmux_triton.spec.gpus import GPUSpec
from pdmux_triton.spec.models import ModelSpec
from pdmux_triton.spec.traffic import Request

PAGE_SIZE = step_cost.KV_PAGE_TOKENS


class GpuExecutors:
    """`executor(strategy, kind, chunk, levels_by)` for each served variant, over one shared
    model."""

    def __init__(self, gpu: GPUSpec, model: ModelSpec, requests: list[Request],
                 config: PDMuxConfig, levels: list[Level], prefill_tokens: int,
                 max_running: int, checkpoint: str | None = None):
        self.gpu, self.model, self.config, self.checkpoint = gpu, model, config, checkpoint
        self.levels = levels
        self.max_running = max_running
        # a prefill batch's rows at the most: the oldest prompt is taken whatever its length
        # (`Engine.take_prompts`), so a long one runs past the batch's token budget; the
        # warm-up grows the allocator's pool to it, not to the budget alone
        self.prefill_rows = max(prefill_tokens, max(r.prompt_len for r in requests))
        longest = max(kv_need(r) for r in requests)
        # the whole run's KV at once if it fits (its pages: a prefix cache then never evicts),
        # else what the GPU keeps (admission waits)
        self.cache_tokens = min(sum(kv_need(r, PAGE_SIZE) for r in requests),
                                step_cost.kv_capacity_tokens(gpu, model))
        self.max_context = -(-longest // PAGE_SIZE) * PAGE_SIZE
        self._warm: set[tuple] = set()

    def executor(self, strategy: str, kind: str, chunk: int,
                 levels_by: LevelPolicy) -> ModelExecutor:
        x = ModelExecutor.shared(self.model, self.gpu, kind, page_size=PAGE_SIZE,
                                 cache_tokens=max(self.cache_tokens, self.max_context),
                                 max_context=self.max_context, checkpoint=self.checkpoint,
                                 progress=self._loading)
        # the policy by its settings, not its type: two ITL targets reach different levels
        key = (strategy, kind, chunk, repr(levels_by))
        if key not in self._warm:
            x.warm_up(strategy, self.config, self.max_running, self.prefill_rows, chunk,
                      levels_by, self.levels)
            self._warm.add(key)
        return x

    def _loading(self, done: int, shards: int) -> None:
        print(f"loading {self.checkpoint}: {done}/{shards} shards", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def watch(self, x: ModelExecutor):
        """Counts, filled in as the block exits, of what happened inside it."""
        counts: dict[str, int] = {}
        captures = x.graphs.captures
        # (the allocation watch outermost: its memory snapshots are no collection of the run's)
        with (AllocWatch(x.partitions.stream_names) as allocated, CompileWatch() as compiled,
              GcWatch() as collected):
            yield counts
        counts["compiles_during_measurement"] = compiled.count
        # not a guard: a diagnostic of the host's slow launches
        counts["gc_collections_during_measurement"] = collected.collections
        counts["gc_pause_ms_during_measurement"] = collected.pause_s * 1e3
        counts["captures_during_measurement"] = x.graphs.captures - captures
        counts["device_allocations_during_measurement"] = allocated.count
        # not guards: which side's pool grew, to warm it up, and whether the pools outgrew
        # the device (segments given back, retries)
        counts["device_allocations_by_stream"] = allocated.by_stream
        counts["device_segments_freed_during_measurement"] = allocated.freed
        counts["device_alloc_retries_during_measurement"] = allocated.retries
        counts["compiled"] = compiled.compiled[:20]

    def close(self) -> None:
        ModelExecutor.release_shared()  # green contexts, graphs, the model
