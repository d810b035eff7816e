import pytest
import torch

from conftest import HAS_CUDA
from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels import (rmsnorm, rope_, rope_cache, rope_store_kv, silu_mul,
                                  stream_read)
from pdmux_triton.kernels._pinned import PINNED_GATES, Pinned, pinned_gate
from reference import assert_close, placements, poisoned

DEV = "cuda" if HAS_CUDA else "cpu"
DTYPES = [torch.float32, torch.float16]


def rms_ref(x, w, eps):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,D", [(1, 64), (7, 96), (97, 32), (255, 8)])
@pytest.mark.parametrize("num_sms", [1, 3, 1000])
def test_rmsnorm(T, D, dtype, num_sms):
    x = torch.randn(T, D, dtype=dtype, device=DEV)
    w = torch.randn(D, dtype=dtype, device=DEV)
    out = poisoned((T, D), dtype, DEV)
    rmsnorm(x, w, 1e-6, out=out, num_sms=num_sms)
    assert_close(out, rms_ref(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_fused_residual(dtype):
    x = torch.randn(13, 48, dtype=dtype, device=DEV)
    res = torch.randn(13, 48, dtype=dtype, device=DEV)
    w = torch.randn(48, dtype=dtype, device=DEV)
    summed = (x.double() + res.double()).to(dtype)
    out = poisoned(x.shape, dtype, DEV)
    rmsnorm(x, w, 1e-5, residual=res, out=out, num_sms=2)
    assert_close(res, summed, dtype)
    assert_close(out, rms_ref(summed, w, 1e-5), dtype)


def test_per_head_norm_on_a_strided_view_in_place():
    qkv = torch.randn(9, 6 * 16, device=DEV)
    q = qkv[:, :4 * 16].view(9, 4, 16)  # token stride 96, head stride 16
    untouched = qkv[:, 64:].clone()
    w = torch.randn(16, device=DEV)
    ref = rms_ref(q, w, 1e-6)
    rmsnorm(q, w, 1e-6, out=q, num_sms=2)
    assert_close(q, ref, torch.float32)
    assert torch.equal(qkv[:, 64:], untouched)


def rope_ref(x, pos, theta, w=None, eps=1e-6):
    x = x.double()
    if w is not None:
        x = rms_ref(x, w, eps)
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double().cpu()[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., : d // 2].cpu(), x[..., d // 2:].cpu()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("T", [1, 7, 97])
def test_rope_with_and_without_qk_norm(T, norm, dtype):
    qkv = torch.randn(T, 3 * 2 * 32, dtype=dtype, device=DEV)
    k = qkv[:, 64:128].view(T, 2, 32)  # a strided view, as inside a fused QKV output
    pos = torch.randint(0, 500, (T,), device=DEV)
    w = torch.randn(32, dtype=dtype, device=DEV) if norm else None
    ref = rope_ref(k, pos, 1e4, w)
    rope_(k, pos, rope_cache(512, 32, 1e4, DEV), w, num_sms=3)
    assert_close(k, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,I", [(1, 8), (7, 100), (97, 33)])
def test_silu_mul(T, I, dtype):
    x = torch.randn(T, 2 * I, dtype=dtype, device=DEV)
    out = poisoned((T, I), dtype, DEV)
    silu_mul(x, out, num_sms=3)
    g, u = x.double()[:, :I], x.double()[:, I:]
    assert_close(out, torch.nn.functional.silu(g) * u, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("T,hq,hkv", [(1, 4, 2), (7, 6, 1), (97, 2, 2)])
@pytest.mark.parametrize("num_sms", [1, 3, 300])
def test_rope_store_kv_is_rope_on_q_and_k_then_the_cache_store(T, hq, hkv, norm, dtype, num_sms):
    """The fused prologue equals its parts: q and k rotated (normalized by their own weights)
    in place, v untouched, the new k and v in the cache at their slots and nowhere else."""
    d = 32
    qkv = torch.randn(T, (hq + 2 * hkv) * d, dtype=dtype, device=DEV)
    heads = qkv.view(T, hq + 2 * hkv, d)
    q, k, v = (part.clone() for part in heads.split([hq, hkv, hkv], dim=1))
    pos = torch.randint(0, 500, (T,), device=DEV)
    wq, wk = ((torch.randn(d, dtype=dtype, device=DEV) for _ in range(2)) if norm
              else (None, None))
    k_cache = poisoned((T + 50, hkv, d), dtype, DEV)
    v_cache = poisoned((T + 50, hkv, d), dtype, DEV)
    slots = torch.randperm(T + 50, device=DEV)[:T]
    rope_store_kv(heads, pos, rope_cache(512, d, 1e4, DEV), hq, k_cache, v_cache, slots, wq, wk,
                  num_sms=num_sms)
    new_q, new_k, new_v = heads.split([hq, hkv, hkv], dim=1)
    assert_close(new_q, rope_ref(q, pos, 1e4, wq), dtype)
    assert_close(new_k, rope_ref(k, pos, 1e4, wk), dtype)
    assert torch.equal(new_v, v)
    assert torch.equal(k_cache[slots], new_k) and torch.equal(v_cache[slots], v)
    others = torch.ones(T + 50, dtype=torch.bool, device=DEV)
    others[slots] = False
    assert torch.isnan(k_cache[others]).all() and torch.isnan(v_cache[others]).all()


@pytest.mark.parametrize("n", [1, 255, 4096, 10000])
@pytest.mark.parametrize("num_sms", [1, 3])
def test_stream_read_reads_every_word(n, num_sms):
    buf = torch.randint(-1000, 1000, (n,), dtype=torch.int32, device=DEV)
    sums = stream_read(buf, num_sms=num_sms)
    assert sums.sum().item() == buf.sum().item()


@pytest.mark.parametrize("ctas,gate", [*((1, name) for name in PINNED_GATES), (2, "claiming")])
def test_pinned_small_ops_whoever_survives(ctas, gate):
    """rmsnorm, rotary, silu_mul and the fused attention prologue on a pinned partition
    (kernels/_pinned.py) give the plain launch's output for any placement of their programs,
    none in the range included, with every gate at one program an SM."""
    T, H, D = 200, 3, 16  # rotary's 32-row tiles: more tiles than slots, so slots stride
    x = torch.randn(T, H, D, device=DEV)
    w = torch.randn(D, device=DEV)
    pos = torch.randint(0, 64, (T,), device=DEV)
    cs = rope_cache(64, D, 1e4, DEV)
    gate_up = torch.randn(T, 2 * D, device=DEV)
    slots = torch.randperm(2 * T, device=DEV)[:T]
    want_norm = rmsnorm(x, w, 1e-6, num_sms=3)
    want_rope = rope_(x.clone(), pos, cs, w, num_sms=3)
    want_act = silu_mul(gate_up, num_sms=3)
    with pinned_gate(gate):
        for _, placement in placements(6, ctas, 1, 4, seed=ctas):
            pinned = Pinned(1, 4, placement.to(torch.int32).to(DEV))
            budget = {"ctas_per_sm": ctas, "pinned": pinned}
            assert torch.equal(rmsnorm(x, w, 1e-6, out=poisoned(x.shape, x.dtype, DEV), **budget),
                               want_norm)
            assert torch.equal(rope_(x.clone(), pos, cs, w, **budget), want_rope)
            assert torch.equal(silu_mul(gate_up, out=poisoned((T, D), x.dtype, DEV), **budget),
                               want_act)
            qkv = torch.cat([x, x, -x], dim=1)  # three heads a token: q, k, v
            k_cache, v_cache = (poisoned((2 * T, H, D), x.dtype, DEV) for _ in range(2))
            rope_store_kv(qkv, pos, cs, H, k_cache, v_cache, slots, w, w, **budget)
            assert torch.equal(qkv[:, :2 * H], torch.cat([want_rope] * 2, dim=1))
            assert torch.equal(k_cache[slots], want_rope) and torch.equal(v_cache[slots], -x)


def test_small_op_errors():
    x = torch.randn(4, 8, device=DEV)
    with pytest.raises(PdmuxError, match="weight has 7 entries but rows have D=8"):
        rmsnorm(x, torch.ones(7, device=DEV))
    with pytest.raises(PdmuxError, match="even number of columns"):
        silu_mul(torch.randn(4, 7, device=DEV))
    with pytest.raises(PdmuxError, match="positions has 3 entries for 4 tokens"):
        rope_(x.view(4, 1, 8), torch.zeros(3, dtype=torch.long, device=DEV),
              rope_cache(8, 8, 1e4, DEV))
    with pytest.raises(PdmuxError, match="3 bytes"):
        stream_read(torch.zeros(3, dtype=torch.uint8, device=DEV))
    if not HAS_CUDA:
        with pytest.raises(PdmuxError, match="telemetry needs a GPU"):
            rmsnorm(x, torch.ones(8), sm_ids=torch.zeros(8, dtype=torch.int32))


@pytest.mark.gpu
def test_small_ops_bf16_real_sizes():
    T, H = 8192, 4096
    x = torch.randn(T, H, dtype=torch.bfloat16, device="cuda")
    res = torch.randn(T, H, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(H, dtype=torch.bfloat16, device="cuda")
    summed = (x.double() + res.double()).to(torch.bfloat16).double()
    out = rmsnorm(x, w, 1e-6, residual=res, num_sms=80)
    ref = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert_close(out, ref, torch.bfloat16)
    gu = torch.randn(T, 2 * 12288, dtype=torch.bfloat16, device="cuda")
    g, u = gu.double()[:, :12288], gu.double()[:, 12288:]
    assert_close(silu_mul(gu, num_sms=80), torch.nn.functional.silu(g) * u, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 32, 2048])
def test_fused_prologue_equals_its_parts_in_bf16(T):
    """On the GPU, in bf16 at Qwen3-8B's shapes: the fused attention prologue is rope_ on q
    and k then the cache store, bit for bit (same arithmetic, same rounding), on the whole GPU
    and on 20 SMs."""
    hq, hkv, d = 32, 8, 128
    qkv = torch.randn(T, (hq + 2 * hkv) * d, dtype=torch.bfloat16, device="cuda")
    pos = torch.randint(0, 4000, (T,), device="cuda")
    cs = rope_cache(4096, d, 1e6, "cuda")
    wq, wk = (torch.randn(d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    slots = torch.randperm(T + 64, device="cuda")[:T]
    for sms in (None, 20):
        heads = qkv.clone().view(T, hq + 2 * hkv, d)
        kc, vc = (torch.zeros(T + 64, hkv, d, dtype=torch.bfloat16, device="cuda")
                  for _ in range(2))
        rope_store_kv(heads, pos, cs, hq, kc, vc, slots, wq, wk, num_sms=sms)
        q, k, v = (p.clone() for p in qkv.view(T, hq + 2 * hkv, d).split([hq, hkv, hkv], 1))
        rope_(q, pos, cs, wq, num_sms=sms)
        rope_(k, pos, cs, wk, num_sms=sms)
        assert torch.equal(heads[:, :hq], q) and torch.equal(heads[:, hq:hq + hkv], k)
        assert torch.equal(kc[slots], k) and torch.equal(vc[slots], v)
