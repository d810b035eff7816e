"""Green contexts through cuda.bindings: every kernel on a 16-SM partition with a 132-program
grid gives the same result as on the whole GPU and stays on the partition's SMs; several decode
programs per SM stay there too (GPU only)."""

import pytest
import torch
from reference import assert_close, attention_ref, poisoned

from pdmux_triton.gpu.green_contexts import split_green
from pdmux_triton.kernels import (decode_attention, extend_attention, linear, rmsnorm, rope_,
                                  rope_cache, rope_store_kv, silu_mul, stream_read)
from pdmux_triton.measure.random_kv import PagedKV

BF16 = torch.bfloat16


def _kernel_cases():
    """name -> a function running one kernel with a given SM budget (fresh inputs, fixed per case)."""
    torch.manual_seed(0)
    dev = "cuda"
    x = torch.randn(300, 4096, dtype=BF16, device=dev)
    w = torch.randn(6144, 4096, dtype=BF16, device=dev) / 64
    x1 = torch.randn(8, 4096, dtype=BF16, device=dev)
    norm_w = torch.randn(4096, dtype=BF16, device=dev)
    res = torch.randn(300, 4096, dtype=BF16, device=dev)
    qk = torch.randn(300, 40, 128, dtype=BF16, device=dev)
    pos = torch.arange(300, device=dev)
    cs = rope_cache(512, 128, 1e6, dev)
    gu = torch.randn(300, 2 * 12288, dtype=BF16, device=dev)
    kv = PagedKV([3000, 17, 900], 8, 128, 16, BF16, dev)
    q_dec = torch.randn(3, 32, 128, dtype=BF16, device=dev)
    lens = torch.tensor(kv.lens, dtype=torch.int32, device=dev)
    q_ext = torch.randn(1000, 32, 128, dtype=BF16, device=dev)
    k_ext, v_ext = torch.randn(2, 1000, 8, 128, dtype=BF16, device=dev)
    new_qkv = torch.randn(64, 32 + 2 * 8, 128, dtype=BF16, device=dev)
    slots = torch.randperm(kv.k_cache.shape[0], device=dev)[:64]
    buf = torch.randn(1 << 24, device=dev)

    def rmsnorm_residual(s, ids=None):
        r = res.clone()
        return rmsnorm(x, norm_w, residual=r, num_sms=s, sm_ids=ids), r

    def prologue(s, ids=None):
        qkv, kc, vc = new_qkv.clone(), kv.k_cache.clone(), kv.v_cache.clone()
        rope_store_kv(qkv, pos[:64], cs, 32, kc, vc, slots, norm_w[:128], norm_w[128:256],
                      num_sms=s, sm_ids=ids)
        return qkv, kc, vc

    return {
        "linear": lambda s, ids=None: linear(x, w, num_sms=s, sm_ids=ids),
        "linear_skinny_split": lambda s, ids=None: linear(x1, w[:512], num_sms=s, sm_ids=ids),
        "rmsnorm_residual": rmsnorm_residual,
        "rope_qk_norm": lambda s, ids=None: rope_(qk.clone(), pos, cs, norm_w[:128], num_sms=s,
                                                  sm_ids=ids),
        "silu_mul": lambda s, ids=None: silu_mul(gu, num_sms=s, sm_ids=ids),
        "rope_store_kv": prologue,
        "decode_attention": lambda s, ids=None: decode_attention(
            q_dec, kv.k_cache, kv.v_cache, kv.page_table, lens, 16, 3000, num_sms=s, sm_ids=ids),
        "extend_attention": lambda s, ids=None: extend_attention(
            q_ext, k_ext, v_ext, kv.k_cache, kv.v_cache, kv.page_table, [900, 17, 83],
            [0, 0, 817], 16, num_sms=s, sm_ids=ids),
        "stream_read": lambda s, ids=None: stream_read(buf, num_sms=s, sm_ids=ids),
    }


CASES = _kernel_cases() if torch.cuda.is_available() else {}


def _flat(result):
    if isinstance(result, tuple):
        return torch.cat([r.float().flatten() for r in result])
    return result.float().flatten()


@pytest.fixture(scope="module")
def green16():
    total = torch.cuda.get_device_properties(0).multi_processor_count
    split = split_green(16, total - 16)
    yield split.first
    split.close()


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_on_a_16_sm_green_context_matches_whole_gpu(name, green16):
    run = CASES[name]
    whole = _flat(run(132))
    ids = torch.full((132,), -1, dtype=torch.int32, device="cuda")
    with torch.cuda.stream(green16.stream):
        capped = _flat(run(132, ids))
    green16.stream.synchronize()
    assert torch.equal(capped, whole), f"{name} differs on the green context"
    used = ids[ids >= 0].unique()
    assert 0 < used.numel() <= green16.sms, f"{name} ran on {used.numel()} SMs of a {green16.sms}-SM partition"


@pytest.mark.gpu
def test_decode_attention_three_ctas_per_sm_on_a_green_context(green16):
    # the launcher's 3-stage config for several programs per SM: all 48 run on the
    # partition's SMs and the merged result matches a float64 reference
    lens = [5000, 1, 777, 2048]
    kv = PagedKV(lens, 8, 128, 16, BF16, "cuda")
    q = torch.randn(len(lens), 32, 128, dtype=BF16, device="cuda")
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = poisoned(q.shape, BF16, "cuda")
    ids = torch.full((48,), -1, dtype=torch.int32, device="cuda")
    with torch.cuda.stream(green16.stream):
        decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, seq, 16, max(lens), out=out,
                         num_sms=16, ctas_per_sm=3, sm_ids=ids)
    green16.stream.synchronize()
    assert (ids >= 0).all() and ids.unique().numel() <= green16.sms
    for b in range(len(lens)):
        k, v = kv.dense(b)
        assert_close(out[b], attention_ref(q[b:b + 1].cpu(), k, v)[0], BF16)
