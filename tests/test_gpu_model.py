"""The real preset on the GPU: split prefill equals whole prefill; the executor's strategies
serve the same greedy tokens."""

import copy

import pytest
import torch

from pdmux_triton import scheduler
from pdmux_triton.execute import ModelExecutor
from pdmux_triton.hardware import detect_gpu, model_preset
from pdmux_triton.model import Budget, ExtendBatch, KVCache, Model, Weights
from pdmux_triton.traffic import Request

pytestmark = pytest.mark.gpu
QWEN = model_preset("qwen3-8b")


@pytest.mark.parametrize("cuts", [[8], [1, 2, 3], [5, 7]])
def test_split_prefill_is_bit_exact(cuts):
    layers = 8
    model = Model(Weights(QWEN, "cuda", layers=layers), KVCache(QWEN, 512, 16, "cuda", layers=layers),
                  max_positions=4096)
    n = 1500
    pos = torch.arange(n, device="cuda")
    table = torch.randperm(512, device="cuda")[:94].to(torch.int32)[None]
    slots = table[0].long()[pos // 16] * 16 + pos % 16
    batch = ExtendBatch(torch.randint(0, QWEN.vocab, (n,), device="cuda"), pos, slots, table, [n], [0])
    whole = model.extend_layers(batch, 0, layers, budget=Budget(80))
    h = r = None
    for a, b in zip([0, *cuts], [*cuts, layers]):
        h, r = model.extend_layers(batch, a, b, h, r, budget=Budget(80))
    assert torch.equal(h, whole[0]) and torch.equal(r, whole[1])


def test_strategies_serve_the_same_tokens_on_the_preset():
    gpu = detect_gpu()
    g = torch.Generator().manual_seed(0)

    def reqs():
        rs = [Request(i, torch.randint(0, QWEN.vocab, (300 + 50 * i,), generator=g).tolist(), 12,
                      0.0, warm=True) for i in range(4)]
        rs.append(Request(4, torch.randint(0, QWEN.vocab, (2000,), generator=g).tolist(), 6, None,
                          after_steps=3))
        return rs
    base = reqs()
    tokens = {}
    for strategy, kw in (("prefill_first", {}), ("chunked", {"chunk": 512}), ("pdmux", {})):
        x = ModelExecutor.shared(QWEN, gpu, "grid_cap", cache_tokens=65536)
        result = scheduler.run(strategy, x, copy.deepcopy(base), **kw)
        tokens[strategy] = {r.rid: r.tokens for r in result.requests}
    assert tokens["prefill_first"] == tokens["chunked"] == tokens["pdmux"]
