"""The root's `kernels/` folder is the package pdmux_triton.kernels; imported as `kernels` from
the repository's root (where Python finds it first) it must leave other packages alone:
transformers depends on Hugging Face's `kernels` and imports it when it builds a model."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BUILD_A_MODEL = """
import kernels, transformers
config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
model = transformers.AutoModelForCausalLM.from_config(config)
print(kernels.__file__, type(model).__name__)
"""

WHICH_KERNELS = "import kernels; print(kernels.__file__, getattr(kernels, 'MARK', None))"


def from_the_root(code, *flags, env=None):
    # `python -c` puts the working directory first on sys.path, as a user's shell at the root does
    out = subprocess.run([sys.executable, *flags, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_transformers_builds_a_model_from_the_repository_root():
    path, model = from_the_root(BUILD_A_MODEL)
    assert model == "LlamaForCausalLM"
    try:
        importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        assert Path(path).parent == ROOT / "kernels"  # nothing else to find: the root's folder
    else:
        assert Path(path).parent != ROOT / "kernels"  # the installed package answered


def test_the_root_hands_the_import_to_a_kernels_package_beyond_it(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("MARK = 'beyond'\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    path, mark = from_the_root(WHICH_KERNELS, "-S", env=env)
    assert (Path(path).parent, mark) == (tmp_path / "kernels", "beyond")


def test_the_root_answers_alone_as_an_empty_module():
    # -S leaves site-packages off sys.path, so no installed `kernels` can be found
    path, mark, names = from_the_root(WHICH_KERNELS + "; print(kernels.__all__)", "-S")
    assert (Path(path).parent, mark, names) == (ROOT / "kernels", "None", "[]")


def test_the_installed_package_has_the_kernels():
    import pdmux_triton.kernels as k

    assert {"linear", "decode_attention", "stream_read"} <= set(k.__all__)
    assert all(callable(getattr(k, name)) or isinstance(getattr(k, name), type)
               for name in k.__all__)
