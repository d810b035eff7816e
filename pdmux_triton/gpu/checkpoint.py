"""Weights from a Hugging Face checkpoint: its safetensors (one file, or shards with their
index) read tensor by tensor straight into the kernels' fused layout on the device (q/k/v rows,
gate/up rows), so no second full copy is ever held in host memory. Every tensor the decoder
needs is checked for its shape; a missing one, or one it would not use, is an error naming it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.decoder import Weights, allocatable_bytes
from pdmux_triton.spec.models import ModelSpec

INDEX = "model.safetensors.index.json"
IGNORED = ("rotary_emb.inv_freq",)  # buffers some checkpoints carry; recomputed here


def shard_files(directory: Path) -> list[Path]:
    """The checkpoint's safetensors files: those its index names, or every one there."""
    index = directory / INDEX
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as err:
            raise PdmuxError(f"cannot read {index}: {err}") from None
        missing = [f for f in files if not (directory / f).is_file()]
        if missing:
            raise PdmuxError(f"{index} names shards that are not there: {', '.join(missing)}")
        return [directory / f for f in files]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise PdmuxError(f"{directory} holds no safetensors weights (model.safetensors or "
                         f"shards with {INDEX})")
    return files


class _Layout:
    """Where each checkpoint tensor lands: a destination tensor and its rows there."""

    def __init__(self, spec: ModelSpec, layers: int, device, dtype):
        h, qd, kvd, inter = spec.hidden, spec.q_dim, spec.kv_dim, spec.intermediate

        def empty(*shape):
            return torch.empty(*shape, device=device, dtype=dtype)
        self.embed, self.final_norm = empty(spec.vocab, h), empty(h)
        self.lm_head = self.embed if spec.tie_embeddings else empty(spec.vocab, h)
        self.layers = []
        self.places: dict[str, tuple[torch.Tensor, int, int]] = {
            "model.embed_tokens.weight": (self.embed, 0, spec.vocab),
            "model.norm.weight": (self.final_norm, 0, h)}
        if not spec.tie_embeddings:
            self.places["lm_head.weight"] = (self.lm_head, 0, spec.vocab)
        for i in range(layers):
            layer = {"in_norm": empty(h), "post_norm": empty(h), "qkv": empty(qd + 2 * kvd, h),
                     "o": empty(h, qd), "gate_up": empty(2 * inter, h), "down": empty(h, inter),
                     "q_norm": empty(spec.head_dim), "k_norm": empty(spec.head_dim)}
            p = f"model.layers.{i}."
            rows = {"q": (0, qd), "k": (qd, qd + kvd), "v": (qd + kvd, qd + 2 * kvd)}
            self.places.update({
                p + "input_layernorm.weight": (layer["in_norm"], 0, h),
                p + "post_attention_layernorm.weight": (layer["post_norm"], 0, h),
                **{p + f"self_attn.{n}_proj.weight": (layer["qkv"], *r) for n, r in rows.items()},
                p + "self_attn.o_proj.weight": (layer["o"], 0, h),
                p + "mlp.gate_proj.weight": (layer["gate_up"], 0, inter),
                p + "mlp.up_proj.weight": (layer["gate_up"], inter, 2 * inter),
                p + "mlp.down_proj.weight": (layer["down"], 0, h)})
            if spec.qk_norm:
                self.places[p + "self_attn.q_norm.weight"] = (layer["q_norm"], 0, spec.head_dim)
                self.places[p + "self_attn.k_norm.weight"] = (layer["k_norm"], 0, spec.head_dim)
            else:  # unused by the kernels; ones keep the layer dict whole
                layer["q_norm"].fill_(1)
                layer["k_norm"].fill_(1)
            if spec.qkv_bias:
                layer["qkv_bias"] = empty(qd + 2 * kvd)
                self.places.update({p + f"self_attn.{n}_proj.bias": (layer["qkv_bias"], *r)
                                    for n, r in rows.items()})
            self.layers.append(layer)


def _skipped(name: str, spec: ModelSpec, layers: int) -> bool:
    """Tensors read by nobody: recomputed buffers, layers past a truncated load, a tied head."""
    if name.endswith(IGNORED) or (spec.tie_embeddings and name == "lm_head.weight"):
        return True
    parts = name.split(".")
    return (len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit()
            and layers <= int(parts[2]) < spec.layers)


def load_weights(spec: ModelSpec, directory: str | Path, device, dtype=torch.bfloat16,
                 layers: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> Weights:
    """The checkpoint in `directory` (its first `layers` layers) as the decoder's weights on
    `device`, converted to `dtype`; `progress(shards done, shards)` after each shard."""
    directory, device = Path(directory), torch.device(device)
    n = spec.layers if layers is None else layers
    if not 1 <= n <= spec.layers:
        raise PdmuxError(f"layers must be in 1..{spec.layers}, got {n}")
    files = shard_files(directory)
    need = step_cost.DTYPE_BYTES * (n * spec.layer_linear_params + spec.vocab * spec.hidden
                                    * (1 if spec.tie_embeddings else 2))
    if device.type == "cuda" and need > (free := allocatable_bytes(device)):
        raise PdmuxError(f"{spec.name}'s weights need {need / 2**30:.1f} GiB; the GPU has "
                         f"{free / 2**30:.1f} GiB free")
    layout = _Layout(spec, n, device, dtype)
    loaded, unused = set(), []
    for done, path in enumerate(files, 1):
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                for name in f.keys():
                    if name not in layout.places:
                        if not _skipped(name, spec, n):
                            unused.append(name)
                        continue
                    dst, lo, hi = layout.places[name]
                    t = f.get_tensor(name)
                    want = (hi - lo, *dst.shape[1:])
                    if tuple(t.shape) != want:
                        raise PdmuxError(f"{path.name}: {name} has shape {tuple(t.shape)}, the "
                                         f"config says {want}")
                    dst[lo:hi].copy_(t)
                    loaded.add(name)
                    del t  # one tensor at a time on the way in
        except (OSError, SafetensorError) as err:  # a damaged or truncated file
            raise PdmuxError(f"cannot read {path}: {err}") from None
        if progress is not None:
            progress(done, len(files))
    if unused:
        raise PdmuxError(f"{directory} holds tensors this decoder would not use, e.g. "
                         f"{', '.join(sorted(unused)[:3])}: is the config's model_type right?")
    missing = sorted(set(layout.places) - loaded)
    if missing:
        raise PdmuxError(f"{directory} lacks {len(missing)} tensors the config needs, e.g. "
                         f"{', '.join(missing[:3])}")
    weights = Weights(spec, layout.embed, layout.lm_head, layout.final_norm, layout.layers)
    weights.fold_norm_gains()
    return weights
