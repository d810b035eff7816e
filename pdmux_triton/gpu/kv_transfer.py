"""A prefilled request's KV pages from a prefill rank to a decode rank, layer by layer, over
torch.distributed point-to-point (gloo on CPUs, NCCL on GPUs).

The two ranks keep their own page tables: the prefill rank sends a layer's K and V of the
request's pages, in the request's page order, as soon as that layer has run (so the transfer
overlaps the layers still to come); the decode rank has allocated its own pages for the same
number of tokens and receives into them in the same order. Each side knows the request's
length, so a layer needs no header: two messages, K then V, of `len(pages)` pages.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.decoder import KVCache


def _slots(cache: KVCache, pages: list[int]) -> torch.Tensor:
    """The cache rows of `pages`, page after page."""
    ps = cache.page_size
    if not pages or min(pages) < 0 or max(pages) >= cache.num_pages:
        raise PdmuxError(f"pages must be ids in 0..{cache.num_pages - 1}, got {pages}")
    device = cache.k[0].device
    ids = torch.tensor(pages, dtype=torch.int64, device=device)
    return (ids[:, None] * ps + torch.arange(ps, device=device)).reshape(-1)


def send_layer(cache: KVCache, layer: int, pages: list[int], dst: int, group=None) -> list:
    """Start sending `layer`'s K and V of `pages` to rank `dst`; the sends to wait on."""
    rows = _slots(cache, pages)
    k, v = cache.k[layer][rows], cache.v[layer][rows]  # gathered copies: the cache may move on
    return [dist.isend(k, dst, group=group), dist.isend(v, dst, group=group)]


class LayerReceive:
    """One layer's K and V of a request arriving from rank `src` into this rank's `pages`."""

    def __init__(self, cache: KVCache, layer: int, pages: list[int], src: int, group=None):
        self.cache, self.layer, self.rows = cache, layer, _slots(cache, pages)
        shape = (len(self.rows), *cache.k[layer].shape[1:])
        self.k = torch.empty(shape, dtype=cache.k[layer].dtype, device=cache.k[layer].device)
        self.v = torch.empty_like(self.k)
        self.works = [dist.irecv(self.k, src, group=group), dist.irecv(self.v, src, group=group)]

    def land(self) -> None:
        """Wait for the layer and write it into the pages."""
        for w in self.works:
            w.wait()
        self.cache.k[self.layer][self.rows] = self.k
        self.cache.v[self.layer][self.rows] = self.v


def receive_request(cache: KVCache, pages: list[int], src: int, group=None) -> None:
    """Every layer of one request's KV from rank `src` into `pages` (posted at once, landed
    in layer order: the request may decode once the last one has)."""
    receives = [LayerReceive(cache, i, pages, src, group) for i in range(len(cache.k))]
    for r in receives:
        r.land()
