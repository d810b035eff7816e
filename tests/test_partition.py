import pytest

from pdmux_triton import policy
from pdmux_triton.errors import PdmuxError
from pdmux_triton.partition import PartitionSpec, for_level, whole

H100 = policy.stream_groups(132, 9)


def test_for_level_maps_every_level():
    assert for_level(H100, 0, "green") == whole(132)
    assert for_level(H100, 7, "grid_cap") == whole(132)
    spec = for_level(H100, 5, "green")
    assert (spec.kind, spec.prefill_sms, spec.decode_sms, spec.split_first) == ("green", 80, 52, "prefill")
    spec.check_green(9)  # every SGLang level is a split the driver can make
    for i in range(1, 7):
        for_level(H100, i, "green").check_green(9)


def test_for_level_rejects_missing_levels():
    with pytest.raises(PdmuxError, match="level 8 does not exist; levels are 0..7"):
        for_level(H100, 8, "green")


@pytest.mark.parametrize("kwargs,message", [
    (dict(kind="mig", prefill_sms=80, decode_sms=52), "unknown partition kind 'mig'"),
    (dict(kind="grid_cap", prefill_sms=100, decode_sms=52), "100 \\+ 52 SMs exceed the GPU's 132"),
    (dict(kind="grid_cap", prefill_sms=0, decode_sms=52), "prefill SMs must be an integer in 1..132"),
    (dict(kind="whole", prefill_sms=80, decode_sms=52), "whole-GPU partition gives both sides all"),
    (dict(kind="green", prefill_sms=80, decode_sms=52, split_first="both"), "split_first must be"),
])
def test_bad_specs(kwargs, message):
    with pytest.raises(PdmuxError, match=message):
        PartitionSpec(total_sms=132, **kwargs)


def test_green_split_rules():
    with pytest.raises(PdmuxError, match="prefill 84 is off the granularity"):
        PartitionSpec("green", 84, 48, 132).check_green(9)
    with pytest.raises(PdmuxError, match="gives decode the remainder, 52 SMs, not 40"):
        PartitionSpec("green", 80, 40, 132).check_green(9)
    # a calibration sweep splits decode off first: any multiple of 8, prefill the rest
    PartitionSpec("green", 108, 24, 132, split_first="decode").check_green(9)
    with pytest.raises(PdmuxError, match="decode 20 is off the granularity"):
        PartitionSpec("green", 112, 20, 132, split_first="decode").check_green(9)
    # Ampere splits in steps of 2 with parts of at least 4
    PartitionSpec("green", 84, 24, 108).check_green(8)


def test_opening_without_a_gpu_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(PdmuxError, match="needs a CUDA GPU"):
        PartitionSpec("grid_cap", 80, 52, 132).open()
