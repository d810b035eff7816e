"""kernels/_replay.py: a layer's launches recorded and made again with other tensors swapped in;
what cannot be replayed is said; the decoder's prefill layers replayed equal them launched one
by one (the interpreter on CPU, the real dims on the GPU)."""

from unittest import mock

import pytest
import torch
from conftest import HAS_CUDA
from test_dispatch import STREAM, kernel  # noqa: F401 (the fixture: a kernel on a fake sm_90)
from triton.tools.tensor_descriptor import TensorDescriptor

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.decoder import ExtendBatch, KVCache, Model, Weights
from pdmux_triton.gpu.streams import kernel_args
from pdmux_triton.kernels import _replay, extend_attention, linear, rmsnorm
from pdmux_triton.kernels._dispatch import run_kernel
from pdmux_triton.kernels._replay import recording
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.models import model_preset

DEV = "cuda" if HAS_CUDA else "cpu"
DTYPE = torch.bfloat16 if HAS_CUDA else torch.float32


def _launch_args(call):
    """The kernel's own arguments of a direct launch (past grid, stream, function, metadata
    and the three hooks)."""
    kind, args = call
    assert kind == "direct"
    return args[9:]


def test_a_replay_swaps_tensors_their_views_and_descriptors(kernel):  # noqa: F811
    x, out = torch.zeros(64), torch.empty(64)
    run_kernel(kernel, 4, x, out, 64, 1.0, 3, BLOCK=16)  # the first goes through Triton
    with recording({"x": x}) as record:
        run_kernel(kernel, 4, x, out, 64, 1.0, 3, BLOCK=16)
        run_kernel(kernel, 2, x[16:], out, 48, 2.0, 3, BLOCK=16)
        run_kernel(kernel, 4, TensorDescriptor.from_tensor(x.view(4, 16), [2, 16]), out, 64,
                   1.0, 3, BLOCK=16)
    assert record.unreplayable is None and len(record.launches) == 3
    del kernel.calls[:]
    y = torch.full((64,), 5.0)
    assert record.replay({"x": y})
    whole, view, desc = (_launch_args(c) for c in kernel.calls)
    assert whole[0] is y and whole[1] is out and whole[2:5] == (64, 1.0, 3)
    assert view[0].data_ptr() == y[16:].data_ptr() and view[0].shape == (48,)
    assert desc[0].base.data_ptr() == y.data_ptr() and desc[0].base.shape == (4, 16)
    assert desc[0].block_shape == [2, 16]
    assert all(c[1][3] == STREAM and c[1][0] in (4, 2) for c in kernel.calls)


def test_a_replay_on_another_stream_is_refused(kernel, monkeypatch):  # noqa: F811
    x, out = torch.zeros(64), torch.empty(64)
    run_kernel(kernel, 4, x, out, 64, 1.0, 3, BLOCK=16)
    with recording({"x": x}) as record:
        run_kernel(kernel, 4, x, out, 64, 1.0, 3, BLOCK=16)
    monkeypatch.setattr(type(_replay.driver.active), "get_current_stream", lambda s, d: 8)
    with pytest.raises(PdmuxError, match="recorded on one stream are replayed on another"):
        record.replay({"x": torch.ones(64)})


def test_a_tensor_of_another_layout_is_not_replayed(kernel):  # noqa: F811
    x, out = torch.zeros(64), torch.empty(64)
    run_kernel(kernel, 4, x, out, 64, 1.0, 3, BLOCK=16)
    with recording({"x": x}) as record:
        run_kernel(kernel, 4, x, out, 64, 1.0, 3, BLOCK=16)
    del kernel.calls[:]
    for other in (torch.zeros(65), torch.zeros(128)[::2], torch.zeros(64, dtype=torch.float64),
                  torch.zeros(65)[1:]):  # (the last starts 4 bytes off x's alignment)
        assert not record.replay({"x": other})
    assert not record.replay({})
    assert kernel.calls == []


def test_a_tensor_given_by_keyword_is_swapped_too(kernel):  # noqa: F811
    x, out = torch.zeros(64), torch.empty(64)
    with recording({"x": x}) as record:  # its first launch: through Triton, by keyword
        run_kernel(kernel, 4, x_ptr=x, out_ptr=out, n=64, scale=1.0, m=3, BLOCK=16)
    assert record.launches[0].kernel is kernel and [s.at for s in record.launches[0].swaps] == [
        "x_ptr"]
    del kernel.calls[:]
    y = torch.ones(64)
    assert record.replay({"x": y})
    assert _launch_args(kernel.calls[0])[0] is y  # (bound by keyword, launched directly)


def test_a_replay_names_the_recorded_tensors_exactly(kernel):  # noqa: F811
    x, w, out = torch.zeros(64), torch.zeros(64), torch.empty(64)
    run_kernel(kernel, 4, x, out, 64, 1.0, 3, BLOCK=16)
    with recording({"x": x, "w": w}) as record:
        run_kernel(kernel, 4, x, out, 64, 1.0, 3, BLOCK=16)
    del kernel.calls[:]
    assert not record.replay({"x": torch.ones(64)})  # w missing
    assert not record.replay({"x": torch.ones(64), "w": torch.ones(64), "b": torch.ones(64)})
    assert kernel.calls == []
    with recording({"x": x, "y": x}) as record:
        run_kernel(kernel, 4, x, out, 64, 1.0, 3, BLOCK=16)
    assert record.unreplayable == "two swapped names are one tensor"


def _small_layer(x, residual, w_norm, w):
    """rmsnorm (a residual added, a view of x read) and a GEMM: launches only."""
    h = rmsnorm(x, w_norm, 1e-6, residual=residual, num_sms=2)
    return linear(h, w, num_sms=3)


def test_real_kernels_replayed_with_other_weights_equal_them_launched():
    g = torch.Generator().manual_seed(1)
    layers = [{"norm": 1 + 0.1 * torch.randn(32, generator=g),
               "w": torch.randn(32, 32, generator=g) / 6} for _ in range(3)]
    x0, res0 = torch.randn(7, 32, generator=g), torch.randn(7, 32, generator=g)
    # launched one by one
    x, res = x0.clone(), res0.clone()
    for lw in layers:
        x = _small_layer(x, res, lw["norm"], lw["w"])
    # the first recorded, the others replayed into the first one's output
    rx, rres = x0.clone(), res0.clone()
    with recording({"hidden": rx, **layers[0]}) as record:
        out = _small_layer(rx, rres, layers[0]["norm"], layers[0]["w"])
    assert record.unreplayable is None
    for lw in layers[1:]:
        assert record.replay({"hidden": out, **lw})
    assert torch.equal(out, x) and torch.equal(rres, res)


def test_what_cannot_be_replayed_is_said():
    x, w = torch.randn(4, 32), torch.ones(32)
    rmsnorm(x, w)  # what a first launch makes once (an unused pointer's buffer), made
    with recording({"x": x, "w": w}) as record:
        y = rmsnorm(x, w)
        y.add_(1)  # GPU work between launches, which a replay would not make
    assert "aten.add_" in record.unreplayable
    with pytest.raises(PdmuxError, match="cannot be replayed: the torch op aten.add_"):
        record.replay({"x": x, "w": w})
    both = torch.ones(64)
    with recording({"a": both[:32], "b": both[32:]}) as record:
        rmsnorm(x, both[8:40])  # whose view: a's or b's?
    assert record.unreplayable == "a kernel read a view of swapped tensors sharing a storage"
    buf = torch.randn(2, 4, 32)
    with recording({"hidden": buf[0]}) as record:  # its residual beside it in one storage
        rmsnorm(buf[0], w, residual=buf[1])
    assert record.unreplayable == "a kernel read memory beside hidden in its storage"
    z = torch.zeros(4, 32)
    with recording({"z": z}) as record:
        rmsnorm(z.view(torch.float16), torch.ones(64, dtype=torch.float16))
    assert record.unreplayable == "a kernel read a view of z as torch.float16"
    with recording({"x": x}) as record:
        rmsnorm(x[1:], w)  # a view of a swapped tensor: followed
    assert record.unreplayable is None
    with recording({}), pytest.raises(PdmuxError, match="already being recorded"):
        with recording({}):
            pass


# -- the decoder's prefill layers ----------------------------------------------------------

LAYERS, PAGE = 5, 4


def _model(layers=LAYERS):
    """The tiny preset with norm gains of its own a layer (folded ones are all ones, and a
    replay that kept the recorded layer's would pass unseen)."""
    spec = model_preset("tiny")
    model = Model(Weights.random(spec, DEV, DTYPE, seed=3, layers=layers),
                  KVCache(spec, 16, PAGE, DEV, DTYPE, layers=layers), max_positions=64)
    g = torch.Generator(device=DEV).manual_seed(4)
    for lw in model.w.layers:
        for name in ("in_norm", "post_norm", "q_norm", "k_norm"):
            lw[name].copy_(1 + 0.2 * torch.randn(lw[name].shape, generator=g, device=DEV))
    return model


def _batch(n=13, pages=(5, 2, 9, 0)):
    pos = torch.arange(n, device=DEV)
    table = torch.tensor([pages], dtype=torch.int32, device=DEV)
    slots = table[0].long()[pos // PAGE] * PAGE + pos % PAGE
    return ExtendBatch(torch.randint(0, 256, (n,), device=DEV), pos, slots, table, [n], [0])


def _one_by_one(model, batch, budget, start=0, end=None, hidden=None, residual=None):
    """The layers launched one by one, as before replays: the reference."""
    def attend(q, k, v, kc, vc):
        return extend_attention(q, k, v, kc, vc, batch.page_table, batch.extend_lens,
                                batch.prefix_lens, model.cache.page_size, plan=batch.plan,
                                **kernel_args(budget))
    if start == 0:
        hidden, residual = model.residual_stream(batch.tokens)
    for i in range(start, len(model.w.layers) if end is None else end):
        hidden, residual = model.layer(i, hidden, residual, batch.positions, batch.slots,
                                       attend, budget)
    return hidden, residual


def _counting_replays():
    calls = []
    replay = _replay.LaunchRecord.replay

    def counted(record, tensors):
        calls.append(replay(record, tensors))
        return calls[-1]
    return calls, mock.patch.object(_replay.LaunchRecord, "replay", counted)


def _caches(model):
    return [c.clone() for c in model.cache.k + model.cache.v]


def test_prefill_layers_replayed_equal_them_launched_one_by_one():
    model, batch, budget = _model(), _batch(), Budget(3)
    model.extend_layers(batch, 0, 1, budget=budget)  # what a first launch makes once, made
    calls, counting = _counting_replays()
    with counting:
        h, r = model.extend_layers(batch, 0, LAYERS, budget=budget)
    assert model.unreplayable is None and calls == [True] * (LAYERS - 1)
    caches = _caches(model)
    ref_h, ref_r = _one_by_one(model, batch, budget)
    assert torch.equal(h, ref_h) and torch.equal(r, ref_r)
    assert all(torch.equal(a, b) for a, b in zip(caches, _caches(model)))
    # split as PD-mux splits a prefill: each call records its first layer
    calls.clear()
    with counting:
        h, r = model.extend_layers(batch, 0, 2, budget=budget)
        h, r = model.extend_layers(batch, 2, LAYERS, h, r, budget=budget)
    assert calls == [True] * (LAYERS - 2)
    assert torch.equal(h, ref_h) and torch.equal(r, ref_r)


def test_a_layer_of_another_layout_is_launched_one_by_one():
    model, batch, budget = _model(), _batch(n=9), Budget(2)
    lw = model.w.layers[3]
    n, k = lw["o"].shape
    lw["o"] = torch.empty(n, k + 8, dtype=DTYPE, device=DEV)[:, :k].copy_(lw["o"])  # rows apart
    model.extend_layers(batch, 0, 1, budget=budget)  # what a first launch makes once, made
    calls, counting = _counting_replays()
    with counting:
        h, r = model.extend_layers(batch, 0, LAYERS, budget=budget)
    assert calls == [True, True, False, True]
    ref_h, ref_r = _one_by_one(model, batch, budget)
    assert torch.equal(h, ref_h) and torch.equal(r, ref_r)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [Budget(80), Budget(80, first_site=52, site_head=52),
                                    Budget(pdl=True)], ids=["grid_cap", "pinned", "whole_pdl"])
def test_prefill_layers_replayed_equal_them_launched_at_real_dims(budget):
    qwen, layers, n = model_preset("qwen3-8b"), 6, 700
    model = Model(Weights.random(qwen, "cuda", layers=layers),
                  KVCache(qwen, 128, 16, "cuda", layers=layers), max_positions=4096)
    pos = torch.arange(n, device="cuda")
    table = torch.randperm(128, device="cuda")[:44].to(torch.int32)[None]
    slots = table[0].long()[pos // 16] * 16 + pos % 16
    batch = ExtendBatch(torch.randint(0, qwen.vocab, (n,), device="cuda"), pos, slots, table,
                        [n], [0])
    model.extend_layers(batch, 0, layers, budget=budget)  # compiled, and seen by run_kernel
    record = _replay.LaunchRecord
    with (mock.patch.object(record, "add_compiled", autospec=True,
                            side_effect=record.add_compiled) as direct,
          mock.patch.object(record, "add_kernel", autospec=True,
                            side_effect=record.add_kernel) as through_triton):
        h, r = model.extend_layers(batch, 0, layers, budget=budget)
    assert model.unreplayable is None
    # every launch of the recorded layer past Triton's dispatch: so are its replays
    assert direct.call_count >= 8 and through_triton.call_count == 0
    caches = _caches(model)
    ref_h, ref_r = _one_by_one(model, batch, budget)
    torch.cuda.synchronize()
    assert torch.equal(h, ref_h) and torch.equal(r, ref_r)
    assert all(torch.equal(a, b) for a, b in zip(caches, _caches(model)))
