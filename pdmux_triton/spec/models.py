"""Model shapes (`ModelSpec`) from Hugging Face configs: the presets (`model_presets.json`, the fields a
config.json holds) and a user's model directory or config.json, checked for what this tool's
decoder runs.

Supported: Qwen3 dense (q/k norm), Llama 3.x (including `rope_scaling` llama3), Qwen2/2.5
(q/k/v bias) and Mistral (Llama's layout), tied embeddings, `head_dim` given or hidden size /
heads. Anything else (experts, sliding windows, other rope types or activations, biases a
family does not have) is an error naming the field and what is supported. Pure: no torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from pdmux_triton.errors import PdmuxError


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
        # (a preset and a config.json are checked as read; a result file's inputs arrive here)
        for key in ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "intermediate",
                    "vocab"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PdmuxError(f"model {self.name}: {key} must be an integer >= 1, got "
                                 f"{value!r}")
        for key in ("rope_theta", "rms_eps"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 < value < math.inf):
                raise PdmuxError(f"model {self.name}: {key} must be a finite number > 0, got "
                                 f"{value!r}")
        if self.q_heads % self.kv_heads:
            raise PdmuxError(f"model {self.name}: q_heads {self.q_heads} is not a multiple of "
                             f"kv_heads {self.kv_heads}")

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



# what each family's decoder adds to the common Llama layout
FAMILIES = {"qwen3": {"qk_norm": True}, "llama": {}, "qwen2": {"qkv_bias": True},
            "mistral": {}}
EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
PRESETS_FILE = Path(__file__).with_name("model_presets.json")


def _field(config: dict, key: str, kind: type, where: str, low: float = 1,
           above: bool = False):
    value = config.get(key)
    if value is None:
        raise PdmuxError(f"{where} lacks {key}: is it a decoder's config.json?")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            kind is int and value != int(value)) or not (
            value > low if above else value >= low) or not math.isfinite(value):
        raise PdmuxError(f"{where}: {key} must be {'an integer' if kind is int else 'a number'} "
                         f"{'>' if above else '>='} {low:g}, got {value!r}")
    return kind(value)


def _rope(config: dict, where: str) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling: top-level fields (transformers 4) or `rope_parameters` (5)."""
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise PdmuxError(f"{where}: rope_theta must be a number > 0, got {theta!r}")
    scaling = config.get("rope_scaling") or params
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise PdmuxError(f"{where}: rope type {kind!r} is not supported (default or llama3)")
    try:
        return float(theta), RopeScaling(float(scaling["factor"]),
                                         float(scaling["low_freq_factor"]),
                                         float(scaling["high_freq_factor"]),
                                         int(scaling["original_max_position_embeddings"]))
    except (KeyError, TypeError, ValueError):
        raise PdmuxError(f"{where}: llama3 rope scaling needs factor, low_freq_factor, "
                         f"high_freq_factor and original_max_position_embeddings") from None


def _refuse_unsupported(config: dict, family: str, where: str) -> None:
    for key in EXPERT_FIELDS:
        if config.get(key):
            raise PdmuxError(f"{where}: {key} {config[key]!r}: mixture-of-experts models are "
                             f"not supported (dense {', '.join(FAMILIES)} only)")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise PdmuxError(f"{where}: hidden_act {act!r} is not supported (silu)")
    if config.get("use_sliding_window") or (family == "mistral" and config.get("sliding_window")):
        window = config.get("sliding_window")
        raise PdmuxError(f"{where}: sliding_window {window!r}: sliding-window attention is not "
                         f"supported (full attention only: sliding_window null)")
    layers = config.get("layer_types") or []
    if any(t != "full_attention" for t in layers):
        raise PdmuxError(f"{where}: layer_types {sorted(set(layers))}: only full_attention "
                         f"layers are supported")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise PdmuxError(f"{where}: {key} true is not supported for {family} (Qwen2's "
                             f"q/k/v bias is the one bias this decoder adds)")


def spec_from_config(config: dict, name: str, where: str) -> ModelSpec:
    """The shape of the decoder a Hugging Face config describes."""
    if not isinstance(config, dict):
        raise PdmuxError(f"{where} holds a JSON {type(config).__name__}, not a config object")
    family = config.get("model_type")
    if family not in FAMILIES:
        raise PdmuxError(f"{where}: model_type {family!r} is not supported "
                         f"({', '.join(FAMILIES)})")
    _refuse_unsupported(config, family, where)
    hidden = _field(config, "hidden_size", int, where)
    heads = _field(config, "num_attention_heads", int, where)
    kv_heads = (_field(config, "num_key_value_heads", int, where)
                if config.get("num_key_value_heads") is not None else heads)
    if heads % kv_heads:
        raise PdmuxError(f"{where}: num_attention_heads {heads} is not a multiple of "
                         f"num_key_value_heads {kv_heads}")
    if config.get("head_dim") is not None:
        head_dim = _field(config, "head_dim", int, where)
    elif hidden % heads:
        raise PdmuxError(f"{where}: no head_dim, and hidden_size {hidden} is not a multiple of "
                         f"num_attention_heads {heads}")
    else:
        head_dim = hidden // heads
    if head_dim % 2:
        raise PdmuxError(f"{where}: head_dim {head_dim} must be even (rotary pairs halves)")
    theta, scaling = _rope(config, where)
    # a config without it (old or hand-written) leaves the context length unchecked
    context = (_field(config, "max_position_embeddings", int, where)
               if config.get("max_position_embeddings") is not None else None)
    tied = config.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise PdmuxError(f"{where}: tie_word_embeddings must be true or false, got {tied!r}")
    return ModelSpec(
        name=name, layers=_field(config, "num_hidden_layers", int, where), hidden=hidden,
        q_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        intermediate=_field(config, "intermediate_size", int, where),
        vocab=_field(config, "vocab_size", int, where),
        qk_norm=FAMILIES[family].get("qk_norm", False), rope_theta=theta,
        rms_eps=_field(config, "rms_norm_eps", float, where, low=0, above=True),
        qkv_bias=FAMILIES[family].get("qkv_bias", False), tie_embeddings=tied,
        rope_scaling=scaling, max_context=context)


def _presets() -> dict[str, ModelSpec]:
    data = json.loads(PRESETS_FILE.read_text())
    return {name: spec_from_config(config, name, f"preset {name}")
            for name, config in data.items() if not name.startswith("_")}


MODELS: dict[str, ModelSpec] = _presets()


def model_preset(name: str) -> ModelSpec:
    key = name.strip().lower()
    if key not in MODELS:
        raise PdmuxError(f"unknown model {name!r}; known: {', '.join(MODELS)}, or a Hugging "
                         f"Face model directory or config.json")
    return MODELS[key]


def config_path(text: str) -> Path | None:
    """The config.json a --model value names, if it names a path (a directory holding one, or
    the file); None for a preset name."""
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PdmuxError(f"{path} holds no config.json: is it a Hugging Face model directory?")
        return path / "config.json"
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise PdmuxError(f"cannot read model config {path}: no such file")
        if not path.is_file():  # /dev/null, a pipe: there, but not a file to read a config from
            raise PdmuxError(f"--model {path} is neither a config.json nor a Hugging Face model "
                             f"directory")
        return path
    return None


def resolve_model(text: str) -> ModelSpec:
    """A preset by name, or the model a Hugging Face directory or config.json describes."""
    path = config_path(text)
    if path is None:
        return model_preset(text)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PdmuxError(f"cannot read model config {path}: {err}") from None
    name = path.parent.name if path.name == "config.json" else path.stem
    return spec_from_config(config, name or "model", str(path))
