"""New device memory taken while a measured run runs, counted and put to the stream that took
it. The caching allocator keeps a freed block for the stream that allocated it, so a segment
allocated inside a measured run names the side, and the level, whose warm-up left too little
memory in its pool (pd-mux runs each level's prefill and decode on streams of their own)."""

from __future__ import annotations

from collections.abc import Callable

import torch

MIB = 2 ** 20


def new_segments_by_stream(before: set[int], after: list[dict],
                           names: dict[int, str]) -> dict[str, dict]:
    """{stream's name: {"segments": n, "mib": their size}} over the segments of the snapshot
    `after` (`torch.cuda.memory_snapshot()`) whose address is not in `before`; a stream
    `names` lacks is named by its handle, a graph's private pool apart from its stream's."""
    out: dict[str, dict] = {}
    for seg in after:
        if seg["address"] in before:
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
    cudaMalloc), and `by_stream`, those still held at its end by stream
    (`new_segments_by_stream`; `stream_names` is read at the end, when every stream is open)."""

    def __init__(self, stream_names: Callable[[], dict[int, str]]):
        self._names = stream_names
        self.count = 0
        self.by_stream: dict[str, dict] = {}

    def __enter__(self) -> "AllocWatch":
        torch.cuda.synchronize()
        self._allocated = torch.cuda.memory_stats().get("segment.all.allocated", 0)
        self._before = {seg["address"] for seg in torch.cuda.memory_snapshot()}
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize()
        self.count = torch.cuda.memory_stats().get("segment.all.allocated", 0) - self._allocated
        self.by_stream = new_segments_by_stream(self._before, torch.cuda.memory_snapshot(),
                                                self._names())
