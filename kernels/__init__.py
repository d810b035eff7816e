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
    # Imported as `kernels` from the repository's root, where this folder comes first on
    # sys.path and shadows Hugging Face's `kernels` (a dependency of transformers, which imports
    # it when it builds a model). Hand that import to the installed package wherever one is
    # found beyond the root; with none, stay an empty module with no version, which such a probe
    # takes for "not installed". The kernels themselves are one package, pdmux_triton.kernels,
    # so they are not loaded here a second time.
    import importlib.machinery
    import importlib.util
    import os
    import sys

    def _beyond_the_root():
        root = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))
        return [p for p in sys.path if os.path.realpath(p or os.getcwd()) != root]

    _spec = importlib.machinery.PathFinder.find_spec(__name__, _beyond_the_root())
    if _spec is not None:
        _installed = importlib.util.module_from_spec(_spec)
        sys.modules[__name__] = _installed  # the import statement returns what sys.modules holds
        _spec.loader.exec_module(_installed)
    __all__ = []
