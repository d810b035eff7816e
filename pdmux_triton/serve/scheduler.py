"""One event loop, three strategies, on any executor (the GPU or a simulated clock).

- `prefill_first`: a new prompt's whole prefill runs on the whole GPU; decode waits.
- `chunked`: every step runs one chunk of the prompt together with the decode batch, the chunk
  counting the batch's rows as SGLang's mixed chunk does.
- `pdmux`: SGLang's PD-multiplexing loop: each round one decode step on the decode side and
  the next `prefill_layers_per_step` layers of the prompt on the prefill side; the host waits
  only for decode; a finished prefill joins the decode batch; the level (SM split) changes
  when a prefill starts or ends, after both sides drain (and, for a `level_policy` that asks,
  between layers of a split prefill when the decode batch changed).

The executor owns time and the model (`executor.Executor` is the whole contract); this module
owns requests, levels and the timeline.
"""

from __future__ import annotations

import math
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.level_policy import LevelPolicy, SGLangLevels
from pdmux_triton.serve.executor import CHUNKED_STEPS, Executor, Rounds, RunResult
from pdmux_triton.serve.prefix_cache import BLOCK_TOKENS, PrefixCache
from pdmux_triton.spec.traffic import Request

LOOPS = ("prefill_first", "chunked", "pdmux")


@dataclass
class PrefillJob:
    reqs: list[Request]
    carry: object  # what the executor's begin_prefill returned
    next_layer: int = 0

    @property
    def tokens(self) -> int:
        """Tokens its prefill computes (SGLang's extend tokens: a cached prefix is read)."""
        return sum(r.prompt_len - r.cached_len for r in self.reqs)


PROGRESS_EVERY_S = 5.0  # wall time between two progress lines


class Progress:
    """A line now and then (every PROGRESS_EVERY_S of wall time) on how far a run is: requests
    served of all, wall time, the executor's clock and the rate served."""

    def __init__(self, say: Callable[[str], None], label: str, total: int):
        self.say, self.label, self.total = say, label, total
        self.every_s = PROGRESS_EVERY_S
        self.started = time.monotonic()
        self.next = self.started + self.every_s

    def tick(self, served: int, clock_s: float) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + self.every_s
        wall = now - self.started
        self.say(f"{self.label}: {served:,}/{self.total:,} requests served, {wall:,.0f} s wall, "
                 f"clock at {clock_s:,.1f} s, {served / wall:,.1f} requests/s")


class Engine:
    """Request bookkeeping shared by the strategies.

    Admission keeps the KV cache from overflowing: a prompt is taken only when the cache has
    room for its prompt and its whole output (reserved up front, so an admitted request is
    never evicted; SGLang reserves less and retracts instead) and the running batch stays
    within `max_running` requests. With a `prefix_cache`, a prompt's cached blocks are read,
    not reserved again, and blocks no request uses are evicted to make room. Requests to come
    wait in arrival order (those arriving after a number of decode steps apart, by that
    number), so admitting one costs O(1)."""

    def __init__(self, executor: Executor, requests: list[Request], max_running: int,
                 progress: Progress | None = None, prefix_cache: PrefixCache | None = None):
        self.x = executor
        self.cache = prefix_cache
        fresh = [r for r in requests if not r.warm]
        self.arrivals = deque(sorted((r for r in fresh if r.arrival is not None),
                                     key=lambda r: (r.arrival, r.rid)))
        self.after_steps = deque(sorted((r for r in fresh if r.arrival is None), key=lambda r: (
            math.inf if r.after_steps is None else r.after_steps, r.rid)))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = [r for r in requests if r.warm]
        self.step_ends = array("d")  # every decode step's end: requests' token times point into it
        for r in self.running:
            r.step_ends, r.step0 = self.step_ends, 0
        self.rounds = Rounds()
        self.progress = progress
        self.served = 0
        self.max_running = max_running
        capacity = executor.kv_capacity_tokens
        self.page = executor.kv_page_tokens
        for r in requests:  # served afresh: nothing read from a cache before this run
            r.cached_len, r.prefix = 0, ()
        # KV tokens each admitted request holds as its own, in whole pages (the cache holds
        # the rest)
        self.own = {r.rid: kv_need(r, self.page) for r in self.running}
        self.kv_free = capacity - sum(self.own.values())
        if self.kv_free < 0 or len(self.running) > max_running:
            raise PdmuxError(f"{len(self.running)} requests decoding from the start need "
                             f"{sum(self.own.values()):,} tokens of KV cache and as "
                             f"many batch slots; the executor holds {capacity:,} tokens and "
                             f"runs at most {max_running} requests")
        for r in requests:
            if kv_need(r, self.page) > capacity:
                raise PdmuxError(f"request {r.rid} needs {kv_need(r, self.page):,} tokens of KV "
                                 f"cache; the executor holds {capacity:,}")

    def busy(self, in_flight: object = None) -> bool:
        """Work is left: requests to come, waiting or decoding, or a prefill in flight."""
        return bool(self.arrivals or self.after_steps or self.waiting or self.running
                    or in_flight is not None)

    def admit(self) -> None:
        """Requests that arrived join the waiting queue: by arrival, then those whose decode
        steps have passed (by id)."""
        now = self.x.now()
        while self.arrivals and self.arrivals[0].arrival <= now:
            self.waiting.append(self.arrivals.popleft())
        due = []
        while (self.after_steps and self.after_steps[0].after_steps is not None
               and self.after_steps[0].after_steps <= len(self.step_ends)):
            r = self.after_steps.popleft()
            r.arrival = now
            due.append(r)
        self.waiting.extend(sorted(due, key=lambda r: r.rid))

    def take_prompts(self, token_budget: int, limit: int | None = None) -> list[Request]:
        """The oldest waiting prompts within the prefill token budget (the oldest always) for
        which the KV cache and the running batch have room; [] while the oldest must wait."""
        batch: list[Request] = []
        tokens = 0
        while self.waiting and (limit is None or len(batch) < limit):
            r = self.waiting[0]
            hit = self.cache.match(r) if self.cache else []
            cached = len(hit) * self.cache.block if hit else 0
            need, new = kv_need(r, self.page) - cached, r.prompt_len - cached
            if (len(self.running) + len(batch) >= self.max_running
                    or (batch and tokens + new > token_budget) or not self._room(need, hit)):
                break
            self.waiting.popleft()
            if self.cache:
                self.cache.admit(r, hit)
                if need > self.kv_free:
                    self.kv_free += self.cache.evict(need - self.kv_free, self.x.drop_prefix)
            self.own[r.rid] = need
            self.kv_free -= need
            tokens += new
            batch.append(r)
        return batch

    def _room(self, need: int, hit: list) -> bool:
        """The KV cache has room for `need` more tokens, evicting cached blocks no request
        uses if it must (not those of `hit`, which the request will read)."""
        if need <= self.kv_free:
            return True
        if not self.cache:
            return False
        keeps = self.cache.block * sum(node.refs == 0 for node in hit)
        return need <= self.kv_free + self.cache.evictable_tokens() - keeps

    def next_arrival(self) -> float | None:
        return self.arrivals[0].arrival if self.arrivals else None

    def idle(self) -> None:
        """Nothing to run: jump to the next arrival (a step-triggered one cannot come)."""
        t = self.next_arrival()
        if t is None:
            raise PdmuxError("requests wait on decode steps but nothing is decoding")
        self.x.idle_until(t)

    def finished(self, r: Request) -> None:
        self.kv_free += self.own.pop(r.rid)
        if self.cache:
            self.cache.finish(r)
        self.x.release(r)
        self.served += 1

    def add_round(self, start: float, end: float, level: int, decode_bs: int, prefill: str,
                  decode_context: int = 0) -> None:
        """A round ended, its tokens recorded."""
        self.rounds.add(start, end, level, decode_bs, prefill, decode_context)
        if self.progress is not None:
            self.progress.tick(self.served, end)

    def record_tokens(self, reqs: list[Request], tokens: list[int] | None, t: float) -> None:
        """A decode step of the running batch `reqs` (all of it: each running request's token
        times are the log's steps from when it joined) ended at `t`."""
        self.step_ends.append(t)
        if tokens is not None:
            for r, tok in zip(reqs, tokens):
                if r.tokens is None:
                    r.tokens = [tok]
                else:
                    r.tokens.append(tok)
        done = []
        for r in reqs:
            r.generated += 1
            r.context += 1
            if r.generated >= r.output_len:
                done.append(r)
        if done:
            self.running = [r for r in self.running if not r.done]
            for r in done:
                self.finished(r)

    def decode_round(self) -> None:
        """A plain decode step of the running batch on the whole GPU, as one round."""
        start, decoding = self.x.now(), list(self.running)
        held = context_of(decoding)
        t, tokens = self.x.wait_decode(self.x.launch_decode(decoding))
        self.record_tokens(decoding, tokens, t)
        self.add_round(start, t, -1, len(decoding), "", held)

    def start_running(self, reqs: list[Request], first_tokens: list[int] | None,
                      t: float) -> None:
        """Prefilled at `t`: each request's first token is out, and it decodes from the next
        step on."""
        for i, r in enumerate(reqs):
            r.prefill_end = r.first_token_s = t
            r.context = r.prompt_len
            if self.cache:  # its whole blocks' KV now serves later prompts too
                self.own[r.rid] -= self.cache.insert(
                    r, lambda start, end, r=r: self.x.keep_prefix(r, start, end))
            r.generated = 1
            r.tokens = None if first_tokens is None else [first_tokens[i]]
            r.step_ends, r.step0 = self.step_ends, len(self.step_ends)
            if r.done:
                self.finished(r)
            else:
                self.running.append(r)


def context_of(reqs: list[Request]) -> int:
    return sum(r.context for r in reqs)


def kv_need(r: Request, page: int = 1) -> int:
    """KV cache tokens a request holds at its end: its prompt and every output token, in
    whole pages of `page` tokens."""
    return -(-(r.prompt_len + r.output_len) // page) * page


def run_prefill_first(e: Engine, token_budget: int) -> None:
    while e.busy():
        e.admit()
        batch = e.take_prompts(token_budget)
        if batch:
            start = e.x.now()
            for r in batch:
                r.prefill_start = start
            carry = e.x.begin_prefill(batch)
            e.x.launch_prefill(carry, 0, e.x.num_layers)
            t, first = e.x.prefill_result(carry, wait=True)
            e.start_running(batch, first, t)
            e.add_round(start, t, -1, 0, "whole")
        elif e.running:
            e.decode_round()
        else:
            e.idle()


def fewest_chunk_tokens(chunk: int, most_rows: int) -> int:
    """The fewest prompt tokens a step of `run_chunked` carries beside at most `most_rows`
    decode rows: a prompt starts only while they leave room in the chunk, and they only shrink
    while it is in flight."""
    return chunk - min(most_rows, chunk - 1)


def check_chunks_beside(chunks: tuple[int, ...], decode_rows: int) -> None:
    """Refuses chunks a fixed batch of `decode_rows` would fill: `run_chunked` holds a prompt
    back until rows finish, so no step would carry it."""
    if (short := [c for c in chunks if c <= decode_rows]):
        raise PdmuxError(f"chunk sizes {', '.join(map(str, short))} hold no prompt tokens "
                         f"beside {decode_rows} decode rows (a chunk counts them, as SGLang's "
                         f"mixed chunk does): choose chunks above the decode batch")


def run_chunked(e: Engine, chunk: int) -> None:
    """One prompt at a time, a chunk of it each step beside the whole decode batch. The chunk
    counts the batch's rows, as SGLang's mixed chunk does (its prefill budget less the running
    batch): a step holds at most `chunk` tokens, and while the rows take it all no new prompt
    starts (the batch only shrinks then). A replay of a run saved before takes the whole chunk
    beside the rows (`Executor.chunked_steps`)."""
    job: Request | None = None
    done_tokens = 0
    rows_in_chunk = e.x.chunked_steps >= CHUNKED_STEPS  # the executor's: fixed for the run
    while e.busy(job):
        e.admit()
        budget = chunk - len(e.running) if rows_in_chunk else chunk
        if job is None and budget > 0:
            taken = e.take_prompts(chunk, limit=1)
            if taken:  # its chunks begin after its cached prefix
                job, done_tokens = taken[0], taken[0].cached_len
                job.prefill_start = e.x.now()
        if job is None:  # no prompt in flight: a plain decode step, as SGLang runs it
            if e.running:
                e.decode_round()
            else:
                e.idle()
            continue
        start = e.x.now()
        decoding = list(e.running)
        # (a job in flight always moves: its rows only shrank since it started)
        n = min(max(budget, 1), job.prompt_len - done_tokens)
        held = context_of(decoding)
        t, tokens, first = e.x.mixed(decoding, job, done_tokens, n)
        if decoding:
            e.record_tokens(decoding, tokens, t)
        label = f"chunk {done_tokens}+{n}"
        done_tokens += n
        if done_tokens == job.prompt_len:
            e.start_running([job], None if first is None else [first], t)
            job = None
        e.add_round(start, t, -1, len(decoding), label, held)


def run_pdmux(e: Engine, levels: list[sglang_rules.Level], config: sglang_rules.PDMuxConfig,
              num_layers: int, token_budget: int, picker: LevelPolicy) -> None:
    job: PrefillJob | None = None

    def contexts() -> list[int]:
        return [r.context for r in e.running]
    level = picker.choose(levels, contexts(), False, None)
    e.x.set_level(levels[level])
    adjust = False
    chosen_for: tuple[int, ...] = ()  # the decode batch the level was last chosen for
    while e.busy(job):
        e.admit()
        adjust = adjust or (level > 0 and not e.running)  # as SGLang: an empty batch re-levels
        starting = e.take_prompts(token_budget) if job is None else []
        if starting:
            taken = e.x.now()  # once: a batch's prompts share one prefill window
            for r in starting:
                r.prefill_start = taken
            adjust = True
        # the decode batch, where a change of it can re-level (read only then)
        batch = tuple(r.rid for r in e.running) if picker.relevel_at_layers else ()
        if adjust:  # SGLang drains both streams before switching the stream group
            level = picker.choose(levels, contexts(), job is not None or bool(starting), level)
            e.x.set_level(levels[level])
            adjust, chosen_for = False, batch
        elif picker.relevel_at_layers and job is not None and batch != chosen_for:
            # between two layers of a split prefill: drain and switch only if the level moves
            new = picker.choose(levels, contexts(), True, level)
            if new != level:
                level = new
                e.x.set_level(levels[level])
            chosen_for = batch
        if starting:  # on the new level's prefill side
            job = PrefillJob(starting, e.x.begin_prefill(starting))
        if job is None and not e.running:
            e.idle()
            continue
        start = e.x.now()
        decoding = list(e.running)
        held = context_of(decoding)
        pending = e.x.launch_decode(decoding) if decoding else None
        launched = ""
        if job is not None and job.next_layer < num_layers:
            per_step = sglang_rules.prefill_layers_per_step(job.tokens, num_layers,
                                                            config.split_forward_token_budget)
            end = min(num_layers, job.next_layer + per_step)
            e.x.launch_prefill(job.carry, job.next_layer, end)
            launched = f"layers {job.next_layer}-{end}"
            job.next_layer = end
        if pending is not None:
            t, tokens = e.x.wait_decode(pending)
            e.record_tokens(decoding, tokens, t)
        if job is not None and job.next_layer == num_layers:
            # with no decode to wait for, the host blocks on the prefill itself
            done = e.x.prefill_result(job.carry, wait=not decoding)
            if done is not None:
                t_done, first = done
                e.start_running(job.reqs, first, t_done)
                job = None
                adjust = True
        e.add_round(start, e.x.now(), level, len(decoding), launched, held)


DEFAULT_PREFILL_TOKENS = 16384  # SGLang's --max-prefill-tokens: one prefill batch's budget
DEFAULT_MAX_RUNNING = 128  # requests in the running batch at most (--max-running-requests)


def run(loop: str, executor: Executor, requests: list[Request], *, chunk: int = 2048,
        config: sglang_rules.PDMuxConfig | None = None,
        levels: list[sglang_rules.Level] | None = None,
        prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
        max_running: int = DEFAULT_MAX_RUNNING,
        levels_by: LevelPolicy | None = None,
        progress: Callable[[str], None] | None = None,
        prefix_block: int | None = BLOCK_TOKENS) -> RunResult:
    """Serve `requests` to completion with one of the LOOPS; the executor's clock starts at 0.

    A prefill batch takes waiting prompts up to `prefill_tokens` tokens (the oldest always);
    PD-mux runs it layer by layer, as many layers a round as the config's
    split_forward_token_budget allows, at the levels `levels_by` picks (SGLang's rule
    under the config by default) among `levels` (a run's settings make them once; the
    config's on the executor's GPU where none are given). `progress`, if given, is handed a
    line on how far the run is every PROGRESS_EVERY_S of wall time. A prefix cache of
    `prefix_block`-token blocks serves prompts' shared prefixes (`prefix_cache`; None: off)."""
    if loop not in LOOPS:
        raise PdmuxError(f"unknown loop {loop!r}; known: {', '.join(LOOPS)}")
    for name, value in (("chunk", chunk if loop == "chunked" else 1),
                        ("prefill tokens", prefill_tokens), ("max running", max_running)):
        if value < 1:
            raise PdmuxError(f"{name} must be >= 1, got {value}")
    config = config or sglang_rules.PDMuxConfig()
    cache = None if prefix_block is None else PrefixCache(prefix_block)
    e = Engine(executor, requests, max_running,
               Progress(progress, loop, len(requests)) if progress else None, cache)
    executor.start([r for r in requests if r.warm])
    if loop == "prefill_first":
        run_prefill_first(e, prefill_tokens)
    elif loop == "chunked":
        run_chunked(e, chunk)
    else:
        levels = levels or config.levels(executor.total_sms, executor.cc_major)
        run_pdmux(e, levels, config, executor.num_layers, prefill_tokens,
                  levels_by or SGLangLevels(config))
    if cache is not None:
        cache.clear(executor.drop_prefix)
    activity = executor.finish()
    return RunResult(loop, requests, e.rounds, executor.now(), activity,
                     prefix_cache=None if cache is None else cache.stats(),
                     chunked_steps=executor.chunked_steps)
