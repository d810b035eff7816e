"""What in a pinned launch costs: the skinny GEMM's body under each piece of the gate, one
piece at a time (bench/results/gate-anatomy-<gpu>.json).

A pinned skinny GEMM on 20 SMs ran ~10% slower than the same GEMM grid-capped to 20 programs
(bench/results/pinned/), with the same inner loop, and the gap grew with the bytes each program
reads. Measured here in one process, the down projection (32 rows, [4096, 12288]) and a wider
one, each as a CUDA graph of back-to-back launches of 20 programs on an ordinary stream, every
launch after zeroing a small counter buffer (so each variant pays the same memset):
- `plain`: the capped launch's program body, as the product launches it;
- `loop`: the body inside the slot loop (`while slot < slots`), slots = program ids, no atomic;
- `atomic first`: one relaxed atomic (a counter of its own per program) before the body;
- `queue`: slots claimed from one relaxed counter, in the slot loop (the gate without the SM
  test);
- `extra programs`: a launch of as many programs as the GPU has SMs, of which the first 20 do
  the capped launch's work and the rest leave at once (the pinned launch's grid, no atomics);
- `rank by site` (a gate with fewer round trips, bench/NOTES.md "Next" 0001c): a program per
  SM reads its SM id and its site (the capped launch's SMs are sites 0..19), takes the slot
  of its site by one relaxed atomic, does it, and leaves by one release atomic; `rank by site,
  no leave` without the last atomic, `relaxed leave` with it relaxed (is the fence the
  cost, or the round trip?), `spread leave` with it relaxed on one of 16 words by program id
  (is it the one word all of the GPU's programs hit?), `workers leave` with only the programs
  that worked leaving by it (or the turned-away programs' traffic?), `late leave` with the
  turned-away programs' leave 20 us after they start, or 5 or 2 (the atomics at the working
  programs' start, or at all?), `stored leave` with a plain store a program, each to its own
  word (an atomic, or any write?), `far leave` and `far stored leave` with the atomic, or the
  stores, in a buffer of their own megabytes away (the gate's lines, or any write?). `site by
  table`: a program on one of the sites takes its slot with no atomic at all (a launch of one
  program an SM, so none lands twice), and every program leaves by the relaxed atomic, or not
  (`no leave`): do the writes slow the working programs' first loads, or their admission
  atomic's round trip? `rank by site, arrival first`: the leave moved to the start,
  an acquire-release arrival right after the site's atomic, whose last arriver would do the
  slots of sites that got no program (none here) and resets the count: no atomic at the end.
  `tagged`: the tagged gate's pieces (`_pinned.run_tagged`) in this kernel: `bare` (a program
  on a site takes it by exchanging a tag into the site's word; nobody else writes), `sweep`
  (and slot 0's program takes the sites still free after its slot), `last waits` (and the
  last program waits for site 0 to be taken), `whole gate` (both, as the product), `last
  sweeps` (no sweep after slot 0: the last program reads until every site is taken, at most
  5 us, then takes those still free), the bare gate on a 32-bit exchange or a 32-bit add
  (is the 64-bit exchange the cost?) and with its body under an `if`, not in the slot loop;
  and `rank by site, no leave, in a loop` (is the loop around the body the cost?), then that
  mode with one thing changed (the notes at RANK_IN_LOOP below): no atomic (`site by table,
  no leave, in a loop`), `if` for `while` (`joined if`), the body on the site, not the
  loop's slot (`body on site`), a `for` loop, with LICM off or not, the body once under `if`
  and an idle second copy in a loop after it (`idle loop after`), and the admission atomic
  under a mask, not a branch (`masked atomic`). All are checked against `plain`'s output;
- `pinned`: the product's pinned launch (kernels/_pinned.py) on sites 0..19, with the
  device's measured site order and with an order whose first 20 sites are the SMs the capped
  launch ran on (so the two run on the same SMs); with the product's gate at one program an
  SM (the one-a-site gate, `_pinned.ONE_A_SITE_AT_C1`: the idea `rank by site, arrival first`
  as the product does it), with the claiming gate and with the tagged gate (no program off
  the range writes: `_pinned.TAGGED_SITES`).

    python bench/gate_anatomy.py --out bench/results
"""

from __future__ import annotations

import contextlib
import sys

import torch
import triton
import triton.language as tl
from common import gpu_results, sites_headed_by

from pdmux_triton.kernels import linear
from pdmux_triton.kernels._pinned import (GATE_WORDS, Pinned, _first_free, _take_free_site,
                                          _take_site_0, _thread_0s, _wait_for_tag, pinned_gate,
                                          site_order, site_table)
from pdmux_triton.kernels.gemm import _skinny_slot, plan
from pdmux_triton.measure.timing import time_alone

SMS, ROWS = 20, 32
SHAPES = {"down": (4096, 12288), "gate_up": (24576, 4096)}
MODES = ("plain", "loop", "atomic first", "queue", "extra programs", "rank by site",
         "rank by site, no leave", "rank by site, relaxed leave", "rank by site, arrival first",
         "rank by site, spread leave", "rank by site, workers leave", "rank by site, late leave",
         "rank by site, stored leave", "rank by site, late leave 5 us",
         "rank by site, late leave 2 us", "rank by site, far leave",
         "rank by site, far stored leave", "site by table, leave", "site by table, no leave",
         "tagged, bare", "tagged, sweep", "tagged, last waits", "tagged, whole gate",
         "tagged, last sweeps", "tagged, bare, 32-bit words", "tagged, bare, by add",
         "tagged, bare, no loop", "rank by site, no leave, in a loop",
         # why the loop costs (each `rank by site, no leave, in a loop` but for one thing):
         "site by table, no leave, in a loop", "rank by site, no leave, joined if",
         "rank by site, no leave, in a loop, body on site",
         "rank by site, no leave, in a for loop", "rank by site, no leave, in a for loop, no licm",
         "rank by site, no leave, idle loop after", "rank by site, no leave, in a loop, masked atomic")
ONE_AN_SM = MODES[4:]  # grids of every SM
# `spread leave`'s words: 16, a 128-byte line apart, after the site counts
SPREAD_BASE, SPREAD_WORDS, SPREAD_STRIDE = tl.constexpr(256), tl.constexpr(16), tl.constexpr(32)
# the far leaves' words: in a buffer of their own, megabytes from the gate's
FAR_WORDS, FAR_BASE = 1 << 21, tl.constexpr(1 << 20)
FAR_LEAVE = tl.constexpr(MODES.index("rank by site, far leave"))
FAR_STORED_LEAVE = tl.constexpr(MODES.index("rank by site, far stored leave"))
BY_TABLE = tl.constexpr(MODES.index("site by table, leave"))  # and the next, without it
# the tagged gate's pieces (kernels/_pinned.run_tagged), the `tagged` modes: its sites' words
# alone, with the sweep after slot 0, with the last program's wait, with both (the whole gate);
# and another way to the same guarantee: no sweep after slot 0, but the last program, once it
# has done its own slot or at once if it has none, waits by reads alone (at most 5 us) until
# every site is taken, and takes the ones still free
TAGGED_FIRST = tl.constexpr(MODES.index("tagged, bare"))
TAGGED_SWEEP, TAGGED_LAST, TAGGED_WHOLE, TAGGED_LAST_SWEEPS = (
    tl.constexpr(MODES.index(f"tagged, {piece}"))
    for piece in ("sweep", "last waits", "whole gate", "last sweeps"))
TAGGED_32, TAGGED_ADD = (tl.constexpr(MODES.index(f"tagged, bare, {word}"))
                         for word in ("32-bit words", "by add"))
TAGGED_LANES = tl.constexpr(32)  # the product's BLOCK_SMS at 20 sites
# the body called once, not in the slot loop (the bare tagged gate), and `rank by site, no
# leave` with its body in the slot loop: is it the loop around the body that costs?
TAGGED_NO_LOOP = tl.constexpr(MODES.index("tagged, bare, no loop"))
RANK_IN_LOOP = tl.constexpr(MODES.index("rank by site, no leave, in a loop"))
# why the loop costs, one piece at a time: every one of these is `rank by site, no leave, in a
# loop` (RANK_IN_LOOP) with one thing changed; each program on a site does its slot once.
# Offline (sm_90, triton 3.6) RANK_IN_LOOP's K loop holds a SHFL.IDX + R2UR that plain's lacks:
# the program's thread id, read under the admission atomic's branch (thread 0 does the atomic)
# and again in the body, is merged by LLVM (GVN's PRE) into a phi of two %tid.x reads after
# the branch, so ptxas no longer sees the warp id as uniform and re-shuffles it every K step.
# - `site by table, no leave, in a loop`: no atomic, the site's slot by table alone, in the
#   loop (is it the loop with turned-away programs, whatever came before it?)
BY_TABLE_LOOP = tl.constexpr(MODES.index("site by table, no leave, in a loop"))
# - `joined if`: the loop's `while` written `if` (the body reached after a join, run once)
JOINED_IF = tl.constexpr(MODES.index("rank by site, no leave, joined if"))
# - `body on site`: the body given `site`, the loop deciding only whether it runs (the
#   loop-carried slot feeding the body's addresses?)
LOOP_ON_SITE = tl.constexpr(MODES.index("rank by site, no leave, in a loop, body on site"))
# - `in a for loop`: `for _ in range(0, n)`, n = 1 admitted else 0 (scf.for, not scf.while),
#   the body on `site`; `no licm`: the same on tl.range(disable_licm=True) (hoisting out of it?)
RANK_IN_FOR = tl.constexpr(MODES.index("rank by site, no leave, in a for loop"))
RANK_IN_FOR_NO_LICM = tl.constexpr(MODES.index("rank by site, no leave, in a for loop, no licm"))
# - `idle loop after`: `rank by site, no leave` (the body under `if`) and after it a second
#   copy of the body in a loop that never runs (its first slot is `slots` unless the site is
#   2**20 or more, which the compiler cannot rule out): the body-once shape; does the copy cost?
IDLE_LOOP_AFTER = tl.constexpr(MODES.index("rank by site, no leave, idle loop after"))
# - `masked atomic`: the admission atomic predicated by a mask, no branch around it, so the
#   thread id is read once before any branch (the lost uniform warp id, if it is that)
LOOP_MASKED = tl.constexpr(MODES.index("rank by site, no leave, in a loop, masked atomic"))
# the late leaves: how long a turned-away program waits first (0: no late leave), by mode
LATE_NS = {MODES.index(name): ns for name, ns in (("rank by site, late leave", 20_000),
                                                  ("rank by site, late leave 5 us", 5_000),
                                                  ("rank by site, late leave 2 us", 2_000))}


@triton.jit
def wait_ns(ns):
    """Spin for `ns` nanoseconds of %globaltimer: a wait on the clock, never on another
    program."""
    now = tl.extra.cuda.globaltimer()
    until = now + ns
    while now < until:
        now = tl.extra.cuda.globaltimer()


@triton.jit
def _anatomy_kernel(x_ptr, w_ptr, y_ptr, b_ptr, part_ptr, count_ptr, queue_ptr, table_ptr,
                    far_ptr, slots, M, N, K, stride_xm, stride_wn, stride_ym, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                    WHOLE_TILES: tl.constexpr, MODE: tl.constexpr, LATE: tl.constexpr):
    # the body's arguments as a tuple literal in the call (a tuple bound to a local name turns
    # its constexprs into tensors), as kernels/_pinned.run_slots takes them
    _run_mode(tl.program_id(0), slots, queue_ptr, table_ptr, far_ptr,
              (x_ptr, w_ptr, y_ptr, b_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_wn,
               stride_ym, 0.0, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, WHOLE_TILES, False, False, False,
               False), MODE, LATE)


@triton.jit
def _run_mode(pid, programs, queue_ptr, table_ptr, far_ptr, args, MODE: tl.constexpr,
              LATE: tl.constexpr):
    if MODE == 0:
        _skinny_slot(pid, programs, *args)
    elif MODE == 1:
        slot = pid
        while slot < programs:
            _skinny_slot(slot, programs, *args)
            slot += programs
    elif MODE == 2:
        if tl.atomic_add(queue_ptr + 1 + pid, 1, sem="relaxed") >= 0:
            _skinny_slot(pid, programs, *args)
    elif MODE == 3:
        slot = tl.atomic_add(queue_ptr, 1, sem="relaxed")
        while slot < programs:
            _skinny_slot(slot, programs, *args)
            slot = tl.atomic_add(queue_ptr, 1, sem="relaxed")
    elif MODE == 4:
        if pid < programs:
            _skinny_slot(pid, programs, *args)
    elif MODE == 8:  # rank by site, the arrival counted at the start: no atomic at the end
        site = tl.load(table_ptr + tl.extra.cuda.smid())
        ok = (site >= 0) & (site < programs)
        if ok:
            ok = tl.atomic_add(queue_ptr + 2 + site, 1, sem="relaxed") == 0
        if tl.atomic_add(queue_ptr + 1, 1, sem="acq_rel") == tl.num_programs(0) - 1:
            tl.store(queue_ptr + 1, 0)  # the last arriver: every admission is in by now
        if ok:
            _skinny_slot(site, programs, *args)
    elif MODE == RANK_IN_LOOP:
        site = tl.load(table_ptr + tl.extra.cuda.smid())
        slot = programs
        if site < programs:
            if site >= 0:
                if tl.atomic_add(queue_ptr + 2 + site, 1, sem="relaxed") == 0:
                    slot = site
        _in_a_loop(slot, programs, args)
    elif MODE >= BY_TABLE_LOOP:
        _loop_pieces(programs, queue_ptr, table_ptr, args, MODE)
    elif MODE >= TAGGED_FIRST:
        _tagged_pieces(programs, queue_ptr, table_ptr, args,
                       (MODE == TAGGED_SWEEP) | (MODE == TAGGED_WHOLE),
                       (MODE == TAGGED_LAST) | (MODE == TAGGED_WHOLE),
                       MODE == TAGGED_LAST_SWEEPS,
                       1 if MODE == TAGGED_32 else (2 if MODE == TAGGED_ADD else 0),
                       MODE != TAGGED_NO_LOOP)
    elif MODE >= BY_TABLE:  # site by table: a program on a site takes its slot, no atomic
        site = tl.load(table_ptr + tl.extra.cuda.smid())
        if (site >= 0) & (site < programs):
            _skinny_slot(site, programs, *args)
        if MODE == BY_TABLE:
            tl.atomic_add(queue_ptr + 1, 1, sem="relaxed")
    else:  # rank by site: the site's slot by one atomic, no queue
        site = tl.load(table_ptr + tl.extra.cuda.smid())
        if site < programs:
            if site >= 0:
                if tl.atomic_add(queue_ptr + 2 + site, 1, sem="relaxed") == 0:
                    _skinny_slot(site, programs, *args)
                    if MODE == 10:  # only the programs that worked leave by the shared word
                        tl.atomic_add(queue_ptr + 1, 1, sem="relaxed")
        if MODE == 5:
            tl.atomic_add(queue_ptr + 1, 1, sem="release")
        elif MODE == 7:
            tl.atomic_add(queue_ptr + 1, 1, sem="relaxed")
        elif MODE == 9:  # the leaves spread over words in other lines (other L2 slices)
            word = SPREAD_BASE + (tl.program_id(0) % SPREAD_WORDS) * SPREAD_STRIDE
            tl.atomic_add(queue_ptr + word, 1, sem="relaxed")
        elif LATE:  # the late leaves
            if site >= programs:  # turned away: its write waits until the working programs
                wait_ns(LATE)  # are under way (theirs comes after their slot anyway)
            tl.atomic_add(queue_ptr + 1, 1, sem="relaxed")
        elif MODE == 12:  # a plain store a program, each its own word, instead of an atomic
            tl.store(queue_ptr + SPREAD_BASE + tl.program_id(0), 1)
        elif MODE == FAR_LEAVE:  # the leave on a word megabytes from the site counts
            tl.atomic_add(far_ptr + FAR_BASE, 1, sem="relaxed")
        elif MODE == FAR_STORED_LEAVE:  # a plain store a program there, each in its own line
            tl.store(far_ptr + FAR_BASE + tl.program_id(0) * SPREAD_STRIDE, 1)


@triton.jit
def _tagged_pieces(programs, queue_ptr, table_ptr, args, SWEEP: tl.constexpr,
                   LAST: tl.constexpr, LAST_SWEEPS: tl.constexpr, WORD: tl.constexpr,
                   LOOP: tl.constexpr):
    """The tagged gate as run_tagged does it, on the capped launch's sites, with its sweep and
    its last program's wait each on or off, or with the last program sweeping instead. The
    tag is 1: the buffer is zeroed before every launch, so no grid id is needed. WORD (the
    bare gate only): the site taken by exchanging a 64-bit word (0, the product's), a 32-bit
    one (1), or by adding 1 to a 32-bit one that held 0 (2): is it the wide exchange? LOOP
    off (the bare gate only): the body called once under an `if`, not in the slot loop."""
    tags = queue_ptr.to(tl.pointer_type(tl.int64))
    tag = tl.full([], 1, tl.int64)
    site = tl.load(table_ptr + tl.extra.cuda.smid())
    slot = programs
    if (site >= 0) & (site < programs):
        if WORD == 1:
            taken = tl.atomic_xchg(queue_ptr + site, 1, sem="relaxed") == 1
        elif WORD == 2:
            taken = tl.atomic_add(queue_ptr + site, 1, sem="relaxed") != 0
        else:
            taken = tl.atomic_xchg(tags + site, tag, sem="relaxed") == tag
        if not taken:
            slot = site
    last = tl.program_id(0) == tl.num_programs(0) - 1
    if LAST:
        if last & (slot >= programs):
            _wait_for_tag(tags, tag, 0, TAGGED_LANES)
            slot = _take_site_0(tags, tag, programs, TAGGED_LANES)
    if LAST_SWEEPS:
        if last & (slot >= programs):
            _wait_for_every_site(tags, tag, programs)
            slot = _take_free_site(tags, tag, programs, TAGGED_LANES)
    sweeper = slot == 0
    if not LOOP:
        if slot < programs:
            _skinny_slot(slot, programs, *args)
    else:
        while slot < programs:
            _skinny_slot(slot, programs, *args)
            after = programs
            if SWEEP:
                if sweeper:
                    after = _take_free_site(tags, tag, programs, TAGGED_LANES)
            if LAST:
                if last & (slot != 0) & (sweeper == 0):  # a slot of its own done: site 0 next
                    after = _take_site_0(tags, tag, programs, TAGGED_LANES)
            if LAST_SWEEPS:
                if last:
                    after = _take_free_site(tags, tag, programs, TAGGED_LANES)
            sweeper = sweeper | (after == 0)
            slot = after


@triton.jit
def _in_a_loop(slot, programs, args):
    """Slot `slot` (none if it is `programs` or more) inside a `while` loop that runs at most
    once: the slot loop's shape around the body."""
    while slot < programs:
        _skinny_slot(slot, programs, *args)
        slot = programs


@triton.jit
def _loop_pieces(programs, queue_ptr, table_ptr, args, MODE: tl.constexpr):
    """`rank by site, no leave, in a loop` with one thing changed (the modes' notes above):
    the program on site s < `programs` takes it by one relaxed atomic (none in `site by
    table`), and does slot s once."""
    site = tl.load(table_ptr + tl.extra.cuda.smid())
    if MODE == BY_TABLE_LOOP:  # no atomic: the table alone, one program an SM
        slot = tl.where((site >= 0) & (site < programs), site, programs)
        _in_a_loop(slot, programs, args)
    elif MODE == LOOP_MASKED:  # the atomic under a mask, not a branch
        on = (site >= 0) & (site < programs)
        got = tl.atomic_add(queue_ptr + 2 + tl.where(on, site, 0), 1, sem="relaxed", mask=on)
        slot = tl.where(on & (got == 0), site, programs)
        _in_a_loop(slot, programs, args)
    elif MODE == IDLE_LOOP_AFTER:
        if site < programs:
            if site >= 0:
                if tl.atomic_add(queue_ptr + 2 + site, 1, sem="relaxed") == 0:
                    _skinny_slot(site, programs, *args)
        # past the slots at run time (a site is < 2**20), which the compiler cannot know
        slot = tl.where(site < (1 << 20), programs, site)
        _in_a_loop(slot, programs, args)
    else:  # RANK_IN_LOOP's admission, then the body in the shape MODE names
        slot = programs
        if site < programs:
            if site >= 0:
                if tl.atomic_add(queue_ptr + 2 + site, 1, sem="relaxed") == 0:
                    slot = site
        if MODE == JOINED_IF:
            if slot < programs:
                _skinny_slot(slot, programs, *args)
        elif MODE == LOOP_ON_SITE:
            while slot < programs:
                _skinny_slot(site, programs, *args)
                slot = programs
        elif MODE == RANK_IN_FOR:
            for _ in range(0, tl.where(slot < programs, 1, 0)):
                _skinny_slot(site, programs, *args)
        else:  # RANK_IN_FOR_NO_LICM
            for _ in tl.range(0, tl.where(slot < programs, 1, 0), disable_licm=True):
                _skinny_slot(site, programs, *args)


@triton.jit
def _wait_for_every_site(tags, tag, slots):
    """Read the sites' words until none of the first `slots` is free, for at most 5 us of
    %globaltimer (64 reads at most): reads only, a wait on the clock. Thread 0's clock
    decides for the whole CTA (`_thread_0s`), so every warp leaves the loop together."""
    start = tl.extra.cuda.globaltimer()
    reads = 0
    waiting = 1
    while waiting > 0:
        free = _first_free(tags, tag, slots, TAGGED_LANES)
        reads += 1
        on = (free < slots) & (tl.extra.cuda.globaltimer() - start < 5_000) & (reads < 64)
        waiting = _thread_0s(on.to(tl.int64), TAGGED_LANES).to(tl.int32)


def variants(N: int, K: int, device_sms: int) -> dict:
    x = torch.randn(ROWS, K, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda") / K ** 0.5
    out = torch.empty(ROWS, N, dtype=torch.bfloat16, device="cuda")
    queue = torch.zeros(GATE_WORDS, dtype=torch.int32, device="cuda")
    far = torch.zeros(FAR_WORDS, dtype=torch.int32, device="cuda")
    p = plan(ROWS, N, K, x.dtype, x.device, SMS)
    ids = torch.full((p.grid,), -1, dtype=torch.int32, device="cuda")
    linear(x, w, out, num_sms=SMS, sm_ids=ids)
    capped_sms = sorted(set(ids.tolist()))
    # the capped launch's SMs are sites 0.. (in SM order), every other SM past them
    table = site_table(capped_sms + [sm for sm in range(device_sms) if sm not in capped_sms],
                       x.device)
    cfg = p.config
    tiles = triton.cdiv(ROWS, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    part = torch.empty((tiles + p.grid, cfg.block_m * cfg.block_n), dtype=torch.float32,
                       device="cuda")
    counts = torch.zeros(tiles, dtype=torch.int32, device="cuda")

    def launch(mode: int):
        grid = device_sms if MODES[mode] in ONE_AN_SM else p.grid

        def run():
            queue.zero_()
            _anatomy_kernel[(grid,)](x, w, out, out, part, counts, queue, table, far, p.grid,
                                     ROWS, N, K,
                                     x.stride(0), w.stride(0), out.stride(0),
                                     BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                                     BLOCK_K=cfg.block_k, EVEN_K=K % cfg.block_k == 0,
                                     WHOLE_TILES=p.whole, MODE=mode, LATE=LATE_NS.get(mode, 0),
                                     num_warps=cfg.num_warps,
                                     num_stages=cfg.num_stages)
        return run

    def product(switches=contextlib.nullcontext, **budget):  # the product's gate unswitched
        def run():
            queue.zero_()
            with switches():
                linear(x, w, out, **budget)
        return run

    runs = {name: launch(i) for i, name in enumerate(MODES)}
    runs["capped (product)"] = product(num_sms=SMS)
    runs["pinned (product)"] = product(pinned=Pinned(0, SMS))
    runs["pinned, claiming gate"] = product(lambda: pinned_gate("claiming"),
                                            pinned=Pinned(0, SMS))
    runs["pinned, tagged gate"] = product(lambda: pinned_gate("tagged"), pinned=Pinned(0, SMS))
    torch.cuda.synchronize()
    return runs, capped_sms, p, out


def main(argv=None) -> int:
    res, gpu = gpu_results("bench/gate_anatomy.py", __doc__, "gate-anatomy", argv)
    res.data["inputs"] = {"rows": ROWS, "sms": SMS, "shapes": SHAPES}
    stream = torch.cuda.Stream()
    measured = site_order(torch.device("cuda"))[0][:SMS]
    for shape, (N, K) in SHAPES.items():
        runs, capped_sms, pl, out = variants(N, K, gpu.sms)
        base = ref = None
        for name, fn in runs.items():
            out.fill_(float("nan"))  # an unwritten element fails the comparison
            fn()
            torch.cuda.synchronize()
            ref = out.clone() if ref is None else ref  # plain's, the first
            us = time_alone(fn, stream, graph=True) * 1e3
            base = base or us
            res.row(section="anatomy", shape=shape, variant=name, us=us, over_plain=us / base,
                    whole_tiles=pl.whole, grid=pl.grid, equals_plain=torch.equal(out, ref))
        with sites_headed_by(capped_sms):
            for gate in ("pinned (product)", "pinned, claiming gate", "pinned, tagged gate"):
                us = time_alone(runs[gate], stream, graph=True) * 1e3
                res.row(section="anatomy", shape=shape, variant=f"{gate} on the capped "
                        "launch's SMs", us=us, over_plain=us / base, capped_sms=capped_sms,
                        shared_with_first_sites=len(set(capped_sms) & set(measured)))
        res.save()
    print(f"wrote {res.path}")
    for r in res.data["rows"]:
        print(f"{r['shape']:8s} {r['variant']:52s} {r['us']:8.1f} us  {r['over_plain']:.3f}"
              + ("" if r.get("equals_plain", True) else "  OUTPUT DIFFERS FROM plain"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
