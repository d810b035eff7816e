"""What the compiler makes of the decode kernels: with a GPU, or offline for sm_90 on any machine.

Prints registers/shared memory and counts of the instructions that tell whether K/V and
weight loads are pipelined: cp.async / TMA bulk copies, 16-byte vs narrow global loads,
mma.sync vs wgmma, and (offline) the shared-memory buffers of the software pipeline — a
`1x128x128` buffer means one tile in flight, `3x...` three — and the SASS instructions per
warp of the attention's inner loop by opcode (what bounds it at one program per SM).

    python bench/profile_decode.py --offline             # no GPU needed: compile for sm_90
    python bench/profile_decode.py                       # compile, run once, print the stats
    ncu --clock-control none -k regex:decode_kernel -c 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python bench/profile_decode.py --budget 16       # hardware counters of one launch
    ncu --clock-control none -k regex:"skinny_kernel|_stream_read_kernel" -c 2 ... \\
        python bench/profile_decode.py                   # gate-up at M = 32 beside a streaming
                                                         # read of its bytes
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from collections import Counter

# the pinned gates by name (kernels/_pinned.py's CLAIMING, ONE_A_SITE, TAGGED, TAGGED_CLAIMING)
GATES = ("claiming", "one-a-site", "tagged", "tagged-claiming")

PTX_PATTERNS = {
    "cp.async (to shared)": r"cp\.async\.(ca|cg)",
    "TMA bulk tensor copy": r"cp\.async\.bulk\.tensor",
    "16-byte global loads": r"ld\.global[\w.]*\.v4\.(b32|u32|f32)",
    "other global loads": r"ld\.global(?![\w.]*\.v4)",
    "mma.sync (Ampere-style)": r"mma\.sync",
    "wgmma (Hopper)": r"wgmma\.mma_async",
    "64-bit multiplies": r"mul\.(wide|lo)\.(s|u)64|mul\.wide\.(s|u)32",
    "barriers": r"bar\.sync|barrier\.sync",
    "L2 prefetches": r"prefetch\.global\.L2",
}


def describe_ptx(ptx: str) -> None:
    for label, pattern in PTX_PATTERNS.items():
        print(f"    {label:<26} {len(re.findall(pattern, ptx))}")


def inner_loop_sass(sass: str) -> list[str]:
    """The instructions of the attention's inner loop: the shortest span from a label to a
    backward branch to it (nvdisasm's listing: `ctrl<TAB>INSTR;` lines and `LBBn:` labels)
    that holds tensor-core MMAs, which leaves out the one-instruction spin after the exit and
    loops that only store."""
    lines = sass.splitlines()
    labels = {line.strip()[:-1]: i for i, line in enumerate(lines) if re.match(r"^LBB\d+:$", line.strip())}
    loop = None
    for i, line in enumerate(lines):
        m = re.search(r"BRA (LBB\d+);", line)
        if m and labels.get(m.group(1), i) < i - 2:
            start = labels[m.group(1)]
            has_mma = any("MMA" in body for body in lines[start:i])
            if has_mma and (loop is None or i - start < loop[1] - loop[0]):
                loop = (start, i)
    if loop is None:
        return []
    return [line.split("\t", 1)[1] for line in lines[loop[0]:loop[1] + 1] if "\t" in line]


def describe_loop(sass: str) -> None:
    """Instructions per warp per trip of the innermost loop, by opcode: a decode kernel at one
    program per SM is bound by these, not by memory, once its loads are pipelined."""
    body = inner_loop_sass(sass)
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].rstrip(";") for ins in body)
    top = ", ".join(f"{op} {n}" for op, n in ops.most_common(12))
    print(f"    {'inner loop (SASS/warp)':<26} {len(body)}: {top}")


def resource_usage(cubin: bytes) -> str:
    """A cubin's registers a thread and its stack frame (where spilled registers go), as
    cuobjdump reads them (Triton's own figures need a device to load the kernel on)."""
    import subprocess
    import tempfile

    from triton import knobs  # the CUDA tools Triton bundles

    tool = knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    regs, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    return (f"{regs.group(1) if regs else '?'} registers, stack "
            f"{stack.group(1) if stack else '?'} B")


def pinned_constexpr(gate: str | None):
    """The kernels' PINNED constexpr for a gate's name (None: a plain launch). Imported here,
    not at the top: a kernel module imported before TRITON_INTERPRET is cleared builds
    interpreted kernels."""
    from pdmux_triton.kernels._pinned import CLAIMING, ONE_A_SITE, TAGGED, TAGGED_CLAIMING

    kinds = dict(zip(GATES, (CLAIMING, ONE_A_SITE, TAGGED, TAGGED_CLAIMING)))
    return kinds[gate] if gate else False


def offline(block_n: int, num_warps: int, num_stages: int, pinned: str | None = None,
            pdl: bool = False, apart: bool = False) -> None:
    """Compile the decode attention kernel for sm_90 with the launcher's specialization
    (`pinned`: its pinned-partition form with that gate, one of `GATES`; `apart`: with the
    body called as a function of its own, as pinned launches of several programs an SM run it)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pdmux_triton.kernels.decode_attention import PDL_PREFETCH_BLOCKS, UNIT_COST, decode_kernel

    pointers = {"q_ptr": "*bf16", "kc_ptr": "*bf16", "vc_ptr": "*bf16", "pt_ptr": "*i32",
                "len_ptr": "*i32", "o_ptr": "*bf16", "part_o_ptr": "*fp32",
                "part_lse_ptr": "*fp32", "count_ptr": "*i32", "sm_ids_ptr": "*i32",
                "gate_ptr": "*i32", "place_ptr": "*i32"}
    constexprs = {"PAGE_SIZE": 16, "GROUP": 4, "BLOCK_G": 16, "BLOCK_N": block_n, "BLOCK_B": 32,
                  "UNIT_COST": UNIT_COST, "D": 128, "WIDE": False, "RECORD_SM": False,
                  "PINNED": pinned_constexpr(pinned), "PLACED": False,
                  "BLOCK_SMS": 32 if pinned else 1, "PDL": pdl, "APART": apart,
                  "PREFETCH_KEYS": PDL_PREFETCH_BLOCKS * block_n if pdl else 0,
                  "LINES": 2}  # (a bf16 row of 128: 2)
    names = list(inspect.signature(decode_kernel.fn).parameters)
    signature = {n: "constexpr" if n in constexprs else pointers.get(n, "i32") for n in names}
    signature["scale_log2"] = "fp32"
    # what a real launch specializes: 16-byte aligned pointers, strides divisible by 16
    aligned = set(pointers) | {"sq_b", "sq_h", "so_b", "so_h", "sc_s", "sc_h", "spt_b"}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in aligned}
    kernel = triton.compile(ASTSource(decode_kernel, signature, constexprs, attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages,
                                     "launch_pdl": pdl})
    form = ", ".join(name for name, on in ((pinned, pinned), ("pdl", pdl), ("apart", apart)) if on)
    print(f"decode attention{f' ({form})' if form else ''}, BLOCK_N={block_n}, {num_warps} "
          f"warps, {num_stages} stages, shared {kernel.metadata.shared} B, "
          f"{resource_usage(kernel.asm['cubin'])}")
    describe_ptx(kernel.asm["ptx"])
    buffers = {m for line in kernel.asm["ttgir"].splitlines() if "local_alloc" in line
               for m in re.findall(r"memdesc<([\dx]+x(?:bf16|i32))", line)}
    print(f"    {'shared buffers':<26} {', '.join(sorted(buffers))}")
    describe_loop(kernel.asm["sass"])


def offline_gemm(pinned: str | None = None, pdl: bool = False) -> None:
    """The GEMM tiles kernels/gemm.py picks, compiled for sm_90: MMA kind, loads, buffers and
    the decode (skinny) loop's instructions (`pinned`: the pinned-partition form, its gate)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pdmux_triton.kernels.gemm import (PDL_PREFETCH_LINES, GemmConfig, decode_tile, gemm_kernel,
                                           skinny_kernel)

    # (label, tile, SwiGLU epilogue, rows normalized in the loop, residual added in the epilogue)
    tiles = [("M<=16, whole GPU", decode_tile(1, 2, False), False, False, False),
             ("M<=16, small budget", decode_tile(1, 2, True), False, False, False),
             ("M=64, whole GPU", decode_tile(64, 2, False), False, False, False),
             ("M=32 normed QKV, whole GPU", decode_tile(32, 2, False), False, True, False),
             ("M=32 normed SwiGLU, whole GPU", decode_tile(32, 2, False), True, True, False),
             ("M=32 normed SwiGLU, small budget", decode_tile(32, 2, True), True, True, False),
             ("M=32 residual add, whole GPU", decode_tile(32, 2, False), False, False, True),
             ("prefill", GemmConfig(128, 256, 64, 8, 3, group_m=16), False, False, False)]
    for label, cfg, glu, rms, accumulate in tiles:
        fn = skinny_kernel if cfg.skinny else gemm_kernel
        names = list(inspect.signature(fn.fn).parameters)
        constexprs = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                      "HAS_BIAS": False, "ACCUMULATE": accumulate, "RECORD_SM": False,
                      "PINNED": pinned_constexpr(pinned), "PLACED": False,
                      "BLOCK_SMS": 32 if pinned else 1, "PDL": pdl}
        # skinny: whole tiles, the schedule most decode shapes take (a constexpr, as launched)
        constexprs.update({"EVEN_K": True, "WHOLE_TILES": True, "GLU": glu, "RMS": rms,
                           "PREFETCH_LINES": PDL_PREFETCH_LINES if pdl else 0} if cfg.skinny
                          else {"GROUP_M": cfg.group_m})
        kinds = {"x_desc": f"tensordesc<bf16[{cfg.block_m}, {cfg.block_k}]>",
                 "w_desc": f"tensordesc<bf16[{cfg.block_n}, {cfg.block_k}]>", "x_ptr": "*bf16",
                 "w_ptr": "*bf16", "y_ptr": "*bf16", "b_ptr": "*bf16", "part_ptr": "*fp32",
                 "count_ptr": "*i32", "sm_ids_ptr": "*i32", "gate_ptr": "*i32",
                 "place_ptr": "*i32", "eps": "fp32"}
        signature = {n: "constexpr" if n in constexprs else kinds.get(n, "i32") for n in names}
        # what a real launch specializes: 16-byte aligned pointers, strides and K divisible by 16
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                 if n.endswith("_ptr") or n.startswith("stride") or n == "K"}
        kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs),
                                target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
                                         "launch_pdl": pdl})
        ptx = kernel.asm["ptx"]
        buffers = {m for line in kernel.asm["ttgir"].splitlines() if "local_alloc" in line
                   for m in re.findall(r"memdesc<([\dx]+xbf16)", line)}
        print(f"gemm{f' ({pinned})' if pinned else ''}{' (pdl)' if pdl else ''} {label} {cfg.block_m}x{cfg.block_n}x{cfg.block_k}, {cfg.num_warps} warps, "
              f"{'skinny' if cfg.skinny else 'tiles'}: "
              + ", ".join(f"{what} {len(re.findall(pattern, ptx))}"
                          for what, pattern in PTX_PATTERNS.items())
              + f"; buffers {', '.join(sorted(buffers))}; {resource_usage(kernel.asm['cubin'])}")
        if cfg.skinny:
            describe_loop(kernel.asm["sass"])


def on_gpu(budget: int) -> None:
    import torch
    from common import PAGE_SIZE, decode_inputs, require_gpu

    from pdmux_triton.kernels import decode_attention, linear, stream_read
    from pdmux_triton.kernels.decode_attention import decode_kernel
    from pdmux_triton.kernels.gemm import gemm_kernel, skinny_kernel

    require_gpu("bench/profile_decode.py")
    lens = [8192] * 32
    kv, q = decode_inputs(lens)
    decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, PAGE_SIZE, max(lens),
                     num_sms=budget)
    x = torch.randn(32, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(24576, 4096, dtype=torch.bfloat16, device="cuda")
    linear(x, w, num_sms=budget)
    stream_read(w, num_sms=budget)  # the same bytes at a streaming read's rate, for ncu beside
    torch.cuda.synchronize()
    for name, fn in (("decode attention", decode_kernel), ("gemm", gemm_kernel),
                     ("gemm skinny", skinny_kernel)):
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
    p.add_argument("--stages", type=int, default=5)
    p.add_argument("--pinned", nargs="?", const="claiming", choices=GATES,
                   help="with --offline: the kernels' pinned-partition forms, with this gate "
                        "(claiming if none is named)")
    p.add_argument("--pdl", action="store_true",
                   help="with --offline: the kernels' programmatic-dependent-launch forms")
    p.add_argument("--apart", action="store_true",
                   help="with --offline --pinned: decode attention's body called as a function "
                        "of its own, as pinned launches of several programs an SM run it")
    args = p.parse_args(argv)
    if (args.pinned or args.pdl) and not args.offline:
        p.error("--pinned and --pdl compile offline: add --offline")
    if args.pinned and args.pdl:
        p.error("--pinned and --pdl conflict: a pinned launch never overlaps the one before")
    if args.apart and not args.pinned:
        p.error("--apart is a pinned form: add --offline --pinned")
    if args.offline:
        os.environ.pop("TRITON_INTERPRET", None)
        offline(args.block_n, args.warps, args.stages, args.pinned, args.pdl, args.apart)
        offline_gemm(args.pinned, args.pdl)
    else:
        on_gpu(args.budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
