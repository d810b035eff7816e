"""Open partitions on the GPU: green contexts realize their split and keep the two sides on
disjoint SMs; without a GPU, opening one is a clear error."""

import pytest
import torch

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.streams import PartitionPool, PartitionStreams
from pdmux_triton.kernels import linear, stream_read
from pdmux_triton.measure.telemetry import probe
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.partition import PartitionSpec, for_level


def _sms():
    return torch.cuda.get_device_properties(0).multi_processor_count


def _groups():
    return sglang_rules.stream_groups(_sms(), torch.cuda.get_device_capability(0)[0])


def test_kernel_args_of_capped_and_pinned_budgets():
    from pdmux_triton.gpu.streams import kernel_args
    from pdmux_triton.kernels._pinned import Pinned
    from pdmux_triton.multiplex.partition import Budget

    assert kernel_args(Budget(52, 2)) == {"num_sms": 52, "ctas_per_sm": 2, "pdl": False}
    assert kernel_args(Budget()) == {"num_sms": None, "ctas_per_sm": 1, "pdl": False}
    assert kernel_args(Budget(pdl=True))["pdl"] is True  # launches overlapped on the whole GPU
    # decode attention's own programs an SM; the other kernels keep the budget's
    served = Budget(20, 1, attention_ctas_per_sm=3)
    assert kernel_args(served)["ctas_per_sm"] == 1
    assert kernel_args(served, attention=True)["ctas_per_sm"] == 3
    assert kernel_args(Budget(20, 2), attention=True)["ctas_per_sm"] == 2
    pinned = kernel_args(Budget(52, 2, first_site=80))
    assert pinned == {"num_sms": None, "ctas_per_sm": 2, "pinned": Pinned(80, 52)}
    assert kernel_args(Budget(80, first_site=52, site_head=52))["pinned"] == Pinned(52, 80, head=52)
    assert kernel_args(Budget(52, 2, first_site=80))["pinned"] is pinned["pinned"]  # made once


def test_opening_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(PdmuxError, match="needs a CUDA GPU"):
        PartitionStreams.open(PartitionSpec("grid_cap", 80, 52, 132))


@pytest.mark.gpu
@pytest.mark.parametrize("index", [1, 5, 6])
def test_green_levels_realize_their_split(index):
    groups = _groups()
    with PartitionStreams.open(for_level(groups[index], "green")) as part:
        assert (part.prefill_sms, part.decode_sms) == groups[index]
        assert part.decode_budget.num_sms == groups[index][1]


@pytest.mark.gpu
def test_decode_first_split_for_calibration():
    total = _sms()
    with PartitionStreams.open(PartitionSpec("green", total - 24, 24, total, split_first="decode")) as part:
        assert part.decode_sms == 24 and part.prefill_sms == total - 24


@pytest.mark.gpu
def test_a_pool_opens_each_partition_once():
    pool = PartitionPool()
    try:
        spec = for_level(_groups()[5], "grid_cap")
        assert pool.get(spec) is pool.get(spec)
        whole = pool.get(for_level((_sms(), 0), "green"))
        assert whole.prefill_stream is whole.decode_stream
        # grid-capped levels share one pair of streams (one allocator pool a side), and a whole
        # GPU of either kind runs on their prefill stream
        split, other = pool.get(spec), pool.get(for_level(_groups()[3], "grid_cap"))
        assert (other.prefill_stream, other.decode_stream) == (split.prefill_stream,
                                                               split.decode_stream)
        assert other.prefill_sms != split.prefill_sms
        assert whole.prefill_stream is split.prefill_stream
        # each open stream named by what runs on it (an allocation's owner, in a measured run)
        sms = lambda side: "/".join(map(str, sorted({getattr(p, f"{side}_sms")  # noqa: E731
                                                     for p in (split, other)})))
        assert pool.stream_names() == {
            split.prefill_stream.cuda_stream: f"grid_cap prefill, {sms('prefill')} SMs; the "
                                              f"whole GPU",
            split.decode_stream.cuda_stream: f"grid_cap decode, {sms('decode')} SMs"}
    finally:
        pool.close()


def _usage(kind):
    total = _sms()
    x = torch.randn(8192, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(24576, 4096, dtype=torch.bfloat16, device="cuda")
    buf = torch.randn(1 << 27, device="cuda")
    with PartitionStreams.open(for_level(sglang_rules.stream_groups(total, 9)[5], kind)) as part:
        return probe(part, lambda ids: linear(x, w, num_sms=part.prefill_sms, sm_ids=ids),
                     lambda ids: stream_read(buf, num_sms=part.decode_sms, sm_ids=ids), total)


@pytest.mark.gpu
def test_green_sides_never_share_an_sm():
    u = _usage("green")
    assert u["shared_sms"] == 0
    assert u["prefill_sms_used"] <= 80 and u["decode_sms_used"] <= 52


@pytest.mark.gpu
def test_grid_cap_telemetry_reports_usage():
    u = _usage("grid_cap")  # the hardware places CTAs: overlap is measured, not asserted away
    assert 0 < u["prefill_sms_used"] <= 132 and 0 < u["decode_sms_used"] <= 132


@pytest.mark.gpu
def test_green_sides_overlap_launches_and_compute_what_a_capped_launch_does():
    """A green split's sides launch with PDL from Hopper on (a grid cap's never): a chain of
    GEMMs on the decode side's stream gives the capped launch's result to the bit."""
    from pdmux_triton.gpu.streams import kernel_args

    level = _groups()[5]
    hopper = torch.cuda.get_device_capability(0)[0] >= 9
    with PartitionStreams.open(for_level(level, "grid_cap")) as capped:
        assert not capped.decode_budget.pdl and not capped.prefill_budget.pdl
    x = torch.randn(8, 4096, dtype=torch.bfloat16, device="cuda")
    ws = [torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda") / 64 for _ in range(3)]
    with PartitionStreams.open(for_level(level, "green")) as part:
        budget = part.decode_budget
        assert budget.pdl == hopper and part.prefill_budget.pdl == hopper
        part.decode_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(part.decode_stream):
            y = x
            for w in ws:
                y = linear(y, w, **kernel_args(budget))
        part.decode_stream.synchronize()
    ref = x
    for w in ws:
        ref = linear(ref, w, num_sms=budget.num_sms)
    assert torch.equal(y, ref)
