"""Random K/V for requests of given lengths, laid out in a paged cache: the inputs that kernel
tests, benchmarks and calibration workloads give the attention kernels.

Pages are shuffled by default (a pool after churn, as a real server's is), or contiguous.
Values are random normals, never zeros, so a kernel that skips a page gives a wrong answer.
"""

from __future__ import annotations

import torch


def page_table(lens: list[int], page_size: int, device, shuffle: bool = True,
               spare_pages: int = 0, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, int]:
    """[requests, pages] int32 table giving each request its own pages; returns it and the
    number of pages the pool needs (`spare_pages` unused ones included)."""
    per = [-(-n // page_size) for n in lens]
    total = sum(per) + spare_pages
    order = (torch.randperm(total, generator=generator).tolist() if shuffle
             else list(range(total)))
    table = torch.zeros((len(lens), max([1, *per])), dtype=torch.int32)
    at = 0
    for b, n in enumerate(per):
        table[b, :n] = torch.tensor(order[at:at + n], dtype=torch.int32)
        at += n
    return table.to(device), total


class PagedKV:
    """K/V caches [pages * page_size, kv_heads, head_dim] and the page table of `lens`."""

    def __init__(self, lens, kv_heads: int, head_dim: int, page_size: int, dtype, device,
                 shuffle: bool = True, spare_pages: int = 3, seed: int | None = None):
        self.lens, self.page_size = list(lens), page_size
        g = None if seed is None else torch.Generator().manual_seed(seed)
        self.page_table, pages = page_table(self.lens, page_size, device, shuffle, spare_pages, g)
        shape = (pages * page_size, kv_heads, head_dim)
        gen = None if seed is None else torch.Generator(device=device).manual_seed(seed)
        self.k_cache = torch.randn(shape, dtype=dtype, device=device, generator=gen)
        self.v_cache = torch.randn(shape, dtype=dtype, device=device, generator=gen)
        self.seq_lens = torch.tensor(self.lens, dtype=torch.int32, device=device)

    def slots(self, b: int, start: int, end: int) -> torch.Tensor:
        """Cache slots of request b's positions [start, end)."""
        pos = torch.arange(start, end)
        pages = self.page_table[b].cpu().long()[pos // self.page_size]
        return pages * self.page_size + pos % self.page_size

    def dense(self, b: int, n: int | None = None):
        """Request b's first n (default all) keys and values, in float64 on the CPU."""
        s = self.slots(b, 0, self.lens[b] if n is None else n)
        return self.k_cache.cpu()[s].double(), self.v_cache.cpu()[s].double()

    def kv_bytes(self) -> int:
        """Bytes of K and V a decode step over every request reads."""
        row = self.k_cache[0].numel() * self.k_cache.element_size()
        return 2 * sum(self.lens) * row
