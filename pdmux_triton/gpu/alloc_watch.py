"""New device memory taken while a measured run runs, counted and put to the stream that took
it. The caching allocator keeps a freed block for the stream that allocated it, so a segment
allocated inside a measured run names the side (and, on green contexts, the level) whose
warm-up left too little memory in its pool."""

from __future__ import annotations

from collections.abc import Callable

import torch

MIB = 2 ** 20


def _identity(seg: dict) -> tuple:
    """A segment as the allocator took it (a segment freed and taken again at the same address
    is another one)."""
    return seg["address"], seg["total_size"], seg["stream"]


def new_segments_by_stream(before: set[tuple], after: list[dict],
                           names: dict[int, str]) -> dict[str, dict]:
    """{stream's name: {"segments": n, "mib": their size}} over the segments of the snapshot
    `after` (`torch.cuda.memory_snapshot()`) not in `before` (`_identity`s); a stream `names`
    lacks is named by its handle, a graph's private pool apart from its stream's."""
    out: dict[str, dict] = {}
    for seg in after:
        if _identity(seg) in before:
            continue
        stream = seg["stream"]
        name = names.get(stream, "the default stream" if stream == 0 else f"stream {stream:#x}")
        if tuple(seg.get("segment_pool_id") or (0, 0)) != (0, 0):
            name += ", a graph's pool"
        entry = out.setdefault(name, {"segments": 0, "mib": 0.0})
        entry["segments"] += 1
        entry["mib"] += seg["total_size"] / MIB
    return out


class AllocWatch:
    """Within the block: `count`, the segments the allocator took from the device (each a
    cudaMalloc), `freed` and `retries` (`_counters`), and `by_stream`, those still held at its
    end by stream (one taken and given back inside is counted, not placed;
    `new_segments_by_stream`; `stream_names` is read at the end, when every stream is
    open)."""

    def __init__(self, stream_names: Callable[[], dict[int, str]]):
        self._names = stream_names
        self.count = self.freed = self.retries = 0
        self.by_stream: dict[str, dict] = {}

    def __enter__(self) -> "AllocWatch":
        torch.cuda.synchronize()
        self._stats = _counters()
        self._before = {_identity(seg) for seg in torch.cuda.memory_snapshot()}
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize()
        after = _counters()
        # (a cudaMalloc that failed makes the allocator free every idle cached segment and
        # retry: the retries, and the segments freed, say the pools outgrew the device)
        self.count, self.freed, self.retries = (a - b for a, b in zip(after, self._stats))
        # (a segment missing before is one taken: none taken, nothing to place)
        self.by_stream = new_segments_by_stream(self._before, torch.cuda.memory_snapshot(),
                                                self._names()) if self.count else {}


def _counters() -> tuple[int, int, int]:
    """Segments taken and given back, and the allocator's retries after a failed cudaMalloc,
    so far."""
    stats = torch.cuda.memory_stats()
    return (stats.get("segment.all.allocated", 0), stats.get("segment.all.freed", 0),
            stats.get("num_alloc_retries", 0))

