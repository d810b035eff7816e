"""The decoder: on the tiny preset (the Triton interpreter, fp32) split prefill and decode agree
with a whole prefill; on the GPU the real preset's split prefill is bit-exact."""

import pytest
import torch
from conftest import HAS_CUDA
from reference import REL_TOL, rel_err

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.decoder import DecodeBatch, ExtendBatch, KVCache, Model, Weights
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.models import model_preset

DEV = "cuda" if HAS_CUDA else "cpu"
DTYPE = torch.bfloat16 if HAS_CUDA else torch.float32
PAGE = 4


def make_model(seed=0):
    spec = model_preset("tiny")
    return Model(Weights.random(spec, DEV, DTYPE, seed=seed), KVCache(spec, 16, PAGE, DEV, DTYPE),
                 max_positions=64)


def prefill_batch(tokens, pages):
    n = len(tokens)
    pos = torch.arange(n, device=DEV)
    table = torch.tensor([pages], dtype=torch.int32, device=DEV)
    slots = table[0].long()[pos // PAGE] * PAGE + pos % PAGE
    return ExtendBatch(torch.tensor(tokens, device=DEV), pos, slots, table, [n], [0])


def test_split_prefill_equals_whole():
    tokens = torch.randint(0, 256, (13,)).tolist()
    pages = [5, 2, 9, 0]  # shuffled pages
    model = make_model()
    batch = prefill_batch(tokens, pages)
    whole_h, whole_r = model.extend_layers(batch, 0, 2, budget=Budget(3))
    h, r = model.extend_layers(batch, 0, 1, budget=Budget(3))
    h, r = model.extend_layers(batch, 1, 2, h, r, budget=Budget(3))
    assert torch.equal(h, whole_h) and torch.equal(r, whole_r)
    logits = model.logits(h[-1:], r[-1:], Budget(3))
    assert logits.shape == (1, 256) and torch.isfinite(logits).all()


def test_decode_step_continues_the_prefill():
    tokens = torch.randint(0, 256, (10,)).tolist()
    pages = [7, 3, 11]
    ref_model = make_model()
    full = prefill_batch(tokens, pages)
    h, r = ref_model.extend_layers(full, 0, 2, budget=Budget(2))
    ref = ref_model.logits(h[-1:], r[-1:], Budget(2))

    model = make_model()
    h, r = model.extend_layers(prefill_batch(tokens[:-1], pages), 0, 2, budget=Budget(2))
    table = torch.tensor([pages], dtype=torch.int32, device=DEV)
    n = len(tokens) - 1
    step = DecodeBatch(torch.tensor(tokens[-1:], device=DEV), torch.tensor([n], device=DEV),
                       torch.tensor([pages[n // PAGE] * PAGE + n % PAGE], device=DEV), table,
                       torch.tensor([n + 1], dtype=torch.int32, device=DEV), max_seq_len=n + 1)
    out = model.decode_step(step, Budget(2))
    # two attention paths (decode vs extend) over the same cache: equal up to rounding
    assert rel_err(out, ref) < (1e-5 if DTYPE == torch.float32 else REL_TOL[DTYPE])


def test_layer_range_errors():
    model = make_model()
    batch = prefill_batch([1, 2, 3], [0])
    with pytest.raises(PdmuxError, match=r"layer range \[1, 3\) is outside 0..2"):
        model.extend_layers(batch, 1, 3)
    with pytest.raises(PdmuxError, match="resumed at layer 1 needs the hidden states"):
        model.extend_layers(batch, 1, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("cuts", [[8], [1, 2, 3], [5, 7]])
def test_split_prefill_is_bit_exact_on_the_preset(cuts):
    qwen, layers, n = model_preset("qwen3-8b"), 8, 1500
    model = Model(Weights.random(qwen, "cuda", layers=layers), KVCache(qwen, 512, 16, "cuda", layers=layers),
                  max_positions=4096)
    pos = torch.arange(n, device="cuda")
    table = torch.randperm(512, device="cuda")[:94].to(torch.int32)[None]
    slots = table[0].long()[pos // 16] * 16 + pos % 16
    batch = ExtendBatch(torch.randint(0, qwen.vocab, (n,), device="cuda"), pos, slots, table, [n], [0])
    whole = model.extend_layers(batch, 0, layers, budget=Budget(80))
    h = r = None
    for a, b in zip([0, *cuts], [*cuts, layers]):
        h, r = model.extend_layers(batch, a, b, h, r, budget=Budget(80))
    assert torch.equal(h, whole[0]) and torch.equal(r, whole[1])
