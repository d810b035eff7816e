"""Partition plans: which kind, how many SMs each side gets, and when a level is the whole GPU."""

import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.partition import Budget, PartitionSpec, for_level, whole

H100 = sglang_rules.stream_groups(132, 9)


def test_for_level_maps_every_level():
    assert for_level(H100[0], "green") == whole(132)
    assert for_level(H100[7], "grid_cap") == whole(132)
    spec = for_level(H100[5], "green")
    assert (spec.kind, spec.prefill_sms, spec.decode_sms, spec.split_first) == ("green", 80, 52, "prefill")
    for level in H100[1:-1]:  # every SGLang level is a split the driver can make
        for_level(level, "green").check_green(9)
    # a decode budget of the whole GPU (a calibration point) is the whole GPU too
    assert for_level((0, 132), "green", split_first="decode").whole_gpu


def test_pinned_levels_put_decode_on_the_first_sites():
    spec = for_level(H100[5], "pinned")
    assert (spec.kind, spec.prefill_sms, spec.decode_sms) == ("pinned", 80, 52)
    assert spec.first_sites == (52, 0)  # decode on sites 0..51, prefill on 52..131
    assert for_level(H100[3], "pinned", 132).first_sites == (H100[3][1], 0)
    assert for_level(H100[0], "pinned") == whole(132)
    assert for_level(H100[5], "grid_cap").first_sites == (None, None)  # the hardware places
    with pytest.raises(PdmuxError, match="num_sms with first_site"):
        Budget(first_site=80)
    # both sides of a pinned split index the site order headed by its decode size
    assert for_level(H100[5], "pinned").site_head == 52
    assert for_level(H100[5], "green").site_head is None
    with pytest.raises(PdmuxError, match="give first_site too"):
        Budget(52, site_head=52)
    with pytest.raises(PdmuxError, match="attention_ctas_per_sm must be an integer >= 1"):
        Budget(52, attention_ctas_per_sm=0)
    with pytest.raises(PdmuxError, match="ctas_per_sm must be an integer >= 1"):
        Budget(52, ctas_per_sm=True)


def test_launches_overlap_only_where_the_hardware_confines_them():
    """PDL's waiting programs land wherever there is room: on the whole GPU and green contexts
    that is the side's SMs, under a grid cap or a pinned gate it is not."""
    assert whole(132).overlaps_launches(9)
    assert for_level(H100[5], "green").overlaps_launches(9)
    assert not for_level(H100[5], "grid_cap").overlaps_launches(9)
    assert not for_level(H100[5], "pinned").overlaps_launches(9)
    assert not whole(108).overlaps_launches(8)  # griddepcontrol needs sm_90


def test_served_decode_attention_runs_three_programs_an_sm_where_a_partition_keeps_them():
    assert for_level(H100[5], "green").served_attention_ctas == 3
    assert for_level(H100[5], "pinned").served_attention_ctas == 3
    assert for_level(H100[5], "grid_cap").served_attention_ctas is None  # 3k would spread
    assert whole(132).served_attention_ctas is None
    with pytest.raises(PdmuxError, match="pinned budget cannot overlap launches"):
        Budget(52, first_site=0, pdl=True)


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
