"""The real executor: the scheduler's work on the model, on the partition's streams.

Decode steps are CUDA graphs (`decode_graphs`), captured on the level's decode stream as SGLang
does and fed through static input buffers. Prefill layers run eagerly on the prefill stream,
carrying hidden states between rounds. Times are host times (when a token is visible to the
server); launch marks (`timeline`) tell how long the GPU sat idle between rounds.

Without CUDA (the Triton interpreter, CPU tests) the same code runs in order on one "stream"
with host timers and no graphs: slow, but it serves the same tokens.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist

from pdmux_triton.cost.step_cost import padded_batch
from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.block_manager import BlockManager
from pdmux_triton.gpu.checkpoint import load_weights
from pdmux_triton.gpu.decode_graphs import DecodeGraphs, padded_sizes
from pdmux_triton.gpu.decoder import (DecodeBatch, ExtendBatch, KVCache, Model, Weights,
                                      table_width)
from pdmux_triton.gpu.streams import PartitionPool
from pdmux_triton.gpu.tensor_parallel import DistCollectives, shard_weights
from pdmux_triton.gpu.timeline import LaunchMarks
from pdmux_triton.gpu.warmup import compile_prefill_side
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.level_policy import LevelPolicy, SGLangLevels
from pdmux_triton.multiplex.partition import Budget, for_level
from pdmux_triton.serve.executor import CHUNKED_STEPS, Activity
from pdmux_triton.spec.gpus import GPUSpec
from pdmux_triton.spec.models import ModelSpec
from pdmux_triton.spec.traffic import Request


@dataclass
class _Side:
    stream: object  # torch.cuda.Stream, or None on the CPU
    budget: Budget


@dataclass
class PrefillCarry:
    """A split prefill between rounds: its batch, the hidden states after the last layer run,
    and, once the last layer was launched, the first tokens and the event that ends them."""

    reqs: list[Request]
    batch: ExtendBatch
    hidden: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    first: torch.Tensor | None = None
    done: object = None  # end mark of the latest launch


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


@dataclass
class Runtime:
    """What outlives one run: the model, the open partitions, the captured decode graphs.

    SGLang creates its stream groups and captures its graphs once at start-up; keeping them
    here lets a warm-up run pay for capture so the measured run does not.
    """

    model: Model
    partitions: PartitionPool
    graphs: DecodeGraphs
    # a tensor-parallel rank's communicators, one per side (decode, prefill); None on one GPU
    comms: tuple = (None, None)

    def close(self) -> None:
        self.graphs.clear()
        self.partitions.close()


class ModelExecutor:
    """Runs decode steps and prefills of a Model for the scheduler."""

    _shared: dict[tuple, Runtime] = {}

    @classmethod
    def shared(cls, spec: ModelSpec, gpu: GPUSpec, kind: str, page_size: int = 16,
               cache_tokens: int = 262_144, max_context: int = 32_768,
               seed: int = 0, checkpoint: str | None = None,
               progress=None, rank: tuple[int, int] | None = None) -> "ModelExecutor":
        """An executor over one model kept across runs (weights are made once per process:
        drawn from `seed`, or read from the Hugging Face `checkpoint` directory, with
        `progress(shards done, shards)`): a KV cache of `cache_tokens` tokens, requests of up
        to `max_context` tokens. `rank` (r, N): this process is rank r of a tensor-parallel
        group of N in torch.distributed's default group, holding its shard of the weights;
        wrap the executor in `tensor_parallel.AgreedExecutor` so the ranks' loops agree."""
        key = (spec, page_size, cache_tokens, max_context, seed, checkpoint, rank)
        if key not in cls._shared:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            # the Triton interpreter's tl.dot is wrong on bf16 (it works on raw bits): fp32 there
            dtype = torch.bfloat16 if device == "cuda" else torch.float32
            pages = -(-cache_tokens // page_size) + 1  # and the scratch page
            weights = (load_weights(spec, checkpoint, device, dtype, progress=progress)
                       if checkpoint else Weights.random(spec, device, dtype, seed=seed))
            comms = (None, None)
            if rank is not None:  # every rank makes the two groups, in the same order
                weights = shard_weights(weights, *rank)
                comms = (DistCollectives(dist.new_group()), DistCollectives(dist.new_group()))
            model = Model(weights, KVCache(weights.spec, pages, page_size, device, dtype),
                          max_positions=max_context + 1)
            graphs = DecodeGraphs(model, width=-(-max_context // page_size))
            cls._shared[key] = Runtime(model, PartitionPool(), graphs, comms)
        return cls(cls._shared[key], gpu, kind)

    @classmethod
    def release_shared(cls) -> None:
        for runtime in cls._shared.values():
            runtime.close()
        cls._shared.clear()
        if torch.cuda.is_available():  # the next runtime's KV cache needs the memory back
            gc.collect()
            torch.cuda.empty_cache()

    def __init__(self, runtime: Runtime, gpu: GPUSpec, kind: str = "grid_cap",
                 use_graphs: bool | None = None):
        model = runtime.model
        self.model = model
        self.total_sms, self.cc_major, self.num_layers = gpu.sms, gpu.cc_major, len(model.w.layers)
        self.kind = kind
        self.device = model.w.embed.device
        self.cuda = self.device.type == "cuda"
        self.use_graphs = self.cuda if use_graphs is None else use_graphs
        self.blocks = BlockManager(model.cache.num_pages, model.cache.page_size)
        self.kv_capacity_tokens = (model.cache.num_pages - 1) * model.cache.page_size  # less scratch
        self.kv_page_tokens = model.cache.page_size
        self.chunked_steps = CHUNKED_STEPS  # (the GPU serves today's loop only)
        self.last_token: dict[int, int] = {}
        self.partitions = runtime.partitions
        self.graphs = runtime.graphs
        self.comms = runtime.comms
        self.marks = LaunchMarks(self.cuda)
        self.decode_side, self.prefill_side = self._sides((self.total_sms, 0))
        self.t0 = time.perf_counter()

    # --- partitions --------------------------------------------------------------------
    def _sides(self, level: sglang_rules.Level) -> tuple[_Side, _Side]:
        """Each side's stream and budget (its SMs, and on a TP rank its own communicator)."""
        decode_comm, prefill_comm = self.comms
        if not self.cuda:  # the interpreter runs in order: one budget, no streams
            return _Side(None, Budget(comm=decode_comm)), _Side(None, Budget(comm=prefill_comm))
        part = self.partitions.get(for_level(level, self.kind, self.total_sms))
        decode = replace(part.decode_budget, comm=decode_comm,
                         attention_ctas_per_sm=part.spec.served_attention_ctas)
        return (_Side(part.decode_stream, decode),
                _Side(part.prefill_stream, replace(part.prefill_budget, comm=prefill_comm)))

    def set_level(self, level: sglang_rules.Level) -> None:
        started = time.perf_counter()
        self._drain()
        self.marks.drains.append(time.perf_counter() - started)
        self.decode_side, self.prefill_side = self._sides(level)

    def _drain(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    # --- time --------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def idle_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    def _remember(self, reqs: list[Request], tokens: list[int]) -> None:
        """The token each request feeds into its next decode step."""
        for r, tok in zip(reqs, tokens):
            self.last_token[r.rid] = tok

    # --- batches -----------------------------------------------------------------------
    def _upload(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """Host int64 arrays to the device on the current stream in one copy, as device views
        of the same shapes, without making the host wait for the stream (a pageable copy
        would): pinned memory and an async copy."""
        # each view starts on a 16-byte boundary: Triton specializes a pointer's alignment, and
        # warm-up's inputs are aligned, so an odd-sized array must not shift the next one
        pieces, starts, at = [], [], 0
        for a in arrays:
            pad = -a.size % 2  # int64s: two make 16 bytes
            pieces += [a.ravel(), np.zeros(pad, dtype=np.int64)]
            starts.append(at)
            at += a.size + pad
        host = torch.from_numpy(np.concatenate(pieces))
        flat = host.pin_memory().to(self.device, non_blocking=True) if self.cuda else host
        return [flat[start:start + a.size].view(a.shape) for start, a in zip(starts, arrays)]

    def _extend_batch(self, seqs: list[tuple[Request, list[int], int]],
                      decode_rows: int = 0) -> ExtendBatch:
        """seqs: (request, new token ids, position of the first) for each sequence, the first
        `decode_rows` of them a mixed step's decode rows (`ExtendBatch.decode_rows`)."""
        bm = self.blocks
        for r, ids, start in seqs:
            if r.rid not in bm.owned:  # its prompt's first tokens: its cached prefix's pages
                bm.begin(r.rid, [page for block in r.prefix for page in block])
            bm.reserve(r.rid, start + len(ids))
        width = table_width(max(len(bm.owned[r.rid]) for r, _, _ in seqs))
        table = np.zeros((len(seqs), width), dtype=np.int64)
        for i, (r, _, _) in enumerate(seqs):
            table[i, :len(bm.owned[r.rid])] = bm.owned[r.rid]
        positions = np.concatenate([np.arange(start, start + len(ids)) for _, ids, start in seqs])
        slots = np.concatenate([bm.slots(r.rid, start, start + len(ids)) for r, ids, start in seqs])
        tokens = np.concatenate([np.asarray(ids, dtype=np.int64) for _, ids, _ in seqs])
        lens = np.array([start + 1 for _, _, start in seqs[:decode_rows]], dtype=np.int64)
        tokens, positions, slots, table, lens = self._upload(tokens, positions, slots, table,
                                                             lens)
        return ExtendBatch(tokens, positions, slots, table.to(torch.int32),
                           [len(ids) for _, ids, _ in seqs], [start for _, _, start in seqs],
                           decode_rows, lens.to(torch.int32) if decode_rows else None)

    def _greedy(self, hidden, residual, batch: ExtendBatch, side: _Side) -> torch.Tensor:
        rows = self._upload(np.cumsum(batch.extend_lens) - 1)[0]  # each sequence's last row
        logits = self.model.logits(hidden[rows], residual[rows], side.budget)
        return logits.argmax(-1)

    # --- decode ------------------------------------------------------------------------
    def _decode_inputs(self, reqs: list[Request], rows: int, width: int) -> tuple:
        """A decode step's inputs on the host, in DecodeBatch's field order (tokens, positions,
        slots, page table, lengths) for `rows` requests; rows past len(reqs) are padding that
        decodes a dummy token into the scratch page."""
        bm, ps = self.blocks, self.blocks.page_size
        tokens, positions, slots, lens = np.zeros((4, rows), dtype=np.int64)
        table = np.zeros((rows, width), dtype=np.int64)
        for i, r in enumerate(reqs):
            pages = bm.owned[r.rid]
            tokens[i], positions[i], lens[i] = self.last_token[r.rid], r.context, r.context + 1
            slots[i] = bm.slot(r.rid, r.context)
            table[i, :len(pages)] = pages
        n = len(reqs)
        # padding writes its K/V into the scratch page and attends to nothing (length 0:
        # decode attention gives it no work, where a length-1 row would cost a block's start)
        slots[n:], lens[n:], table[n:] = bm.scratch_page * ps, 0, bm.scratch_page
        return tokens, positions, slots, table, lens

    def _decode_batch(self, inputs: tuple, width: int) -> DecodeBatch:
        """Device inputs; the attention's host bound on lengths is what the table holds."""
        tokens, positions, slots, table, lens = self._upload(*inputs)
        return DecodeBatch(tokens, positions, slots, table.to(torch.int32), lens.to(torch.int32),
                           width * self.blocks.page_size)

    def launch_decode(self, reqs: list[Request]):
        side = self.decode_side
        for r in reqs:
            self.blocks.reserve(r.rid, r.context + 1)
        width = max(len(self.blocks.owned[r.rid]) for r in reqs)
        if self.use_graphs and width > self.graphs.width:
            raise PdmuxError(f"a request of {width * self.blocks.page_size} tokens is longer than "
                             f"the {self.graphs.width * self.blocks.page_size} this executor "
                             f"captured its decode graphs for")
        # batch sizes padded to a few captured sizes, as SGLang does
        rows = padded_batch(len(reqs)) if self.use_graphs else len(reqs)
        inputs = self._decode_inputs(reqs, rows, width)
        with _on(side.stream):
            start = self.marks.mark(side.stream)
            if self.use_graphs:
                step = self.graphs.get(side.stream, side.budget, rows, self._static_decode_batch)
                out = step.replay(self._upload(*inputs), len(reqs))  # one upload, device copies
            else:
                out = self.model.decode_step(self._decode_batch(inputs, width),
                                             side.budget).argmax(-1)
            end = self.marks.mark(side.stream)
        self.marks.add(start, end, decode=True)
        return reqs, out, end

    def _static_decode_batch(self, rows: int, width: int) -> DecodeBatch:
        """A captured step's inputs until the first real step fills them: the scratch page."""
        return self._decode_batch(self._decode_inputs([], rows, width), width)

    def wait_decode(self, pending):
        reqs, out, end = pending
        end.synchronize()
        tokens = out.tolist()
        self._remember(reqs, tokens)
        return self.now(), tokens

    # --- before measuring ----------------------------------------------------------------
    def warm_up(self, strategy: str, config: sglang_rules.PDMuxConfig, max_running: int,
                prefill_tokens: int, chunk: int, levels_by: LevelPolicy | None = None,
                levels: list[sglang_rules.Level] | None = None) -> None:
        """Compile every kernel variant and capture every decode graph a run of this strategy
        can launch, on each side it can use (for pd-mux: each of `levels`, the config's on this
        GPU where not given, that `levels_by`, SGLang's rule by default, can pick), so the
        measured run compiles and captures nothing (SGLang captures its graphs at start-up
        too). GPU only: the interpreter compiles nothing."""
        if not self.cuda:
            return
        levels = levels or config.levels(self.total_sms, self.cc_major)
        if strategy == "pdmux":
            prefilling, decoding = (levels_by or SGLangLevels(config)).reachable(len(levels),
                                                                                 max_running)
        else:  # everything on the whole GPU
            prefilling = decoding = {0}
        # (a chunked step holds at most the chunk, its decode rows counted in it)
        rows = chunk if strategy == "chunked" else prefill_tokens
        seqs = max_running + 1
        # the graphs first: a capture empties the allocator's cache (torch.cuda.graph), which
        # would hand back the pool the prefills below grow for the measured run
        for level in sorted(decoding):
            side, _ = self._sides(levels[level])
            for n in reversed(padded_sizes(max_running)):  # largest first: one memory pool
                self.graphs.get(side.stream, side.budget, n, self._static_decode_batch)
        for level in sorted(prefilling):
            _, side = self._sides(levels[level])
            with _on(side.stream):
                compile_prefill_side(self.model, side.budget, rows, seqs, self.blocks.scratch_page)
        self._drain()

    # --- prefill -----------------------------------------------------------------------
    def start(self, warm: list[Request]) -> None:
        """Prefill the requests that are decoding from the start, before the clock starts."""
        self.set_level((self.total_sms, 0))
        for i in range(0, len(warm), 8):  # a few prompts per batch bounds activation memory
            group = warm[i:i + 8]
            carry = self.begin_prefill(group)
            self.launch_prefill(carry, 0, self.num_layers)
            self.prefill_result(carry, wait=True)
            for r in group:
                r.context = r.prompt_len
        self._drain()
        self.marks.clear()
        self.t0 = time.perf_counter()

    def begin_prefill(self, reqs: list[Request]) -> PrefillCarry:
        with _on(self.prefill_side.stream):  # the side's stream must see the uploads in order
            return PrefillCarry(list(reqs), self._extend_batch(
                [(r, r.prompt[r.cached_len:], r.cached_len) for r in reqs]))

    def launch_prefill(self, carry: PrefillCarry, start: int, end: int) -> None:
        side = self.prefill_side
        with _on(side.stream):
            mark = self.marks.mark(side.stream)
            began = time.perf_counter()
            carry.hidden, carry.residual = self.model.extend_layers(
                carry.batch, start, end, carry.hidden, carry.residual, budget=side.budget)
            self._launched(began, end - start)
            if end == self.num_layers:
                carry.first = self._greedy(carry.hidden, carry.residual, carry.batch, side)
                carry.hidden = carry.residual = None  # free the activations
            carry.done = self.marks.mark(side.stream)
        self.marks.add(mark, carry.done)

    def prefill_result(self, carry: PrefillCarry, wait: bool):
        if wait:
            carry.done.synchronize()
        elif not carry.done.query():
            return None
        tokens = carry.first.tolist()
        self._remember(carry.reqs, tokens)
        return self.now(), tokens

    def mixed(self, decoding: list[Request], prompt: Request, start: int, n: int):
        """One chunked-prefill step: decode tokens and the prompt chunk in one forward."""
        seqs = [(r, [self.last_token[r.rid]], r.context) for r in decoding]
        seqs.append((prompt, prompt.prompt[start:start + n], start))
        side = self.decode_side
        with _on(side.stream):  # uploads too: the side's stream must see them in order
            mark = self.marks.mark(side.stream)
            batch = self._extend_batch(seqs, decode_rows=len(decoding))
            began = time.perf_counter()
            h, r = self.model.extend_layers(batch, 0, self.num_layers, budget=side.budget)
            self._launched(began, self.num_layers)
            out = self._greedy(h, r, batch, side)
            end = self.marks.mark(side.stream)
        self.marks.add(mark, end)
        end.synchronize()  # the host copy below runs on another stream
        out = out.tolist()
        tokens = out[:len(decoding)]
        self._remember(decoding, tokens)
        first = None
        if start + n == prompt.prompt_len:
            first = out[-1]
            self._remember([prompt], [first])
        return self.now(), tokens, first

    def _launched(self, began: float, layers: int) -> None:
        """The host's time of an eager launch of `layers` layers that began at `began`."""
        first = self.model.first_launched_at
        self.marks.launched_layers(first - began, time.perf_counter() - first, layers,
                                   began - self.t0)

    def release(self, r: Request) -> None:
        self.blocks.release(r.rid)
        self.last_token.pop(r.rid, None)

    def keep_prefix(self, r: Request, start: int, end: int) -> list[int]:
        return self.blocks.keep(r.rid, start, end)

    def drop_prefix(self, pages: list[int]) -> None:
        self.blocks.drop(pages)

    def finish(self) -> Activity:
        self._drain()
        return self.marks.activity()
