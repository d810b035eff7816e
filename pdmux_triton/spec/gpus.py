"""GPUs: presets, and detection of the local GPU (torch imported lazily).

GPU figures are datasheet values (dense bf16, no sparsity) except where a comment says they
were measured; they are starting points for `estimate`, which calibration replaces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdmux_triton.errors import PdmuxError

MAX_SMS = 4096  # more than any GPU has: bounds what an SM count may ask for


@dataclass(frozen=True)
class GPUSpec:
    name: str
    sms: int
    cc: tuple[int, int]
    hbm_tbps: float | None  # None for a detected GPU with no preset: bandwidth unknown
    bf16_tflops: float | None
    l2_mib: float
    memory_gb: float | None = None  # HBM capacity (datasheet GB, or what the device reports)

    def __post_init__(self):  # (presets are checked here too; a result file's inputs arrive here)
        if isinstance(self.sms, bool) or not isinstance(self.sms, int) or not (
                1 <= self.sms <= MAX_SMS):
            raise PdmuxError(f"GPU {self.name}: sms must be an integer in 1..{MAX_SMS}, got "
                             f"{self.sms!r}")
        for key in ("hbm_tbps", "bf16_tflops", "memory_gb", "l2_mib"):
            value = getattr(self, key)
            # (None: not known; an L2 of 0 is what a device that reports none says)
            zero_allowed = key == "l2_mib"
            if value is not None and (
                    isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed)):
                raise PdmuxError(f"GPU {self.name}: {key} must be a finite number "
                                 f"{'>= 0' if zero_allowed else '> 0'}, got {value!r}")

    @property
    def cc_major(self) -> int:
        return self.cc[0]


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("h100-sxm", 132, (9, 0), 3.35, 989.0, 50.0, 80.0),
        # H200: L2 as torch reports it on the test machine (60 MiB).
        GPUSpec("h200", 132, (9, 0), 4.8, 989.0, 60.0, 141.0),
        GPUSpec("h20", 78, (9, 0), 4.0, 148.0, 60.0, 96.0),
        GPUSpec("a100-80gb", 108, (8, 0), 2.039, 312.0, 40.0, 80.0),
        GPUSpec("b200", 148, (10, 0), 8.0, 2250.0, 126.0, 180.0),
    )
}

# Substrings of torch's device name -> preset; first match wins, so more specific names first.
_DEVICE_NAME_PRESETS = (
    ("H200", "h200"),
    ("H20", "h20"),
    ("H100", "h100-sxm"),
    ("A100", "a100-80gb"),
    ("B200", "b200"),
)



def gpu_preset(name: str) -> GPUSpec:
    key = name.strip().lower()
    if key not in GPUS:
        raise PdmuxError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[key]


def preset_for_device_name(device_name: str) -> str | None:
    for needle, preset in _DEVICE_NAME_PRESETS:
        if needle in device_name:
            return preset
    return None


def detect_gpu(device: int = 0) -> GPUSpec:
    """The local GPU as torch sees it: a preset when the name matches, else what torch reports."""
    try:
        import torch
    except ImportError:
        raise PdmuxError("no local GPU: torch is not installed") from None
    if not torch.cuda.is_available():
        raise PdmuxError("no CUDA GPU is visible to torch")
    props = torch.cuda.get_device_properties(device)
    cc = (props.major, props.minor)
    preset = preset_for_device_name(props.name)
    if preset is not None:
        spec = GPUS[preset]
        # Trust the device over the preset for what it reports (a cut-down or MIG part).
        return GPUSpec(spec.name, props.multi_processor_count, cc, spec.hbm_tbps,
                       spec.bf16_tflops, props.L2_cache_size / 2**20, props.total_memory / 1e9)
    return GPUSpec(props.name, props.multi_processor_count, cc, None, None,
                   props.L2_cache_size / 2**20, props.total_memory / 1e9)


def resolve_gpu(name: str) -> GPUSpec:
    """A preset by name, or `local` for the GPU torch sees."""
    if name.strip().lower() != "local":
        return gpu_preset(name)
    try:
        return detect_gpu()
    except PdmuxError as err:
        raise PdmuxError(f"{err}; name a preset instead ({', '.join(GPUS)})") from None
