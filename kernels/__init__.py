"""Persistent Triton kernels with a capped grid (installed as `pdmux_triton.kernels`).

Every launcher takes `num_sms` (the SM budget; default the whole GPU) and `ctas_per_sm`, launches
at most num_sms * ctas_per_sm programs that loop over their tiles, and can record each
program's SM id into `sm_ids` (GPU only).
"""

# Run from the repository's root, `import kernels` would find this folder as a second copy of
# the same files (re-jitted kernels, two module objects): there is one name for them.
if __name__ != "pdmux_triton.kernels":
    raise ImportError(f"the kernels are the package pdmux_triton.kernels (install the project, "
                      f"e.g. pip install -e .), not {__name__!r}")

from pdmux_triton.kernels.activation import silu_mul
from pdmux_triton.kernels.decode_attention import decode_attention
from pdmux_triton.kernels._paged import AttnConfig
from pdmux_triton.kernels.gemm import GemmConfig, linear
from pdmux_triton.kernels.kv_cache import store_kv
from pdmux_triton.kernels.prefill_attention import extend_attention
from pdmux_triton.kernels.rmsnorm import rmsnorm
from pdmux_triton.kernels.rotary import rope_, rope_cache
from pdmux_triton.kernels.stream import stream_read

__all__ = ["AttnConfig", "GemmConfig", "decode_attention", "extend_attention", "linear", "rmsnorm", "rope_",
           "rope_cache", "silu_mul", "store_kv", "stream_read"]
