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
