"""Pinned partitions (kernels/_pinned.py): whatever programs survive the SM gate, every slot is
done exactly once, by programs on the partition's SMs (at most c to an SM), and the gate's
counters are left zero for the next launch. Under the interpreter a placement (a site a
program) stands in for `%smid`; on the GPU the hardware places the programs and the device's
site order says which SMs a range of sites is."""

import os
import re
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from conftest import HAS_CUDA
from reference import placements

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels import stream_read
from pdmux_triton.kernels._launch import shared_counters
from pdmux_triton.kernels._pinned import (_SITES, CLAIMING, CLAIMS, LAUNCH_TAG,
                                          SITE_ADMISSIONS, _gridid, FIRST_TAG, GATE_BUFFER_WORDS,
                                          GATE_WORDS, MAX_SITE, ONE_A_SITE, PINNED_GATES, TAGGED,
                                          TAGGED_CLAIMING, Pinned, admitted, first_slot, pinned_gate, pinned_launch,
                                          run_claimed, run_slots, site_order)

# indexed as kernels see their tensors' devices: the gate's counters are kept per device
DEV = torch.device("cuda", torch.cuda.current_device()) if HAS_CUDA else torch.device("cpu")


def _counters(device: torch.device = DEV) -> torch.Tensor:
    """The current stream's gate counters (the buffer's int32 counters, not the tagged gate's
    site tags, which are never reset)."""
    return shared_counters("pinned gate", GATE_BUFFER_WORDS, device)[:GATE_WORDS]


@triton.jit
def _count_slot(slot, slots, hits_ptr, worker_ptr, sm):
    tl.atomic_add(hits_ptr + slot, 1)
    tl.store(worker_ptr + 2 * slot, tl.program_id(0))
    tl.store(worker_ptr + 2 * slot + 1, sm)


@triton.jit
def _count_slots_kernel(hits_ptr, worker_ptr, admitted_ptr, gate_ptr, place_ptr, first_site, n_sms,
                        ctas, slots, programs, PINNED: tl.constexpr, PLACED: tl.constexpr,
                        BLOCK_SMS: tl.constexpr, PDL: tl.constexpr):
    """Each slot counts how often it was done and who did it (program id, SM) through the
    kernels' own claiming loop; each program says whether the gate admitted it. (PDL comes
    with every launch's keyword arguments; a pinned launch's is always off.)"""
    ok, _, sm = admitted(gate_ptr, place_ptr, first_site, n_sms, ctas, PLACED)
    tl.store(admitted_ptr + tl.program_id(0), ok.to(tl.int32))
    slot = first_slot(gate_ptr, ok, first_site, n_sms, slots, programs, BLOCK_SMS)
    run_claimed(_count_slot, (hits_ptr, worker_ptr, sm), slot, sm, worker_ptr, gate_ptr,
                first_site, n_sms, slots, programs, False, BLOCK_SMS)


def _served(pinned: Pinned, slots: int, ctas: int):
    launch = pinned_launch(pinned, slots, ctas, DEV)
    hits = torch.zeros(slots, dtype=torch.int32, device=DEV)
    worker = torch.full((slots, 2), -1, dtype=torch.int32, device=DEV)
    admitted = torch.full((launch.grid,), -1, dtype=torch.int32, device=DEV)
    _count_slots_kernel[(launch.grid,)](hits, worker, admitted, *launch.args, **launch.kwargs)
    return hits, worker, admitted.bool()


@pytest.mark.parametrize("total,first,k,ctas,slots", [
    (8, 0, 3, 1, 3), (8, 5, 3, 2, 6), (12, 2, 7, 3, 5), (6, 0, 6, 2, 12), (9, 4, 1, 4, 4),
    (5, 1, 2, 1, 1)])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_slot_done_once_whoever_survives(total, first, k, ctas, slots, seed):
    gate = _counters()
    for name, placement in placements(total, ctas, first, k, seed):
        placement = placement.to(torch.int32).to(DEV)
        hits, worker, admitted = _served(Pinned(first, k, placement), slots, ctas)
        assert (hits == 1).all(), (name, hits.tolist())
        assert (gate == 0).all(), f"{name}: the gate's counters were not left zero"
        # admitted: min(c, landed) programs on each SM of the range, none elsewhere
        inside = (placement >= first) & (placement < first + k)
        for sm in range(total):
            landed = int((placement == sm).sum())
            want = min(ctas, landed) if first <= sm < first + k else 0
            assert int(admitted[placement == sm].sum()) == want, (name, sm)
        workers = {int(p) for p in worker[:, 0]}
        if inside.any():  # only admitted programs worked
            assert all(admitted[p] for p in workers), name
        else:  # nobody was admitted: the launch's last program did every slot itself
            assert workers == {placement.numel() - 1}, name


@pytest.mark.parametrize("total,first,k,ctas,slots", [
    (8, 5, 3, 2, 6), (12, 2, 7, 3, 5), (6, 0, 6, 2, 12), (9, 4, 1, 4, 4), (8, 0, 3, 1, 5)])
@pytest.mark.parametrize("seed", [0, 1])
def test_tagged_claims_every_slot_once_whoever_survives(total, first, k, ctas, slots, seed):
    """The tagged claiming gate (several programs an SM, or more slots than sites): every slot
    once for any placement, launch after launch on one buffer with nothing reset, by programs
    on the range's sites, at most c of them a site; with none on the range the launch's last
    program does every slot itself; the counters are left untouched."""
    gate = _counters()
    for name, placement in placements(total, ctas, first, k, seed):
        placement = placement.to(torch.int32).to(DEV)
        with pinned_gate("tagged"):
            kind, hits, worker = _run_gated(Pinned(first, k, placement), slots, ctas)
        assert kind == TAGGED_CLAIMING
        assert (hits == 1).all(), (name, hits.tolist())
        assert (gate == 0).all(), name
        sites = [placement[p].item() for p in set(worker.tolist())]
        if ((placement >= first) & (placement < first + k)).any():
            assert all(first <= site < first + k for site in sites), (name, sites)
            assert all(sites.count(site) <= ctas for site in sites), (name, sites)
        else:
            assert set(worker.tolist()) == {placement.numel() - 1}, name


@pytest.mark.parametrize("ctas,slots", [(2, 6), (3, 5), (1, 9)])
@pytest.mark.parametrize("seed", [0, 1])
def test_tagged_claims_open_words_a_larger_tag_left(ctas, slots, seed):
    """Tags grow on a stream, but should a word hold a larger one (a launch id that did not
    grow), it is stale all the same: the claiming gate still does every slot once and leaves
    its own tag on the words it used."""
    words = shared_counters("pinned gate", GATE_BUFFER_WORDS, DEV).view(torch.int64)
    first, k = 2, 4
    for name, placement in placements(8, ctas, first, k, seed):
        placement = placement.to(torch.int32).to(DEV)
        ahead = (int(words[LAUNCH_TAG]) + 1000) << 16  # a later tag, over a count of 7
        words[SITE_ADMISSIONS.value:SITE_ADMISSIONS.value + GATE_WORDS] = ahead + 7
        words[CLAIMS.value] = ahead + 7
        with pinned_gate("tagged"):
            kind, hits, _ = _run_gated(Pinned(first, k, placement), slots, ctas)
        assert kind == TAGGED_CLAIMING
        assert (hits == 1).all(), (name, hits.tolist())
        assert int(words[CLAIMS.value]) >> 16 == int(words[LAUNCH_TAG]), name


@pytest.mark.parametrize("ctas,slots", [(1, 3), (1, 7), (3, 5)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_tagged_gates_write_only_their_sites_words(ctas, slots, seed):
    """What the tagged gates are for: a program off the range writes nothing. Launch after
    launch, with the launch tag jumping ahead between them (a GPU's grid ids count every
    launch of the context), every slot is done once and the only words of the gate buffer
    that change are the range's sites' (and the claims word, claiming)."""
    buffer = shared_counters("pinned gate", GATE_BUFFER_WORDS, DEV)
    words = buffer.view(torch.int64)
    gen = torch.Generator().manual_seed(seed)
    first, k = 2, 4
    for name, placement in placements(8, ctas, first, k, seed):
        placement = placement.to(torch.int32).to(DEV)
        words[LAUNCH_TAG] += int(torch.randint(0, 1 << 20, (), generator=gen))
        before = buffer.clone()
        with pinned_gate("tagged"):
            kind, hits, _ = _run_gated(Pinned(first, k, placement), slots, ctas)
        assert (hits == 1).all(), (name, hits.tolist())
        changed = {i // 2 for i in (buffer != before).nonzero().flatten().tolist()}  # int64
        base = FIRST_TAG if kind == TAGGED else SITE_ADMISSIONS.value
        allowed = {base + first + r for r in range(k)} | {LAUNCH_TAG}
        if kind == TAGGED_CLAIMING:
            allowed.add(CLAIMS.value)
        assert changed <= allowed, (name, sorted(changed - allowed))


# compiled for sm_90 in a process without the interpreter: a probe of the claims' max and add
_MAX_THEN_ADD = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pdmux_triton.kernels._pinned import _next_of

@triton.jit
def probe(word_ptr, out_ptr, packed):
    tl.store(out_ptr, _next_of(word_ptr.to(tl.pointer_type(tl.int64)), packed))

kernel = triton.compile(ASTSource(probe, {"word_ptr": "*i32", "out_ptr": "*i64",
                                          "packed": "i64"}, {}),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print(kernel.asm["ptx"])
"""


def test_the_claims_max_and_add_come_from_one_thread(tmp_path):
    """The tagged claiming gate takes a place or a slot by an atomic max and then an add on the
    same word, and counts on the add seeing the max: PTX orders two atomics of one thread on
    one address. Compiled for sm_90, Triton issues both from thread 0 (it broadcasts a scalar
    atomic's result): one predicate, thread 0's, on one address. A Triton that issued them
    from different threads would break the gate; this says so."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    probe = tmp_path / "probe.py"  # (Triton reads a kernel's source from its file)
    probe.write_text(_MAX_THEN_ADD)
    out = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    atomics = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(@%p\d+)\s+atom\.global\.\S*\.(max|add)\.\S+\s+\S+\s+\[\s*(\S+)", line)
        if m:
            atomics.setdefault(m.group(2), []).append((m.group(1), m.group(3)))
    assert len(atomics.get("max", [])) == 1 and len(atomics.get("add", [])) == 1, atomics
    (pred, address), = atomics["max"]
    assert atomics["add"] == [(pred, address)], atomics
    # thread 0's predicate: %tid.x == 0, or (Triton 3.6) %tid.x & (threads - 1) == 0
    tid = re.search(r"mov\.u32\s+(%r\d+),\s*%tid\.x;", out.stdout).group(1)
    masked = re.search(rf"and\.b32\s+(%r\d+),\s*{tid},\s*127;", out.stdout)
    checked = {tid, masked.group(1)} if masked else {tid}
    assert any(re.search(rf"setp\.eq\.[bsu]32\s+{pred[1:]},\s*{r},\s*0;", out.stdout)
               for r in checked), pred


@triton.jit
def _record_slot(slot, slots, hits_ptr, worker_ptr):
    tl.atomic_add(hits_ptr + slot, 1)
    tl.store(worker_ptr + slot, tl.program_id(0))


@triton.jit
def _gated_kernel(hits_ptr, worker_ptr, sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms, ctas,
                  slots, programs, PINNED: tl.constexpr, PLACED: tl.constexpr,
                  BLOCK_SMS: tl.constexpr, PDL: tl.constexpr):
    """The kernels' own entry (`run_slots`), whichever gate the launch took: each slot counts
    how often it was done and which program did it."""
    run_slots(_record_slot, (hits_ptr, worker_ptr), sm_ids_ptr, gate_ptr, place_ptr, first_site,
              n_sms, ctas, slots, programs, False, PINNED, PLACED, BLOCK_SMS, PDL)


def _run_gated(pinned: Pinned, slots: int, ctas: int):
    """(the gate the launch took, times each slot was done, the program that did each)."""
    launch = pinned_launch(pinned, slots, ctas, DEV)
    hits = torch.zeros(slots, dtype=torch.int32, device=DEV)
    worker = torch.full((slots,), -1, dtype=torch.int32, device=DEV)
    _gated_kernel[(launch.grid,)](hits, worker, worker, *launch.args, **launch.kwargs)
    return launch.kwargs["PINNED"], hits, worker


@pytest.mark.parametrize("total,first,k,slots", [
    (8, 0, 3, 3), (8, 5, 3, 2), (12, 2, 7, 7), (6, 0, 6, 6), (9, 4, 1, 1), (5, 1, 2, 1)])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("tagged", [False, True])
def test_one_a_site_slot_r_runs_on_site_r(total, first, k, slots, seed, tagged):
    """The one-a-site gates (one program an SM): slot r is done by the first program that
    arrived on the range's site r (the interpreter runs programs in order: the lowest id), a
    slot whose site got no program by the launch's last program, every slot once, launch after
    launch on one buffer, and the counters are left zero (the tagged gate touches none; its
    tags say which launch took each site last). The tagged gate's holder of slot 0 sweeps the
    sites still free after its slot, so it may take a site before its own program lands there
    (under the interpreter, every site of a later program)."""
    gate = _counters()
    for name, placement in placements(total, 1, first, k, seed):
        placement = placement.to(torch.int32).to(DEV)
        with pinned_gate("tagged" if tagged else "one a site"):
            kind, hits, worker = _run_gated(Pinned(first, k, placement), slots, 1)
        assert kind == (TAGGED if tagged else ONE_A_SITE)
        assert (hits == 1).all(), (name, hits.tolist())
        assert (gate == 0).all(), f"{name}: the gate's counters were not left zero"
        sweepers = {worker[0].item(), placement.numel() - 1} if tagged else set()
        for r in range(slots):
            on_site = (placement == first + r).nonzero().flatten().tolist()
            if HAS_CUDA:  # programs arrive in the hardware's order: one of the site's, if any
                assert not on_site or worker[r].item() in {*on_site, *sweepers}, (
                    name, r, worker.tolist())
            elif tagged:
                assert worker[r].item() in {*on_site[:1], *sweepers}, (name, r, worker.tolist())
                # the site's own program did it if it ran before slot 0's holder swept
                if on_site and on_site[0] < worker[0].item():
                    assert worker[r].item() == on_site[0], (name, r, worker.tolist())
            else:
                want = on_site[0] if on_site else placement.numel() - 1
                assert worker[r].item() == want, (name, r, worker.tolist())


def test_the_gates_take_turns_on_one_counter_buffer():
    """Launches of every gate on one stream share its gate buffer: each leaves its counters
    zero for the next (the tagged gates touch none), whichever ran before, and each does every
    slot once."""
    gate = _counters()
    placement = torch.tensor([3, 0, 1, 1, 5, 2, 4, 2], dtype=torch.int32, device=DEV)
    for gate_name, ctas, slots, want in (
            ("one a site", 1, 4, ONE_A_SITE), ("claiming", 1, 4, CLAIMING),
            ("tagged", 1, 4, TAGGED), ("one a site", 2, 7, CLAIMING), ("tagged", 1, 3, TAGGED),
            ("tagged", 2, 7, TAGGED_CLAIMING), ("one a site", 1, 3, ONE_A_SITE),
            ("tagged", 1, 4, TAGGED), ("tagged", 1, 5, TAGGED_CLAIMING),
            ("one a site", 1, 5, CLAIMING)):
        with pinned_gate(gate_name):
            # slots past the range's 4 sites (5 at c = 1): no site to rank them by, so they
            # are claimed
            kind, hits, _ = _run_gated(Pinned(1, 4, placement[:4 * ctas]), slots, ctas)
        assert kind == want and (hits == 1).all() and (gate == 0).all(), (gate_name, ctas)


def test_the_highest_site_is_counted_inside_the_gate_buffer():
    buffer = shared_counters("pinned gate", GATE_BUFFER_WORDS, DEV)
    assert buffer.numel() == GATE_BUFFER_WORDS
    gate = buffer[:GATE_WORDS]
    placement = torch.full((3,), MAX_SITE, dtype=torch.int32, device=DEV)
    hits, _, admitted = _served(Pinned(MAX_SITE, 1, placement), 2, 1)
    assert (hits == 1).all() and admitted.tolist() == [True, False, False]
    assert (gate == 0).all()
    # the tagged gate's tag of that site: its own word, before the launch tag's
    tags = buffer.view(torch.int64)
    with pinned_gate("tagged"):
        kind, hits, _ = _run_gated(Pinned(MAX_SITE, 1, placement), 1, 1)
        assert kind == TAGGED and (hits == 1).all() and (gate == 0).all()
        assert tags[FIRST_TAG + MAX_SITE].item() != 0 and buffer.numel() // 2 == tags.numel()
        # and the claiming form's word of that site (two slots, one site: claimed)
        kind, hits, _ = _run_gated(Pinned(MAX_SITE, 1, placement), 2, 1)
        assert kind == TAGGED_CLAIMING and (hits == 1).all() and (gate == 0).all()


@pytest.mark.parametrize("n", [1, 255, 10000])
def test_pinned_stream_read_reads_every_word(n):
    buf = torch.randint(-1000, 1000, (n,), dtype=torch.int32, device=DEV)
    for ctas in (1, 2):
        placement = torch.randint(6, (6 * ctas,), dtype=torch.int32).to(DEV)
        sums = stream_read(buf, ctas_per_sm=ctas, pinned=Pinned(2, 3, placement))
        assert sums.sum().item() == buf.sum().item()


def test_pinned_errors():
    placement = torch.zeros(4, dtype=torch.int32, device=DEV)
    buf = torch.zeros(64, dtype=torch.int32, device=DEV)
    with pytest.raises(PdmuxError, match="leave num_sms out"):
        stream_read(buf, num_sms=2, pinned=Pinned(0, 2, placement))
    with pytest.raises(PdmuxError, match="sms must be an integer >= 1"):
        Pinned(0, 0)
    with pytest.raises(PdmuxError, match="first_site must be an integer >= 0"):
        Pinned(-1, 2)
    with pytest.raises(PdmuxError, match="sites must be up to"):
        Pinned(MAX_SITE, 2)
    with pytest.raises(PdmuxError, match="head must be an integer >= 1"):
        Pinned(0, 2, head=0)
    with pytest.raises(PdmuxError, match="1-D int32 tensor"):
        stream_read(buf, pinned=Pinned(0, 2, placement.long()))
    with pytest.raises(PdmuxError, match="sites must be in 0"):
        stream_read(buf, pinned=Pinned(0, 2, placement - 1))
    if not HAS_CUDA:
        with pytest.raises(PdmuxError, match="only a GPU has"):
            stream_read(buf, pinned=Pinned(0, 2))
        with pytest.raises(PdmuxError, match="needs a CUDA GPU"):
            stream_read(buf, pdl=True)
    with pytest.raises(PdmuxError, match="pinned launch cannot overlap"):
        stream_read(buf, pinned=Pinned(0, 2, placement), pdl=True)


def _sites(sm_ids: torch.Tensor, head: int | None = None) -> list[int]:
    """The sites of recorded SM ids (the device's site order of `head`)."""
    order, _ = site_order(torch.device("cuda"), head)
    return [order.index(sm) for sm in sm_ids.tolist()]


@pytest.mark.gpu
def test_site_order_is_every_sm_once_however_the_gpu_is_named():
    total = torch.cuda.get_device_properties(0).multi_processor_count
    dev = torch.device("cuda", torch.cuda.current_device())
    first, table = site_order(dev)
    assert site_order(torch.device("cuda")) is _SITES[(dev, None)]  # one entry, however named
    assert sorted(first) == list(range(total)), first
    assert table[first].tolist() == list(range(total)) and (table[total:] == -1).all()


@pytest.mark.gpu
def test_a_splits_first_sites_are_where_a_capped_launch_of_its_size_lands():
    """What a pinned split reproduces: the sites 0..k-1 of its order (headed by k, its decode
    size) are the SMs a grid-capped GEMM of k programs lands on, another GEMM than the probe's;
    the first k programs of a launch of one an SM land elsewhere (session 23, on the H200:
    pairs of SMs, where a launch of 20 took one SM of each of 12 pairs and 124-131)."""
    from pdmux_triton.kernels import linear

    total = torch.cuda.get_device_properties(0).multi_processor_count
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(3, 2048, dtype=torch.bfloat16, device=dev)
    w = torch.randn(96 * total, 2048, dtype=torch.bfloat16, device=dev)
    for k in (20, 52):
        first, _ = site_order(dev, k)
        assert sorted(first) == list(range(total))
        sm_ids = torch.full((k,), -1, dtype=torch.int32, device=dev)
        linear(x, w, num_sms=k, sm_ids=sm_ids)
        assert set(sm_ids.tolist()) == set(first[:k]), (k, sorted(sm_ids.tolist()), first[:k])
    with pytest.raises(PdmuxError, match="site order's head must be 1"):
        site_order(dev, total + 1)


# (CTAs per SM, the gate at one an SM): every gate a pinned launch can take
GATES = [*((1, name) for name in PINNED_GATES), *((c, name) for c in (2, 3)
                                                  for name in ("claiming", "tagged"))]




@pytest.mark.gpu
@pytest.mark.parametrize("ctas,gate", GATES)
def test_pinned_stream_read_stays_on_its_sms(ctas, gate):
    """On the GPU the hardware places the programs: every slot runs on the partition's SMs,
    the read is whole, and the counters are left zero. One a site: slot r on site r (on an
    idle GPU every SM of the range gets a program, as the claiming gate's c = 1 shows)."""
    total = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.randint(-1000, 1000, (1 << 24,), dtype=torch.int32, device="cuda")
    for first, k in ((0, 16), (total - 20, 20), (40, 52)):
        sm_ids = torch.empty(k * ctas, dtype=torch.int32, device="cuda")
        with pinned_gate(gate):
            sums = stream_read(buf, ctas_per_sm=ctas, pinned=Pinned(first, k), sm_ids=sm_ids)
        assert sums.sum().item() == buf.sum().item()
        assert all(first <= s < first + k for s in _sites(sm_ids)), sm_ids.tolist()
        assert (_counters(buf.device) == 0).all()
        if ctas == 1:  # SM ids are 0..total-1 and the hardware gave each SM of the range one
            assert len(set(sm_ids.tolist())) == k, sorted(set(sm_ids.tolist()))
        if ctas == 1 and gate != "claiming":
            assert _sites(sm_ids) == list(range(first, first + k)), _sites(sm_ids)


def _decode_inputs():
    """A ragged decode batch's attention inputs, its activations and three weights (few tiles,
    split, to many, whole)."""
    from pdmux_triton.measure.random_kv import PagedKV

    torch.manual_seed(3)
    kv = PagedKV([3000, 17, 900, 5000, 1], 8, 128, 16, torch.bfloat16, "cuda")
    lens = torch.tensor(kv.lens, dtype=torch.int32, device="cuda")
    q = torch.randn(5, 32, 128, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(8, 4096, dtype=torch.bfloat16, device="cuda")
    ws = [torch.randn(n, 4096, dtype=torch.bfloat16, device="cuda") / 64
          for n in (1024, 4096, 12288)]
    return kv, lens, q, x, ws


def _decode_kernels(inputs, pinned: Pinned | None, num_sms: int | None, ctas: int):
    from pdmux_triton.kernels import decode_attention, linear

    kv, lens, q, x, ws = inputs
    budget = {"num_sms": num_sms, "ctas_per_sm": ctas, "pinned": pinned}
    return [decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, lens, 16, 5000, **budget),
            *(linear(x, w, **budget) for w in ws)]


@pytest.mark.gpu
@pytest.mark.parametrize("ctas,gate", GATES)
def test_pinned_decode_kernels_equal_the_capped_launch(ctas, gate):
    """Admitted programs do the capped launch's programs' work as slots: the same results to
    the bit (same partials, same merge order), on the hardware's placement and on a placement
    that admits fewer programs than c x k (all programs crowded onto two SMs: one a site, the
    last arriver does the other 18 sites' slots)."""
    total = torch.cuda.get_device_properties(0).multi_processor_count
    inputs = _decode_inputs()
    capped = _decode_kernels(inputs, None, 20, ctas)
    crowded = torch.full((ctas * total,), total - 20, dtype=torch.int32, device="cuda")
    crowded[::2] = total - 1
    with pinned_gate(gate):
        pinned = _decode_kernels(inputs, Pinned(total - 20, 20), None, ctas)
        few = _decode_kernels(inputs, Pinned(total - 20, 20, crowded), None, ctas)
    for a, b, c in zip(capped, pinned, few):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_a_capture_zeroes_the_tags_once_before_its_first_tagged_launch(monkeypatch):
    """A graph's replays repeat its launches' grid ids, so the tags a replay finds must be
    zeroed within the graph: once a capture, before its first tagged launch on a buffer, and
    again in the next capture (the capture's id told apart by the driver, stubbed here); an
    eager GPU launch zeroes nothing (its grid id is new)."""
    import pdmux_triton.kernels._pinned as pinned_module

    gate = torch.zeros(GATE_BUFFER_WORDS, dtype=torch.int32)
    words = gate.view(torch.int64)
    words[:FIRST_TAG] = 3  # the counters before the tags
    monkeypatch.setattr(pinned_module, "_INTERPRETING", False)
    monkeypatch.setattr(pinned_module, "_TAGS_ZEROED", {})
    capturing, capture = [False], [7]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(pinned_module, "_capture_id", lambda stream: capture[0])

    def launch_after(tag):  # a launch's programs leave their tag on the words
        pinned_module._fresh_tags(gate)
        before = words[FIRST_TAG:].clone()
        words[FIRST_TAG:] = tag
        return before

    assert (launch_after(5) == 0).all()  # eager: nothing zeroed, so the next sees 5
    assert (launch_after(6) == 5).all()
    capturing[0] = True
    assert (launch_after(8) == 0).all()  # the capture's first tagged launch: zeroed
    assert (launch_after(9) == 8).all()  # its second: not again
    capture[0] = 11
    assert (launch_after(8) == 0).all()  # the next capture zeroes again
    assert (words[:FIRST_TAG] == 3).all()  # the counters are left alone


@triton.jit
def _grid_id_kernel(out_ptr, at):
    if tl.program_id(0) == 0:
        tl.store(out_ptr + at, _gridid())


@pytest.mark.gpu
def test_grid_ids_are_new_at_every_eager_launch_and_repeat_at_every_replay():
    """The tagged gates' tag is the launch's %gridid. Eager launches, another stream's
    included, never repeat an id, and on a stream the ids grow (the claiming form opens its
    claims word by an atomic max); a graph's replays repeat the ids of its capture, in capture
    order, which is why a capture zeroes the tags first (`_fresh_tags`)."""
    ids = torch.full((64,), -1, dtype=torch.int64, device="cuda")
    streams = [torch.cuda.Stream() for _ in range(2)]
    with torch.cuda.stream(streams[0]):
        for at in range(3):
            _grid_id_kernel[(2,)](ids, at)
    graphs = []
    for g in range(2):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=streams[0]):
            for at in (3 + 2 * g, 4 + 2 * g):
                _grid_id_kernel[(2,)](ids, at)
        graphs.append(graph)
    torch.cuda.synchronize()
    eager = ids[:3].tolist()  # (a capture runs nothing)
    replays = [[], []]
    for _ in range(3):
        for g, graph in enumerate(graphs):
            with torch.cuda.stream(streams[0]):
                graph.replay()
            with torch.cuda.stream(streams[1]):
                _grid_id_kernel[(2,)](ids, 63)
            torch.cuda.synchronize()  # (a replay writes the same entries again: read them now)
            replays[g].append(ids[3 + 2 * g:5 + 2 * g].tolist())
            eager.append(ids[63].item())
    print(f"grid ids: eager {eager}, replays {replays}")
    assert -1 not in eager and len(set(eager)) == len(eager), eager
    assert eager == sorted(eager), eager
    for runs in replays:
        assert all(run == runs[0] for run in runs) and runs[0] == sorted(set(runs[0])), runs
        # below every eager launch after the capture: those find the words a replay left
        # open to their atomic max
        assert max(runs[0]) < min(eager[3:]), (runs, eager)
        assert not set(runs[0]) & set(eager), (runs, eager)
    # the claiming form packs the tag's low 47 bits: far from wrapping
    assert max(eager) < 1 << 46, max(eager)


@pytest.mark.gpu
def test_pinned_sides_share_no_sm_and_replay_from_a_graph():
    """Two pinned reads on complementary SMs, on two streams at once, stay on their SMs; a
    captured graph of pinned decode kernels replays exactly on new inputs."""
    total = torch.cuda.get_device_properties(0).multi_processor_count
    bufs = [torch.randint(-9, 9, (1 << 26,), dtype=torch.int32, device="cuda") for _ in range(2)]
    sides = [(0, 20), (20, total - 20)]
    streams = [torch.cuda.Stream() for _ in sides]
    seen = []
    for _ in range(3):
        ids = [torch.empty(k * 2, dtype=torch.int32, device="cuda") for _, k in sides]
        sums = []
        for (first, k), stream, buf, sm_ids in zip(sides, streams, bufs, ids):
            with torch.cuda.stream(stream):
                sums.append(stream_read(buf, ctas_per_sm=2, pinned=Pinned(first, k),
                                        sm_ids=sm_ids))
        torch.cuda.synchronize()
        for (first, k), s, buf, sm_ids in zip(sides, sums, bufs, ids):
            assert s.sum().item() == buf.sum().item()
            assert all(first <= s < first + k for s in _sites(sm_ids))
        seen.append([set(i.tolist()) for i in ids])
    assert all(not (a & b) for a, b in seen)

    inputs = _decode_inputs()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up on the capturing stream: counters made once
        _decode_kernels(inputs, Pinned(0, 16), None, 2)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = _decode_kernels(inputs, Pinned(0, 16), None, 2)
    _, _, q, x, _ = inputs
    for _ in range(2):
        q.normal_()
        x.normal_()
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(_decode_kernels(inputs, None, 16, 2), captured):
            assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["one a site", "tagged"])
def test_one_a_site_sides_at_once_and_in_a_graph_beside_the_claiming_gate(gate):
    """Both sides one a site on complementary SMs, on two streams at once, results exact: a
    decode GEMM (one program an SM by its shared memory) and rmsnorm (small programs, which may
    share an SM). Every slot runs on its own site but those of sites the hardware left empty,
    which all run where the last arriver is (one SM; the tagged gate's two sweepers: two SMs;
    how many is printed). Then a captured graph of a served decode side, attention at three an
    SM (the claiming gate) and the linears one a site, replays exactly on new inputs (the
    tagged gates: each replay on zeroed tags), and so does a graph of one linear; every stream's
    gate counters are left zero."""
    from pdmux_triton.kernels import decode_attention, linear, rmsnorm

    total = torch.cuda.get_device_properties(0).multi_processor_count
    sides = [(0, 20), (20, total - 20)]
    x = torch.randn(8, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(128 * total, 4096, dtype=torch.bfloat16, device="cuda") / 64
    rows = torch.randn(4 * total, 4096, dtype=torch.bfloat16, device="cuda")
    norm_w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    want = [linear(x, w), rmsnorm(rows, norm_w)]
    streams = [torch.cuda.Stream() for _ in sides]
    with pinned_gate(gate):
        for _ in range(3):
            got, ids = [], []
            for (first, k), stream in zip(sides, streams):
                sm = [torch.empty(k, dtype=torch.int32, device="cuda") for _ in want]
                with torch.cuda.stream(stream):
                    got.append([linear(x, w, pinned=Pinned(first, k), sm_ids=sm[0]),
                                rmsnorm(rows, norm_w, pinned=Pinned(first, k), sm_ids=sm[1])])
                ids.append(sm)
            torch.cuda.synchronize()
            for (first, k), results, sm in zip(sides, got, ids):
                for a, b, where in zip(want, results, sm):
                    assert torch.equal(a, b)
                    sites = _sites(where)
                    off = [r for r, site in enumerate(sites) if site != first + r]
                    assert len({sites[r] for r in off}) <= (2 if gate == "tagged" else 1), sites
                    print(f"sites {first}..{first + k - 1}: {len(off)} slots off their site")

        inputs = _decode_inputs()
        kv, lens, q, x8, ws = inputs
        stream = torch.cuda.Stream()

        def side():
            return [decode_attention(q, kv.k_cache, kv.v_cache, kv.page_table, lens, 16, 5000,
                                     ctas_per_sm=3, pinned=Pinned(0, 16)),
                    *(linear(x8, w, pinned=Pinned(0, 16)) for w in ws)]

        with torch.cuda.stream(stream):  # warm up on the capturing stream: counters made once
            side()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = side()
        for _ in range(2):
            q.normal_()
            x8.normal_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(captured[0], decode_attention(
                q, kv.k_cache, kv.v_cache, kv.page_table, lens, 16, 5000, num_sms=16,
                ctas_per_sm=3))
            for w, b in zip(ws, captured[1:]):
                assert torch.equal(linear(x8, w, num_sms=16), b)
        # a graph of one launch: each replay finds the words its last one left
        lone = torch.cuda.CUDAGraph()
        with torch.cuda.graph(lone, stream=stream):
            one = linear(x8, ws[0], pinned=Pinned(0, 16))
        for _ in range(2):
            x8.normal_()
            lone.replay()
            torch.cuda.synchronize()
            assert torch.equal(linear(x8, ws[0], num_sms=16), one)
    for s in (*streams, stream):
        with torch.cuda.stream(s):
            assert (_counters(q.device) == 0).all()
