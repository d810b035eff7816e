"""Where kernels run, as a plan: which partition kind, how many SMs each side gets, and the
SM budget (`Budget`) every kernel is launched with. Pure data, checked without a GPU; the
`streams` module opens a plan on the device.

Four kinds:
- `grid_cap`: two ordinary streams; every kernel is launched with at most its side's budget of
  programs (the emulation this project studies; the hardware still picks the SMs).
- `green`: two CUDA green contexts; one side's share is split off first (on the architecture's
  granularity) and the other gets the rest. SGLang's levels split prefill off first; the S_SAT
  sweeps split decode off first, so its budget can be any multiple of the granularity.
- `pinned`: two ordinary streams; every kernel's programs run on its side's SMs only, at most
  its CTAs per SM on each (an SM-id gate in every kernel, kernels/_pinned.py): decode on the
  SMs a grid-capped launch of its size lands on (the first sites of the split's site order),
  prefill on the rest. Exact placement without green contexts, at any SM count.
- `whole`: one stream, the whole GPU for both sides (prefill-first and chunked baselines, and
  SGLang's prefill-only and decode-only levels).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules

SPLIT_KINDS = ("grid_cap", "green", "pinned")  # the ways of splitting SMs the tool compares
DEFAULT_KINDS = ("grid_cap", "green")  # what a run or sweep takes unless told (--kinds)
KINDS = (*SPLIT_KINDS, "whole")


@dataclass(frozen=True)
class Budget:
    """What one side's work may use: at most num_sms * ctas_per_sm programs a kernel (None:
    the whole GPU) or, pinned, sites first_site .. first_site + num_sms - 1 with at most
    ctas_per_sm programs on each, and, on a tensor-parallel rank, the side's own collectives
    (its communicator: the two sides of a split never share one, or their all-reduces
    deadlock)."""

    num_sms: int | None = None
    ctas_per_sm: int = 1
    comm: object = None  # tensor_parallel.DistCollectives; None on one GPU
    first_site: int | None = None  # pinned: the side's first site (gpu.streams.kernel_args)
    # pinned: the split's decode SMs, whose site order both sides index (kernels/_pinned.Pinned)
    site_head: int | None = None
    # decode attention's programs an SM where they differ from the other kernels' (a served
    # green or pinned decode side: gpu.model_executor); None: ctas_per_sm
    attention_ctas_per_sm: int | None = None
    # programmatic dependent launch (kernels/_pinned._check_pdl): only where the hardware keeps
    # a launch's waiting programs on the side's SMs (the whole GPU, a green context)
    pdl: bool = False

    def __post_init__(self):
        if self.first_site is not None and self.num_sms is None:
            raise PdmuxError("a pinned budget names its SMs: num_sms with first_site")
        if self.site_head is not None and self.first_site is None:
            raise PdmuxError("site_head orders a pinned budget's sites: give first_site too")
        for name in ("ctas_per_sm", "attention_ctas_per_sm"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise PdmuxError(f"a budget's {name} must be an integer >= 1, got {value!r}")
        if self.pdl and self.first_site is not None:
            raise PdmuxError("a pinned budget cannot overlap launches (pdl): their waiting "
                             "programs would hold SMs outside the partition")


@dataclass(frozen=True)
class PartitionSpec:
    kind: str
    prefill_sms: int
    decode_sms: int
    total_sms: int
    split_first: str = "prefill"  # green only: the side split off on the granularity

    def __post_init__(self):
        if self.split_first not in ("prefill", "decode"):
            raise PdmuxError(f"split_first must be 'prefill' or 'decode', got {self.split_first!r}")
        if self.kind not in KINDS:
            raise PdmuxError(f"unknown partition kind {self.kind!r}; known: {', '.join(KINDS)}")
        for name, value in (("prefill SMs", self.prefill_sms), ("decode SMs", self.decode_sms)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= self.total_sms:
                raise PdmuxError(f"{name} must be an integer in 1..{self.total_sms}, got {value!r}")
        if self.kind == "whole" and (self.prefill_sms, self.decode_sms) != (self.total_sms,) * 2:
            raise PdmuxError("a whole-GPU partition gives both sides all SMs")
        if self.kind != "whole" and self.prefill_sms + self.decode_sms > self.total_sms:
            raise PdmuxError(f"{self.prefill_sms} + {self.decode_sms} SMs exceed the GPU's "
                             f"{self.total_sms}")

    def check_green(self, major: int) -> None:
        """A green split must be one the driver can make: the first side on the granularity,
        the other side the exact remainder."""
        min_part, granularity = sglang_rules.arch_constraints(major)
        first = self.prefill_sms if self.split_first == "prefill" else self.decode_sms
        if first % granularity or first < min_part:
            raise PdmuxError(f"green contexts split off multiples of {granularity} SMs (at least "
                             f"{min_part}) on compute capability {major}.x; {self.split_first} "
                             f"{first} is off the granularity")
        if self.prefill_sms + self.decode_sms != self.total_sms:
            rest = "decode" if self.split_first == "prefill" else "prefill"
            raise PdmuxError(f"a green split gives {rest} the remainder, "
                             f"{self.total_sms - first} SMs, not "
                             f"{self.decode_sms if rest == 'decode' else self.prefill_sms}")

    @property
    def whole_gpu(self) -> bool:
        return self.kind == "whole"

    def overlaps_launches(self, cc_major: int) -> bool:
        """Whether its sides' kernels may launch while the one before drains (PDL), on a GPU
        of that compute capability: from Hopper on (griddepcontrol), and only where the
        hardware confines each stream's programs (the whole GPU, green contexts), not under a
        grid cap or a pinned gate, whose waiting programs would land on the other side's
        SMs."""
        return cc_major >= 9 and self.kind in ("whole", "green")

    @property
    def first_sites(self) -> tuple[int | None, int | None]:
        """A pinned split's first site per side (prefill, decode; kernels/_pinned.py): decode on
        the first sites, the SMs a capped launch of its size takes (`site_head`), prefill on
        the rest; None for the kinds that leave placement to the hardware."""
        if self.kind != "pinned":
            return None, None
        return self.decode_sms, 0

    @property
    def served_attention_ctas(self) -> int | None:
        """Decode attention's programs an SM on this split's decode side when it serves: three
        where the partition keeps a launch's programs on its SMs (green, pinned), which read
        more of the KV cache than one an SM at every middle level's budget (bench/RESULTS.md,
        "Kernels"); None (the budget's own) under a grid cap, whose 3k programs would spread
        over 3k SMs, and on the whole GPU, where three gain nothing."""
        return 3 if self.kind in ("green", "pinned") else None

    @property
    def site_head(self) -> int | None:
        """A pinned split's site order (kernels/_pinned.site_order): headed by the SMs a
        grid-capped launch of the decode side's size lands on; None for the other kinds."""
        return self.decode_sms if self.kind == "pinned" else None

    @property
    def label(self) -> str:
        return f"{self.kind} {self.prefill_sms}/{self.decode_sms}"


def whole(total_sms: int) -> PartitionSpec:
    return PartitionSpec("whole", total_sms, total_sms, total_sms)


def for_level(level: sglang_rules.Level, kind: str, total_sms: int | None = None,
              split_first: str = "prefill") -> PartitionSpec:
    """The partition a (prefill SMs, decode SMs) level runs on: its split for `grid_cap`,
    `green` and `pinned`. A level that gives one side no SMs (SGLang's prefill-only and
    decode-only levels, or a decode budget of the whole GPU) runs on the whole GPU, as SGLang
    runs it on ordinary streams: this is the one place that rule lives."""
    prefill, decode = level
    total = prefill + decode if total_sms is None else total_sms
    if prefill == 0 or decode == 0:
        return whole(total)
    return PartitionSpec(kind, prefill, decode, total, split_first)
