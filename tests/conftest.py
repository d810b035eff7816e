"""Without a CUDA GPU, kernels run under the Triton interpreter: set it before any kernel import."""

import os
import sys
from pathlib import Path

import pytest


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Run from the repository root (python -m pytest), sys.path holds the root, where `kernels/`
# would pass for Hugging Face's `kernels` package, which transformers probes for on import.
# The project is installed (editable): its kernels are pdmux_triton.kernels from anywhere.
ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]

HAS_CUDA = _has_cuda()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _unplanned_gemms():
    """Each test starts with no GEMM planned: tests patch what `gemm.plan` calls (whole_tiles,
    interpreting, the interpreter's SM count), and plans are remembered per problem."""
    gemm = sys.modules.get("pdmux_triton.kernels.gemm")
    if gemm is not None:
        gemm.forget_plans()
