"""pdmux-triton: measure and tune PD multiplexing (prefill and decode on split SMs of one GPU).

Its folders, bottom to top, are the architecture: spec (what is served on what), cost (what a
step costs), multiplex (how SMs are split), serve (the serving loops), gpu (the model made of
kernels and what runs it), measure (measurements on the GPU), experiments (`run` and
`capacity`), cli. A folder imports only those below it, and nothing outside gpu/ and measure/
imports torch or triton, so the planning commands run anywhere. Kernels live in
`pdmux_triton.kernels`.
"""

from pdmux_triton.errors import PdmuxError

__version__ = "0.1.0"

__all__ = ["PdmuxError", "__version__"]
