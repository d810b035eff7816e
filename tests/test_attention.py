import sys

import pytest
import torch
from conftest import HAS_CUDA
from reference import assert_close, attention_ref, placements, poisoned, rope_ref

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels import NewTokens, decode_attention, extend_attention, rope_cache
from pdmux_triton.kernels._pinned import Pinned
from pdmux_triton.measure.random_kv import PagedKV

DEV = "cuda" if HAS_CUDA else "cpu"


def check_decode(lens, hq, hkv, d, page_size, dtype, num_sms, device=DEV, **budget):
    kv = PagedKV(lens, hkv, d, page_size, dtype, device)
    q = torch.randn(len(lens), hq, d, dtype=dtype, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = poisoned(q.shape, dtype, device)
    decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, seq_lens, page_size, max(lens),
                     out=out, num_sms=num_sms, **budget)
    for b, n in enumerate(lens):
        if n == 0:
            assert (out[b] == 0).all()
            continue
        k, v = kv.dense(b)
        assert_close(out[b], attention_ref(q[b:b + 1].cpu(), k, v)[0], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("lens", [[1], [7, 97], [255, 3, 40]])
def test_decode_attention(lens, page_size, dtype):
    check_decode(lens, 4, 2, 16, page_size, dtype, num_sms=3)


@pytest.mark.parametrize("lens", [[130, 5, 33], [1, 130, 1, 1, 40, 1, 0, 1]])
@pytest.mark.parametrize("num_sms", [1, 2, 3, 7, 500])
def test_decode_attention_splits_and_grids(lens, num_sms):
    # 16-key blocks: 9, 1 and 3 per KV head (each unit led by UNIT_COST slots of fixed cost);
    # 2, 3 and 7 programs cut units at different blocks, some ranges hold only fixed-cost
    # slots, 500 programs give every block its own program (9-way merges)
    check_decode(lens, 8, 2, 32, 16, torch.float32, num_sms=num_sms)


@pytest.mark.parametrize("num_sms", [1, 4, 5, 7, 500])
def test_decode_attention_uniform_batches(num_sms):
    # equal lengths (24 units of 5 slots: cut at different slots on each grid) and a batch
    # padded with empty rows, which own no slots
    check_decode([40] * 6, 8, 4, 16, 16, torch.float32, num_sms=num_sms)
    check_decode([40, 0, 40, 40, 0], 4, 2, 16, 16, torch.float32, num_sms=num_sms)


@pytest.mark.parametrize("ctas", [1, 2])
def test_pinned_decode_attention_whoever_survives(ctas):
    """On a pinned partition (kernels/_pinned.py) the admitted programs do the capped launch's
    programs' ranges as slots: exact for any placement, including none in the range."""
    for lens, first, k in (([130, 5, 33], 1, 3), ([1, 130, 1, 0, 40], 0, 6), ([40] * 6, 5, 1)):
        for _, placement in placements(6, ctas, first, k, seed=len(lens)):
            pinned = Pinned(first, k, placement.to(torch.int32).to(DEV))
            check_decode(lens, 8, 2, 32, 16, torch.float32, None, ctas_per_sm=ctas,
                         pinned=pinned)


def test_decode_attention_repeated_calls():
    # the merge counters are reset by each call: a second call on new inputs is as exact
    for lens in ([130, 5, 33], [64, 200], [3]):
        check_decode(lens, 4, 2, 16, 16, torch.float32, num_sms=5)


def test_decode_attention_zero_length_gives_zeros():
    check_decode([0, 20], 4, 4, 16, 1, torch.float32, num_sms=2)
    check_decode([0, 40, 0, 0, 7], 4, 4, 16, 1, torch.float32, num_sms=3)
    check_decode([0, 0], 4, 2, 16, 16, torch.float32, num_sms=3)


def new_tokens(kv, extend, prefix, hq):
    """q, k, v of the new tokens as views of one QKV-projection-like [T, (hq + 2 hkv) d] tensor
    (strided rows), k and v holding the cache's values at the new positions; those cache slots
    are then poisoned, so a kernel that read the new tokens from the cache would give NaN."""
    _, hkv, d = kv.k_cache.shape
    T, dtype, dev = sum(extend), kv.k_cache.dtype, kv.k_cache.device
    qkv = torch.randn(T, (hq + 2 * hkv) * d, dtype=dtype, device=dev)
    q = qkv[:, :hq * d].view(T, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].view(T, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(T, hkv, d)
    slots = torch.cat([kv.slots(b, p, p + e) for b, (e, p) in enumerate(zip(extend, prefix))])
    slots = slots.to(dev)
    k.copy_(kv.k_cache[slots])
    v.copy_(kv.v_cache[slots])
    dense = [kv.dense(b) for b in range(len(extend))]
    kv.k_cache[slots] = float("nan")
    kv.v_cache[slots] = float("nan")
    return q, k, v, dense


def check_extend(extend, prefix, hq, hkv, d, page_size, dtype, num_sms, device=DEV, **budget):
    lens = [e + p for e, p in zip(extend, prefix)]
    kv = PagedKV(lens, hkv, d, page_size, dtype, device)
    q, k, v, dense = new_tokens(kv, extend, prefix, hq)
    out = poisoned(q.shape, dtype, device)
    extend_attention(q, k, v, kv.k_cache, kv.v_cache, kv.page_table, extend, prefix, page_size,
                     out=out, num_sms=num_sms, **budget)
    start = 0
    for b, (e, p) in enumerate(zip(extend, prefix)):
        ref = attention_ref(q[start:start + e].cpu(), *dense[b], q_pos=torch.arange(p, p + e))
        assert_close(out[start:start + e], ref, dtype)
        start += e


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("extend,prefix", [([1], [0]), ([7], [0]), ([97], [0]), ([40, 7], [0, 0])])
def test_extend_attention_whole_prefill(extend, prefix, page_size, dtype):
    check_extend(extend, prefix, 4, 2, 16, page_size, dtype, num_sms=3)


@pytest.mark.parametrize("extend,prefix", [([33], [64]), ([5, 20], [17, 100]), ([1], [255])])
def test_extend_attention_after_a_cached_prefix(extend, prefix):
    check_extend(extend, prefix, 4, 1, 32, 16, torch.float32, num_sms=2)


@pytest.mark.parametrize("num_sms", [1, 2, 400])
def test_extend_attention_grids(num_sms):
    check_extend([19, 2], [3, 0], 2, 2, 16, 1, torch.float16, num_sms=num_sms)


@pytest.mark.parametrize("ctas", [1, 2])
def test_pinned_extend_attention_whoever_survives(ctas):
    for _, placement in placements(5, ctas, 2, 2, seed=ctas):
        pinned = Pinned(2, 2, placement.to(torch.int32).to(DEV))
        check_extend([19, 2], [3, 0], 2, 2, 16, 1, torch.float16, None, ctas_per_sm=ctas,
                     pinned=pinned)


def test_64_bit_cache_offsets(monkeypatch):
    # caches of 2^31+ elements take 64-bit offsets; too big for a test, so force the flag
    for name in ("decode_attention", "prefill_attention"):  # the modules, not the functions
        monkeypatch.setattr(sys.modules[f"pdmux_triton.kernels.{name}"], "wide_offsets",
                            lambda k_cache: True)
    check_decode([97, 5], 4, 2, 16, 16, torch.float16, num_sms=2)
    check_extend([33], [20], 4, 2, 16, 16, torch.float16, num_sms=2)


def test_chunked_equals_whole():
    """Attention of a 60-token prompt in chunks of 25 equals the whole prefill."""
    kv = PagedKV([60], 2, 16, 16, torch.float32, DEV)
    q, k, v, _ = new_tokens(kv, [60], [0], 4)
    # a chunk's prefix is in the cache (the earlier chunks): undo new_tokens' poisoning
    kc, vc, slots = kv.k_cache.clone(), kv.v_cache.clone(), kv.slots(0, 0, 60).to(DEV)
    kc[slots], vc[slots] = k, v
    whole = extend_attention(q, k, v, kc, vc, kv.page_table, [60], [0], 16, num_sms=2)
    parts = [extend_attention(q[s:s + 25], k[s:s + 25], v[s:s + 25], kc, vc, kv.page_table,
                              [min(25, 60 - s)], [s], 16, num_sms=2) for s in range(0, 60, 25)]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-5, atol=1e-5)


def test_attention_bad_inputs():
    kv = PagedKV([8], 3, 16, 1, torch.float32, DEV)
    q = torch.randn(1, 4, 16, device=DEV)
    lens = torch.tensor([8], dtype=torch.int32, device=DEV)
    with pytest.raises(PdmuxError, match="4 query heads do not divide into 3 KV heads"):
        decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, lens, 1, 8)
    kv = PagedKV([8], 2, 16, 1, torch.float32, DEV)
    with pytest.raises(PdmuxError, match="max_seq_len 9 must fit in the page table"):
        decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, lens, 1, 9)
    k = torch.randn(1, 2, 16, device=DEV)
    with pytest.raises(PdmuxError, match="q has 1 tokens but extend_lens sum to 2"):
        extend_attention(q, k, k, kv.k_cache, kv.v_cache, kv.page_table, [2], [0], 1)
    with pytest.raises(PdmuxError, match=r"v must be \[1, 2, 16\] with each row's heads"):
        extend_attention(q, k, torch.randn(1, 2, 32, device=DEV)[:, :, :16], kv.k_cache,
                         kv.v_cache, kv.page_table, [1], [0], 1)
    with pytest.raises(PdmuxError, match="k must start on a 16-byte boundary"):
        extend_attention(q, torch.randn(33, device=DEV)[1:].view(1, 2, 16), k, kv.k_cache,
                         kv.v_cache, kv.page_table, [1], [0], 1)
    with pytest.raises(PdmuxError, match="page_table has dtype int64"):
        decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table.long(), lens, 1, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_attention_bf16_real_sizes(page_size):
    lens = [1, 100, 2048, 16000, 131072]
    check_decode(lens, 32, 8, 128, page_size, torch.bfloat16, num_sms=132, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("num_sms,ctas,norm,pdl", [(132, 1, True, True), (132, 1, False, False),
                                                   (16, 1, True, True), (16, 3, True, False),
                                                   (48, 1, True, False)])
def test_decode_attention_finishes_the_prologue_bf16_real_sizes(num_sms, ctas, norm, pdl):
    # every program of a unit runs at once on the GPU: the new key must be stored by the one
    # folding the unit's last block and read by it alone (the interpreter runs them in turn,
    # so only here can a race show: each case launched a few times on fresh inputs)
    lens = [1, 100, 2048, 16000, 131072, 0, 37, 4097, 300]
    for _ in range(3):
        check_decode_new_tokens(lens, 32, 8, 128, 16, torch.bfloat16, num_sms, norm,
                                device="cuda", ctas_per_sm=ctas, pdl=pdl)


@pytest.mark.gpu
@pytest.mark.parametrize("ctas", [1, 3])
def test_pinned_decode_attention_finishes_the_prologue_bf16(ctas):
    # 20 pinned SMs (the device's site order), units cut between slots claimed in turn
    lens = [1, 100, 2048, 16000, 0, 37, 4097, 300]
    for _ in range(3):
        check_decode_new_tokens(lens, 32, 8, 128, 16, torch.bfloat16, None, True, device="cuda",
                                ctas_per_sm=ctas, pinned=Pinned(112, 20))


@pytest.mark.gpu
@pytest.mark.parametrize("extend,prefix", [([8192], [0]), ([2048], [6144]), ([97, 1000], [0, 300])])
def test_extend_attention_bf16_real_sizes(extend, prefix):
    check_extend(extend, prefix, 32, 8, 128, 16, torch.bfloat16, num_sms=112, device="cuda")


def check_decode_new_tokens(lens, hq, hkv, d, page_size, dtype, num_sms, norm, device=DEV,
                            **budget):
    """Decode attention that finishes its own prologue (`NewTokens`): against q and k
    normalized and rotated in float64 (reference.rope_ref) and attention over the cache with
    the new key and value at each request's last position. Those cache slots are poisoned
    first (a kernel reading one before writing it gives NaN), every other slot must come back
    untouched, and an empty request's slot (a spare one) is never written."""
    kv = PagedKV(lens, hkv, d, page_size, dtype, device)
    B = len(lens)
    qkv = torch.randn(B, (hq + 2 * hkv) * d, dtype=dtype, device=device)
    q = qkv[:, :hq * d].view(B, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].view(B, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(B, hkv, d)
    spare = kv.k_cache.shape[0] - 1  # the last page is a spare: no request's
    slots = torch.tensor([int(kv.slots(b, n - 1, n)[0]) if n else spare
                          for b, n in enumerate(lens)], device=device)
    pos = torch.tensor([max(n - 1, 0) for n in lens])
    wq, wk = ((torch.randn(d, dtype=dtype, device=device) for _ in range(2)) if norm
              else (None, None))
    cos_sin = rope_cache(max(lens) + 5, d, 1e4, device)
    new = [b for b, n in enumerate(lens) if n]
    kv.k_cache[slots[new]] = float("nan")
    kv.v_cache[slots[new]] = float("nan")
    k_before, v_before = kv.k_cache.clone(), kv.v_cache.clone()
    out = poisoned(q.shape, dtype, device)
    decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, page_size,
                     max(lens), out=out, new=NewTokens(k, v, cos_sin, slots, wq, wk),
                     num_sms=num_sms, **budget)
    q_ref, k_ref = rope_ref(q, pos, 1e4, wq), rope_ref(k, pos, 1e4, wk)
    written = torch.zeros(kv.k_cache.shape[0], dtype=torch.bool)
    written[slots[new].cpu()] = True
    kept = ~written.to(device)
    assert torch.equal(kv.k_cache[kept], k_before[kept])
    assert torch.equal(kv.v_cache[kept], v_before[kept])
    for b, n in enumerate(lens):
        if n == 0:
            assert (out[b] == 0).all()
            continue
        assert_close(kv.k_cache[slots[b]], k_ref[b], dtype)
        assert torch.equal(kv.v_cache[slots[b]], v[b])
        keys, values = kv.dense(b)
        assert_close(out[b], attention_ref(q_ref[b:b + 1], keys, values)[0], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("lens", [[1], [7, 97], [255, 3, 40]])
def test_decode_attention_finishes_the_new_tokens_prologue(lens, page_size, norm, dtype):
    check_decode_new_tokens(lens, 4, 2, 16, page_size, dtype, 3, norm)


@pytest.mark.parametrize("lens", [[130, 5, 33], [1, 130, 1, 1, 40, 1, 0, 1], [40, 0, 40, 0]])
@pytest.mark.parametrize("num_sms", [1, 2, 7, 500])
def test_decode_attention_writes_each_new_token_once_on_any_grid(lens, num_sms):
    # units cut between programs at different blocks: only the program folding a unit's last
    # block writes its new key, and it reads it after; 500 programs give every block its own
    check_decode_new_tokens(lens, 8, 2, 32, 16, torch.float32, num_sms, True)


@pytest.mark.parametrize("ctas", [1, 2])
def test_pinned_decode_attention_finishes_the_prologue_whoever_survives(ctas):
    for lens, first, k in (([130, 5, 33], 1, 3), ([1, 130, 1, 0, 40], 0, 6)):
        for _, placement in placements(6, ctas, first, k, seed=len(lens)):
            pinned = Pinned(first, k, placement.to(torch.int32).to(DEV))
            check_decode_new_tokens(lens, 8, 2, 32, 16, torch.float32, None, True,
                                    ctas_per_sm=ctas, pinned=pinned)


def test_new_tokens_bad_inputs():
    kv = PagedKV([5, 9], 2, 16, 16, torch.float32, DEV)
    qkv = torch.randn(2, 8 * 16, device=DEV)
    q, k, v = qkv[:, :64].view(2, 4, 16), qkv[:, 64:96].view(2, 2, 16), qkv[:, 96:].view(2, 2, 16)
    cs, slots = rope_cache(16, 16, 1e4, DEV), torch.tensor([4, 8], device=DEV)
    w = torch.ones(16, device=DEV)

    def attend(**new):
        fields = {"k": k, "v": v, "cos_sin": cs, "slots": slots, **new}
        decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, kv.seq_lens, 16, 9,
                         new=NewTokens(**fields))
    for bad, says in (({"k": k.contiguous()}, "q's strides"), ({"v": v[:1]}, "new tokens' v"),
                      ({"cos_sin": cs[:8]}, "positions >= 9"),
                      ({"cos_sin": cs.double()}, "cos_sin has dtype"),
                      ({"q_norm": w}, "go together"), ({"q_norm": w[:8], "k_norm": w}, "8 entries"),
                      ({"slots": slots[:1]}, "1 entries for 2"),
                      ({"slots": slots.float()}, "slots has dtype")):
        with pytest.raises(PdmuxError, match=says):
            attend(**bad)
