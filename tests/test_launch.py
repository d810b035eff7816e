"""What every launcher shares (kernels/_launch.py): per-stream arrival counters that each call
leaves zero, so captured graphs replay exactly."""

import pytest
import torch
from conftest import HAS_CUDA
from reference import assert_close

from pdmux_triton.kernels import decode_attention, linear
from pdmux_triton.kernels._launch import arrival_counters
from pdmux_triton.measure.random_kv import PagedKV

BF16 = torch.bfloat16
DEV = "cuda" if HAS_CUDA else "cpu"


def test_arrival_counters_made_once_per_stream_and_grown_zeroed():
    dev = torch.device(DEV)
    a = arrival_counters(8, dev)
    assert arrival_counters(8, dev) is a and (a == 0).all()
    b = arrival_counters(a.numel() + 1, dev)  # outgrown: a new zeroed buffer
    assert b is not a and b.numel() > a.numel() and (b == 0).all()
    assert arrival_counters(8, dev) is b


@pytest.mark.gpu
@pytest.mark.parametrize("warm_up_on_capture_stream", [True, False])
def test_counted_merges_replay_from_a_cuda_graph(warm_up_on_capture_stream):
    """Decode attention and the skinny GEMM's even split finish cut pieces through per-stream
    arrival counters that each call leaves zero: replays of a captured graph on new inputs stay exact,
    whether the counters were made before the capture (warm-up on the capturing stream) or
    inside it (zeroed by the graph itself)."""
    torch.manual_seed(1)
    kv = PagedKV([3000, 17, 900, 5000], 8, 128, 16, BF16, "cuda")
    lens = torch.tensor(kv.lens, dtype=torch.int32, device="cuda")
    q = torch.randn(4, 32, 128, dtype=BF16, device="cuda")
    x = torch.randn(8, 4096, dtype=BF16, device="cuda")
    w = torch.randn(1024, 4096, dtype=BF16, device="cuda") / 64  # 16 tiles: split on any GPU
    stream = torch.cuda.Stream()

    def step():
        return (decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, lens, 16, 5000),
                linear(x, w))
    if warm_up_on_capture_stream:
        with torch.cuda.stream(stream):
            step()
        stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        att, y = step()
    for _ in range(2):
        q.normal_()
        x.normal_()
        graph.replay()
        torch.cuda.synchronize()
        ref_att = decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, lens, 16, 5000)
        torch.testing.assert_close(att, ref_att, rtol=0, atol=0)  # same kernel, same order
        assert_close(y, x.double() @ w.double().T, BF16)
