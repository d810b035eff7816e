"""The offline compile diagnostic runs on any machine: it needs Triton's bundled ptxas, no GPU."""

import os
import subprocess
import sys


def test_decode_kernel_compiles_for_sm90_offline():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "bench/profile_decode.py", "--offline"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "cp.async (to shared)" in out.stdout and "shared buffers" in out.stdout
    assert "128x128xbf16" in out.stdout  # K/V tiles staged in shared memory
    assert "gemm prefill 128x256x64" in out.stdout and "wgmma 0" in out.stdout
