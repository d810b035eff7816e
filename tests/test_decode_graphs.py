"""Captured decode steps: padded sizes, and a capture whose static inputs reach its stream in
order."""

import importlib

import pytest
import torch

from pdmux_triton.cost.step_cost import padded_batch
from pdmux_triton.gpu.decode_graphs import DecodeGraphs, padded_sizes
from pdmux_triton.gpu.decoder import DecodeBatch, KVCache, Model, Weights
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.models import model_preset


def test_padded_sizes_cover_every_batch_with_few_graphs():
    assert [padded_batch(n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 72)] == [1, 2, 4, 8, 8, 16, 16,
                                                                          24, 72]
    sizes = padded_sizes(40)
    assert sizes == [1, 2, 4, 8, 16, 24, 32, 40]
    assert all(padded_batch(n) in sizes and padded_batch(n) >= n for n in range(1, 41))


@pytest.mark.gpu
def test_static_inputs_are_made_on_the_capture_stream():
    """The warm-up step before a capture reads the static inputs on the capture stream, so they
    must be uploaded there: made on another stream, the step could read tokens and slots whose
    copies had not landed (an out-of-range embedding gather, K/V written anywhere)."""
    spec, dtype, dev = model_preset("tiny"), torch.bfloat16, torch.device("cuda")
    scratch, ps = 7, 4
    model = Model(Weights.random(spec, dev, dtype), KVCache(spec, scratch + 1, ps, dev, dtype),
                  max_positions=64)
    graphs = DecodeGraphs(model, width=4)
    stream = torch.cuda.Stream()
    seen = []

    def static_batch(rows: int, width: int) -> DecodeBatch:
        seen.append(torch.cuda.current_stream())
        zeros = torch.zeros(rows, dtype=torch.int64, device=dev)
        table = torch.full((rows, width), scratch, dtype=torch.int32, device=dev)
        return DecodeBatch(zeros, zeros.clone(), zeros + scratch * ps, table,
                           torch.zeros(rows, dtype=torch.int32, device=dev), width * ps)

    torch.cuda._sleep(50_000_000)  # the default stream stays busy while the capture runs
    step = graphs.get(stream, Budget(None), 2, static_batch)
    assert seen == [stream]
    assert graphs.captures == 1 and graphs.get(stream, Budget(None), 2, static_batch) is step
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("attention_prefetch", [0, 2])
def test_overlapped_launches_give_the_same_logits_replayed_from_a_graph(monkeypatch,
                                                                       attention_prefetch):
    """A decode step whose kernels launch while the one before drains (PDL, each waiting for
    it before its first read), captured and replayed on new tokens, gives the logits of the
    same step launched kernel after kernel, to the bit; a prefill's layers too. So does one
    whose decode attention fetches its first segment's first K/V blocks before its wait, while the
    kernel before it writes the new token's."""
    from pdmux_triton.measure.workloads import DecodeStep, PrefillLayers

    attention = importlib.import_module("pdmux_triton.kernels.decode_attention")
    monkeypatch.setattr(attention, "PDL_PREFETCH_BLOCKS", attention_prefetch)

    step = DecodeStep(model_preset("qwen3-8b"), batch=8, context=300)
    step.model.w.layers[:] = step.model.w.layers[:3]  # three layers: the chain, not the model
    apart = step.model.decode_step(step.batch, Budget())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on the capturing stream (compiles, counters)
        step.model.decode_step(step.batch, Budget(pdl=True))
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = step.model.decode_step(step.batch, Budget(pdl=True))
    for _ in range(3):
        step.batch.tokens.random_(0, step.model.spec.vocab)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, step.model.decode_step(step.batch, Budget()))
    assert not torch.equal(captured, apart)  # the tokens did change

    prefill = PrefillLayers(model_preset("qwen3-8b"), tokens=1000, layers=2, prompts=3)
    hidden = [prefill.model.extend_layers(prefill.batch, 0, 2, budget=Budget(pdl=pdl))[0]
              for pdl in (False, True)]
    assert torch.equal(*hidden)
