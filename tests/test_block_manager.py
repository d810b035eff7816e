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
