"""Segments allocated inside a measured run, put to the stream that took them (the GPU side of
the watch is in test_executors)."""

from pdmux_triton.gpu.alloc_watch import MIB, new_segments_by_stream


def segment(address: int, stream: int, mib: float, pool=(0, 0)) -> dict:
    return {"address": address, "stream": stream, "total_size": int(mib * MIB),
            "segment_pool_id": pool}


def test_only_new_segments_count_by_their_streams_name():
    before = {(0x1000, 20 * MIB, 7), (0x2000, 2 * MIB, 9), (0x9000, 2 * MIB, 7)}
    after = [segment(0x1000, 7, 20), segment(0x2000, 9, 2),  # held before: not counted
             segment(0x9000, 7, 20),  # given back inside and taken again, larger: a new one
             segment(0x3000, 7, 20), segment(0x4000, 7, 2), segment(0x5000, 9, 2),
             segment(0x6000, 0, 64), segment(0x7000, 11, 4),
             segment(0x8000, 9, 6, pool=(0, 3))]
    names = {7: "prefill, 112 SMs", 9: "decode, 20 SMs"}
    assert new_segments_by_stream(before, after, names) == {
        "prefill, 112 SMs": {"segments": 3, "mib": 42.0},
        "decode, 20 SMs": {"segments": 1, "mib": 2.0},
        "decode, 20 SMs, a graph's pool": {"segments": 1, "mib": 6.0},
        "the default stream": {"segments": 1, "mib": 64.0},
        "stream 0xb": {"segments": 1, "mib": 4.0}}


def test_nothing_new_is_an_empty_table():
    after = [segment(0x1000, 7, 20)]
    assert new_segments_by_stream({(0x1000, 20 * MIB, 7)}, after, {7: "prefill, 112 SMs"}) == {}
    assert new_segments_by_stream(set(), [], {}) == {}
