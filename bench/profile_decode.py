"""What the compiler makes of the decode kernels: with a GPU, or offline for sm_90 on any machine.

Prints registers/shared memory and counts of the instructions that tell whether K/V and
weight loads are pipelined: cp.async / TMA bulk copies, 16-byte vs narrow global loads,
mma.sync vs wgmma, and (offline) the shared-memory buffers of the software pipeline — a
`1x128x128` buffer means one tile in flight, `3x...` three.

    python bench/profile_decode.py --offline             # no GPU needed: compile for sm_90
    python bench/profile_decode.py                       # compile, run once, print the stats
    ncu --clock-control none -k regex:_decode_kernel -c 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python bench/profile_decode.py --budget 16       # hardware counters of one launch
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys

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


def describe_ptx(ptx: str) -> None:
    for label, pattern in PTX_PATTERNS.items():
        print(f"    {label:<26} {len(re.findall(pattern, ptx))}")


def offline(block_n: int, num_warps: int, num_stages: int, prefetch_pages: bool) -> None:
    """Compile the decode attention kernel for sm_90 with the launcher's specialization."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pdmux_triton.kernels.decode_attention import _decode_kernel

    pointers = {"q_ptr": "*bf16", "kc_ptr": "*bf16", "vc_ptr": "*bf16", "pt_ptr": "*i32",
                "len_ptr": "*i32", "o_ptr": "*bf16", "part_o_ptr": "*fp32",
                "part_lse_ptr": "*fp32", "sm_ids_ptr": "*i32"}
    constexprs = {"GROUP": 4, "BLOCK_G": 16, "BLOCK_N": block_n, "D": 128, "DIRECT": False,
                  "PREFETCH_PAGES": prefetch_pages, "RECORD_SM": False}
    names = list(inspect.signature(_decode_kernel.fn).parameters)
    signature = {n: "constexpr" if n in constexprs else pointers.get(n, "i32") for n in names}
    signature["scale_log2"] = "fp32"
    # what a real launch specializes: 16-byte aligned pointers, strides divisible by 16
    aligned = set(pointers) | {"sq_b", "sq_h", "so_b", "so_h", "sc_s", "sc_h", "spt_b", "chunk"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in aligned}
    kernel = triton.compile(ASTSource(_decode_kernel, signature, constexprs, attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    print(f"decode attention, BLOCK_N={block_n}, {num_warps} warps, {num_stages} stages, "
          f"prefetch_pages={prefetch_pages}: shared {kernel.metadata.shared} B")
    describe_ptx(kernel.asm["ptx"])
    buffers = {m for line in kernel.asm["ttgir"].splitlines() if "local_alloc" in line
               for m in re.findall(r"memdesc<([\dx]+x(?:bf16|i32))", line)}
    print(f"    {'shared buffers':<26} {', '.join(sorted(buffers))}")


def on_gpu(budget: int) -> None:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kernels import paged_cache

    from pdmux_triton.kernels import decode_attention, linear
    from pdmux_triton.kernels.decode_attention import _decode_kernel
    from pdmux_triton.kernels.gemm import _gemm_kernel

    lens = [8192] * 32
    k, v, table = paged_cache(lens, 16)
    q = torch.randn(len(lens), 32, 128, dtype=torch.bfloat16, device="cuda")
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    decode_attention(q, k, v, table, seq, 16, max(lens), num_sms=budget)
    x = torch.randn(32, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(24576, 4096, dtype=torch.bfloat16, device="cuda")
    linear(x, w, num_sms=budget)
    torch.cuda.synchronize()
    for name, fn in (("decode attention", _decode_kernel), ("gemm", _gemm_kernel)):
        for cache in fn.device_caches.values():
            for kernel in cache[0].values():
                print(f"{name}: regs {kernel.n_regs}, spills {kernel.n_spills}, shared "
                      f"{kernel.metadata.shared} B, warps {kernel.metadata.num_warps}, stages "
                      f"{kernel.metadata.num_stages}")
                describe_ptx(kernel.asm.get("ptx", ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--offline", action="store_true", help="compile for sm_90 without a GPU")
    p.add_argument("--budget", type=int, default=132, help="SMs for the launched kernels")
    p.add_argument("--block-n", type=int, default=128)
    p.add_argument("--warps", type=int, default=4)
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--prefetch-pages", action="store_true")
    args = p.parse_args(argv)
    if args.offline:
        os.environ.pop("TRITON_INTERPRET", None)
        offline(args.block_n, args.warps, args.stages, args.prefetch_pages)
    else:
        on_gpu(args.budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
