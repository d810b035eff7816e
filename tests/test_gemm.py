import re
from unittest import mock

import pytest
import torch

from conftest import HAS_CUDA
from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels import GemmConfig, gemm, linear, swiglu_linear
from pdmux_triton.kernels.gemm import normalizes_rows
from pdmux_triton.kernels._pinned import Pinned, pinned_gate
from reference import assert_close, placements, poisoned

DEV = "cuda" if HAS_CUDA else "cpu"
CPU_DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("M,N,K", [(1, 40, 64), (7, 33, 128), (97, 64, 80), (255, 48, 96)])
@pytest.mark.parametrize("num_sms", [1, 3, 64])
def test_linear_matches_reference(M, N, K, dtype, num_sms):
    x = torch.randn(M, K, dtype=dtype, device=DEV)
    w = torch.randn(N, K, dtype=dtype, device=DEV) / K ** 0.5
    out = poisoned((M, N), dtype, DEV)
    linear(x, w, out, num_sms=num_sms)
    assert_close(out, x.double() @ w.double().T, dtype)


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize("M,N,K", [(1, 40, 64), (7, 33, 128), (20, 48, 112), (3, 24, 100)])
@pytest.mark.parametrize("num_sms,ctas", [(1, 1), (2, 1), (3, 1), (5, 1), (64, 1), (2, 2)])
def test_skinny_grids(M, N, K, num_sms, ctas, whole):
    # both schedules on every grid. Stream-K: programs of 1 to 16 slabs, tiles whole, cut in
    # two, cut in three; grids above the unit count. K not a multiple of the slab (masked
    # tail), M and N not of the tile (clamped rows)
    from pdmux_triton.kernels import gemm

    x = torch.randn(M, K, device=DEV)
    w = torch.randn(N, K, device=DEV)
    out = poisoned((M, N), torch.float32, DEV)
    with mock.patch.object(gemm, "whole_tiles", return_value=whole):
        linear(x, w, out, num_sms=num_sms, ctas_per_sm=ctas,
               config=GemmConfig(16, 16, 16, 4, 1, skinny=True))
    assert_close(out, x.double() @ w.double().T, torch.float32)


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize("M,N,K,k,ctas,gate", [
    (1, 40, 64, 2, 1, "claiming"), (1, 40, 64, 2, 1, "one a site"), (1, 40, 64, 2, 1, "tagged"),
    (7, 33, 128, 3, 2, "claiming"), (20, 48, 112, 5, 1, "claiming"),
    (20, 48, 112, 5, 1, "one a site"), (20, 48, 112, 5, 1, "tagged")])
def test_pinned_skinny_whoever_survives(M, N, K, k, ctas, gate, whole):
    """On a pinned partition (kernels/_pinned.py) both skinny schedules are exact for any
    placement of the programs, none in the range included (stream-K's cut tiles are merged by
    whichever slot finishes them last), with every gate at one program an SM."""
    from pdmux_triton.kernels import gemm

    x = torch.randn(M, K, device=DEV)
    w = torch.randn(N, K, device=DEV)
    for name, placement in placements(8, ctas, 1, k, seed=M):
        out = poisoned((M, N), torch.float32, DEV)
        with (mock.patch.object(gemm, "whole_tiles", return_value=whole),
              pinned_gate(gate)):
            linear(x, w, out, ctas_per_sm=ctas, config=GemmConfig(16, 16, 16, 4, 1, skinny=True),
                   pinned=Pinned(1, k, placement.to(torch.int32).to(DEV)))
        assert_close(out, x.double() @ w.double().T, torch.float32)


@pytest.mark.parametrize("M,N,K,k,ctas,gate", [(7, 33, 128, 3, 2, "claiming"),
                                                (20, 48, 112, 5, 1, "tagged")])
def test_pinned_split_tiles_normalize_rows_whoever_survives(M, N, K, k, ctas, gate):
    """Rows normalized on split tiles of a pinned partition, any placement: slots run out of
    order there, so a program holding one tile's tail and the next tile's head keeps both
    tiles' squares apart until their last programs merge them (plain launches run the
    interpreter's programs in order, which hides a shared slot); the same through SwiGLU."""
    from pdmux_triton.kernels import gemm

    x = torch.randn(M, K, device=DEV) * 3
    w = torch.randn(N, K, device=DEV) / K ** 0.5
    gate_up = torch.cat([w, w.flip(0)])
    normed = _rms_normalized(x, 1e-5)
    cfg = GemmConfig(16, 16, 16, 4, 1, skinny=True)
    for name, placement in placements(8, ctas, 1, k, seed=M):
        pinned = Pinned(1, k, placement.to(torch.int32).to(DEV))
        with (mock.patch.object(gemm, "whole_tiles", return_value=False), pinned_gate(gate)):
            out = linear(x, w, poisoned((M, N), torch.float32, DEV), rms_eps=1e-5,
                         ctas_per_sm=ctas, config=cfg, pinned=pinned)
            glu = swiglu_linear(x, gate_up, poisoned((M, N), torch.float32, DEV), rms_eps=1e-5,
                                ctas_per_sm=ctas, config=cfg, pinned=pinned)
        assert_close(out, normed @ w.double().T, torch.float32)
        assert_close(glu, _swiglu_reference(normed, gate_up), torch.float32)


def test_pinned_tiles_whoever_survives():
    """The prefill schedule (whole tiles through TMA) on a pinned partition, any placement."""
    x = torch.randn(97, 80, device=DEV)
    w = torch.randn(72, 80, device=DEV)
    for ctas in (1, 2):
        for name, placement in placements(6, ctas, 2, 3, seed=ctas):
            out = poisoned((97, 72), torch.float32, DEV)
            linear(x, w, out, ctas_per_sm=ctas, config=GemmConfig(16, 16, 16, 4, 1),
                   pinned=Pinned(2, 3, placement.to(torch.int32).to(DEV)))
            assert_close(out, x.double() @ w.double().T, torch.float32)


@pytest.mark.parametrize("schedule", ["tiles", "skinny whole", "skinny split"])
@pytest.mark.parametrize("M,N,K", [(1, 40, 64), (7, 33, 128), (70, 48, 96)])
@pytest.mark.parametrize("num_sms", [3, 5])  # 5: stream-K cuts tiles between programs
def test_bias_is_added_once_per_output(schedule, M, N, K, num_sms):
    """Every schedule adds the bias once: a stream-K tile cut between programs too (where
    adding it in each program's partial would count it several times)."""
    x = torch.randn(M, K, device=DEV)
    w = torch.randn(N, K, device=DEV) / K ** 0.5
    b = torch.randn(N, device=DEV) * 3
    out = poisoned((M, N), torch.float32, DEV)
    config = GemmConfig(16, 16, 16, 4, 1, skinny=schedule != "tiles")
    with mock.patch.object(gemm, "whole_tiles", return_value=schedule == "skinny whole"):
        linear(x, w, out, bias=b, num_sms=num_sms, config=config)
    assert_close(out, x.double() @ w.double().T + b.double(), torch.float32)
    with pytest.raises(PdmuxError, match="bias must have N=40 entries, got 39"):
        linear(torch.randn(2, 64, device=DEV), torch.randn(40, 64, device=DEV),
               bias=torch.randn(39, device=DEV))
    empty_k = linear(torch.randn(3, 0, device=DEV), torch.randn(5, 0, device=DEV),
                     bias=torch.arange(5.0, device=DEV))
    assert torch.equal(empty_k, torch.arange(5.0, device=DEV).expand(3, 5))


def _swiglu_reference(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    both = x.double() @ gate_up.double().T
    gate, up = both.chunk(2, dim=1)
    return torch.nn.functional.silu(gate) * up


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize("M,I,K", [(1, 20, 64), (7, 33, 128), (20, 8, 112), (3, 40, 100)])
@pytest.mark.parametrize("num_sms,ctas", [(1, 1), (3, 1), (5, 1), (2, 2)])
def test_swiglu_in_the_skinny_epilogue(M, I, K, num_sms, ctas, whole):
    """silu(gate) * up from one skinny launch on both schedules: tiles of gate and up rows of
    the same columns, I not a multiple of the half tile (clamped rows), stream-K tiles cut
    between programs and summed before the epilogue."""
    x = torch.randn(M, K, device=DEV)
    gate_up = torch.randn(2 * I, K, device=DEV) / K ** 0.5
    out = poisoned((M, I), torch.float32, DEV)
    with mock.patch.object(gemm, "whole_tiles", return_value=whole):
        swiglu_linear(x, gate_up, out, num_sms=num_sms, ctas_per_sm=ctas,
                      config=GemmConfig(16, 16, 16, 4, 1, skinny=True))
    assert_close(out, _swiglu_reference(x, gate_up), torch.float32)


@pytest.mark.parametrize("whole", [True, False])
def test_pinned_swiglu_whoever_survives(whole):
    x = torch.randn(5, 96, dtype=torch.float16, device=DEV)
    gate_up = torch.randn(2 * 40, 96, dtype=torch.float16, device=DEV) / 96 ** 0.5
    for name, placement in placements(8, 2, 1, 3, seed=5):
        out = poisoned((5, 40), torch.float16, DEV)
        with mock.patch.object(gemm, "whole_tiles", return_value=whole):
            swiglu_linear(x, gate_up, out, ctas_per_sm=2,
                          config=GemmConfig(16, 16, 16, 4, 1, skinny=True),
                          pinned=Pinned(1, 3, placement.to(torch.int32).to(DEV)))
        assert_close(out, _swiglu_reference(x, gate_up), torch.float16)


def test_swiglu_off_the_skinny_kernel_is_the_gemm_then_silu_mul():
    x = torch.randn(70, 48, device=DEV)
    gate_up = torch.randn(2 * 24, 48, device=DEV) / 48 ** 0.5
    out = swiglu_linear(x, gate_up, poisoned((70, 24), torch.float32, DEV), num_sms=3,
                        config=GemmConfig(16, 16, 16, 4, 1))
    assert_close(out, _swiglu_reference(x, gate_up), torch.float32)
    assert torch.equal(swiglu_linear(torch.randn(3, 0, device=DEV), torch.randn(8, 0, device=DEV)),
                       torch.zeros(3, 4, device=DEV))
    with pytest.raises(PdmuxError, match="even number of rows .gate; up., got 7"):
        swiglu_linear(x, torch.randn(7, 48, device=DEV))
    with pytest.raises(PdmuxError, match=r"out must have shape \(70, 24\), got \(70, 48\)"):
        swiglu_linear(x, gate_up, torch.empty(70, 48, device=DEV))


def _rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + eps)


@pytest.mark.parametrize("M,N,K", [(1, 40, 64), (7, 33, 128), (20, 48, 100), (3, 24, 300)])
@pytest.mark.parametrize("num_sms,ctas", [(1, 1), (2, 1), (3, 1), (2, 2), (64, 1)])
@pytest.mark.parametrize("whole", [True, False], ids=["whole tiles", "split"])
def test_rows_normalized_inside_skinny_tiles(M, N, K, num_sms, ctas, whole):
    """rms_eps: each program's loop sums its rows' squares over its K-slabs and the tile is
    scaled by them, all of K's where it holds the whole tile, else summed with the partials by
    the tile's last program (K not a multiple of the slab: masked columns add nothing); the
    same through SwiGLU. Split on 1 to 4 programs, and on 64 SMs one program a unit."""
    x = torch.randn(M, K, device=DEV) * 3
    w = torch.randn(N, K, device=DEV) / K ** 0.5
    cfg = GemmConfig(16, 16, 16, 4, 1, skinny=True)
    with mock.patch.object(gemm, "whole_tiles", return_value=whole):
        assert normalizes_rows(M, w, num_sms=num_sms, ctas_per_sm=ctas, config=cfg)
        out = linear(x, w, poisoned((M, N), torch.float32, DEV), rms_eps=1e-5, num_sms=num_sms,
                     ctas_per_sm=ctas, config=cfg)
        assert_close(out, _rms_normalized(x, 1e-5) @ w.double().T, torch.float32)
        glu = swiglu_linear(x, torch.cat([w, w.flip(0)]), poisoned((M, N), torch.float32, DEV),
                            rms_eps=1e-5, num_sms=num_sms, ctas_per_sm=ctas, config=cfg)
        assert_close(glu, _swiglu_reference(_rms_normalized(x, 1e-5), torch.cat([w, w.flip(0)])),
                     torch.float32)


def test_rows_are_normalized_only_on_skinny_tiles_of_a_verified_form():
    x, w = torch.randn(5, 96, device=DEV), torch.randn(24, 96, device=DEV)
    skinny = GemmConfig(16, 16, 16, 4, 1, skinny=True)
    for cfg in (GemmConfig(16, 16, 16, 8, 1, skinny=True), GemmConfig(64, 16, 16, 4, 1,
                                                                        skinny=True)):
        assert not normalizes_rows(5, w, num_sms=3, config=cfg)
        with pytest.raises(PdmuxError, match=rf"only on skinny tiles of up to 32 rows on 4 "
                                             rf"warps; 5 rows against a \[24, 96\] weight run "
                                             rf"on {cfg.block_m}-row tiles with "
                                             rf"{cfg.num_warps} warps"):
            linear(x, w, rms_eps=1e-6, num_sms=3, config=cfg)
    tiles = GemmConfig(16, 16, 16, 4, 1)
    assert not normalizes_rows(5, w, config=tiles)
    with pytest.raises(PdmuxError, match="run as prefill tiles here: normalize them first"):
        linear(x, w, rms_eps=1e-6, config=tiles)
    for eps in (0.0, -1e-6, float("nan"), float("inf")):
        with pytest.raises(PdmuxError, match="rms_eps must be a positive finite number"):
            linear(x, w, rms_eps=eps, config=skinny)


@pytest.mark.parametrize("schedule", ["tiles", "skinny whole", "skinny split"])
@pytest.mark.parametrize("M,N,K", [(1, 40, 64), (7, 33, 128), (70, 48, 96)])
def test_accumulate_adds_into_out_once(schedule, M, N, K):
    """accumulate: out += x @ W^T (+ bias) on every schedule, once per element (a stream-K
    tile cut between programs adds out's old values in its merge only)."""
    x = torch.randn(M, K, device=DEV)
    w = torch.randn(N, K, device=DEV) / K ** 0.5
    b = torch.randn(N, device=DEV)
    before = torch.randn(M, N, device=DEV)
    out = before.clone()
    config = GemmConfig(16, 16, 16, 4, 1, skinny=schedule != "tiles")
    with mock.patch.object(gemm, "whole_tiles", return_value=schedule == "skinny whole"):
        linear(x, w, out, bias=b, accumulate=True, num_sms=5, config=config)
    assert_close(out, before.double() + x.double() @ w.double().T + b.double(), torch.float32)
    with pytest.raises(PdmuxError, match="accumulate adds into out: give out"):
        linear(x, w, accumulate=True)


def test_skinny_split_repeated_calls():
    # the last program of a cut tile resets its counter: later calls (other shapes too) stay exact
    for m, n, k in ((5, 24, 96), (3, 40, 64), (5, 24, 96)):
        x, w = torch.randn(m, k, device=DEV), torch.randn(n, k, device=DEV)
        with mock.patch.object(gemm, "whole_tiles", return_value=False):
            out = linear(x, w, poisoned((m, n), torch.float32, DEV), num_sms=3,
                         config=GemmConfig(16, 16, 16, 4, 1, skinny=True))
        assert_close(out, x.double() @ w.double().T, torch.float32)


def test_strided_x_view():
    big = torch.randn(9, 160, dtype=torch.float16, device=DEV)
    x = big[:, 32:96]  # rows 160 apart: a column slice, as of a fused projection
    w = torch.randn(16, 64, dtype=torch.float16, device=DEV)
    assert_close(linear(x, w, num_sms=2), x.double() @ w.double().T, torch.float16)


@pytest.mark.parametrize("x_shape,w_shape,dtype,message", [
    ((4, 8), (16, 9), torch.float32, "K=8 columns but weight"),
    ((4, 7), (16, 7), torch.float16, "16-byte"),
    ((4, 8), (16, 8), torch.int32, "dtype int32"),
])
def test_bad_inputs(x_shape, w_shape, dtype, message):
    x = torch.ones(x_shape, dtype=dtype, device=DEV)
    w = torch.ones(w_shape, dtype=dtype, device=DEV)
    with pytest.raises(PdmuxError, match=message):  # the tile schedule's TMA needs aligned rows
        linear(x, w, config=GemmConfig(16, 16, 16, 4, 1))


def test_skinny_takes_unaligned_rows():
    x = torch.randn(4, 7, dtype=torch.float16, device=DEV)
    w = torch.randn(16, 7, dtype=torch.float16, device=DEV)
    out = linear(x, w, poisoned((4, 16), torch.float16, DEV),
                 config=GemmConfig(16, 16, 16, 4, 1, skinny=True))
    assert_close(out, x.double() @ w.double().T, torch.float16)


def test_bad_budget():
    x = torch.ones(4, 8, device=DEV)
    linear(x, x, num_sms=1)  # planned: a budget equal to 1 but of another type is not
    for bad in (0, True, 2.0, [2]):
        refused = f"num_sms must be a positive integer, got {bad!r}"
        with pytest.raises(PdmuxError, match=re.escape(refused)):
            linear(x, x, num_sms=bad)


def test_plans_are_remembered_per_problem_and_setting():
    cfg = GemmConfig(16, 16, 16, 4, 1, skinny=True)
    first = gemm.plan(5, 512, 4096, torch.float16, torch.device(DEV), 132, 1, cfg)
    assert gemm.plan(5, 512, 4096, torch.float16, torch.device(DEV), 132, 1, cfg) is first
    with mock.patch.object(gemm, "ALIGNED_SPLIT_BUSY", 2.0):  # a module setting is in the key
        assert gemm.plan(5, 512, 4096, torch.float16, torch.device(DEV), 132, 1, cfg).grid == 132
    assert first.grid == 128  # 32 tiles' slabs split evenly on 128 of 132 programs
    assert gemm.plan(5, 512, 4096, torch.float16, torch.device(DEV), 132, 1, cfg) is first


def _bf16_linear_matches(M, N, K, num_sms, config=None):
    x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda") / K ** 0.5
    out = poisoned((M, N), torch.bfloat16, "cuda")
    linear(x, w, out, num_sms=num_sms, config=config)
    assert_close(out, x.double() @ w.double().T, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 33, 64, 72, 128, 255, 2048, 8192])
@pytest.mark.parametrize("N,K", [(6144, 4096), (4096, 12288)])
@pytest.mark.parametrize("sms", [80, 20])  # 20: a small budget's decode tiles
def test_linear_bf16_real_sizes(M, N, K, sms):
    _bf16_linear_matches(M, N, K, num_sms=sms)


@pytest.mark.gpu
def test_mid_size_m_with_few_tiles_runs_skinny():
    # a 512-token chunk through a 4096-wide projection: 128 tiles of 128 x 128 < 132 programs,
    # so the skinny kernel takes it with 128-row x tiles
    from pdmux_triton.kernels.gemm import default_config

    assert default_config(512, 4096, 4096, 132, torch.bfloat16, 132).skinny
    _bf16_linear_matches(512, 4096, 4096, num_sms=132)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 32, 64])
@pytest.mark.parametrize("N,K", [(4096, 4096), (4096, 12288)])
def test_aligned_split_bf16_real_sizes(M, N, K):
    """Qwen3-8B's down projection (and the o projection, whole tiles by default) on the whole
    GPU as 64 tiles cut in two K halves on 128 programs (`split_grid`), written and added
    into a residual, against float64."""
    x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda") / K ** 0.5
    sms = torch.cuda.get_device_properties(0).multi_processor_count  # 132 on an H200: 128
    with mock.patch.object(gemm, "whole_tiles", return_value=False):
        assert gemm.plan(M, N, K, torch.bfloat16, x.device) == gemm.GemmPlan(
            gemm.default_config(M, N, K, sms, torch.bfloat16, sms), gemm.split_grid(64, sms),
            False)
        for _ in range(2):  # the second call finds the merge counters reset by the first
            out = linear(x, w, poisoned((M, N), torch.bfloat16, "cuda"))
            assert_close(out, x.double() @ w.double().T, torch.bfloat16)
        residual = torch.randn(M, N, dtype=torch.bfloat16, device="cuda")
        expected = residual.double() + x.double() @ w.double().T
        assert_close(linear(x, w, residual, accumulate=True), expected, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 33, 64, 72, 128])
@pytest.mark.parametrize("cfg", [GemmConfig(16, 64, 256, 4, 4, skinny=True),
                                 GemmConfig(64, 64, 128, 4, 6, skinny=True),
                                 GemmConfig(128, 128, 64, 8, 3, skinny=True)])
@pytest.mark.parametrize("sms", [132, 80, 7])
def test_skinny_bf16_real_sizes(M, cfg, sms):
    _bf16_linear_matches(M, 6144, 4096, num_sms=sms, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 32, 33, 64, 72, 128])
@pytest.mark.parametrize("sms", [132, 20])
def test_swiglu_bf16_real_sizes(M, sms):
    """Qwen3-8B's gate_up at decode batches, whole GPU and a small budget (whole tiles and
    stream-K both occur), against silu(gate) * up in float64."""
    x = torch.randn(M, 4096, dtype=torch.bfloat16, device="cuda")
    gate_up = torch.randn(2 * 12288, 4096, dtype=torch.bfloat16, device="cuda") / 64
    out = swiglu_linear(x, gate_up, poisoned((M, 12288), torch.bfloat16, "cuda"), num_sms=sms)
    assert_close(out, _swiglu_reference(x, gate_up), torch.bfloat16)


def test_rows_are_normalized_only_in_the_forms_the_gpu_verified():
    # the whole GPU's decode tile (<= 32 rows, 4 warps) normalizes; 64-row tiles and the small
    # budget's 8-warp tile summed the squares wrongly on the H200 and run the norm apart
    from pdmux_triton.kernels import _launch

    with (mock.patch.object(gemm, "interpreting", return_value=False),
          mock.patch.object(_launch, "INTERPRETER_DEFAULT_SMS", 132)):  # an H200's SMs
        w = torch.empty(6144, 4096, dtype=torch.bfloat16)
        assert normalizes_rows(32, w, num_sms=132) and normalizes_rows(1, w, num_sms=132)
        assert not normalizes_rows(64, w, num_sms=132)
        assert not normalizes_rows(32, w, num_sms=20)
        # split tiles too: Qwen3-32B's QKV (160 tiles, two waves of 1.3 MB) is cut between programs
        qkv_32b = torch.empty(10240, 5120, dtype=torch.bfloat16)
        assert not gemm.plan(32, 10240, 5120, qkv_32b.dtype, qkv_32b.device, 132).whole
        assert normalizes_rows(32, qkv_32b, num_sms=132)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 32])
def test_normed_rows_and_residual_add_bf16_real_sizes(M, sms=132):
    """Qwen3-8B's QKV with the rows normalized in the loop, gate-up through SwiGLU likewise,
    and the down projection adding into a residual, against float64 (the decode step's fused
    layer, `Model.fused_layer`)."""
    x = torch.randn(M, 4096, dtype=torch.bfloat16, device="cuda") * 4
    qkv = torch.randn(6144, 4096, dtype=torch.bfloat16, device="cuda") / 64
    gate_up = torch.randn(2 * 12288, 4096, dtype=torch.bfloat16, device="cuda") / 64
    assert normalizes_rows(M, qkv, num_sms=sms) and normalizes_rows(M, gate_up, num_sms=sms)
    normed = _rms_normalized(x, 1e-6)
    out = linear(x, qkv, poisoned((M, 6144), torch.bfloat16, "cuda"), rms_eps=1e-6, num_sms=sms)
    assert_close(out, normed @ qkv.double().T, torch.bfloat16)
    glu = swiglu_linear(x, gate_up, poisoned((M, 12288), torch.bfloat16, "cuda"), rms_eps=1e-6,
                        num_sms=sms)
    assert_close(glu, _swiglu_reference(normed, gate_up), torch.bfloat16)
    down = torch.randn(4096, 12288, dtype=torch.bfloat16, device="cuda") / 111
    residual = x.clone()
    linear(glu, down, residual, accumulate=True, num_sms=sms)
    assert_close(residual, x.double() + glu.double() @ down.double().T, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 8, 32])
@pytest.mark.parametrize("sms", [132, 100])
def test_normed_rows_split_between_programs_bf16_real_sizes(M, sms):
    """Qwen3-8B's QKV with the rows normalized in the loop, its 96 tiles split between every
    program (stream-K, the squares merged with the partials), against float64: the form the
    whole GPU's QKV would take to run on all its SMs."""
    x = torch.randn(M, 4096, dtype=torch.bfloat16, device="cuda") * 4
    qkv = torch.randn(6144, 4096, dtype=torch.bfloat16, device="cuda") / 64
    with mock.patch.object(gemm, "whole_tiles", return_value=False):
        assert not gemm.plan(M, 6144, 4096, x.dtype, x.device, sms).whole
        assert normalizes_rows(M, qkv, num_sms=sms)
        for _ in range(2):  # the second call after the first reset the tiles' counters
            out = linear(x, qkv, poisoned((M, 6144), torch.bfloat16, "cuda"), rms_eps=1e-6,
                         num_sms=sms)
            assert_close(out, _rms_normalized(x, 1e-6) @ qkv.double().T, torch.bfloat16)


def test_decode_tiles_follow_the_budget():
    from dataclasses import astuple

    from pdmux_triton.kernels.gemm import decode_tile

    assert astuple(decode_tile(1, 2, small_budget=True))[:4] == (16, 128, 128, 8)
    assert astuple(decode_tile(1, 2, small_budget=False))[:4] == (16, 64, 128, 4)
    assert decode_tile(33, 2, small_budget=False).block_m == 64  # x rows: the MMA's N
    assert decode_tile(8, 4, small_budget=True).block_k == 64  # fp32 slabs stay small
    assert all(decode_tile(m, 2, s).skinny for m in (1, 64) for s in (True, False))
    # 65-128 rows on a small budget: one x tile of 128 rows (W read once), two warpgroups
    assert astuple(decode_tile(65, 2, small_budget=True))[:5] == (128, 128, 64, 8, 4)
    assert not decode_tile(128, 2, small_budget=True).skinny


def test_rows_past_64_keep_one_x_tile_only_on_a_small_budget():
    from pdmux_triton.kernels.gemm import default_config

    with mock.patch.object(gemm, "interpreting", return_value=False):
        for M in (65, 72, 128):
            assert default_config(M, 4096, 4096, 60, torch.bfloat16, 132).block_m == 128
            assert default_config(M, 4096, 4096, 132, torch.bfloat16, 132).block_m == 64
        assert default_config(129, 4096, 4096, 20, torch.bfloat16, 132).block_m == 64
        assert default_config(64, 4096, 4096, 20, torch.bfloat16, 132).skinny


def test_skinny_schedule_splits_only_when_whole_tiles_leave_most_programs_idle():
    from pdmux_triton.kernels.gemm import split_grid, whole_tiles

    kib = 1024
    assert whole_tiles(96, 132, 8192 * kib) and whole_tiles(384, 132, 512 * kib)
    assert whole_tiles(64, 132, 512 * kib) and not whole_tiles(64, 132, 1536 * kib)
    assert whole_tiles(133, 132, 512 * kib) and whole_tiles(1, 1, 8192 * kib)
    assert not whole_tiles(32, 132, 64 * kib) and not whole_tiles(3, 12, 64 * kib)
    # split: on a multiple of the tiles that keeps 90% of the programs (64 tiles cut in two on
    # 128 of 132), else on every program with tiles cut unevenly
    assert split_grid(64, 132) == 128 and split_grid(32, 132) == 128
    assert split_grid(50, 132) == 132 and split_grid(125, 132) == 132  # 2 a tile would not fit
    assert split_grid(5, 12) == 12 and split_grid(3, 10) == 9
    with mock.patch.object(gemm, "ALIGNED_SPLIT_BUSY", 2.0):  # > 1: off
        assert split_grid(64, 132) == 132
