"""What the compiler made of the decode kernels, and one launch for Nsight Compute.

Prints, for every compiled variant of the decode attention and GEMM kernels: registers,
spills, shared memory, and counts of the instructions that tell whether K/V and weight loads
are pipelined (cp.async / TMA bulk copies, 16-byte global loads, mma vs wgmma, 64-bit integer
multiplies in address math).

    python bench/profile_decode.py                       # compile, run once, print the stats
    ncu --clock-control none -k regex:_decode_kernel -c 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python bench/profile_decode.py --budget 16       # hardware counters of one launch
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernels import paged_cache  # noqa: E402

from pdmux_triton.kernels import decode_attention, linear  # noqa: E402
from pdmux_triton.kernels.decode_attention import _decode_kernel  # noqa: E402
from pdmux_triton.kernels.gemm import _gemm_kernel  # noqa: E402

PTX_PATTERNS = {
    "cp.async (to shared)": r"cp\.async\.(ca|cg)",
    "TMA bulk tensor copy": r"cp\.async\.bulk\.tensor",
    "16-byte global loads": r"ld\.global[\w.]*\.v4\.(b32|u32|f32)",
    "other global loads": r"ld\.global(?![\w.]*\.v4)",
    "mma.sync (Ampere-style)": r"mma\.sync",
    "wgmma (Hopper)": r"wgmma\.mma_async",
    "64-bit multiplies": r"mul\.(wide|lo)\.(s|u)64|mul\.wide\.(s|u)32",
    "barriers": r"bar\.sync|barrier\.sync",
}


def compiled_variants(jit_fn):
    """Every CompiledKernel of a @triton.jit function on the current device."""
    for cache in jit_fn.device_caches.values():
        yield from cache[0].values()


def describe(name: str, kernel) -> None:
    ptx = kernel.asm.get("ptx", "")
    print(f"{name}: regs {kernel.n_regs}, spills {kernel.n_spills}, "
          f"shared {kernel.metadata.shared} B, warps {kernel.metadata.num_warps}, "
          f"stages {kernel.metadata.num_stages}")
    for label, pattern in PTX_PATTERNS.items():
        print(f"    {label:<26} {len(re.findall(pattern, ptx))}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=int, default=132, help="SMs for the launched kernels")
    args = p.parse_args(argv)
    lens = [8192] * 32
    k, v, table = paged_cache(lens, 16)
    q = torch.randn(len(lens), 32, 128, dtype=torch.bfloat16, device="cuda")
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    decode_attention(q, k, v, table, seq, 16, max(lens), num_sms=args.budget)
    x = torch.randn(32, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(24576, 4096, dtype=torch.bfloat16, device="cuda")
    linear(x, w, num_sms=args.budget)
    torch.cuda.synchronize()
    for kernel in compiled_variants(_decode_kernel):
        describe("decode attention", kernel)
    for kernel in compiled_variants(_gemm_kernel):
        describe("gemm", kernel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
