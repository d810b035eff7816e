"""Pinned partitions: a kernel's programs run on a fixed range of SM ids, at most c to an SM.

Where a program lands is the hardware's choice, so a pinned launch gives every SM of the GPU
its c programs' worth (c x the device's SMs). Each program reads its SM id (`%smid`) and
leaves at once unless its SM is in the level's range and fewer than c programs took that SM
before it (one counter per SM). The survivors take the work as slots: slot s of S is what
program s of a grid-capped launch of S programs does (S = min(c x k, tiles)), claimed one at
a time from a shared counter, so every slot is done exactly once however many programs
survive (c on every SM, fewer on some, none on others). Nobody waits for anybody (a program
the hardware has not placed yet could never arrive): the last program of the launch to leave
resets the counters for the next launch and, if no program survived at all, does every slot
itself, outside the range, rather than leave the work undone.

A claim is one atomic a slot, a few per program: never one per small unit of work, which
starves under memory pressure (design.md, the SM-id gating facts). The counts and claims are
relaxed atomics: they publish no data (a slot's results reach the next launch at the kernel's
end), and an acquire-release atomic costs a fence and an L1 flush each on Hopper
(MEMBAR.ALL.GPU, CCTL.IVALL). Leaving is acquire-release: the last program to leave must see
every claim made before the others left.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from pdmux_triton.errors import PdmuxError
from pdmux_triton.kernels._launch import (default_num_sms, interpreting, record_sm, shared_counters,
                                          unused_pointer)

# the gate buffer: slots claimed, programs left, then a count per SM
QUEUE, LEFT, SM_COUNTS = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
GATE_WORDS = 1024  # the gate buffer's int32 counters
MAX_SM_ID = GATE_WORDS - 3  # the highest SM id it counts (after QUEUE and LEFT)


@dataclass(frozen=True)
class Pinned:
    """The SMs a pinned launch runs on: ids first_sm .. first_sm + sms - 1. `placement`, an
    int32 tensor, names the SM each program lands on instead of `%smid` (one entry a program:
    the launch has that many programs); the interpreter has no `%smid`, so there it is needed."""

    first_sm: int
    sms: int
    placement: torch.Tensor | None = field(default=None, compare=False)  # by identity in a hash

    def __post_init__(self):
        for name, value, low in (("first_sm", self.first_sm, 0), ("sms", self.sms, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise PdmuxError(f"a pinned partition's {name} must be an integer >= {low}, "
                                 f"got {value!r}")
        if self.first_sm + self.sms - 1 > MAX_SM_ID:
            raise PdmuxError(f"a pinned partition's SMs must have ids up to {MAX_SM_ID}, got "
                             f"{self.first_sm}..{self.first_sm + self.sms - 1}")


@dataclass(frozen=True)
class PinnedLaunch:
    """What a launcher passes a kernel: `grid` programs doing `slots` slots (a plain launch:
    grid == slots, one slot a program), and the gate's arguments (`args`, then `constexprs`)."""

    grid: int
    slots: int
    args: tuple
    constexprs: dict


PLAIN = {"PINNED": False, "PLACED": False, "BLOCK_SMS": 1}  # a plain launch's gate constexprs


def pinned_budget(pinned: Pinned | None, num_sms: int | None) -> int | None:
    """The SM budget a launch's slots are counted with: a pinned partition's own SMs."""
    if pinned is None:
        return num_sms
    if num_sms is not None:
        raise PdmuxError(f"a pinned launch runs on its partition's {pinned.sms} SMs: leave "
                         f"num_sms out (got {num_sms})")
    return pinned.sms


def pinned_launch(pinned: Pinned | None, slots: int, ctas_per_sm: int,
                  device: torch.device) -> PinnedLaunch:
    """The launch of a kernel whose grid-capped form has `slots` programs (`grid_size`'s)."""
    if pinned is None:
        none = unused_pointer(device)
        return PinnedLaunch(slots, slots, (none, none, 0, 1, 1, slots, slots), PLAIN)
    placement = pinned.placement
    if placement is None:
        if interpreting() or device.type != "cuda":
            raise PdmuxError("a pinned partition reads %smid, which only a GPU has: give a "
                             "placement (the SM of each program) to run it elsewhere")
        total = default_num_sms(device)
        if pinned.first_sm + pinned.sms > total:
            raise PdmuxError(f"SMs {pinned.first_sm}..{pinned.first_sm + pinned.sms - 1} are not "
                             f"all on this GPU, which has {total}")
        grid = ctas_per_sm * total
    else:
        if (not isinstance(placement, torch.Tensor) or placement.dtype != torch.int32
                or placement.dim() != 1 or placement.device != device or placement.numel() < 1):
            raise PdmuxError(f"a placement must be a non-empty 1-D int32 tensor on {device}")
        low, high = int(placement.min()), int(placement.max())
        if low < 0 or high > MAX_SM_ID:
            raise PdmuxError(f"a placement's SM ids must be in 0..{MAX_SM_ID}, got {low}..{high}")
        grid = placement.numel()
    gate = shared_counters("pinned gate", GATE_WORDS, device)
    return PinnedLaunch(grid, slots,
                        (gate, placement if placement is not None else unused_pointer(device),
                         pinned.first_sm, pinned.sms, ctas_per_sm, slots, grid),
                        {"PINNED": True, "PLACED": placement is not None,
                         "BLOCK_SMS": triton.next_power_of_2(pinned.sms)})


@triton.jit
def _leave(gate_ptr, first_sm, n_sms, slots, programs, BLOCK_SMS: tl.constexpr):
    """A program leaves: the slot it must still do (only the launch's last program, when no
    program survived) or `slots`. The last to leave resets the counters."""
    left = tl.atomic_add(gate_ptr + LEFT, 1)
    slot = slots
    if left >= programs - 1:  # every other program has left: nobody claims any more
        slot = tl.atomic_add(gate_ptr + QUEUE, 1, sem="relaxed")
        if slot >= slots:
            offs = tl.arange(0, BLOCK_SMS)
            tl.store(gate_ptr + SM_COUNTS + first_sm + offs, tl.zeros((BLOCK_SMS,), tl.int32),
                     mask=offs < n_sms)
            tl.store(gate_ptr + QUEUE, 0)
            tl.store(gate_ptr + LEFT, 0)
    return slot


@triton.jit
def admitted(gate_ptr, place_ptr, first_sm, n_sms, ctas, PLACED: tl.constexpr):
    """(whether this program may work: its SM is in the range and holds fewer than c
    programs that were admitted before it; the SM it runs on)."""
    if PLACED:
        sm = tl.load(place_ptr + tl.program_id(0))
    else:
        sm = tl.extra.cuda.smid()
    ok = (sm >= first_sm) & (sm < first_sm + n_sms)
    if ok:
        ok = tl.atomic_add(gate_ptr + SM_COUNTS + sm, 1, sem="relaxed") < ctas
    return ok, sm


@triton.jit
def first_slot(gate_ptr, ok, first_sm, n_sms, slots, programs, BLOCK_SMS: tl.constexpr):
    """This program's first slot (`ok`: it was admitted), or `slots` if it does none."""
    slot = slots
    if ok:
        slot = tl.atomic_add(gate_ptr + QUEUE, 1, sem="relaxed")
    if slot >= slots:
        slot = _leave(gate_ptr, first_sm, n_sms, slots, programs, BLOCK_SMS)
    return slot


@triton.jit
def pinned_start(gate_ptr, place_ptr, first_sm, n_sms, ctas, slots, programs,
                 PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr):
    """(this program's first slot, or `slots` if the gate turned it away; its SM)."""
    ok, sm = admitted(gate_ptr, place_ptr, first_sm, n_sms, ctas, PLACED)
    return first_slot(gate_ptr, ok, first_sm, n_sms, slots, programs, BLOCK_SMS), sm


@triton.jit
def record_slot(sm_ids_ptr, slot, sm, RECORD_SM: tl.constexpr):
    """Telemetry of a pinned launch: the SM that did each slot."""
    if RECORD_SM:
        tl.store(sm_ids_ptr + slot, sm)


@triton.jit
def run_slots(BODY: tl.constexpr, args, sm_ids_ptr, gate_ptr, place_ptr, first_sm, n_sms, ctas,
              slots, programs, RECORD_SM: tl.constexpr, PINNED: tl.constexpr,
              PLACED: tl.constexpr, BLOCK_SMS: tl.constexpr):
    """A kernel's work: `BODY(pid, programs, *args)` is what program pid of a capped launch of
    `programs` does. Plain, each program does its own; pinned, the programs the gate admits do
    the capped launch's programs as slots."""
    if PINNED:
        slot, sm = pinned_start(gate_ptr, place_ptr, first_sm, n_sms, ctas, slots, programs,
                                PLACED, BLOCK_SMS)
        while slot < slots:
            record_slot(sm_ids_ptr, slot, sm, RECORD_SM)
            BODY(slot, slots, *args)
            slot = next_slot(gate_ptr, first_sm, n_sms, slots, programs, BLOCK_SMS)
    else:
        record_sm(sm_ids_ptr, RECORD_SM)
        BODY(tl.program_id(0), tl.num_programs(0), *args)


@triton.jit
def next_slot(gate_ptr, first_sm, n_sms, slots, programs, BLOCK_SMS: tl.constexpr):
    """A survivor's next slot, or `slots` once every slot is taken (it has then left)."""
    slot = tl.atomic_add(gate_ptr + QUEUE, 1, sem="relaxed")
    if slot >= slots:
        slot = _leave(gate_ptr, first_sm, n_sms, slots, programs, BLOCK_SMS)
    return slot
