"""pdmux-triton: measure and tune PD multiplexing (prefill and decode on split SMs of one GPU).

Importing the package, `policy`, `hardware` or `estimate` pulls in no torch or triton, so the
planning commands run anywhere. Kernels live in `pdmux_triton.kernels`.
"""

from pdmux_triton.errors import PdmuxError

__version__ = "0.1.0"

__all__ = ["PdmuxError", "__version__"]
