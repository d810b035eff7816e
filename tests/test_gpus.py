import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec import gpus
from pdmux_triton.spec.models import model_preset


def test_required_presets_exist():
    for name in ("h100-sxm", "h200", "h20", "a100-80gb", "b200"):
        assert gpus.gpu_preset(name).sms > 0


def test_qwen3_8b_sizes():
    m = model_preset("Qwen3-8B")
    # 36 x (QKV 4096x6144 + O 4096x4096 + gate/up/down 3 x 4096x12288) + LM head 151936x4096
    assert m.linear_params == 36 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 12288) + 151936 * 4096
    assert m.kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2


def test_unknown_presets_list_the_known_ones():
    with pytest.raises(PdmuxError, match="unknown GPU 'v100'.*h200"):
        gpus.gpu_preset("v100")


@pytest.mark.parametrize("device_name,preset", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H20", "h20"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA B200", "b200"), ("Tesla T4", None)])
def test_device_names_map_to_presets(device_name, preset):
    assert gpus.preset_for_device_name(device_name) == preset
