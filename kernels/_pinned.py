"""Pinned partitions: a kernel's programs run on a fixed set of SMs, at most c to an SM.

Where a program lands is the hardware's choice, so a pinned launch gives every SM of the GPU
its c programs' worth (c x the device's SMs). Each program reads its SM id (`%smid`) and
leaves at once unless its SM is one of the partition's and fewer than c programs took that SM
before it (one counter per SM). The survivors take the work as slots: slot s of S is what
program s of a grid-capped launch of S programs does (S = min(c x k, tiles)), claimed one at
a time from a shared counter, so every slot is done exactly once however many programs
survive (c on every SM, fewer on some, none on others). Nobody waits for anybody (a program
the hardware has not placed yet could never arrive): the last program of the launch to leave
resets the counters for the next launch and, if no program survived at all, does every slot
itself, outside the partition, rather than leave the work undone.

A partition is a range of *sites*: the device's SMs in the order the hardware places a
launch's programs on an idle GPU (`site_order`, measured once per device with a decode GEMM),
so sites 0..k-1 are the SMs the first k programs of a launch take. Which SMs those are
depends on the grid's size (a launch of 20 programs and the first 20 of a launch of 132 take
different SMs: bench/NOTES.md), so a split's sides index an order headed by the SMs a capped
launch of its decode size lands on (`Pinned.head`): decode runs where a capped decode side
would. Consecutive SM ids sit together on the chip (the H200's green contexts and
grid-capped launches spread over its blocks of SM ids; 20 consecutive ids read slower than
either), and a range of sites is spread as they are.

A claim is one atomic a slot, a few per program: never one per small unit of work, which
starves under memory pressure (design.md, the SM-id gating facts). Claims and departures share
one 64-bit word (claims in its low half, turned-away programs in its high half), so a
survivor's claim that comes back empty is its departure too: one round trip at its end, the
cost that counted (bench/NOTES.md). Claims and departures release (each program's admission
count is out before them) and the last program out acquires them with one more claim, so it
resets the counts after every admission; acquiring on every claim would cost an L1 flush each
on Hopper (CCTL.IVALL). The per-site admission counts are relaxed.

At one program an SM a launch can go without that atomic at each program's end (the gate's
anatomy measured it as the claiming gate's cost: bench/results/gate-anatomy-<gpu>.json). The
*one-a-site* gate (`ONE_A_SITE`): the program admitted on the partition's r-th site does slot
r, nothing claimed. Every program counts its arrival (a release) right after its admission; the
last to arrive acquires them all (one L1 flush a launch), does the slots of the sites no
program was admitted on (wherever it runs: telemetry shows it) and leaves the counters zero.
Several programs an SM keep the claiming gate: whether an SM gets all c of them depends on how
many of the kernel's programs fit it (a GEMM's shared memory holds one), so slots handed out
by rank would fall to the last arriver one after another. `ONE_A_SITE_AT_C1` chooses the gate
at one an SM: the one-a-site gate, since the GPU measured it faster than the claiming one at
every level, alone and beside a prefill (bench/decode_floor.py times both in one process;
bench/NOTES.md says by how much).

Both gates make every program write (an arrival or a departure), and any write of the
turned-away programs while the working ones start slows those (bench/gate_anatomy.py). The
*tagged* gates (`TAGGED_SITES`, off until the GPU has timed them: `run_tagged`,
`run_tagged_claims`) let no program off the range write and reset nothing: each launch tags
the words it takes with its own grid id, so an earlier launch's words read as free.
"""

from __future__ import annotations

import contextlib
import functools
import types
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._launch import (default_num_sms, grid_size, interpreting,
                                          next_power_of_2, record_sm, shared_counters,
                                          telemetry_args, unused_pointer)

# the gate buffer: one 64-bit word of slots claimed and programs left (`_gate_word`: its two
# int32 words), then a count per site; a one-a-site launch, which claims nothing, counts its
# programs' arrivals in the word's low half
GATE_WORD, ARRIVALS, SITE_COUNTS = tl.constexpr(0), tl.constexpr(0), tl.constexpr(2)
# the kernels' PINNED constexpr: the gate a pinned launch takes (False: a plain launch)
CLAIMING, ONE_A_SITE, TAGGED, TAGGED_CLAIMING = 1, 2, 3, 4
ONE_A_SITE_GATE, TAGGED_GATE = tl.constexpr(ONE_A_SITE), tl.constexpr(TAGGED)  # in a kernel
TAGGED_CLAIMING_GATE = tl.constexpr(TAGGED_CLAIMING)
# whether a launch of one program an SM takes the one-a-site gate (the module's note)
ONE_A_SITE_AT_C1 = True
# whether the gates are the tagged ones (`run_tagged` at one program an SM, else
# `run_tagged_claims`): no program writes but the ones on the range's sites, nothing counted,
# nothing reset. A diagnostic, off until the GPU has timed it:
# the turned-away programs' writes while the working ones start cost the down GEMM ~4 us a
# launch, on any word or buffer, atomic or plain, and nothing 2 us later
# (bench/results/pinned/gate-anatomy-h200.json)
TAGGED_SITES = False


# the pinned gates by name: the claiming gate at every c; the one-a-site gate at one program an
# SM and the claiming gate at more (the product's); the tagged gates (one a site at one, else
# claiming)
PINNED_GATES = ("claiming", "one a site", "tagged")


@contextlib.contextmanager
def pinned_gate(name: str):
    """The gates pinned launches take inside the block, by name (`PINNED_GATES`: the switches
    `ONE_A_SITE_AT_C1` and `TAGGED_SITES`), to time them in one process."""
    if name not in PINNED_GATES:
        raise PdmuxError(f"a pinned gate is one of {PINNED_GATES}, got {name!r}")
    before = ONE_A_SITE_AT_C1, TAGGED_SITES
    _set_gate(name != "claiming", name == "tagged")
    try:
        yield
    finally:
        _set_gate(*before)


def _set_gate(one_a_site: bool, tagged: bool) -> None:
    global ONE_A_SITE_AT_C1, TAGGED_SITES
    ONE_A_SITE_AT_C1, TAGGED_SITES = one_a_site, tagged


GATE_WORDS = 1024  # the gate buffer's int32 counters, and the site table's entries (SM ids)
MAX_SITE = GATE_WORDS - 3  # the highest site it counts (after the 64-bit word)
TABLE_WORDS = tl.constexpr(GATE_WORDS)  # the site table's entries, in a kernel
# the tagged gates' words, int64 past the counters: each site's tag (the launch that took it
# last), the interpreter's launch tag (it has no %gridid: the launcher counts launches), then
# the claiming form's: each site's tag and admissions packed in one word, and the launch's
# tag and claims in one more
FIRST_TAG = GATE_WORDS // 2
SITE_TAGS = tl.constexpr(FIRST_TAG)  # the same, in a kernel
LAUNCH_TAG = FIRST_TAG + GATE_WORDS
SITE_ADMISSIONS = tl.constexpr(LAUNCH_TAG + 1)
CLAIMS = tl.constexpr(LAUNCH_TAG + 1 + GATE_WORDS)
GATE_BUFFER_WORDS = 2 * (CLAIMS.value + 1)  # the whole buffer, in int32 words
# a packed word: the tag's low 47 bits over a 16-bit count (positive, so the claims word
# opens by an atomic max: a later launch's tag is larger; a launch adds at most programs +
# slots + 1 to a count; the tag wraps after 2^47 launches of a context, years at a million a
# second)
COUNT_BITS, TAG_MASK = tl.constexpr(16), tl.constexpr((1 << 47) - 1)
COUNT_SPAN = tl.constexpr(1 << COUNT_BITS.value)  # a count is below it; a larger tag, above
_INTERPRETING = interpreting()  # (set before any kernel module is imported)
INTERPRETED = tl.constexpr(_INTERPRETING)
# how long the tagged gate's last program waits at most for site 0 to be taken before it takes
# it itself (it waits on the clock, never for another program): a site's program lands within
# a few us unless none will
SITE_WAIT_NS = tl.constexpr(5_000)
# and at most this many reads of the word, so the wait ends even on a clock that does not move
# (a read is an L2 round trip, ~0.5-1 us: the clock ends it first)
SITE_WAIT_READS = tl.constexpr(64)


@dataclass(frozen=True)
class Pinned:
    """The SMs a pinned launch runs on: sites first_site .. first_site + sms - 1 of the
    device's `site_order(device, head)` (`head`: a split's decode SM count, whose order begins
    with the SMs a grid-capped launch of that many programs lands on; None: the order of a
    launch of one program an SM). `placement`, an int32 tensor, names the site each program is
    at instead of `%smid` (one entry a program: the launch has that many programs); the
    interpreter has no `%smid`, so there it is needed."""

    first_site: int
    sms: int
    placement: torch.Tensor | None = field(default=None, compare=False)  # not in eq or hash
    head: int | None = None

    def __post_init__(self):
        values = [("first_site", self.first_site, 0), ("sms", self.sms, 1)]
        if self.head is not None:
            values.append(("head", self.head, 1))
        for name, value, low in values:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise PdmuxError(f"a pinned partition's {name} must be an integer >= {low}, "
                                 f"got {value!r}")
        if self.first_site + self.sms - 1 > MAX_SITE:
            raise PdmuxError(f"a pinned partition's sites must be up to {MAX_SITE}, got "
                             f"{self.first_site}..{self.first_site + self.sms - 1}")


_SITES: dict[tuple[torch.device, int | None], tuple[list[int], torch.Tensor]] = {}


def site_order(device: torch.device, head: int | None = None) -> tuple[list[int], torch.Tensor]:
    """(the device's SM ids in site order, the site table: SM id -> site, -1 for ids the
    order lacks), measured once per device and head with a decode GEMM's SM telemetry: first
    the SMs a grid-capped launch of `head` programs lands on (a split's decode side: the SMs
    a capped side of that size would use), then the SMs a launch of one program an SM lands
    on, in program order, less those. Placement depends on the grid's size (a launch of 20
    programs and the first 20 programs of a launch of 132 take different SMs on the H200,
    bench/NOTES.md) and on a program's footprint (tiny programs pile onto pairs of SMs), so
    the probe is a kernel the step runs, one program an SM by its shared memory. Each launch
    runs three times and the last counts: a cold GPU's first launches can place otherwise."""
    from pdmux_triton.kernels.gemm import linear  # gemm imports this module

    if device.type == "cuda" and device.index is None:  # one entry per GPU, however named
        device = torch.device("cuda", torch.cuda.current_device())
    total = default_num_sms(device)
    if head is not None and not 1 <= head <= total:
        raise PdmuxError(f"a site order's head must be 1..{total} SMs, got {head}")
    key = (device, head)
    if key in _SITES:
        return _SITES[key]
    if torch.cuda.is_current_stream_capturing():
        raise PdmuxError("a pinned partition measures its device's site order on its first "
                         "launch, which must not be inside a graph capture: launch once first")
    torch.cuda.synchronize(device)  # placed on an idle GPU, not beside another stream's work
    # 128 weight rows a tile (the small-budget tile; 64 on the whole GPU): >= total tiles; the
    # tile's shared memory, one program an SM, does not depend on K
    x = torch.randn(1, 512, dtype=torch.bfloat16, device=device)
    w = torch.randn(128 * total, 512, dtype=torch.bfloat16, device=device)
    order = []
    for budget in ([head] if head is not None else []) + [None]:
        where = torch.full((total,), -1, dtype=torch.int32, device=device)
        with torch.cuda.device(device):  # Triton launches on the current device
            for _ in range(3):
                linear(x, w, num_sms=budget, sm_ids=where)
        order += [sm for sm in where.tolist() if sm >= 0 and sm not in order]
    order += [sm for sm in range(total) if sm not in order]
    _SITES[key] = order, site_table(order, device)
    return _SITES[key]


def site_table(order: list[int], device: torch.device) -> torch.Tensor:
    """The kernels' view of a site order: SM id -> its site, -1 for ids not in it."""
    if min(order) < 0 or max(order) >= GATE_WORDS:
        raise PdmuxError(f"SM ids {min(order)}..{max(order)} are not all in the site table's "
                         f"0..{GATE_WORDS - 1}")
    table = torch.full((GATE_WORDS,), -1, dtype=torch.int32)
    table[order] = torch.arange(len(order), dtype=torch.int32)
    return table.to(device)


@dataclass(frozen=True)
class PinnedLaunch:
    """What a launcher passes a kernel: `grid` programs doing `slots` slots (a plain launch:
    grid == slots, one slot a program), the gate's arguments (`args`), and the keyword
    arguments of the launch (`kwargs`: the gate's constexprs, PDL's constexpr and option)."""

    grid: int
    slots: int
    args: tuple
    kwargs: dict


def pinned_budget(pinned: Pinned | None, num_sms: int | None) -> int | None:
    """The SM budget a launch's slots are counted with: a pinned partition's own SMs."""
    if pinned is None:
        return num_sms
    if num_sms is not None:
        raise PdmuxError(f"a pinned launch runs on its partition's {pinned.sms} SMs: leave "
                         f"num_sms out (got {num_sms})")
    return pinned.sms


PDL_MIN_MAJOR = 9  # griddepcontrol needs sm_90 (Hopper) or later


@functools.lru_cache(maxsize=None)
def _check_pdl(device: torch.device) -> None:
    """Whether a device can overlap launches, asked once per device (launches are hot).

    Programmatic dependent launch (PDL): the kernel may be scheduled while the one before it
    on the stream drains, and waits for it (`gdc_wait` in `run_slots`) before it reads what
    that one wrote. Its waiting programs land wherever there is room, so it keeps a launch
    inside its SMs only where the hardware confines the stream (the whole GPU, a green
    context): never for a grid cap of fewer SMs or a pinned partition (their callers leave it
    off: `PartitionSpec.overlaps_launches`)."""
    if interpreting() or device.type != "cuda":
        raise PdmuxError("programmatic dependent launch needs a CUDA GPU (the Triton "
                         "interpreter has no griddepcontrol)")
    major, minor = torch.cuda.get_device_capability(device)
    if major < PDL_MIN_MAJOR:
        raise PdmuxError(f"programmatic dependent launch needs compute capability "
                         f"{PDL_MIN_MAJOR}.0 or later; {torch.cuda.get_device_name(device)} is "
                         f"{major}.{minor}")


# a plain launch's keyword arguments besides the kernel's own: the gate's constexprs, PDL's
# constexpr and launch option (read-only: every plain launch shares them)
_PLAIN = {pdl: types.MappingProxyType({"PINNED": False, "PLACED": False, "BLOCK_SMS": 1,
                                      "PDL": pdl, "launch_pdl": pdl})
          for pdl in (False, True)}


def pinned_launch(pinned: Pinned | None, slots: int, ctas_per_sm: int, device: torch.device,
                  pdl: bool = False) -> PinnedLaunch:
    """The launch of a kernel whose grid-capped form has `slots` programs (`grid_size`'s)."""
    if pinned is None:
        return _plain_launch(slots, device, pdl)
    if pdl:
        raise PdmuxError("a pinned launch cannot overlap the one before it (programmatic "
                         "dependent launch): its programs that wait would hold SMs outside "
                         "the partition")
    placement = pinned.placement
    # one a site needs a site for every slot; grid_size gives at most c x k slots
    one_a_site = ONE_A_SITE_AT_C1 and ctas_per_sm == 1 and slots <= pinned.sms
    if placement is None:
        if interpreting() or device.type != "cuda":
            raise PdmuxError("a pinned partition reads %smid, which only a GPU has: give a "
                             "placement (the site of each program) to run it elsewhere")
        order, where = site_order(device, pinned.head)
        if pinned.first_site + pinned.sms > len(order):
            raise PdmuxError(f"sites {pinned.first_site}..{pinned.first_site + pinned.sms - 1} "
                             f"are not all on this GPU, which has {len(order)} SMs")
        grid = ctas_per_sm * default_num_sms(device)
    else:
        if (not isinstance(placement, torch.Tensor) or placement.dtype != torch.int32
                or placement.dim() != 1 or placement.device != device or placement.numel() < 1):
            raise PdmuxError(f"a placement must be a non-empty 1-D int32 tensor on {device}")
        low, high = int(placement.min()), int(placement.max())
        if low < 0 or high > MAX_SITE:
            raise PdmuxError(f"a placement's sites must be in 0..{MAX_SITE}, got {low}..{high}")
        grid, where = placement.numel(), placement
    gate = shared_counters("pinned gate", GATE_BUFFER_WORDS, device)
    if TAGGED_SITES:
        kind = TAGGED if one_a_site else TAGGED_CLAIMING
        _fresh_tags(gate)
    else:
        kind = ONE_A_SITE if one_a_site else CLAIMING
    return PinnedLaunch(grid, slots,
                        (gate, where, pinned.first_site, pinned.sms, ctas_per_sm, slots, grid),
                        {"PINNED": kind,
                         "PLACED": placement is not None,
                         "BLOCK_SMS": next_power_of_2(pinned.sms),
                         "PDL": False, "launch_pdl": False})


# each gate buffer's last capture that zeroed its tags (by the buffer's address)
_TAGS_ZEROED: dict[int, int] = {}


def _fresh_tags(gate: torch.Tensor) -> None:
    """Make this launch's tag (`_launch_tag`) new to the tagged words. A GPU launch's is its
    %gridid, new at every eager launch, but a graph's replays repeat their launches' ids (a gpu
    test shows it), so a capture zeroes the buffer's tags before its first tagged launch on it:
    every replay starts from free words and its ids grow in capture order. Under the
    interpreter, which has no %gridid, the launcher counts launches."""
    words = gate.view(torch.int64)
    if _INTERPRETING:
        words[LAUNCH_TAG] += 1
    elif torch.cuda.is_current_stream_capturing():
        capture = _capture_id(torch.cuda.current_stream(gate.device))
        if _TAGS_ZEROED.get(gate.data_ptr()) != capture:
            words[FIRST_TAG:].zero_()
            _TAGS_ZEROED[gate.data_ptr()] = capture


def _capture_id(stream: torch.cuda.Stream) -> int:
    """The id of the graph capture `stream` is in: the driver's, unique in the process."""
    try:
        from cuda.bindings import driver
    except ImportError:
        raise PdmuxError("capturing tagged pinned launches needs cuda-bindings, to tell one "
                         "capture from the next: pip install 'pdmux-triton[green]'") from None
    err, status, capture, *_ = driver.cuStreamGetCaptureInfo(
        driver.CUstream(stream.cuda_stream))
    if (err != driver.CUresult.CUDA_SUCCESS
            or status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE):
        raise PdmuxError(f"cuStreamGetCaptureInfo on a capturing stream gave {err}, {status}")
    return int(capture)


def budget_launch(units: int, num_sms: int | None, ctas_per_sm: int, device: torch.device,
                  pinned: Pinned | None, pdl: bool,
                  sm_ids: torch.Tensor | None) -> tuple[PinnedLaunch, torch.Tensor, bool]:
    """A kernel's launch for `units` of work on a budget (`grid_size`'s programs, or the pinned
    partition's slots) and its telemetry arguments (`telemetry_args`)."""
    # (a default budget is left out: it is the current device's SM count)
    if pinned is None and sm_ids is None and num_sms is not None:
        return _plain_budget_launch(units, num_sms, ctas_per_sm, device, pdl)
    slots = grid_size(units, pinned_budget(pinned, num_sms), ctas_per_sm, device)
    return (pinned_launch(pinned, slots, ctas_per_sm, device, pdl),
            *telemetry_args(sm_ids, slots, device))


# Plain launches are made once per shape: a prefill layer's launchers ask for the same few in
# every layer, and their host time counts (bench/host_profile.py). Typed, so that True is not
# taken for 1 (grid_size refuses a bool); a launch that raises is not kept.
@functools.lru_cache(maxsize=4096, typed=True)
def _plain_launch(slots: int, device: torch.device, pdl: bool) -> PinnedLaunch:
    none = unused_pointer(device)
    if pdl:
        _check_pdl(device)
    return PinnedLaunch(slots, slots, (none, none, 0, 1, 1, slots, slots), _PLAIN[pdl])


@functools.lru_cache(maxsize=4096, typed=True)
def _plain_budget_launch(units: int, num_sms: int, ctas_per_sm: int, device: torch.device,
                         pdl: bool) -> tuple[PinnedLaunch, torch.Tensor, bool]:
    slots = grid_size(units, num_sms, ctas_per_sm, device)
    return _plain_launch(slots, device, pdl), *telemetry_args(None, slots, device)


@triton.jit
def _gate_word(gate_ptr):
    """The gate's claims and departures, one 64-bit word: slots claimed in its low half,
    programs the gate turned away that left in its high half."""
    return (gate_ptr + GATE_WORD).to(tl.pointer_type(tl.int64))


@triton.jit
def _claim(gate_ptr, first_site, n_sms, slots, programs, BLOCK_SMS: tl.constexpr):
    """An admitted program's next slot, or `slots` once none is left: the claim that comes
    back empty is also its departure, so leaving costs no round trip of its own."""
    old = tl.atomic_add(_gate_word(gate_ptr), 1, sem="release")  # (the module's note)
    slot = (old & 0xFFFFFFFF).to(tl.int32)
    if slot >= slots:  # departed: the turned-away programs, and the empty claims so far
        left = (old >> 32).to(tl.int32) + (slot - slots) + 1
        slot = _last_out(gate_ptr, left, first_site, n_sms, slots, programs, BLOCK_SMS)
    return slot


@triton.jit
def _turned_away(gate_ptr, first_site, n_sms, slots, programs, BLOCK_SMS: tl.constexpr):
    """A program the gate turned away departs: `slots`, unless it is the launch's last and no
    program was admitted (`_last_out`)."""
    old = tl.atomic_add(_gate_word(gate_ptr), 1 << 32, sem="release")
    claimed = (old & 0xFFFFFFFF).to(tl.int32)
    left = (old >> 32).to(tl.int32) + 1 + tl.maximum(claimed - slots, 0)
    return _last_out(gate_ptr, left, first_site, n_sms, slots, programs, BLOCK_SMS)


@triton.jit
def _last_out(gate_ptr, left, first_site, n_sms, slots, programs, BLOCK_SMS: tl.constexpr):
    """After a departure that leaves `left` programs gone: `slots`, or, once every program is
    gone, the next slot nobody claimed (there are some only if no program was admitted: this
    program does them, outside the partition, one claim at a time) and, when none is left,
    the counters reset for the next launch."""
    slot = slots
    if left >= programs:  # acquire-release: after every other program's release on the word
        slot = (tl.atomic_add(_gate_word(gate_ptr), 1) & 0xFFFFFFFF).to(tl.int32)
        if slot >= slots:
            offs = tl.arange(0, BLOCK_SMS)
            tl.store(gate_ptr + SITE_COUNTS + first_site + offs, tl.zeros((BLOCK_SMS,), tl.int32),
                     mask=offs < n_sms)
            tl.store(_gate_word(gate_ptr), 0)
            slot = slots
    return slot


@triton.jit
def _site(place_ptr, PLACED: tl.constexpr):
    """(this program's site, the SM it runs on or its placed site). `place_ptr`: the
    placement (a site a program) or the site table (a site an SM id)."""
    if PLACED:
        sm = tl.load(place_ptr + tl.program_id(0))
        site = sm
    else:
        sm = tl.extra.cuda.smid()
        site = tl.load(place_ptr + sm, mask=sm < TABLE_WORDS, other=-1)
    return site, sm


@triton.jit
def admitted(gate_ptr, place_ptr, first_site, n_sms, ctas, PLACED: tl.constexpr):
    """(whether this program may work: its SM's site is in the range and holds fewer than c
    programs that were admitted before it; its site's place in the range; the SM it runs on,
    or its placed site)."""
    site, sm = _site(place_ptr, PLACED)
    ok = (site >= first_site) & (site < first_site + n_sms)
    # a masked atomic, not one under `if ok`: that branch made LLVM merge two thread-id reads
    # and ptxas keep a warp shuffle in the body's K loop (gate_anatomy, session 47)
    count = tl.atomic_add(gate_ptr + SITE_COUNTS + site, 1, mask=ok, sem="relaxed")
    return ok & (count < ctas), site - first_site, sm


@triton.jit
def first_slot(gate_ptr, ok, first_site, n_sms, slots, programs, BLOCK_SMS: tl.constexpr):
    """This program's first slot (`ok`: it was admitted), or `slots` if it does none."""
    if ok:
        slot = _claim(gate_ptr, first_site, n_sms, slots, programs, BLOCK_SMS)
    else:
        slot = _turned_away(gate_ptr, first_site, n_sms, slots, programs, BLOCK_SMS)
    return slot


@triton.jit
def pinned_start(gate_ptr, place_ptr, first_site, n_sms, ctas, slots, programs,
                 PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr):
    """(this program's first slot, or `slots` if the gate turned it away; its SM)."""
    ok, _, sm = admitted(gate_ptr, place_ptr, first_site, n_sms, ctas, PLACED)
    return first_slot(gate_ptr, ok, first_site, n_sms, slots, programs, BLOCK_SMS), sm


@triton.jit
def record_slot(sm_ids_ptr, slot, sm, RECORD_SM: tl.constexpr):
    """Telemetry of a pinned launch: the SM that did each slot."""
    if RECORD_SM:
        tl.store(sm_ids_ptr + slot, sm)


@triton.jit
def run_slots(BODY: tl.constexpr, args, sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms, ctas,
              slots, programs, RECORD_SM: tl.constexpr, PINNED: tl.constexpr,
              PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr, PDL: tl.constexpr):
    """A kernel's work: `BODY(pid, programs, *args)` is what program pid of a capped launch of
    `programs` does. Plain, each program does its own; pinned, the programs the gate admits do
    the capped launch's programs as slots. PDL (`_check_pdl`): the next kernel may be
    scheduled at once, and this one waits for the one before it to finish before it reads
    anything that one wrote (a kernel may prefetch what no kernel of the step writes, such as
    a weight, into L2 first: L2 is where every SM's writes meet, so that is safe anyway)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    if PINNED == TAGGED_GATE:
        run_tagged(BODY, args, sm_ids_ptr, gate_ptr, place_ptr, first_site, slots, programs,
                   RECORD_SM, PLACED, BLOCK_SMS)
    elif PINNED == TAGGED_CLAIMING_GATE:
        run_tagged_claims(BODY, args, sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms, ctas,
                          slots, programs, RECORD_SM, PLACED, BLOCK_SMS)
    elif PINNED == ONE_A_SITE_GATE:
        run_one_a_site(BODY, args, sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms, slots,
                       programs, RECORD_SM, PLACED, BLOCK_SMS)
    elif PINNED:
        slot, sm = pinned_start(gate_ptr, place_ptr, first_site, n_sms, ctas, slots, programs,
                                PLACED, BLOCK_SMS)
        run_claimed(BODY, args, slot, sm, sm_ids_ptr, gate_ptr, first_site, n_sms, slots,
                    programs, RECORD_SM, BLOCK_SMS)
    else:
        record_sm(sm_ids_ptr, RECORD_SM)
        BODY(tl.program_id(0), tl.num_programs(0), *args)


@triton.jit
def run_claimed(BODY: tl.constexpr, args, slot, sm, sm_ids_ptr, gate_ptr, first_site, n_sms,
                slots, programs, RECORD_SM: tl.constexpr, BLOCK_SMS: tl.constexpr):
    """A survivor's work from its first slot on, a claim after each slot until one comes back
    empty."""
    while slot < slots:
        record_slot(sm_ids_ptr, slot, sm, RECORD_SM)
        BODY(slot, slots, *args)
        slot = _claim(gate_ptr, first_site, n_sms, slots, programs, BLOCK_SMS)


@triton.jit
def run_one_a_site(BODY: tl.constexpr, args, sm_ids_ptr, gate_ptr, place_ptr, first_site, n_sms,
                   slots, programs, RECORD_SM: tl.constexpr, PLACED: tl.constexpr,
                   BLOCK_SMS: tl.constexpr):
    """The one-a-site gate (the module's note): the program admitted on the range's r-th site
    does slot r; the launch's last program to arrive also does the slots of the sites nobody
    was admitted on, and leaves the counters zero."""
    ok, rank, sm = admitted(gate_ptr, place_ptr, first_site, n_sms, 1, PLACED)
    # released after this program's admission count: the last arriver sees every count
    last = tl.atomic_add(gate_ptr + ARRIVALS, 1, sem="release") == programs - 1
    slot = tl.where(ok & (rank < slots), rank, slots)
    done = -1  # the last missed slot done
    missed = tl.zeros((BLOCK_SMS,), tl.int32)
    if last:  # (only the last arriver reduces over the sites: turned-away programs leave at once)
        missed = _sites_missed(gate_ptr, first_site, n_sms, slots, BLOCK_SMS)
        if slot >= slots:
            slot = _next_missed(missed, done, slots, BLOCK_SMS)
            done = slot
    while slot < slots:
        slot = _one_a_site_slot(BODY, args, slot, done, slots, sm, sm_ids_ptr, last, missed,
                                RECORD_SM, BLOCK_SMS)
        done = slot


@triton.jit
def _one_a_site_slot(BODY: tl.constexpr, args, slot, done, slots, sm, sm_ids_ptr, last, missed,
                     RECORD_SM: tl.constexpr, BLOCK_SMS: tl.constexpr):
    """A one-a-site program's slot done; the next it does: the last arriver's first missed
    site after `done`, anyone else's none (`slots`)."""
    record_slot(sm_ids_ptr, slot, sm, RECORD_SM)
    BODY(slot, slots, *args)
    after = slots
    if last:
        after = _next_missed(missed, done, slots, BLOCK_SMS)
    return after


@triton.jit
def _sites_missed(gate_ptr, first_site, n_sms, slots, BLOCK_SMS: tl.constexpr):
    """The last arriver's: 1 for each of the range's first `slots` sites that no program was
    admitted on, 0 elsewhere; the counters left zero for the next launch."""
    # acquire: after every program's release of its arrival, so every admission count is in.
    # One thread does the atomic and every warp reads the counts (each keeps its own copy of
    # `missed`): a barrier orders their reads after the acquire, and another keeps the zeros
    # from landing before a warp has read, or warps would disagree on the slots left
    tl.atomic_xchg(gate_ptr + ARRIVALS, 0, sem="acquire")
    tl.debug_barrier()
    offs = tl.arange(0, BLOCK_SMS)
    counts = tl.load(gate_ptr + SITE_COUNTS + first_site + offs, mask=offs < n_sms, other=1,
                     cache_modifier=".cg")
    tl.debug_barrier()
    tl.store(gate_ptr + SITE_COUNTS + first_site + offs, tl.zeros((BLOCK_SMS,), tl.int32),
             mask=offs < n_sms)
    return ((counts == 0) & (offs < slots)).to(tl.int32)


@triton.jit
def _next_missed(missed, done, slots, BLOCK_SMS: tl.constexpr):
    """The first missed site's slot after `done`, or `slots` when none is left."""
    offs = tl.arange(0, BLOCK_SMS)
    return tl.min(tl.where((missed != 0) & (offs > done), offs, slots), axis=0)


@triton.jit
def run_tagged(BODY: tl.constexpr, args, sm_ids_ptr, gate_ptr, place_ptr, first_site, slots,
               programs, RECORD_SM: tl.constexpr, PLACED: tl.constexpr,
               BLOCK_SMS: tl.constexpr):
    """The tagged gate (`TAGGED_SITES`), one program an SM: the program on the range's r-th
    site takes it by exchanging the launch's tag (`_launch_tag`) into the site's word and does
    slot r unless the word held the tag already (another program of this launch took the
    site). A program anywhere else writes nothing and leaves: nothing is counted and nothing
    reset, since a word tagged by an earlier launch reads as free. Whoever holds slot 0 takes
    the sites still free after it (two programs piled onto one SM leave one empty), by the
    same exchange, so each slot is done once even when a site's own program lands meanwhile;
    the launch's last program makes sure someone holds slot 0: if it did no slot, it waits on
    the clock (at most SITE_WAIT_NS) for site 0 to be taken, and after its own slot if it did
    one; then it takes site 0 itself if it is still free. Every decision is read through a
    reduction over a whole CTA (`_first_free`), so all warps of a program make it alike."""
    site, sm = _site(place_ptr, PLACED)
    rank = site - first_site
    tag = _launch_tag(gate_ptr)
    tags = gate_ptr.to(tl.pointer_type(tl.int64)) + SITE_TAGS + first_site
    slot = slots
    if (rank >= 0) & (rank < slots):
        if tl.atomic_xchg(tags + rank, tag, sem="relaxed") != tag:
            slot = rank
    last = tl.program_id(0) == programs - 1
    if last & (slot >= slots):
        if not INTERPRETED:  # (no clock there, and the others have run by now)
            _wait_for_tag(tags, tag, 0, BLOCK_SMS)  # site 0's
        slot = _take_site_0(tags, tag, slots, BLOCK_SMS)
    sweeper = slot == 0
    while slot < slots:  # (one call of the body: a second copy would double the code)
        record_slot(sm_ids_ptr, slot, sm, RECORD_SM)
        BODY(slot, slots, *args)
        if sweeper:
            slot = _take_free_site(tags, tag, slots, BLOCK_SMS)
        elif last:  # after a slot of its own
            slot = _take_site_0(tags, tag, slots, BLOCK_SMS)
            sweeper = slot == 0
        else:
            slot = slots


@triton.jit
def _gridid():
    """The launch's grid id: the CUDA context's count of launches (%gridid), new at every
    eager launch; a graph's launches keep the ids of their capture at every replay, which
    `_fresh_tags` answers (a gpu test checks both). Pinned launches run on the primary
    context's streams, so a stream's gate buffer only ever sees that one count."""
    return tl.inline_asm_elementwise("mov.u64 $0, %gridid;", "=l", [], dtype=tl.int64,
                                     is_pure=True, pack=1)


@triton.jit
def _launch_tag(gate_ptr):
    """This launch's tag, never 0 (a zeroed buffer's words are free): its grid id + 1 on a
    GPU; under the interpreter, which has no %gridid, the launcher's count of launches."""
    if INTERPRETED:
        tag = tl.load(gate_ptr.to(tl.pointer_type(tl.int64)) + LAUNCH_TAG)
    else:
        tag = _gridid() + 1
    return tag


@triton.jit
def _lane_offsets(BLOCK_SMS: tl.constexpr):
    """0, 1, ... over the lanes the tagged gates read their words over: the range's sites,
    and at least one a thread, so a reduction crosses every warp and all of them see one
    answer even while other programs change the words (a vector narrower than the CTA is read
    warp by warp, and warps could disagree); no more, or its addresses would sit in registers
    through the body. (A tensor, not the count: Triton 3.6 makes a constexpr a jit function
    returns into a tensor, which tl.arange refuses.)"""
    if INTERPRETED:  # (one program at a time: no warps)
        lanes: tl.constexpr = BLOCK_SMS
    else:
        threads: tl.constexpr = tl.extra.cuda.num_threads()
        if BLOCK_SMS > threads:
            lanes: tl.constexpr = BLOCK_SMS
        else:
            lanes: tl.constexpr = threads
    return tl.arange(0, lanes)


@triton.jit
def _first_free(tags, tag, slots, BLOCK_SMS: tl.constexpr):
    """The first of the first `slots` sites that no program of this launch took yet, or
    `slots` (read over `_lane_offsets`)."""
    offs = _lane_offsets(BLOCK_SMS)
    # volatile: read again on every call (the wait's loop), from L2 where the exchanges land
    seen = tl.load(tags + offs, mask=offs < slots, other=tag, volatile=True)
    return tl.min(tl.where(seen != tag, offs, slots), axis=0)


@triton.jit
def _take_free_site(tags, tag, slots, BLOCK_SMS: tl.constexpr):
    """A site still free, taken by the exchange its own program makes, or `slots` when none
    is left."""
    won = slots
    slot = _first_free(tags, tag, slots, BLOCK_SMS)
    while slot < slots:
        if tl.atomic_xchg(tags + slot, tag, sem="relaxed") != tag:
            won = slot
            slot = slots
        else:  # its program took it meanwhile
            slot = _first_free(tags, tag, slots, BLOCK_SMS)
    return won


@triton.jit
def _take_site_0(tags, tag, slots, BLOCK_SMS: tl.constexpr):
    """0 if site 0 was still free and this program took it, else `slots` (a read first: no
    write unless it is free)."""
    slot = slots
    if _first_free(tags, tag, 1, BLOCK_SMS) == 0:
        if tl.atomic_xchg(tags, tag, sem="relaxed") != tag:
            slot = 0
    return slot


@triton.jit
def _thread_0s(x, BLOCK_SMS: tl.constexpr):
    """`x` as thread 0 has it, for every thread: reduced over `_lane_offsets`, so all warps
    agree (a load or a clock each thread reads for itself may differ between warps)."""
    offs = _lane_offsets(BLOCK_SMS)
    return tl.max(tl.where(offs < 1, x, tl.full([], -(1 << 62), tl.int64)), axis=0)


@triton.jit
def _wait_for_tag(word, tag, SHIFT: tl.constexpr, BLOCK_SMS: tl.constexpr):
    """Spin until `word` carries this launch's tag (its bits above SHIFT: a site's tag, or the
    claims word's packed one) or SITE_WAIT_NS pass (or SITE_WAIT_READS reads); a wait on the
    clock, never on another program."""
    offs = _lane_offsets(BLOCK_SMS)
    start = tl.extra.cuda.globaltimer()
    waiting = 1
    reads = 0
    while waiting > 0:  # (lane 0's thread's word and clock decide, through the reduction)
        seen = tl.load(word + offs, mask=offs < 1, other=tag, volatile=True)
        now = tl.extra.cuda.globaltimer()
        reads += 1
        waiting = tl.max(tl.where(((seen >> SHIFT) != (tag >> SHIFT))
                                  & (now - start < SITE_WAIT_NS) & (reads < SITE_WAIT_READS),
                                  1, 0), axis=0)


@triton.jit
def run_tagged_claims(BODY: tl.constexpr, args, sm_ids_ptr, gate_ptr, place_ptr, first_site,
                      n_sms, ctas, slots, programs, RECORD_SM: tl.constexpr,
                      PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr):
    """The tagged claiming gate (`TAGGED_SITES`, several programs an SM, or more slots than
    sites): a program on one of the range's sites takes a place there from its site's word,
    which packs the launch's tag with the places taken (`_next_of`: an earlier launch's word
    counts none), and is admitted if fewer than c were; the admitted programs claim slots one
    at a time from the claims word, which packs the tag with the slots claimed. A program
    anywhere else writes nothing and leaves; nothing is reset. If no program is admitted, the
    launch's last program does every slot itself, after waiting on the clock (at most
    SITE_WAIT_NS) for a first claim. Every decision comes from an atomic's result or a
    reduction over a whole CTA, so all warps of a program agree."""
    site, sm = _site(place_ptr, PLACED)
    rank = site - first_site
    packed = (_launch_tag(gate_ptr) & TAG_MASK) << COUNT_BITS  # the tag over a count of 0
    words = gate_ptr.to(tl.pointer_type(tl.int64))
    ok = 0
    if (rank >= 0) & (rank < n_sms):
        ok = (_next_of(words + SITE_ADMISSIONS + site, packed) < ctas).to(tl.int32)
    if (tl.program_id(0) == programs - 1) & (ok == 0):
        if not INTERPRETED:  # (the interpreter's last program runs after all the others)
            _wait_for_tag(words + CLAIMS, packed, COUNT_BITS, BLOCK_SMS)
        # none claimed yet: this launch's tag is not on the claims word
        claims = _thread_0s(tl.load(words + CLAIMS, volatile=True), BLOCK_SMS)
        ok = ((claims >> COUNT_BITS) != (packed >> COUNT_BITS)).to(tl.int32)
    slot = slots
    if ok != 0:
        slot = _as_slot(_next_of(words + CLAIMS, packed), slots)
    while slot < slots:  # (a claim past the last slot is a program's last)
        record_slot(sm_ids_ptr, slot, sm, RECORD_SM)
        BODY(slot, slots, *args)
        slot = _as_slot(tl.atomic_add(words + CLAIMS, 1, sem="relaxed") - packed, slots)


@triton.jit
def _as_slot(count, slots):
    """A claims word's count as a slot, `slots` past the last (a count below 0 would mean an
    older tag than the word's: launch ids that did not grow, which a gpu test rules out)."""
    return tl.where((count >= 0) & (count < slots), count, slots).to(tl.int32)


@triton.jit
def _next_of(word, packed):
    """The count a packed word held for this launch before this program's turn: a max opens an
    earlier launch's word to this one's tag over 0 (tags grow on a stream, whose launches
    never overlap, from one zeroing of the words to the next: `_fresh_tags`) and leaves this
    launch's alone, and the add right after it, by the same thread to the same word, sees it:
    one round trip. Should a word hold a larger tag all the same (an id that did not grow),
    it is stale too, and is opened by a compare-and-swap (`_open`); below 0 (the add landed on
    an older tag: it cannot, but the retry costs nothing where it does not) both go again."""
    count = tl.full([], -1, tl.int64)
    while count < 0:
        tl.atomic_max(word, packed, sem="relaxed")
        count = tl.atomic_add(word, 1, sem="relaxed") - packed
        if count >= COUNT_SPAN:  # another tag above this one's
            _open(word, count + packed + 1, packed)
            count = tl.full([], -1, tl.int64)
    return count


@triton.jit
def _open(word, seen, packed):
    """Swap a stale word (`seen`: what this program's add left there) for this launch's tag
    over 0, whatever its count reached meanwhile; done once this launch's tag is on it (this
    program's swap, or another's of this launch). Every try that fails reads the word anew,
    and other programs add to a stale word at most once each before they come here."""
    done = 0
    while done == 0:
        before = tl.atomic_cas(word, seen, packed, sem="relaxed")
        if (before == seen) | ((before >> COUNT_BITS) == (packed >> COUNT_BITS)):
            done = 1
        else:
            seen = before
