"""The decoder: on the tiny preset (the Triton interpreter, fp32) split prefill and decode agree
with a whole prefill; on the GPU the real preset's split prefill is bit-exact."""

from unittest import mock

import pytest
import torch
from conftest import HAS_CUDA
from reference import REL_TOL, rel_err

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu import decoder
from pdmux_triton.gpu.decoder import DecodeBatch, ExtendBatch, KVCache, Model, Weights
from pdmux_triton.kernels import gemm
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


@pytest.mark.parametrize("programs,whole,fused", [(2, True, False), (64, True, True),
                                                 (64, False, True)],
                         ids=["prefill tiles", "whole skinny tiles", "split skinny tiles"])
def test_decode_step_continues_the_prefill(programs, whole, fused):
    """The decode step against the prefill's layers: on 2 programs the decode GEMMs run the
    prefill's tiles and the norms apart; on 64 they take skinny tiles, whole or split between
    programs (forced), and the step runs `fused_layer` (norms and residual adds inside the
    GEMMs)."""
    with mock.patch.object(gemm, "whole_tiles", return_value=whole):
        _decode_continues_prefill(Budget(programs), fused)


def _decode_continues_prefill(budget: Budget, fused: bool):
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
    assert model.fuses_norms(1, budget) == fused
    out = model.decode_step(step, budget)
    # two attention paths (decode vs extend) over the same cache: equal up to rounding
    assert rel_err(out, ref) < (1e-5 if DTYPE == torch.float32 else REL_TOL[DTYPE])


def test_layer_range_errors():
    model = make_model()
    batch = prefill_batch([1, 2, 3], [0])
    with pytest.raises(PdmuxError, match=r"layer range \[1, 3\) is outside 0..2"):
        model.extend_layers(batch, 1, 3)
    with pytest.raises(PdmuxError, match="resumed at layer 1 needs the hidden states"):
        model.extend_layers(batch, 1, 2)
    h, _ = model.extend_layers(batch, 0, 1)
    with pytest.raises(PdmuxError, match="needs the hidden states and the residual stream"):
        model.extend_layers(batch, 1, 2, h)  # (no residual: its adds would be skipped)


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


@pytest.mark.gpu
def test_fused_decode_step_equals_the_layers_at_real_dims(sms=132):
    """Qwen3-8B's dims (2 layers, seeded weights), 32 requests at ragged contexts: the decode
    step's fused layers (norms and residual adds in the GEMMs) give the logits of the
    unfused layers on the same cache, within bf16 rounding."""
    spec = model_preset("qwen3-8b")
    weights = Weights.random(spec, "cuda", seed=3, layers=2)
    page, batch = 16, 32
    lens = torch.randint(100, 3000, (batch,), generator=torch.Generator().manual_seed(3))
    pages = [-(-int(n) // page) for n in lens]
    cache = KVCache(spec, sum(pages), page, "cuda", layers=2)
    for layer in range(2):  # a random cache: attention reads real values
        cache.k[layer].normal_()
        cache.v[layer].normal_()
    model = Model(weights, cache, max_positions=4096)
    order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(4))
    table = torch.zeros(batch, max(pages), dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[at:at + n]
        at += n
    positions = (lens - 1).cuda()
    table = table.cuda()
    page_ids = table.gather(1, (positions // page)[:, None]).squeeze(1).long()
    slots = page_ids * page + positions % page
    step = DecodeBatch(torch.randint(0, spec.vocab, (batch,), device="cuda"), positions, slots,
                       table, lens.to(torch.int32).cuda(), int(lens.max()))
    budget = Budget(sms)
    assert model.fuses_norms(batch, budget)
    fused = model.decode_step(step, budget)
    with mock.patch.object(Model, "fuses_norms", return_value=False):
        layers = model.decode_step(step, budget)
    assert rel_err(fused, layers) < REL_TOL[torch.bfloat16]


def test_folded_gains_give_the_norm_then_the_projection():
    """rmsnorm(x) * g @ W^T before the fold equals rmsnorm(x) @ W'^T after it, for both folded
    weights; the norms are left at unit gain and a second fold changes nothing."""
    spec = model_preset("tiny")
    w = Weights.random(spec, DEV, torch.float32, seed=1, layers=1)
    layer = w.layers[0]
    gains = {n: 1 + 0.1 * torch.randn(spec.hidden, device=DEV) for n in ("in_norm", "post_norm")}
    raw = {"qkv": layer["qkv"].clone(), "gate_up": layer["gate_up"].clone()}
    for n, g in gains.items():
        layer[n].copy_(g)
    w.fold_norm_gains()
    x = torch.randn(5, spec.hidden, device=DEV, dtype=torch.float64)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + spec.rms_eps)
    for n, name in (("in_norm", "qkv"), ("post_norm", "gate_up")):
        want = (normed * gains[n].double()) @ raw[name].double().T
        assert rel_err(normed @ layer[name].double().T, want) < 1e-6
        assert torch.equal(layer[n], torch.ones_like(layer[n]))
    folded = layer["qkv"].clone()
    w.fold_norm_gains()
    assert torch.equal(layer["qkv"], folded)


def test_a_mixed_steps_decode_rows_attend_as_a_decode_step():
    """A mixed step's leading decode rows run through decode attention and the rest through
    the extend kernel, into one output: the same as the extend kernel over all of them (fp32
    rounding apart), with a chunk after them, with decode rows alone, and with a one-token
    chunk after its prefix (not a decode row: the batch says how many it has). The layers
    after the first replay the first's launches."""
    layers, prefix_rows = 3, [(8, [0, 1, 2]), (12, [3, 4, 5, 6])]
    models = []
    for _ in range(2):
        spec = model_preset("tiny")
        models.append(Model(Weights.random(spec, DEV, DTYPE, seed=1, layers=layers),
                            KVCache(spec, 16, PAGE, DEV, DTYPE, layers=layers), max_positions=64))
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n, _ in prefix_rows]
    chunk_prefix = torch.randint(0, 256, (4,), generator=g).tolist()
    for m in models:  # the decoding rows' contexts and the chunk's prefix in the caches
        for tokens, (_, pages) in zip(prompts + [chunk_prefix], prefix_rows + [(4, [9, 10])]):
            m.extend_layers(prefill_batch(tokens, pages), 0, layers, budget=Budget(3))
    pages = [p for _, p in prefix_rows] + [[9, 10, 11]]
    table = torch.zeros(3, 4, dtype=torch.int32, device=DEV)
    for i, p in enumerate(pages):
        table[i, :len(p)] = torch.tensor(p)
    tokens = torch.randint(0, 256, (8,), generator=g).to(DEV)

    def batch(chunk: int, decode_rows: int) -> ExtendBatch:
        """Both decode rows (contexts 8 and 12), then a chunk of `chunk` tokens after 4."""
        pos = torch.tensor([8, 12, *range(4, 4 + chunk)], device=DEV)
        rows = [0, 1] + [2] * chunk
        slots = torch.stack([table[r, int(q) // PAGE].long() * PAGE + int(q) % PAGE
                             for r, q in zip(rows, pos.tolist())])
        n = 2 + (chunk > 0)
        lens = torch.tensor([9, 13], dtype=torch.int32, device=DEV)[:decode_rows]
        return ExtendBatch(tokens[:2 + chunk], pos, slots, table[:n], [1, 1, chunk][:n],
                           [8, 12, 4][:n], decode_rows, lens if decode_rows else None)
    tol = 1e-5 if DTYPE == torch.float32 else REL_TOL[DTYPE]
    for chunk in (6, 0, 1):
        with mock.patch.object(decoder, "decode_attention",
                               wraps=decoder.decode_attention) as decode:
            h, r = models[0].extend_layers(batch(chunk, 2), 0, layers, budget=Budget(3))
        ref_h, ref_r = models[1].extend_layers(batch(chunk, 0), 0, layers, budget=Budget(3))
        assert decode.call_count == 1  # the first layer's; the later ones replay its launches
        assert models[0].unreplayable is None, models[0].unreplayable
        assert rel_err(h, ref_h) < tol and rel_err(r, ref_r) < tol, chunk
        assert rel_err(models[0].cache.k[2], models[1].cache.k[2]) < tol
    with pytest.raises(PdmuxError, match="2 decode rows need one new token each"):
        ExtendBatch(tokens[:7], tokens[:7], tokens[:7], table, [6, 1, 0], [4, 8, 12], 2, None)
