"""Which SMs each side ran on, from the kernels' %smid records."""

import pytest
import torch

from pdmux_triton.kernels import stream_read
from pdmux_triton.measure.telemetry import sm_usage


def test_sm_usage_overlap_and_tpcs():
    u = sm_usage([0, 1, 2, 3, -1], [3, 4, 5, -1, -1])
    assert (u["prefill_sms_used"], u["decode_sms_used"], u["shared_sms"]) == (4, 3, 1)
    assert u["shared_sm_ids"] == [3]
    assert (u["prefill_tpcs"], u["decode_tpcs"], u["shared_tpcs"]) == (2, 2, 1)
    assert "decode_off_side" not in u


def test_sm_usage_counts_records_off_their_side():
    """A pinned launch records an SM a slot: slots run twice on one SM count twice."""
    u = sm_usage([0, 1, 2, 7, 7, -1], [8, 9, 1, 1, -1], sides=([0, 1, 2, 3], {8, 9}))
    assert (u["prefill_off_side"], u["decode_off_side"]) == (2, 2)
    assert u["shared_sm_ids"] == [1]


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [1, 8, 52, 132])
def test_sm_telemetry_covers_every_program(budget):
    ids = torch.full((budget + 4,), -7, dtype=torch.int32, device="cuda")
    grid = stream_read(torch.randn(1 << 24, device="cuda"), num_sms=budget, sm_ids=ids).numel()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert grid == budget
    assert ((ids[:grid] >= 0) & (ids[:grid] < sms)).all()
    assert (ids[grid:] == -7).all()  # nothing past the grid is written
