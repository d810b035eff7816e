"""Facts about GPUs and models: presets, and detection of the local GPU (torch imported lazily).

GPU figures are datasheet values (dense bf16, no sparsity) except where a comment says they
were measured; they are starting points for `estimate`, which calibration replaces.
"""

from __future__ import annotations

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

    @property
    def cc_major(self) -> int:
        return self.cc[0]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qk_norm: bool  # Qwen3 normalizes q and k per head before rotary
    rope_theta: float
    rms_eps: float = 1e-6

    @property
    def q_dim(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_linear_params(self) -> int:
        qkv = self.hidden * (self.q_dim + 2 * self.kv_dim)
        out = self.q_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down
        return qkv + out + mlp

    @property
    def linear_params(self) -> int:
        """Every weight a token's forward multiplies by: all layers' linears plus the LM head."""
        return self.layers * self.layer_linear_params + self.vocab * self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_dim * dtype_bytes


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

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, True, 1e6),
        # Llama 3.1's long-context rope scaling is not modeled: it changes values, not cost
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, False, 5e5, 1e-5),
        ModelSpec("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936, True, 1e6),
        # Small enough for the Triton interpreter; GQA 4:2 and qk-norm like Qwen3.
        ModelSpec("tiny", 2, 64, 4, 2, 16, 128, 256, True, 1e4),
    )
}


def _lookup(kind: str, table: dict, name: str):
    key = name.strip().lower()
    if key not in table:
        raise PdmuxError(f"unknown {kind} {name!r}; known: {', '.join(table)}")
    return table[key]


def gpu_preset(name: str) -> GPUSpec:
    return _lookup("GPU", GPUS, name)


def model_preset(name: str) -> ModelSpec:
    return _lookup("model", MODELS, name)


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
