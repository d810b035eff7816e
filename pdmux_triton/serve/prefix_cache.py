"""A prefix cache over the KV cache, as SGLang serves by default (its radix cache): the KV of
a prompt's whole blocks stays after its prefill, keyed by the tokens that made it, so a later
prompt that begins with the same blocks computes only the rest.

A block is `block_tokens` long (BLOCK_TOKENS: Mooncake's hash-id block, so a trace's sharing
is what the cache sees). The cache is a tree with a node a cached block, whose children are
the blocks that followed it in some prompt. A request pins the nodes it reads (a reference
count) from its admission to its end, and the nodes its prefill added until its end; nodes
no request pins and with no children are evicted, least recently used first, when admission
needs room. The cache belongs to the serving loop (`scheduler.Engine`), so a simulated clock
and the GPU decide the same on the same requests; an executor keeps each node's pages
(`Executor.keep_prefix`, `drop_prefix`).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Callable, Hashable

import numpy as np

from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec.traffic import HASH_BLOCK_TOKENS, Request

BLOCK_TOKENS = HASH_BLOCK_TOKENS


class Node:
    """One cached block: its key under its parent, the executor's handle on its pages."""

    __slots__ = ("key", "parent", "children", "refs", "last_use", "handle")

    def __init__(self, key: Hashable, parent: "Node | None", handle: object = None):
        self.key, self.parent, self.handle = key, parent, handle
        self.children: dict[Hashable, Node] = {}
        self.refs = 0
        self.last_use = 0


class PrefixCache:
    """Cached blocks, their pins and their eviction order; and what was served from them."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS):
        if block_tokens < 1 or HASH_BLOCK_TOKENS % block_tokens:
            raise PdmuxError(f"a prefix cache block of {block_tokens} tokens; it must divide "
                             f"a trace's {HASH_BLOCK_TOKENS}-token hash-id block")
        self.block = block_tokens
        self.root = Node(None, None)
        self.blocks = 0  # nodes held
        self.unpinned = 0  # of them, pinned by no request
        self._clock = itertools.count(1)  # uses, in order: the LRU order, the same on any clock
        self._order = itertools.count()  # breaks ties in the heap
        self._evictable: list[tuple[int, int, Node]] = []  # (last use, order, node), lazily
        self.pins: dict[int, list[Node]] = {}  # a request's pinned nodes, by id
        self._keys: dict[int, list[Hashable] | None] = {}  # a request's block keys, by id
        # what was served: prompt tokens admitted, of them read from the cache; blocks evicted
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.evicted_blocks = 0

    # --- keys ----------------------------------------------------------------------------
    def keys(self, r: Request) -> list[Hashable] | None:
        """The keys of the prompt's whole blocks, in order; None where its tokens are its own
        (drawn from its request's stream: no other prompt holds them). Made once a request
        (a waiting prompt is matched every round), until it ends."""
        if r.rid not in self._keys:
            self._keys[r.rid] = self._make_keys(r)
        return self._keys[r.rid]

    def _make_keys(self, r: Request) -> list[Hashable] | None:
        n = r.prompt_len // self.block
        if r.hash_ids is not None:  # a hash id's tokens, and where in them the block begins
            per = HASH_BLOCK_TOKENS // self.block
            return [(r.hash_ids[k // per], k % per) for k in range(n)]
        if not r.ids_given:
            return None
        ids = np.asarray(r.prompt[:n * self.block], dtype=np.int64).reshape(n, self.block)
        return [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in ids]

    # --- admission -----------------------------------------------------------------------
    def match(self, r: Request) -> list[Node]:
        """The longest run of the prompt's blocks cached from its start, short of its last
        token (a prefill computes at least one, to sample from)."""
        keys = self.keys(r)
        if not keys:
            return []
        keys = keys[:(r.prompt_len - 1) // self.block]
        found, node = [], self.root
        for key in keys:
            node = node.children.get(key)
            if node is None:
                break
            found.append(node)
        return found

    def admit(self, r: Request, nodes: list[Node]) -> None:
        """`r` is admitted reading `nodes` (what `match` gave): they are pinned until it ends,
        and its prefill computes the rest of its prompt."""
        for node in nodes:
            self._pin(node)
        self.pins[r.rid] = list(nodes)
        r.cached_len = len(nodes) * self.block
        r.prefix = tuple(node.handle for node in nodes)
        self.prompt_tokens += r.prompt_len
        self.cached_tokens += r.cached_len

    def evictable_tokens(self) -> int:
        """Tokens that eviction could free now: every unpinned node's (a request pins a chain
        from the root, so no unpinned node holds a pinned one below it)."""
        return self.block * self.unpinned

    def evict(self, tokens: int, drop: Callable[[object], None]) -> int:
        """Evict unpinned leaves, least recently used first, until `tokens` are free or none
        is left; `drop` hands each one's pages back. Returns the tokens freed."""
        freed = 0
        while freed < tokens and self._evictable:
            last_use, _, node = heapq.heappop(self._evictable)
            if node.refs or node.children or node.last_use != last_use or node.parent is None:
                continue  # pinned, a parent, used again since, or gone: a stale entry
            del node.parent.children[node.key]
            parent, node.parent = node.parent, None
            drop(node.handle)
            self.blocks -= 1
            self.unpinned -= 1
            self.evicted_blocks += 1
            freed += self.block
            if parent is not self.root and parent.refs == 0 and not parent.children:
                self._push(parent)
        return freed

    # --- after the prefill ---------------------------------------------------------------
    def insert(self, r: Request, keep: Callable[[int, int], object]) -> int:
        """`r`'s prefill is done: its whole blocks past the cached ones join the cache, pinned
        until it ends (a block another request added meanwhile stays `r`'s own copy, and the
        cached one is pinned instead, so pins stay chains from the root). `keep(start, end)`
        hands the pages of its tokens [start, end) to the cache and returns their handle.
        Returns the tokens that moved from the request to the cache."""
        keys = self.keys(r)
        if not keys:
            return 0
        pinned = self.pins.setdefault(r.rid, [])
        node = pinned[-1] if pinned else self.root  # what it read at admission, pinned since
        moved = 0
        for k in range(len(pinned), len(keys)):
            child = node.children.get(keys[k])
            if child is None:
                child = node.children[keys[k]] = Node(keys[k], node, keep(k * self.block,
                                                                          (k + 1) * self.block))
                self.blocks += 1
                self.unpinned += 1  # until pinned, next
                moved += self.block
            self._pin(child)
            pinned.append(child)
            node = child
        return moved

    def finish(self, r: Request) -> None:
        """`r` ended: its pins are released (its blocks stay, evictable once unpinned)."""
        self._keys.pop(r.rid, None)
        for node in reversed(self.pins.pop(r.rid, ())):  # the deepest first: used last
            node.refs -= 1
            node.last_use = next(self._clock)
            if node.refs == 0:
                self.unpinned += 1
                if not node.children:
                    self._push(node)

    def _pin(self, node: Node) -> None:
        self.unpinned -= node.refs == 0
        node.refs += 1
        node.last_use = next(self._clock)

    def _push(self, node: Node) -> None:
        heapq.heappush(self._evictable, (node.last_use, next(self._order), node))

    def clear(self, drop: Callable[[object], None]) -> None:
        """Every block evicted (the run is over: each run starts with an empty cache); not
        counted as evictions."""
        if self.pins:
            raise PdmuxError(f"{len(self.pins)} request(s) still read the prefix cache")
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            drop(node.handle)
            stack.extend(node.children.values())
        self.root.children.clear()
        self.blocks = self.unpinned = 0
        self._evictable.clear()
        self._keys.clear()

    def stats(self) -> dict:
        """What the run read from the cache: its hit rate (cached prompt tokens over prompt
        tokens admitted), the tokens, and the blocks evicted."""
        return {"block_tokens": self.block, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens,
                "hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
                "evicted_blocks": self.evicted_blocks}
