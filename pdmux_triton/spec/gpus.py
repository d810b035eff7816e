"""Facts about GPUs and models: GPU presets, a model's shape (`ModelSpec`; presets and Hugging
Face configs are read in `models`), and detection of the local GPU (torch imported lazily).

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
class RopeScaling:
    """Llama 3's rope scaling (`rope_type` llama3): wavelengths beyond the original context
    are stretched by `factor`, those under it by `high_freq_factor` stay, and between the two
    the frequencies are blended."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int


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
    qkv_bias: bool = False  # Qwen2: the q, k and v projections add a bias
    tie_embeddings: bool = False  # the LM head is the embedding table
    rope_scaling: RopeScaling | None = None
    # tokens a request may hold, prompt and output (`max_position_embeddings`); None: not
    # known (result files written before it was recorded), nothing is checked against it
    max_context: int | None = None

    def __post_init__(self):
        if isinstance(self.rope_scaling, dict):  # as a result file holds it
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))

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
