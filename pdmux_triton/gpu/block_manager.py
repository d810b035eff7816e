"""Pages of the paged KV cache: which pages each request owns, which the prefix cache holds,
and which are free."""

from __future__ import annotations

import numpy as np

from pdmux_triton.errors import PdmuxError


class BlockManager:
    """A free list, and each request's pages in order.

    The last page is never handed out: it is the scratch page that padded rows of a captured
    decode batch point at, so warm-up and padding writes never touch a request's tokens.
    Pages the prefix cache holds (`keep`) stay when the request that wrote them, or any that
    read them, is released; they are free again only when the cache drops them.
    """

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 2:
            raise PdmuxError(f"a KV cache needs at least 2 pages (one is scratch), got {num_pages}")
        self.page_size = page_size
        self.scratch_page = num_pages - 1
        self.free_pages = list(range(num_pages - 2, -1, -1))
        self.owned: dict[int, list[int]] = {}
        self.cached: set[int] = set()  # pages the prefix cache holds

    def begin(self, rid: int, prefix: list[int]) -> None:
        """A request's page table begins with the cached pages of its prompt's prefix."""
        if rid in self.owned:
            raise PdmuxError(f"request {rid} already holds pages")
        self.owned[rid] = list(prefix)

    def keep(self, rid: int, start: int, end: int) -> list[int]:
        """The prefix cache takes the pages of the request's positions [start, end)."""
        ps = self.page_size
        if start % ps or end % ps:
            raise PdmuxError(f"a cached block [{start}, {end}) must begin and end on a page of "
                             f"{ps} tokens")
        pages = self.owned[rid][start // ps:end // ps]
        self.cached.update(pages)
        return pages

    def drop(self, pages: list[int]) -> None:
        """The prefix cache evicted these pages: free."""
        if not self.cached.issuperset(pages):
            raise PdmuxError(f"pages {sorted(set(pages) - self.cached)} are not the prefix "
                             f"cache's to free")
        self.cached.difference_update(pages)
        self.free_pages.extend(reversed(pages))

    def reserve(self, rid: int, tokens: int) -> list[int]:
        pages = self.owned.setdefault(rid, [])
        need = -(-tokens // self.page_size) - len(pages)
        if need > len(self.free_pages):
            raise PdmuxError(f"the KV cache is full: request {rid} needs {need} more pages of "
                             f"{self.page_size} tokens, {len(self.free_pages)} are free")
        for _ in range(max(0, need)):
            pages.append(self.free_pages.pop())
        return pages

    def slot(self, rid: int, pos: int) -> int:
        """The cache slot of one position (a decode step's new token: no array needed)."""
        return self.owned[rid][pos // self.page_size] * self.page_size + pos % self.page_size

    def slots(self, rid: int, start: int, end: int) -> np.ndarray:
        """Cache slots of the request's positions [start, end), as slot() maps each."""
        pos, ps = np.arange(start, end), self.page_size
        return np.asarray(self.owned[rid], dtype=np.int64)[pos // ps] * ps + pos % ps

    def release(self, rid: int) -> None:
        self.free_pages.extend(p for p in reversed(self.owned.pop(rid, [])) if p not in self.cached)
