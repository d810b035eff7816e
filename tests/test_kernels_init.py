"""The root's `kernels/` folder is the package pdmux_triton.kernels; imported as `kernels` from
the repository's root (where Python finds it first) it must leave other packages alone:
transformers probes for Hugging Face's `kernels` when it builds a model."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BUILD_A_MODEL = """
import kernels, transformers
from transformers.utils.import_utils import is_kernels_available
config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
model = transformers.AutoModelForCausalLM.from_config(config)
print(kernels.__file__, type(model).__name__, is_kernels_available(), kernels.__all__)
"""


def test_transformers_builds_a_model_from_the_repository_root():
    # `python -c` puts the working directory first on sys.path, as a user's shell at the root does
    out = subprocess.run([sys.executable, "-c", BUILD_A_MODEL], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    path, model, available, names = out.stdout.split(maxsplit=3)
    assert Path(path).parent == ROOT / "kernels"  # the root's folder answered the probe
    assert (model, available, names.strip()) == ("LlamaForCausalLM", "False", "[]")


def test_the_installed_package_has_the_kernels():
    import pdmux_triton.kernels as k

    assert {"linear", "decode_attention", "stream_read"} <= set(k.__all__)
    assert all(callable(getattr(k, name)) or isinstance(getattr(k, name), type)
               for name in k.__all__)
