"""Random paged K/V: every request gets pages of its own, the pool holds them and the spare
ones, shuffle off lays them out in order, and slots()/dense() read what the page table says."""

import pytest
import torch

from pdmux_triton.measure.random_kv import PagedKV, page_table

SHAPES = [([1], 1), ([1], 16), ([7, 97], 1), ([7, 97], 16), ([16, 17, 0, 33], 16)]


def pages_of(table, lens, page_size):
    return [table[b, :-(-n // page_size)].tolist() for b, n in enumerate(lens)]


@pytest.mark.parametrize("spare", [0, 3])
@pytest.mark.parametrize("lens,page_size", SHAPES)
def test_every_request_gets_its_own_pages_of_the_pool(lens, page_size, spare):
    g = torch.Generator().manual_seed(len(lens) * page_size + spare)
    table, total = page_table(lens, page_size, "cpu", spare_pages=spare, generator=g)
    need = [-(-n // page_size) for n in lens]
    assert total == sum(need) + spare
    assert table.dtype == torch.int32 and table.shape == (len(lens), max(1, *need))
    used = [p for pages in pages_of(table, lens, page_size) for p in pages]
    assert len(used) == len(set(used)) == sum(need)  # no page in two places
    assert all(0 <= p < total for p in used)
    for b, n in enumerate(need):
        assert (table[b, n:] == 0).all()  # past a request's pages: zeros


@pytest.mark.parametrize("lens,page_size", SHAPES)
def test_shuffle_off_gives_contiguous_pages_in_request_order(lens, page_size):
    table, total = page_table(lens, page_size, "cpu", shuffle=False, spare_pages=2)
    pages = pages_of(table, lens, page_size)
    assert [p for row in pages for p in row] == list(range(total - 2))


def test_the_shuffle_follows_the_generator():
    def table(seed):
        return page_table([97, 40, 5], 4, "cpu", generator=torch.Generator().manual_seed(seed))[0]

    assert torch.equal(table(1), table(1))
    assert not torch.equal(table(1), table(2))
    assert not torch.equal(table(1), page_table([97, 40, 5], 4, "cpu", shuffle=False)[0])


@pytest.mark.parametrize("lens,page_size", SHAPES)
def test_slots_and_dense_read_the_page_tables_rows(lens, page_size):
    kv = PagedKV(lens, 2, 8, page_size, torch.float32, "cpu", seed=5)
    pages = sum(-(-n // page_size) for n in lens) + 3  # and 3 spare pages by default
    assert kv.k_cache.shape == kv.v_cache.shape == (pages * page_size, 2, 8)
    assert (kv.k_cache != 0).all() and (kv.v_cache != 0).all()
    assert kv.seq_lens.tolist() == lens and kv.seq_lens.dtype == torch.int32
    every = []
    for b, n in enumerate(lens):
        want = [int(kv.page_table[b, p // page_size]) * page_size + p % page_size
                for p in range(n)]
        assert kv.slots(b, 0, n).tolist() == want
        assert kv.slots(b, n // 2, n).tolist() == want[n // 2:]
        k, v = kv.dense(b)
        assert k.dtype == v.dtype == torch.float64
        assert torch.equal(k, kv.k_cache[want].double()) and torch.equal(v, kv.v_cache[want].double())
        assert torch.equal(kv.dense(b, n // 2)[0], k[:n // 2])
        every += want
    assert len(every) == len(set(every))  # requests never share a slot


def test_a_seed_makes_the_same_cache_and_k_differs_from_v():
    a = PagedKV([97, 7], 2, 16, 16, torch.float32, "cpu", seed=3)
    b = PagedKV([97, 7], 2, 16, 16, torch.float32, "cpu", seed=3)
    c = PagedKV([97, 7], 2, 16, 16, torch.float32, "cpu", seed=4)
    assert torch.equal(a.page_table, b.page_table)
    assert torch.equal(a.k_cache, b.k_cache) and torch.equal(a.v_cache, b.v_cache)
    assert not torch.equal(a.k_cache, c.k_cache)
    assert not torch.equal(a.k_cache, a.v_cache)


@pytest.mark.parametrize("dtype,element", [(torch.float32, 4), (torch.float16, 2)])
def test_kv_bytes_counts_k_and_v_of_every_token(dtype, element):
    kv = PagedKV([97, 7, 1], 2, 16, 16, dtype, "cpu", spare_pages=0)
    assert kv.kv_bytes() == 2 * (97 + 7 + 1) * 2 * 16 * element


@pytest.mark.gpu
def test_on_the_gpu_the_table_and_caches_live_there_and_dense_comes_back():
    kv = PagedKV([97, 7], 2, 16, 16, torch.bfloat16, "cuda", seed=1)
    assert kv.page_table.is_cuda and kv.k_cache.is_cuda and kv.seq_lens.is_cuda
    k, v = kv.dense(0)
    assert not k.is_cuda and k.dtype == torch.float64 and k.shape == (97, 2, 16)
    assert torch.equal(k, kv.k_cache.cpu()[kv.slots(0, 0, 97)].double())
    again = PagedKV([97, 7], 2, 16, 16, torch.bfloat16, "cuda", seed=1)
    assert torch.equal(again.k_cache, kv.k_cache) and torch.equal(again.v_cache, kv.v_cache)
