"""Persistent Triton kernels with a capped grid (installed as `pdmux_triton.kernels`).

Every launcher takes `num_sms` (the SM budget; default the whole GPU) and `ctas_per_sm`, launches
at most num_sms * ctas_per_sm programs that loop over their tiles, and can record each
program's SM id into `sm_ids` (GPU only). With `pinned` (`_pinned.Pinned`) the same work runs
on a fixed set of SMs instead (a range of the device's sites), at most ctas_per_sm on each.
"""

if __name__ == "pdmux_triton.kernels":
    from pdmux_triton.kernels.activation import silu_mul
    from pdmux_triton.kernels.decode_attention import decode_attention
    from pdmux_triton.kernels._paged import AttnConfig
    from pdmux_triton.kernels.gemm import GemmConfig, linear, swiglu_linear
    from pdmux_triton.kernels.prefill_attention import extend_attention
    from pdmux_triton.kernels.rmsnorm import rmsnorm
    from pdmux_triton.kernels.rotary import rope_, rope_cache, rope_store_kv
    from pdmux_triton.kernels.stream import stream_read

    __all__ = ["AttnConfig", "GemmConfig", "decode_attention", "extend_attention", "linear",
               "rmsnorm", "rope_", "rope_cache", "rope_store_kv", "silu_mul", "stream_read",
               "swiglu_linear"]
else:
    # Imported as `kernels` from the repository's root, where this folder shadows any package
    # of that name (transformers probes for Hugging Face's `kernels` and imports it to read its
    # version): an empty module with no version, which such a probe takes for "not installed".
    # The kernels themselves are one package, pdmux_triton.kernels, so they are not loaded
    # here a second time.
    __all__ = []
