"""The KV cache's pages: reserved in order, released whole, the scratch page never handed out."""

import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.block_manager import BlockManager


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


def test_pages_the_prefix_cache_holds_outlive_their_requests():
    bm = BlockManager(num_pages=9, page_size=4)  # page 8 is scratch
    bm.reserve(1, 10)  # pages 0 1 2
    kept = bm.keep(1, 0, 8)  # its first two pages: a cached block
    assert kept == [0, 1] and bm.cached == {0, 1}
    bm.release(1)
    assert sorted(bm.free_pages) == [2, 3, 4, 5, 6, 7]  # the cached pages stay out
    bm.begin(2, kept)  # a prompt that reads them, then computes the rest
    assert bm.reserve(2, 12) == [0, 1, 2] and bm.slot(2, 9) == 9
    with pytest.raises(PdmuxError, match="request 2 already holds pages"):
        bm.begin(2, [])
    with pytest.raises(PdmuxError, match=r"a cached block \[2, 8\) must begin and end on a page"):
        bm.keep(2, 2, 8)
    bm.release(2)
    bm.drop(kept)
    assert sorted(bm.free_pages) == list(range(8)) and not bm.cached
