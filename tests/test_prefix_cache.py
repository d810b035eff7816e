"""The prefix cache on synthetic sequences: which blocks hit, who pins them, what is evicted
and in which order; and the same cache serving a run on the simulated clock."""

import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.serve import scheduler
from pdmux_triton.serve.prefix_cache import PrefixCache
from pdmux_triton.spec.traffic import Request, TokenIds

IDS = TokenIds(1000, seed=0)


def ask(rid, tokens):
    return Request(rid, list(tokens), 2, 0.0)


class Pages:
    """An executor's side of the cache: a handle per kept block, and what was dropped."""

    def __init__(self):
        self.kept, self.dropped = [], []

    def keep(self, r):
        def keep(start, end):
            self.kept.append((r.rid, start, end))
            return (r.rid, start)
        return keep


def serve(cache, pages, r):
    """Admit `r` reading what the cache holds, prefill it, and return the blocks it read."""
    hit = cache.match(r)
    cache.admit(r, hit)
    cache.insert(r, pages.keep(r))
    return hit


def test_blocks_hit_only_as_a_prefix_and_short_of_the_last_token():
    cache, pages = PrefixCache(4), Pages()
    a = ask(0, range(10))  # two whole blocks [0-3] [4-7], two tokens over
    assert serve(cache, pages, a) == [] and pages.kept == [(0, 0, 4), (0, 4, 8)]
    b = ask(1, [*range(8), 50, 51, 52])
    assert len(serve(cache, pages, b)) == 2 and (b.cached_len, b.prefix) == (8, ((0, 0), (0, 4)))
    c = ask(2, [99, *range(1, 12)])  # same tokens, shifted: not a prefix
    assert serve(cache, pages, c) == [] and c.cached_len == 0
    d = ask(3, range(8))  # the whole prompt is cached: its last block is computed again
    assert len(cache.match(d)) == 1
    assert cache.blocks == 2 + 3  # a's two and c's three (b's third is not whole)
    with pytest.raises(PdmuxError, match="must divide a trace's 512-token hash-id block"):
        PrefixCache(3)


def test_pins_last_from_admission_to_the_end_and_only_unpinned_leaves_go():
    cache, pages = PrefixCache(4), Pages()
    a, b = ask(0, range(13)), ask(1, [*range(4), 70, 71, 72, 73, 74])
    serve(cache, pages, a)  # blocks a0 a1 a2
    serve(cache, pages, b)  # reads a0, adds b1
    assert [n.refs for n in cache.pins[0]] == [2, 1, 1] and cache.evictable_tokens() == 0
    assert cache.evict(100, pages.dropped.append) == 0  # all pinned: nothing goes
    cache.finish(a)
    assert cache.evictable_tokens() == 8  # a1 and a2: a0 is still b's
    assert cache.evict(100, pages.dropped.append) == 8
    assert pages.dropped == [(0, 8), (0, 4)]  # the deeper block first, then its parent
    cache.finish(b)
    assert cache.evict(4, pages.dropped.append) == 4 and pages.dropped[-1] == (1, 4)
    assert cache.blocks == 1 and cache.evicted_blocks == 3


def test_the_least_recently_used_leaf_goes_first():
    cache, pages = PrefixCache(4), Pages()
    reqs = [ask(i, [i] * 4 + [9]) for i in range(3)]
    for r in reqs:
        serve(cache, pages, r)
        cache.finish(r)
    again = ask(3, [0] * 4 + [8])  # reads block 0 again: now the most recent
    serve(cache, pages, again)
    cache.finish(again)
    cache.evict(8, pages.dropped.append)
    assert pages.dropped == [(1, 0), (2, 0)]
    assert cache.stats() == {"block_tokens": 4, "prompt_tokens": 20, "cached_tokens": 4,
                             "hit_rate": 0.2, "evicted_blocks": 2}


def test_a_block_added_twice_stays_its_second_writers_own():
    cache, pages = PrefixCache(4), Pages()
    a, b = ask(0, range(9)), ask(1, range(9))
    for r in (a, b):  # both admitted before either's prefill ended: neither reads
        cache.admit(r, cache.match(r))
    cache.insert(a, pages.keep(a))
    assert cache.insert(b, pages.keep(b)) == 0  # a's copies are cached; b keeps its own
    assert pages.kept == [(0, 0, 4), (0, 4, 8)] and cache.blocks == 2
    cache.finish(a)
    assert cache.evictable_tokens() == 0  # b pins the cached chain it matches
    cache.finish(b)
    cache.clear(pages.dropped.append)
    assert sorted(pages.dropped) == [(0, 0), (0, 4)] and cache.blocks == 0
    cache.admit(a, [])
    with pytest.raises(PdmuxError, match="1 request.s. still read the prefix cache"):
        cache.clear(pages.dropped.append)


def test_identical_hash_ids_give_identical_tokens():
    a = Request(0, 1100, 2, 0.0, draw=IDS, hash_ids=[7, 8, 9])
    b = Request(1, 700, 2, 0.0, draw=IDS, hash_ids=[7, 5])
    c = Request(2, 700, 2, 0.0, draw=TokenIds(1000, seed=1), hash_ids=[7, 5])
    assert (a.prompt[:512] == b.prompt[:512]).all() and (a.prompt[512:700] != b.prompt[512:]).any()
    assert (b.prompt[:512] != c.prompt[:512]).any()  # another seed, other tokens
    assert len(a.prompt) == 1100 and a.prompt.max() < 1000
    cache = PrefixCache(128)  # four cache blocks a hash id
    assert cache.keys(a)[:5] == [(7, 0), (7, 1), (7, 2), (7, 3), (8, 0)] and len(cache.keys(a)) == 8
    assert cache.keys(Request(3, 700, 2, 0.0, draw=IDS)) is None  # its own tokens: never shared
    with pytest.raises(PdmuxError, match="request 4: 1 hash ids for a 600-token prompt; one per "
                                         "512 tokens makes 2"):
        Request(4, 600, 2, 0.0, draw=IDS, hash_ids=[1])


def sim_executor(capacity=None):
    from pdmux_triton.cost import step_cost
    from pdmux_triton.serve.simulated import SimExecutor
    from pdmux_triton.spec.gpus import gpu_preset
    from pdmux_triton.spec.models import model_preset

    gpu, model = gpu_preset("h200"), model_preset("qwen3-8b")
    x = SimExecutor(gpu, model, step_cost.SaturationLaw(4.0, 66),
                    step_cost.PrefillRate.fixed(gpu.bf16_tflops, gpu.sms, 0.5))
    if capacity is not None:
        x.kv_capacity_tokens = capacity
    return x


def shared_prefix_trace():
    """Requests two by two sharing a 4-block system prompt, then their own blocks."""
    reqs = []
    for i in range(12):
        n = 2560 + 100 * i
        own = [1000 * i + k for k in range(-(-n // 512) - 4)]
        reqs.append(Request(i, n, 8, 0.05 * i, draw=IDS, hash_ids=[1, 2, 3, 4, *own]))
    return reqs


@pytest.mark.parametrize("loop,kw", [("prefill_first", {}), ("chunked", {"chunk": 512}),
                                     ("pdmux", {})])
def test_a_simulated_run_reads_shared_prefixes_and_computes_less(loop, kw):
    on = scheduler.run(loop, sim_executor(), shared_prefix_trace(), **kw)
    off = scheduler.run(loop, sim_executor(), shared_prefix_trace(), prefix_block=None, **kw)
    assert off.prefix_cache is None and all(r.cached_len == 0 for r in off.requests)
    stats = on.prefix_cache
    # every request after the first finds the system prompt, if its prefill began after the
    # first one's ended
    late = [r for r in on.requests if r.prefill_start >= on.requests[0].prefill_end]
    assert all(r.cached_len == 2048 for r in late) and len(late) >= 8
    assert stats["cached_tokens"] == sum(r.cached_len for r in on.requests)
    assert stats["prompt_tokens"] == sum(r.prompt_len for r in on.requests)
    ttft = lambda run: sorted(r.ttft for r in run.requests)[len(run.requests) // 2]  # noqa: E731
    assert ttft(on) < ttft(off)


def test_eviction_makes_room_and_keeps_the_books():
    """A cache that holds two requests at a time: blocks of finished requests are evicted for
    the next, and every token is accounted for at the end."""
    reqs = [Request(i, 1500, 4, 0.0, draw=IDS, hash_ids=[0, 10 + i, 20 + i]) for i in range(9)]
    x = sim_executor(capacity=2 * 1504)
    result = scheduler.run("prefill_first", x, reqs, prefill_tokens=1)
    assert result.prefix_cache["evicted_blocks"] > 0 and all(r.done for r in result.requests)
    # the shared block is read by every request after the first: always pinned or the most
    # recently used, it is never the one evicted
    assert [r.cached_len for r in result.requests] == [0] + [512] * 8
    # the loop's books, by hand: every token free or in a cached block once all have ended
    cache = PrefixCache()
    e = scheduler.Engine(x, [Request(i, 1500, 4, 0.0, draw=IDS, hash_ids=[0, 10 + i, 20 + i])
                             for i in range(9)], 128, prefix_cache=cache)
    x.start([])
    scheduler.run_prefill_first(e, 1)
    assert e.served == 9 and not e.own and not cache.pins
    assert e.kv_free + cache.blocks * cache.block == x.kv_capacity_tokens and cache.blocks > 0
    assert cache.unpinned == cache.blocks  # nothing pins a block once every request ended


def test_mooncakes_trace_reads_what_an_unbounded_cache_would():
    """The committed Mooncake conversation trace's first 300 requests (within Qwen3-8B's
    context) on a cache that never evicts: the hit rate a plain set of the block-id prefixes
    seen so far gives, prompt by prompt; on the H200's KV cache, no more than that."""
    import json

    from pdmux_triton.spec.traces import load_trace

    path = "bench/data/mooncake-fast25/conversation_trace.jsonl"
    trace = load_trace(path, 40960, "qwen3-8b's context").replayed(0, 300, 0.3)
    rows = [json.loads(line) for line in open(path)]
    rows = [rows[line - 1] for line in trace.line.tolist()]
    seen, hit = set(), 0
    for row in rows:  # whole blocks short of the last token, then the prompt's whole blocks
        ids, n = row["hash_ids"], row["input_length"]
        k = 0
        while k < (n - 1) // 512 and tuple(ids[:k + 1]) in seen:
            k += 1
        hit += 512 * k
        seen.update(tuple(ids[:j + 1]) for j in range(n // 512))
    expected = hit / sum(row["input_length"] for row in rows)
    unbounded, hbm = sim_executor(capacity=10**9), sim_executor()
    # one prompt a batch: a batch's prompts do not read each other's blocks (inserted after
    # their prefill), and the reference inserts each prompt's before the next reads
    got = [scheduler.run("prefill_first", x, trace.requests(1000), prefill_tokens=1).prefix_cache
           for x in (unbounded, hbm)]
    assert got[0]["hit_rate"] == pytest.approx(expected, abs=1e-12) and expected > 0.1
    assert got[0]["evicted_blocks"] == 0 and got[1]["evicted_blocks"] > 0
    assert got[1]["hit_rate"] <= got[0]["hit_rate"]
