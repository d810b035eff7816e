"""The real executor: the scheduler's work on the model, on the partition's streams.

Decode steps are CUDA graphs, one per (level, batch size, context bucket), captured on that
level's decode stream as SGLang does, and fed through static input buffers. Prefill layers run
eagerly on the prefill stream, carrying hidden states between rounds. Times are host times
(when a token is visible to the server); GPU busy intervals are recorded with CUDA events to
measure how long the GPU sat idle between rounds.

Without CUDA (the Triton interpreter, CPU tests) the same code runs in order on one "stream"
with host timers and no graphs: slow, but it serves the same tokens.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np
import torch

from pdmux_triton.errors import PdmuxError
from pdmux_triton.metrics import uncovered
from pdmux_triton.hardware import GPUSpec, ModelSpec
from pdmux_triton.model import Budget, DecodeBatch, ExtendBatch, KVCache, Model, Weights
from pdmux_triton.traffic import Request


class BlockManager:
    """Pages of the KV cache: a free list, and each request's pages in order.

    The last page is never handed out: it is the scratch page that padded rows of a captured
    decode batch point at, so warm-up and padding writes never touch a request's tokens.
    """

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 2:
            raise PdmuxError(f"a KV cache needs at least 2 pages (one is scratch), got {num_pages}")
        self.page_size = page_size
        self.scratch_page = num_pages - 1
        self.free_pages = list(range(num_pages - 2, -1, -1))
        self.owned: dict[int, list[int]] = {}

    def reserve(self, rid: int, tokens: int) -> list[int]:
        pages = self.owned.setdefault(rid, [])
        need = -(-tokens // self.page_size) - len(pages)
        if need > len(self.free_pages):
            raise PdmuxError(f"the KV cache is full: request {rid} needs {need} more pages of "
                             f"{self.page_size} tokens, {len(self.free_pages)} are free")
        for _ in range(max(0, need)):
            pages.append(self.free_pages.pop())
        return pages

    def slot(self, rid: int, pos: int) -> int:
        """The cache slot of one position (a decode step's new token: no array needed)."""
        return self.owned[rid][pos // self.page_size] * self.page_size + pos % self.page_size

    def slots(self, rid: int, start: int, end: int) -> np.ndarray:
        """Cache slots of the request's positions [start, end), as slot() maps each."""
        pos, ps = np.arange(start, end), self.page_size
        return np.asarray(self.owned[rid], dtype=np.int64)[pos // ps] * ps + pos % ps

    def release(self, rid: int) -> None:
        self.free_pages.extend(reversed(self.owned.pop(rid, [])))


class _HostMark:
    """A CPU stand-in for a CUDA event."""

    def __init__(self):
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


@dataclass
class _Side:
    stream: object  # torch.cuda.Stream or None on the CPU
    budget: Budget


def _padded_batch(n: int) -> int:
    """The captured batch size serving n requests: 1, 2, 4, 8, then multiples of 8."""
    return 1 << (n - 1).bit_length() if n <= 8 else -(-n // 8) * 8


def _on(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


@dataclass
class Runtime:
    """What outlives one run: the model, the open partitions, the captured decode graphs.

    SGLang creates its stream groups and captures its graphs once at start-up; keeping them
    here lets a warm-up run pay for capture so the measured run does not.
    """

    model: Model
    partitions: dict
    graphs: dict

    def close(self) -> None:
        self.graphs.clear()
        for part in self.partitions.values():
            part.close()
        self.partitions.clear()


class ModelExecutor:
    """Runs decode steps and prefills of a Model for the scheduler."""

    _shared: dict[tuple, Runtime] = {}

    @classmethod
    def shared(cls, spec: ModelSpec, gpu: GPUSpec, kind: str, page_size: int = 16,
               cache_tokens: int = 262_144, seed: int = 0) -> "ModelExecutor":
        """An executor over one model kept across runs (weights are drawn once per process)."""
        key = (spec.name, page_size, cache_tokens, seed)
        if key not in cls._shared:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            # the interpreter's tl.dot is wrong on bf16 (design.md): fp32 on the CPU
            dtype = torch.bfloat16 if device == "cuda" else torch.float32
            pages = -(-cache_tokens // page_size)
            cls._shared[key] = Runtime(Model(Weights(spec, device, dtype, seed=seed),
                                             KVCache(spec, pages, page_size, device, dtype)), {}, {})
        return cls(cls._shared[key], gpu, kind)

    @classmethod
    def release_shared(cls) -> None:
        for runtime in cls._shared.values():
            runtime.close()
        cls._shared.clear()

    def __init__(self, runtime: Runtime, gpu: GPUSpec, kind: str = "grid_cap",
                 use_graphs: bool | None = None):
        model = runtime.model
        self.model = model
        self.spec = model.spec
        self.total_sms, self.cc_major, self.num_layers = gpu.sms, gpu.cc_major, len(model.w.layers)
        self.kind = kind
        self.device = model.w.embed.device
        self.cuda = self.device.type == "cuda"
        self.use_graphs = self.cuda if use_graphs is None else use_graphs
        self.blocks = BlockManager(model.cache.num_pages, model.cache.page_size)
        self.last_token: dict[int, int] = {}
        self.partitions = runtime.partitions
        self.graphs = runtime.graphs
        self.marks: list[tuple[object, object]] = []  # (start, end) of every GPU launch
        self.decode_marks: list[tuple[object, object]] = []  # those of decode steps
        whole = self._side_pair(self.total_sms, 0)
        self.decode_side, self.prefill_side = whole
        self.t0 = time.perf_counter()

    # --- partitions --------------------------------------------------------------------
    def _side_pair(self, prefill_sms: int, decode_sms: int) -> tuple[_Side, _Side]:
        if not self.cuda:
            return _Side(None, Budget()), _Side(None, Budget())
        from pdmux_triton.partition import PartitionSpec, whole

        whole_gpu = 0 in (prefill_sms, decode_sms)
        key = ("whole",) if whole_gpu else (self.kind, prefill_sms, decode_sms)
        if key not in self.partitions:
            spec = (whole(self.total_sms) if whole_gpu else
                    PartitionSpec(self.kind, prefill_sms, decode_sms, self.total_sms))
            self.partitions[key] = spec.open()
        part = self.partitions[key]
        return (_Side(part.decode_stream, Budget(part.decode_sms)),
                _Side(part.prefill_stream, Budget(part.prefill_sms)))

    def set_level(self, prefill_sms: int, decode_sms: int) -> None:
        self._drain()
        self.decode_side, self.prefill_side = self._side_pair(prefill_sms, decode_sms)

    def _drain(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    # --- time --------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _mark(self, stream):
        if not self.cuda:
            return _HostMark()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    def idle_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    def idle_s(self) -> float:
        """GPU time with no kernel queued on any side, from the launch marks."""
        if not self.marks:
            return 0.0
        if self.cuda:
            base = self.marks[0][0]
            spans = [(base.elapsed_time(a) / 1e3, base.elapsed_time(b) / 1e3) for a, b in self.marks]
        else:
            spans = [(a.t, b.t) for a, b in self.marks]
        return uncovered(spans, min(a for a, _ in spans), max(b for _, b in spans))

    def decode_gpu_s(self) -> list[float]:
        """Each decode step's GPU time, launch to end, from its marks."""
        if self.cuda:
            return [a.elapsed_time(b) / 1e3 for a, b in self.decode_marks]
        return [b.t - a.t for a, b in self.decode_marks]

    def _remember(self, reqs: list[Request], tokens: list[int]) -> None:
        """The token each request feeds into its next decode step."""
        for r, tok in zip(reqs, tokens):
            self.last_token[r.rid] = tok

    # --- batches -----------------------------------------------------------------------
    def _upload(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """Host int64 arrays to the device on the current stream in one copy, as device views
        of the same shapes, without making the host wait for the stream (a pageable copy
        would): pinned memory and an async copy."""
        host = torch.from_numpy(np.concatenate([a.ravel() for a in arrays]))
        flat = host.pin_memory().to(self.device, non_blocking=True) if self.cuda else host
        views, at = [], 0
        for a in arrays:
            views.append(flat[at:at + a.size].view(a.shape))
            at += a.size
        return views

    def _extend_batch(self, seqs: list[tuple[Request, list[int], int]]) -> ExtendBatch:
        """seqs: (request, new token ids, position of the first) for each sequence."""
        bm = self.blocks
        for r, ids, start in seqs:
            bm.reserve(r.rid, start + len(ids))
        width = max(len(bm.owned[r.rid]) for r, _, _ in seqs)
        table = np.zeros((len(seqs), width), dtype=np.int64)
        for i, (r, _, _) in enumerate(seqs):
            table[i, :len(bm.owned[r.rid])] = bm.owned[r.rid]
        positions = np.concatenate([np.arange(start, start + len(ids)) for _, ids, start in seqs])
        slots = np.concatenate([bm.slots(r.rid, start, start + len(ids)) for r, ids, start in seqs])
        tokens = np.fromiter((t for _, ids, _ in seqs for t in ids), dtype=np.int64)
        tokens, positions, slots, table = self._upload(tokens, positions, slots, table)
        return ExtendBatch(tokens, positions, slots, table.to(torch.int32),
                           [len(ids) for _, ids, _ in seqs], [start for _, _, start in seqs])

    def _last_rows(self, batch: ExtendBatch) -> torch.Tensor:
        return self._upload(np.cumsum(batch.extend_lens) - 1)[0]

    def _greedy(self, hidden, residual, rows, side: _Side) -> torch.Tensor:
        logits = self.model.logits(hidden[rows], residual[rows], side.budget)
        return logits.argmax(-1)

    def _extend_tokens(self, seqs, side: _Side) -> list[int]:
        """All layers of `seqs` on one side; returns their next-token ids on the host."""
        with _on(side.stream):  # uploads too: the side's stream must see them in order
            start = self._mark(side.stream)
            batch = self._extend_batch(seqs)
            h, r = self.model.extend_layers(batch, 0, self.num_layers, budget=side.budget)
            out = self._greedy(h, r, self._last_rows(batch), side)
            end = self._mark(side.stream)
        self.marks.append((start, end))
        end.synchronize()  # the host copy below runs on another stream
        return out.tolist()

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

    def _decode_graph(self, B: int, width: int, bucket: int, side: _Side):
        """Static buffers and the captured step for this batch size and context bucket."""
        key = (id(side.stream), side.budget, B, width, bucket)
        if key not in self.graphs:
            # until the first real step fills them, the inputs point at the scratch page
            batch = self._decode_batch(self._decode_inputs([], B, width), bucket)
            graph = torch.cuda.CUDAGraph()
            with _on(side.stream):
                self.model.decode_step(batch, side.budget).argmax(-1)  # compile and warm up
                side.stream.synchronize()
                with torch.cuda.graph(graph, stream=side.stream):
                    out = self.model.decode_step(batch, side.budget).argmax(-1)
            self.graphs[key] = (batch, graph, out)
        return self.graphs[key]

    def _decode_batch(self, inputs: tuple, bucket: int) -> DecodeBatch:
        tokens, positions, slots, table, lens = self._upload(*inputs)
        return DecodeBatch(tokens, positions, slots, table.to(torch.int32), lens.to(torch.int32),
                           bucket)

    def launch_decode(self, reqs: list[Request], side: _Side | None = None):
        side = side or self.decode_side
        for r in reqs:
            self.blocks.reserve(r.rid, r.context + 1)
        # graphs are keyed on a power-of-two context bound, so a few cover a whole run
        bucket = 1 << max(r.context for r in reqs).bit_length()
        width = max(-(-bucket // self.blocks.page_size),
                    max(len(self.blocks.owned[r.rid]) for r in reqs))
        # batch sizes padded to a few captured sizes, as SGLang does
        rows = _padded_batch(len(reqs)) if self.use_graphs else len(reqs)
        inputs = self._decode_inputs(reqs, rows, width)
        with _on(side.stream):
            start = self._mark(side.stream)
            if self.use_graphs:
                batch, graph, out = self._decode_graph(rows, width, bucket, side)
                # one upload, then device copies into the static buffers
                static = (batch.tokens, batch.positions, batch.slots, batch.page_table,
                          batch.seq_lens)
                for dst, val in zip(static, self._upload(*inputs)):
                    dst.copy_(val)
                graph.replay()
                out = out[:len(reqs)].clone()  # the next replay overwrites the static output
            else:
                out = self.model.decode_step(self._decode_batch(inputs, bucket),
                                             side.budget).argmax(-1)
            end = self._mark(side.stream)
        self.marks.append((start, end))
        self.decode_marks.append((start, end))
        return reqs, out, end

    def wait_decode(self, pending):
        reqs, out, end = pending
        end.synchronize()
        tokens = out.tolist()
        self._remember(reqs, tokens)
        return self.now(), tokens

    def decode(self, reqs: list[Request]):
        return self.wait_decode(self.launch_decode(reqs, self.decode_side))

    # --- prefill -----------------------------------------------------------------------
    def start(self, warm: list[Request]) -> None:
        """Prefill the requests that are decoding from the start, before the clock starts."""
        self.set_level(self.total_sms, 0)
        for i in range(0, len(warm), 8):  # a few prompts per batch bounds activation memory
            group = warm[i:i + 8]
            self._remember(group, self._extend_tokens([(r, r.prompt, 0) for r in group],
                                                      self.prefill_side))
            for r in group:
                r.context = len(r.prompt)
        self._drain()
        self.marks.clear()
        self.decode_marks.clear()
        self.t0 = time.perf_counter()

    def prefill(self, reqs: list[Request]):
        tokens = self._extend_tokens([(r, r.prompt, 0) for r in reqs], self.prefill_side)
        self._remember(reqs, tokens)
        return self.now(), tokens

    def launch_prefill(self, job, start: int, end: int) -> None:
        side = self.prefill_side
        with _on(side.stream):
            mark = self._mark(side.stream)
            if start == 0:
                job.state = {"batch": self._extend_batch([(r, r.prompt, 0) for r in job.reqs]),
                             "h": None, "r": None}
            st = job.state
            st["h"], st["r"] = self.model.extend_layers(st["batch"], start, end, st["h"], st["r"],
                                                        budget=side.budget)
            if end == self.num_layers:
                st["first"] = self._greedy(st["h"], st["r"], self._last_rows(st["batch"]), side)
                st["h"] = st["r"] = None  # free the activations
            st["done"] = self._mark(side.stream)
            self.marks.append((mark, st["done"]))

    def _finish_prefill(self, job):
        tokens = job.state["first"].tolist()
        self._remember(job.reqs, tokens)
        return self.now(), tokens

    def prefill_done(self, job):
        return self._finish_prefill(job) if job.state["done"].query() else None

    def wait_prefill(self, job):
        job.state["done"].synchronize()
        return self._finish_prefill(job)

    def mixed(self, decoding: list[Request], job: Request, start: int, n: int):
        """One chunked-prefill step: decode tokens and the prompt chunk in one forward."""
        seqs = [(r, [self.last_token[r.rid]], r.context) for r in decoding]
        seqs.append((job, job.prompt[start:start + n], start))
        out = self._extend_tokens(seqs, self.decode_side)
        tokens = out[:len(decoding)]
        self._remember(decoding, tokens)
        first = None
        if start + n == len(job.prompt):
            first = out[-1]
            self._remember([job], [first])
        return self.now(), tokens, first

    def release(self, r: Request) -> None:
        self.blocks.release(r.rid)
        self.last_token.pop(r.rid, None)

    def finish(self) -> None:
        self._drain()

