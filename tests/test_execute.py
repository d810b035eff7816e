"""The real executor on the tiny model (Triton interpreter on CPU, the GPU when present):
every strategy serves the same greedy tokens, and the block manager keeps its pages."""

import copy

import pytest

from pdmux_triton import scheduler
from pdmux_triton.errors import PdmuxError
from pdmux_triton.execute import BlockManager, ModelExecutor
from pdmux_triton.hardware import GPUSpec, model_preset
from pdmux_triton.traffic import Request

TINY = model_preset("tiny")
# a small GPU so the PD-mux levels exist: 48 SMs, Hopper rules -> levels 32/16 etc.
GPU = GPUSpec("test", 48, (9, 0), 1.0, 100.0, 1.0)


def requests():
    return [Request(0, [5, 17, 99, 3, 42, 7, 250], 6, 0.0, warm=True),
            Request(1, list(range(30, 42)), 7, 0.0, warm=True),
            Request(2, [(i * 37) % 256 for i in range(21)], 5, None, after_steps=2)]


@pytest.fixture(autouse=True, scope="module")
def _release():
    yield
    ModelExecutor.release_shared()


def serve(strategy, **kw):
    reqs = copy.deepcopy(requests())
    x = ModelExecutor.shared(TINY, GPU, "grid_cap", page_size=4, cache_tokens=512)
    result = scheduler.run(strategy, x, reqs, **kw)
    assert all(r.done for r in result.requests)
    assert not x.blocks.owned  # every page released
    return {r.rid: r.tokens for r in result.requests}, result


def test_strategies_serve_the_same_tokens():
    first, _ = serve("prefill_first")
    chunked, _ = serve("chunked", chunk=8)
    pdmux, result = serve("pdmux")
    assert first == chunked == pdmux
    assert len({t for toks in first.values() for t in toks}) > 3  # real, varied greedy tokens
    assert len(first[2]) == 5 and len(first[0]) == 6
    assert any(r.prefill.startswith("layers") for r in result.rounds)


def test_block_manager_pages():
    bm = BlockManager(num_pages=5, page_size=4)  # page 4 is scratch
    assert bm.reserve(7, 5) == [0, 1]
    assert bm.slots(7, 3, 6).tolist() == [bm.slot(7, p) for p in (3, 4, 5)] == [3, 4, 5]
    assert bm.reserve(7, 8) == [0, 1]
    with pytest.raises(PdmuxError, match="the KV cache is full: request 8 needs 3 more pages"):
        bm.reserve(8, 12)
    bm.release(7)
    assert sorted(bm.reserve(8, 16)) == [0, 1, 2, 3]  # never the scratch page
    with pytest.raises(PdmuxError, match="at least 2 pages"):
        BlockManager(1, 4)
