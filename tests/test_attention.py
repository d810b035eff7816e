import importlib
import sys

import pytest
import torch
import triton
import triton.language as tl
from conftest import HAS_CUDA
from reference import assert_close, attention_ref, placements, poisoned

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels import decode_attention, extend_attention
from pdmux_triton.kernels.decode_attention import UNIT_COST, cache_lines, first_segment_head
from pdmux_triton.kernels._pinned import PINNED_GATES, Pinned, pinned_gate
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


@pytest.mark.parametrize("ctas,gate", [*((1, name) for name in PINNED_GATES), (2, "claiming"),
                                       (3, "claiming")])
def test_pinned_decode_attention_whoever_survives(ctas, gate):
    """On a pinned partition (kernels/_pinned.py) the admitted programs do the capped launch's
    programs' ranges as slots: exact for any placement, including none in the range, with
    every gate at one program an SM, and at several an SM (the body called apart)."""
    for lens, first, k in (([130, 5, 33], 1, 3), ([1, 130, 1, 0, 40], 0, 6), ([40] * 6, 5, 1)):
        for _, placement in placements(6, ctas, first, k, seed=len(lens)):
            pinned = Pinned(first, k, placement.to(torch.int32).to(DEV))
            with pinned_gate(gate):
                check_decode(lens, 8, 2, 32, 16, torch.float32, None, ctas_per_sm=ctas,
                             pinned=pinned)


@triton.jit
def _record_head(offsets, out_ptr, pid, KEYS: tl.constexpr, LINES: tl.constexpr):
    k = tl.arange(0, KEYS)
    line = tl.arange(0, LINES)
    tl.store(out_ptr + (pid * KEYS + k[:, None]) * LINES + line[None, :], offsets)


@triton.jit
def _first_segment_head_kernel(out_ptr, pt_ptr, len_ptr, B, KV_HEADS, sc_s, sc_h, spt_b,
                               PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_B: tl.constexpr, UNIT_COST: tl.constexpr,
                               KEYS: tl.constexpr, D: tl.constexpr, LINES: tl.constexpr,
                               WIDE: tl.constexpr):
    pid = tl.program_id(0)
    first_segment_head(_record_head, (out_ptr, pid, KEYS, LINES), pid, tl.num_programs(0),
                       pt_ptr, len_ptr, B, KV_HEADS, sc_s, sc_h, spt_b, PAGE_SIZE, BLOCK_N,
                       BLOCK_B, UNIT_COST, KEYS, D, LINES, WIDE)


def first_segment_heads_ref(lens, hkv, programs, block_n, keys, kv):
    """Per program, the cache offsets (one per 128-byte line of each key's head row) of the
    first `keys` keys of the first of its segments that reads any K/V (None if none does), as
    decode attention's work split gives them: units (request, KV head) of cdiv(len, block_n)
    blocks after UNIT_COST slots each, back to back, in equal contiguous ranges."""
    _, _, d = kv.k_cache.shape
    per_line = d // cache_lines(kv.k_cache)
    sc_s, sc_h = kv.k_cache.stride(0), kv.k_cache.stride(1)
    work = [-(-n // block_n) + UNIT_COST if n else 0 for n in lens]
    total = sum(work) * hkv
    per = max(1, -(-total // programs))
    table = kv.page_table.tolist()
    out = []
    for p in range(programs):
        lo, hi, start_of_unit, head = p * per, min(p * per + per, total), 0, None
        for b, w in enumerate(work):
            for h in range(hkv):
                first_block, unit_end = start_of_unit + UNIT_COST, start_of_unit + w
                start_of_unit = unit_end
                seg_lo, seg_hi = max(lo, first_block), min(hi, unit_end)
                if seg_lo < seg_hi and head is None:
                    start = (seg_lo - first_block) * block_n
                    end = min(lens[b], (seg_hi - first_block) * block_n)
                    pos = [min(start + i, end - 1) for i in range(keys)]
                    slots = [table[b][x // kv.page_size] * kv.page_size + x % kv.page_size
                             for x in pos]
                    head = [[slot * sc_s + h * sc_h + line * per_line
                             for line in range(cache_lines(kv.k_cache))] for slot in slots]
        out.append(head)
    return out


@pytest.mark.parametrize("lens,programs", [([130, 5, 33], 3), ([1, 130, 1, 0, 40, 1], 7),
                                           ([40] * 6, 5), ([97], 1), ([7, 300], 40)])
@pytest.mark.parametrize("keys", [16, 32])
@pytest.mark.parametrize("page_size,wide", [(16, False), (1, True)])
def test_first_segment_head_names_its_first_keys(lens, programs, keys, page_size, wide):
    """What decode attention prefetches before it waits for the kernel before it (PDL): the
    rows of the first keys of a program's first segment that reads K/V, read from the same
    lengths and pages its work split reads, past the segment's end its last key again (inside
    the request); a program whose range holds only fixed-cost slots is left alone (poisoned
    stays). In 64-bit offsets too (caches of 2^31 elements or more)."""
    d, hkv, block_n = 64, 2, 16  # fp32 rows of 256 bytes: 2 lines a row
    kv = PagedKV(lens, hkv, d, page_size, torch.float32, DEV)
    lines = cache_lines(kv.k_cache)
    out = torch.full((programs, keys, lines), -1, dtype=torch.int64 if wide else torch.int32,
                     device=DEV)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    _first_segment_head_kernel[(programs,)](
        out, kv.page_table, seq_lens, len(lens), hkv, kv.k_cache.stride(0), kv.k_cache.stride(1),
        kv.page_table.stride(0), PAGE_SIZE=page_size, BLOCK_N=block_n,
        BLOCK_B=triton.next_power_of_2(len(lens)), UNIT_COST=UNIT_COST, KEYS=keys, D=d,
        LINES=lines, WIDE=wide)
    ref = first_segment_heads_ref(lens, hkv, programs, block_n, keys, kv)
    for p, head in enumerate(ref):
        want = head if head is not None else [[-1] * lines] * keys
        assert out[p].tolist() == want, f"program {p}"


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


def test_decode_attention_refuses_a_prefetch_of_other_than_a_power_of_two(monkeypatch):
    module = importlib.import_module("pdmux_triton.kernels.decode_attention")
    monkeypatch.setattr(module, "PDL_PREFETCH_BLOCKS", 3)
    with pytest.raises(PdmuxError, match="PDL_PREFETCH_BLOCKS must be 0 or a power of two, got 3"):
        check_decode([40], 4, 2, 16, 16, torch.float32, num_sms=2)


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", [1, 2])
def test_decode_attention_prefetching_before_its_wait(monkeypatch, blocks):
    # programmatic dependent launch on the whole GPU, with the first segment's first K/V
    # blocks fetched into L2 before the wait: the same attention (a hint changes no value)
    # (the module by its name: the package's `decode_attention` is the function)
    module = importlib.import_module("pdmux_triton.kernels.decode_attention")
    monkeypatch.setattr(module, "PDL_PREFETCH_BLOCKS", blocks)
    for lens in ([1, 100, 2048, 16000, 131072], [2048] * 32, [0, 5, 0, 300]):
        check_decode(lens, 32, 8, 128, 16, torch.bfloat16, num_sms=132, device="cuda", pdl=True)


@pytest.mark.gpu
@pytest.mark.parametrize("extend,prefix", [([8192], [0]), ([2048], [6144]), ([97, 1000], [0, 300])])
def test_extend_attention_bf16_real_sizes(extend, prefix):
    check_extend(extend, prefix, 32, 8, 128, 16, torch.bfloat16, num_sms=112, device="cuda")
