"""KV pages between ranks, over a stand-in for torch.distributed's point-to-point calls that
matches messages in the order they were posted (as gloo and NCCL do): a layer leaves as K then
V of its pages in the given order, copied out of the cache when sent; a receive writes only
the receiving rank's own pages of its layer, once its messages arrived; bad page lists are
refused before anything is posted. test_tensor_parallel serves a request across two gloo
ranks; on two GPUs the same goes over NCCL."""

import pytest
import torch

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu import kv_transfer
from pdmux_triton.gpu.decoder import KVCache
from pdmux_triton.gpu.kv_transfer import LayerReceive, receive_request, send_layer
from pdmux_triton.spec.models import model_preset

TINY = model_preset("tiny")  # 2 layers, K/V rows of 2 heads x 16
GROUP = object()  # a process group, passed through untouched


class Wire:
    """In-process isend/irecv: a receive's wait() copies in the message of its rank in order."""

    def __init__(self):
        self.sent, self.posted, self.waits = [], [], []

    def isend(self, tensor, dst, group=None):
        self.sent.append((dst, group, tensor))
        return _Work(None)

    def irecv(self, tensor, src, group=None):
        self.posted.append((src, group, tensor))
        return _Work(lambda i=len(self.posted) - 1: self._arrive(i))

    def _arrive(self, i):
        self.waits.append((i, len(self.posted)))
        self.posted[i][2].copy_(self.sent[i][2])


class _Work:
    def __init__(self, on_wait):
        self.on_wait = on_wait

    def wait(self):
        if self.on_wait:
            self.on_wait()


@pytest.fixture
def wire(monkeypatch):
    w = Wire()
    monkeypatch.setattr(kv_transfer, "dist", w)
    return w


def cache(pages, page_size, seed):
    c = KVCache(TINY, pages, page_size, "cpu", torch.float32)
    g = torch.Generator().manual_seed(seed)
    for t in (*c.k, *c.v):
        t.copy_(torch.randn(t.shape, generator=g))
    return c


def rows(c, pages):
    ps = c.page_size
    return [r for p in pages for r in range(p * ps, (p + 1) * ps)]


PAGES = [  # (page size, the prefill rank's pages, the decode rank's pages for the same tokens)
    (1, [5, 2, 9, 0, 7, 3, 11], [12, 0, 4, 1, 8, 13, 2]),
    (16, [3], [0]),
    (16, [2, 0, 5], [1, 7, 3]),
]


@pytest.mark.parametrize("page_size,sent,into", PAGES)
def test_a_layer_leaves_as_k_then_v_of_its_pages_in_order(wire, page_size, sent, into):
    src = cache(12, page_size, seed=1)
    want_k, want_v = src.k[1][rows(src, sent)].clone(), src.v[1][rows(src, sent)].clone()
    works = send_layer(src, 1, sent, dst=3, group=GROUP)
    assert len(works) == 2
    (dk, gk, k), (dv, gv, v) = wire.sent
    assert (dk, dv) == (3, 3) and gk is gv is GROUP
    src.k[1].zero_()  # the cache moves on: what was sent is a copy
    src.v[1].zero_()
    assert torch.equal(k, want_k) and torch.equal(v, want_v)


@pytest.mark.parametrize("page_size,sent,into", PAGES)
def test_a_request_lands_in_the_receivers_own_pages_and_nowhere_else(wire, page_size, sent, into):
    src, dst = cache(12, page_size, seed=1), cache(14, page_size, seed=2)
    before = [t.clone() for t in (*dst.k, *dst.v)]
    for layer in range(TINY.layers):
        send_layer(src, layer, sent, dst=1, group=GROUP)
    receive_request(dst, into, src=0, group=GROUP)
    # every layer's two receives were posted before the first one was waited for
    assert wire.waits[0] == (0, 2 * TINY.layers)
    assert [i for i, _ in wire.waits] == list(range(2 * TINY.layers))
    assert all(s == 0 and g is GROUP for s, g, _ in wire.posted)
    mine, theirs = rows(dst, into), rows(src, sent)
    untouched = [r for r in range(14 * page_size) if r not in set(mine)]
    for got, old, sent_t in zip((*dst.k, *dst.v), before, (*src.k, *src.v)):
        assert torch.equal(got[mine], sent_t[theirs])
        assert torch.equal(got[untouched], old[untouched])


def test_a_layer_is_written_only_once_it_has_arrived(wire):
    src, dst = cache(4, 16, seed=3), cache(4, 16, seed=4)
    old = dst.k[0].clone()
    send_layer(src, 0, [1, 3], dst=1)
    arriving = LayerReceive(dst, 0, [2, 0], src=0)
    assert arriving.k.shape == (32, 2, 16) and torch.equal(dst.k[0], old)
    arriving.land()
    assert torch.equal(dst.k[0][32:48], src.k[0][16:32]) and torch.equal(dst.k[0][:16], src.k[0][48:])
    assert torch.equal(dst.k[1], cache(4, 16, seed=4).k[1])  # the other layer: as it was


@pytest.mark.parametrize("pages,shown", [([], r"\[\]"), ([-1, 2], r"\[-1, 2\]"),
                                         ([0, 3, 4], r"\[0, 3, 4\]")])
def test_bad_pages_are_refused_before_anything_is_posted(wire, pages, shown):
    c = cache(4, 16, seed=5)
    match = rf"pages must be ids in 0..3, got {shown}"
    with pytest.raises(PdmuxError, match=match):
        send_layer(c, 0, pages, dst=1)
    with pytest.raises(PdmuxError, match=match):
        LayerReceive(c, 1, pages, src=0)
    with pytest.raises(PdmuxError, match=match):
        receive_request(c, pages, src=0)
    assert wire.sent == [] and wire.posted == []


def _nccl_rank(rank, rendezvous, out):
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    try:
        c = KVCache(TINY, 8, 16, "cuda", torch.bfloat16)
        if rank == 0:
            g = torch.Generator(device="cuda").manual_seed(0)
            for t in (*c.k, *c.v):
                t.copy_(torch.randn(t.shape, generator=g, device="cuda"))
            works = [w for layer in range(TINY.layers) for w in send_layer(c, layer, [6, 1], 1)]
            for w in works:
                w.wait()
        else:
            receive_request(c, [0, 5], 0)
        torch.cuda.synchronize()
        torch.save({"k": [k.cpu() for k in c.k], "v": [v.cpu() for v in c.v]},
                   f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_pages_go_between_two_gpus_over_nccl(tmp_path):
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    mp.start_processes(_nccl_rank, args=(tmp_path / "rendezvous", tmp_path), nprocs=2,
                       start_method="spawn")
    sent, got = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for a, b in zip((*sent["k"], *sent["v"]), (*got["k"], *got["v"])):
        assert torch.equal(b[0:16], a[96:112]) and torch.equal(b[80:96], a[16:32])
        assert not b[16:80].any() and not b[96:].any()  # the rest of a zeroed cache
