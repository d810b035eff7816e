"""The served run's real executors: a KV cache for the run's whole KV when the GPU keeps it
(else what it keeps, never less than the longest request), one model shared by every variant,
a warm-up once per strategy, kind, chunk and level policy, and on the GPU the counts of what
happened inside a measured block."""

import dataclasses
import gc
import types

import pytest
from conftest import HAS_CUDA

from pdmux_triton.cost import step_cost
from pdmux_triton.gpu.executors import PAGE_SIZE, GpuExecutors
from pdmux_triton.gpu.model_executor import ModelExecutor
from pdmux_triton.multiplex.level_policy import SGLangLevels
from pdmux_triton.multiplex.sglang_rules import PDMuxConfig
from pdmux_triton.spec.gpus import GPUSpec, detect_gpu
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import Request

TINY = model_preset("tiny")  # 256 bytes of K/V a token
CONFIG = PDMuxConfig()
# on the CPU a small GPU so the PD-mux levels exist: 48 SMs, Hopper rules
GPU = detect_gpu() if HAS_CUDA else GPUSpec("test", 48, (9, 0), 1.0, 100.0, 1.0)


def requests():
    # KV needs (prompt + output): 100, 16 and 2 tokens; 118 in all, the longest 7 pages of 16
    return [Request(0, 97, 3, 0.0), Request(1, 7, 9, 0.0), Request(2, 1, 1, None, after_steps=1)]


def gpu_keeping(tokens: int | None) -> GPUSpec:
    """GPU with memory that keeps `tokens` of TINY's KV (None: memory unknown)."""
    memory = None if tokens is None else (
        step_cost.footprint_bytes(TINY, 0) + (tokens + 0.5) * 256 / step_cost.KV_MEMORY_FRACTION) / 1e9
    gpu = dataclasses.replace(GPU, memory_gb=memory)
    if tokens is not None:
        assert step_cost.kv_capacity_tokens(gpu, TINY) == tokens
    return gpu


def executors(gpu=None, **kw) -> GpuExecutors:
    gpu = gpu or gpu_keeping(None)
    return GpuExecutors(gpu, TINY, requests(), CONFIG, CONFIG.levels(gpu.sms, gpu.cc_major),
                        prefill_tokens=128, max_running=4, **kw)


@pytest.fixture(autouse=True)
def warmed(monkeypatch):
    """The warm-ups asked for (the warm-up itself is test_warmup's and test_model_executor's)."""
    calls = []
    monkeypatch.setattr(ModelExecutor, "warm_up", lambda self, *args: calls.append((self, args)))
    yield calls
    ModelExecutor.release_shared()


class OtherPolicy(SGLangLevels):
    """A level policy of another type."""


@pytest.mark.parametrize("keeps,cache_tokens,pages", [
    (None, 144, 9),  # memory unknown: the whole run's KV, in whole pages (7 + 1 + 1)
    (1000, 144, 9),  # it fits
    (115, 115, 8),  # what the GPU keeps: admission waits
    (50, 50, 7),  # less than the longest request: the cache still holds that one
])
def test_the_kv_cache_holds_the_runs_kv_or_what_the_gpu_keeps(keeps, cache_tokens, pages):
    gx = executors(gpu_keeping(keeps))
    assert gx.cache_tokens == cache_tokens and gx.max_context == 112  # 100 tokens: 7 pages
    x = gx.executor("prefill_first", "grid_cap", 0, SGLangLevels(CONFIG))
    assert x.model.cache.page_size == PAGE_SIZE
    assert x.model.cache.num_pages == pages + 1  # and the scratch page
    assert x.kv_capacity_tokens == pages * PAGE_SIZE
    assert x.graphs.width == 7


def test_every_variant_shares_one_model_until_close():
    gx = executors()
    variants = [("prefill_first", "grid_cap", 0), ("chunked", "grid_cap", 512),
                ("pdmux", "grid_cap", 0), ("pdmux", "green", 0)]
    xs = [gx.executor(*v, SGLangLevels(CONFIG)) for v in variants]
    assert len({id(x) for x in xs}) == 4 and [x.kind for x in xs] == [k for _, k, _ in variants]
    assert all(x.model is xs[0].model and x.graphs is xs[0].graphs for x in xs)
    gx.close()
    assert ModelExecutor._shared == {}
    assert gx.executor("pdmux", "green", 0, SGLangLevels(CONFIG)).model is not xs[0].model


def test_a_warm_up_runs_once_per_strategy_kind_chunk_and_policy(warmed):
    gx = executors()
    sglang = SGLangLevels(CONFIG)
    calls = [("pdmux", "green", 0, sglang), ("pdmux", "green", 0, sglang),
             ("pdmux", "green", 0, SGLangLevels(CONFIG)),  # an equal policy: warm already
             ("pdmux", "green", 0, SGLangLevels(CONFIG, relevel_at_layers=True)),  # another
             ("pdmux", "grid_cap", 0, sglang), ("pdmux", "green", 0, OtherPolicy(CONFIG)),
             ("chunked", "grid_cap", 256, sglang), ("chunked", "grid_cap", 512, sglang),
             ("chunked", "grid_cap", 512, sglang)]
    xs = [gx.executor(*c) for c in calls]
    assert [(args[0], self.kind, args[4]) for self, args in warmed] == [
        ("pdmux", "green", 0), ("pdmux", "green", 0), ("pdmux", "grid_cap", 0),
        ("pdmux", "green", 0), ("chunked", "grid_cap", 256), ("chunked", "grid_cap", 512)]
    assert warmed[0][0] is xs[0] and warmed[1][1][5].relevel_at_layers
    assert type(warmed[3][1][5]) is OtherPolicy
    # the strategy, the config, max_running, prefill tokens, chunk, policy and levels
    assert warmed[4][1] == ("chunked", CONFIG, 4, 128, 256, sglang, gx.levels)


def test_the_warm_up_takes_the_longest_prompt_past_the_batch_budget(warmed):
    """The oldest prompt joins a prefill batch whatever its length: a prompt of 97 tokens
    beside a budget of 64 makes batches of 97 rows, which the warm-up grows the pool to."""
    gx = GpuExecutors(GPU if HAS_CUDA else gpu_keeping(None), TINY, requests(), CONFIG,
                      CONFIG.levels(GPU.sms, GPU.cc_major), prefill_tokens=64, max_running=4)
    gx.executor("pdmux", "grid_cap", 0, SGLangLevels(CONFIG))
    assert warmed[-1][1][3] == 97
    assert executors().prefill_rows == 128  # a budget above every prompt: the budget


def test_loading_progress_goes_to_stderr(capsys):
    executors(checkpoint="/models/tiny")._loading(2, 5)
    assert capsys.readouterr() == ("", "loading /models/tiny: 2/5 shards\n")


@pytest.mark.gpu
def test_a_watched_block_counts_compiles_captures_and_device_allocations():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _fill(x_ptr, BLOCK: tl.constexpr):  # made here: no other test compiled it
        tl.store(x_ptr + tl.arange(0, BLOCK), tl.full((BLOCK,), 3.0, tl.float32))

    gx = executors()
    side = torch.cuda.Stream()
    x = types.SimpleNamespace(  # what watch reads
        graphs=types.SimpleNamespace(captures=3),
        partitions=types.SimpleNamespace(stream_names=lambda: {side.cuda_stream: "prefill, 7 SMs"}))
    with gx.watch(x) as counts:
        pass
    guards = ("compiles_during_measurement", "captures_during_measurement",
              "device_allocations_during_measurement", "compiled", "device_allocations_by_stream")
    assert {k: counts[k] for k in guards} == {
        "compiles_during_measurement": 0, "captures_during_measurement": 0,
        "device_allocations_during_measurement": 0, "compiled": [],
        "device_allocations_by_stream": {}}
    assert set(counts) == {*guards, "gc_collections_during_measurement",
                           "gc_pause_ms_during_measurement",
                           "device_segments_freed_during_measurement",
                           "device_alloc_retries_during_measurement"}
    torch.cuda.empty_cache()  # so a large block needs a new segment
    with gx.watch(x) as counts:
        assert counts == {}  # filled in as the block exits
        with torch.cuda.stream(side):  # put to the stream that allocated it, by its name
            big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        _fill[(1,)](big.view(torch.float32), BLOCK=64)
        _fill[(1,)](big.view(torch.float32), BLOCK=64)
        x.graphs.captures += 2
        gc.collect()  # a collection inside: counted, its pause timed
    assert counts["gc_collections_during_measurement"] >= 1
    assert counts["gc_pause_ms_during_measurement"] > 0
    assert counts["compiles_during_measurement"] == 1 and "_fill" in counts["compiled"][0]
    assert counts["captures_during_measurement"] == 2
    assert counts["device_allocations_during_measurement"] >= 1
    assert counts["device_allocations_by_stream"] == {"prefill, 7 SMs": {"segments": 1,
                                                                          "mib": 1024.0}}
    assert big.view(torch.float32)[:64].tolist() == [3.0] * 64
