"""GPU presets and the device names that map to them."""

import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec import gpus


def test_required_presets_exist():
    for name in ("h100-sxm", "h200", "h20", "a100-80gb", "b200"):
        assert gpus.gpu_preset(name).sms > 0


def test_unknown_presets_list_the_known_ones():
    with pytest.raises(PdmuxError, match="unknown GPU 'v100'.*h200"):
        gpus.gpu_preset("v100")


@pytest.mark.parametrize("device_name,preset", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H20", "h20"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA B200", "b200"), ("Tesla T4", None)])
def test_device_names_map_to_presets(device_name, preset):
    assert gpus.preset_for_device_name(device_name) == preset


@pytest.mark.parametrize("field, value, message", [
    ("sms", 0, "sms must be an integer in 1..4096, got 0"),
    ("sms", 5000, "got 5000"),
    ("sms", 66.5, "got 66.5"),
    ("hbm_tbps", 0.0, "hbm_tbps must be a finite number > 0, got 0.0"),
    ("bf16_tflops", float("inf"), "bf16_tflops must be a finite number > 0, got inf"),
    ("memory_gb", -1.0, "memory_gb must be a finite number > 0"),
    ("l2_mib", -1.0, "l2_mib must be a finite number >= 0, got -1.0"),
    ("l2_mib", True, "l2_mib must be a finite number >= 0, got True"),
])
def test_a_gpu_spec_checks_its_fields_as_a_result_file_brings_them(field, value, message):
    """A GPU's fields from a saved run's inputs are checked as the presets are: one line that
    names the GPU, the field and the value; what a detected GPU does not know (None) or an L2
    it reports as 0 stays allowed."""
    import dataclasses
    h200 = gpus.gpu_preset("h200")
    with pytest.raises(PdmuxError, match=message):
        dataclasses.replace(h200, **{field: value})
    unknown = dataclasses.replace(h200, hbm_tbps=None, bf16_tflops=None, memory_gb=None,
                                  l2_mib=0.0)
    assert unknown.sms == 132
