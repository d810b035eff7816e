"""The measured workloads: a run's rate from the bytes or FLOPs it moves, the names the
calibration can ask for, and on the GPU each workload of the tiny model built (inputs in
place, never zeros), run under a budget and counted as step_cost counts it."""

import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.measure.calibration_sweep import DECODE_WORKLOADS
from pdmux_triton.measure.workloads import Workload, make_decode_workload
from pdmux_triton.spec.models import model_preset

TINY = model_preset("tiny")  # 2 layers, 2 KV heads of 16: 256 bytes of K/V a token


@pytest.mark.parametrize("amount,ms,rate", [(1e9, 1.0, 1.0), (4.8e9, 2.0, 2.4), (3e12, 7.5, 400.0)])
def test_rate_is_the_amount_per_second_in_tera_units(amount, ms, rate):
    wl = Workload()
    wl.amount = amount
    assert wl.rate(ms) == pytest.approx(rate)


def test_a_workload_must_say_how_it_runs():
    with pytest.raises(NotImplementedError):
        Workload().run(None)


def test_an_unknown_workload_names_the_known_ones():
    with pytest.raises(PdmuxError, match="unknown workload 'prefill'; known: stream_read, "
                                         "decode_attention, decode_linear, decode_step$"):
        make_decode_workload("prefill", TINY, 4, 64)


# batch 3 at a context of 97: awkward pages (7 of 16 tokens a request, the last part-filled)
DECODE_AMOUNTS = {
    "stream_read": float(1 << 30),  # its own 1 GiB buffer, whatever the model
    "decode_attention": 256 * 3 * 97 / 2,  # one of the two layers
    "decode_linear": 2.0 * (128 * 64 + 64 * 64 + 256 * 64 + 64 * 128),  # qkv, o, gate_up, down
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", DECODE_WORKLOADS)
def test_each_decode_workload_runs_and_counts_what_it_moves(name):
    import torch

    from pdmux_triton.cost import step_cost
    from pdmux_triton.multiplex.partition import Budget

    wl = make_decode_workload(name, TINY, 3, 97)
    assert wl.name == name and wl.unit == "TB/s"
    want = DECODE_AMOUNTS.get(name, step_cost.decode_step_bytes(TINY, 3 * 97))
    assert wl.amount == pytest.approx(want)
    for budget in (Budget(), Budget(7)):
        wl.run(budget)
    torch.cuda.synchronize()
    assert wl.rate(1.0) == pytest.approx(want / 1e9)


@pytest.mark.gpu
def test_decode_attention_reads_a_contiguous_random_cache():
    import torch

    from pdmux_triton.measure.workloads import DecodeAttention

    wl = DecodeAttention(TINY, batch=3, context=97)
    assert torch.equal(wl.kv.page_table.cpu(), torch.arange(21, dtype=torch.int32).view(3, 7))
    assert wl.kv.k_cache.shape == (21 * 16, 2, 16) and (wl.kv.k_cache != 0).all()
    assert wl.q.shape == (3, 4, 16)


@pytest.mark.gpu
def test_decode_linear_takes_each_layers_weights_in_turn():
    from pdmux_triton.measure.workloads import DecodeLinear
    from pdmux_triton.multiplex.partition import Budget

    wl = DecodeLinear(TINY, batch=3, layers=2)
    assert [tuple(w.shape) for w in wl.weights[1]] == [(128, 64), (64, 64), (256, 64), (64, 128)]
    assert sorted(wl.x) == [64, 128] and wl.x[64].shape == (3, 64)
    for expect in (1, 0, 1):
        wl.run(Budget())
        assert wl._next == expect


@pytest.mark.gpu
def test_a_decode_step_writes_the_next_token_of_a_filled_cache():
    import torch

    from pdmux_triton.measure.workloads import DecodeStep
    from pdmux_triton.multiplex.partition import Budget

    wl = DecodeStep(TINY, batch=3, context=97)
    b, cache = wl.batch, wl.model.cache
    assert all((k != 0).all() and (v != 0).all() for k, v in zip(cache.k, cache.v))
    assert b.positions.tolist() == [97] * 3 and b.seq_lens.tolist() == [98] * 3
    # 98 tokens: 7 pages each, in order; position 97 is row 1 of a request's 7th page
    assert b.slots.tolist() == [(7 * r + 6) * 16 + 1 for r in range(3)]
    before = [k.clone() for k in cache.k]
    wl.run(Budget())
    torch.cuda.synchronize()
    rows = b.slots.cpu()
    for k, old in zip(cache.k, before):
        k, others = k.cpu(), torch.ones(len(old), dtype=torch.bool)
        others[rows] = False
        assert not torch.equal(k[rows], old.cpu()[rows])  # the new token's K landed there
        assert torch.equal(k[others], old.cpu()[others])  # and nowhere else


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,layers,prompts", [(97, 1, 1), (256, 2, 1), (97, 2, 3)])
def test_prefill_layers_fill_the_prompts_cache_and_count_its_flops(tokens, layers, prompts):
    import torch

    from pdmux_triton.cost import step_cost
    from pdmux_triton.measure.workloads import PrefillLayers
    from pdmux_triton.multiplex.partition import Budget

    wl = PrefillLayers(TINY, tokens=tokens, layers=layers, prompts=prompts)
    lens = wl.batch.extend_lens
    assert sum(lens) == tokens and len(lens) == prompts and max(lens) - min(lens) <= 1
    assert wl.unit == "TFLOP/s" and len(wl.model.cache.k) == layers
    # attention is causal within each prompt: three prompts of ~32 cost less than one of 97
    assert wl.amount == pytest.approx(sum(step_cost.layer_flops(TINY, n, 0, layers) for n in lens))
    wl.run(Budget(5))
    torch.cuda.synchronize()
    written = torch.zeros(wl.model.cache.k[0].shape[0], dtype=torch.bool, device="cuda")
    written[wl.batch.slots] = True
    assert int(written.sum()) == tokens  # every token its own slot
    for k in wl.model.cache.k:  # every prompt token's K, from a zeroed cache, and nothing else
        assert (k[written].float().abs().sum((1, 2)) > 0).all()
        assert not k[~written].any()


@pytest.mark.gpu
def test_prefill_layers_attend_over_a_cached_prefix():
    """New tokens after a cached prefix: the FLOPs count attention over it, the new tokens
    land after it, and what they compute reads it (the second layer's K of the new tokens
    moves when the first layer's cached prefix does)."""
    import torch

    from pdmux_triton.cost import step_cost
    from pdmux_triton.measure.workloads import PrefillLayers
    from pdmux_triton.multiplex.partition import Budget

    wl = PrefillLayers(TINY, tokens=97, layers=2, prompts=3, prefix=40)
    assert wl.batch.prefix_lens == [40] * 3
    assert wl.amount == pytest.approx(sum(step_cost.layer_flops(TINY, n, 40, 2)
                                          for n in wl.batch.extend_lens))
    assert int(wl.batch.positions.min()) == 40
    prefix_slots = wl.batch.page_table[:, 0].long() * 16 + torch.arange(16, device="cuda")[:, None]
    before = wl.model.cache.k[0][prefix_slots].clone()
    wl.run(Budget(5))
    torch.cuda.synchronize()
    assert torch.equal(wl.model.cache.k[0][prefix_slots], before)  # the prefix is read, not written
    first = wl.model.cache.k[1][wl.batch.slots].clone()
    for kv in (wl.model.cache.k[0], wl.model.cache.v[0]):
        new = torch.zeros(kv.shape[0], dtype=torch.bool, device="cuda")
        new[wl.batch.slots] = True
        kv[~new] *= 3  # the first layer's cached prefix, not the new tokens' own K/V
    wl.run(Budget(5))
    torch.cuda.synchronize()
    assert not torch.allclose(wl.model.cache.k[1][wl.batch.slots].float(), first.float())


@pytest.mark.gpu
def test_prefill_layers_with_decode_rows_run_a_mixed_step():
    """Decode rows lead the batch as the executor packs a mixed step: one new token each after
    its context, then the prompt's tokens; the FLOPs count them; the run writes each row's new
    K at its own slot (after its context), reads its context (the next layer's K of the rows
    moves when their cached context does) and leaves the context as it was."""
    import torch

    from pdmux_triton.cost import step_cost
    from pdmux_triton.measure.workloads import PrefillLayers
    from pdmux_triton.multiplex.partition import Budget

    wl = PrefillLayers(TINY, tokens=97, layers=2, prefix=20, decode_rows=3, decode_context=40)
    b = wl.batch
    assert b.decode_rows == 3 and b.extend_lens == [1, 1, 1, 97]
    assert b.prefix_lens == [40, 40, 40, 20] and b.decode_seq_lens.tolist() == [41] * 3
    assert b.positions[:3].tolist() == [40] * 3 and int(b.positions[3]) == 20
    assert len(set(b.slots.tolist())) == 100  # every new token its own slot
    assert b.page_table.shape[1] % 4 == 0  # the executor's width: rows start 16-byte aligned
    assert wl.amount == pytest.approx(step_cost.layer_flops(TINY, 97, 20, 2)
                                      + 3 * step_cost.layer_flops(TINY, 1, 40, 2))
    context = b.page_table[:3, :3].long()[:, :, None] * 16 + torch.arange(16, device="cuda")
    context = context.reshape(3, -1)[:, :40]
    before = wl.model.cache.k[0][context].clone()
    rows_before = wl.model.cache.k[0][b.slots[:3]].clone()
    wl.run(Budget(5))
    torch.cuda.synchronize()
    assert torch.equal(wl.model.cache.k[0][context], before)  # read, not written
    assert not torch.equal(wl.model.cache.k[0][b.slots[:3]], rows_before)  # the rows' new K
    first = wl.model.cache.k[1][b.slots[:3]].clone()
    wl.model.cache.k[0][context] *= 3
    wl.model.cache.v[0][context] *= 3
    wl.run(Budget(5))
    torch.cuda.synchronize()
    assert not torch.allclose(wl.model.cache.k[1][b.slots[:3]].float(), first.float())


@pytest.mark.parametrize("rows,context,says", [
    (-1, 4, "decode_rows is an integer of 0 or more, got -1"),
    (True, 4, "decode_rows is an integer of 0 or more, got True"),
    (2, 2.5, "decode_context is an integer of 0 or more, got 2.5"),
    (2, 0, "decode rows need a context of 1 or more tokens"),
    (0, 8, "and a context needs decode rows, got 0 rows of 8 tokens")])
def test_prefill_layers_refuse_decode_rows_without_a_context_or_the_reverse(rows, context, says):
    from pdmux_triton.measure.workloads import PrefillLayers

    with pytest.raises(PdmuxError, match=says):
        PrefillLayers(TINY, tokens=4, layers=1, decode_rows=rows, decode_context=context)


@pytest.mark.parametrize("prefix", [-1, True, 2.5])
def test_prefill_layers_refuse_a_prefix_that_is_no_token_count(prefix):
    from pdmux_triton.measure.workloads import PrefillLayers

    with pytest.raises(PdmuxError, match=f"cached prefix is 0 or more tokens, got {prefix!r}"):
        PrefillLayers(TINY, tokens=4, layers=1, prefix=prefix)


@pytest.mark.parametrize("prompts", [0, 5, True, 1.5])
def test_prefill_layers_refuse_more_prompts_than_tokens(prompts):
    from pdmux_triton.measure.workloads import PrefillLayers

    with pytest.raises(PdmuxError,
                       match=f"a prefill of 4 tokens takes 1..4 prompts, got {prompts!r}"):
        PrefillLayers(TINY, tokens=4, layers=1, prompts=prompts)
