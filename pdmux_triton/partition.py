"""Where kernels run: a prefill stream, a decode stream and the SM budget each side's kernels use.

Three kinds, one interface:
- `grid_cap`: two ordinary streams; every kernel is launched with at most its side's budget of
  programs (the emulation this project studies; the hardware still picks the SMs).
- `green`: two CUDA green contexts; one side's share is split off first (on the architecture's
  granularity) and the other gets the rest. SGLang's levels split prefill off first; the S_SAT
  sweeps split decode off first, so its budget can be any multiple of the granularity.
- `whole`: one stream, the whole GPU for both sides (prefill-first and chunked baselines, and
  SGLang's prefill-only and decode-only levels).

A `PartitionSpec` is the plan (pure data, checked without a GPU); `open()` makes the streams.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdmux_triton import policy
from pdmux_triton.errors import PdmuxError

KINDS = ("grid_cap", "green", "whole")


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
        min_part, granularity = policy.arch_constraints(major)
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
    def label(self) -> str:
        return f"{self.kind} {self.prefill_sms}/{self.decode_sms}"

    def open(self) -> "Partition":
        return Partition.open(self)


def whole(total_sms: int) -> PartitionSpec:
    return PartitionSpec("whole", total_sms, total_sms, total_sms)


def for_level(groups: list[policy.Level], index: int, kind: str) -> PartitionSpec:
    """The partition of SGLang level `index`: its split for `grid_cap`/`green`; the prefill-only
    and decode-only levels run on the whole GPU, as SGLang runs them on ordinary streams."""
    if not 0 <= index < len(groups):
        raise PdmuxError(f"level {index} does not exist; levels are 0..{len(groups) - 1}")
    prefill, decode = groups[index]
    total = prefill + decode
    if prefill == 0 or decode == 0:
        return whole(total)
    return PartitionSpec(kind, prefill, decode, total)


class Partition:
    """Open streams of a spec. Use as a context manager; green contexts are freed on close."""

    def __init__(self, spec: PartitionSpec, prefill_stream, decode_stream, green=None,
                 prefill_sms: int | None = None, decode_sms: int | None = None):
        self.spec = spec
        self.prefill_stream = prefill_stream
        self.decode_stream = decode_stream
        self._green = green
        # the budgets kernels use: what the driver realized for green contexts
        self.prefill_sms = prefill_sms or spec.prefill_sms
        self.decode_sms = decode_sms or spec.decode_sms

    @classmethod
    def open(cls, spec: PartitionSpec) -> "Partition":
        import torch

        if not torch.cuda.is_available():
            raise PdmuxError(f"a {spec.kind} partition needs a CUDA GPU; torch sees none")
        device_sms = torch.cuda.get_device_properties(0).multi_processor_count
        if spec.total_sms != device_sms:
            raise PdmuxError(f"the partition is planned for {spec.total_sms} SMs but the GPU has "
                             f"{device_sms}")
        if spec.kind == "whole":
            stream = torch.cuda.Stream()
            return cls(spec, stream, stream)
        if spec.kind == "grid_cap":
            return cls(spec, torch.cuda.Stream(), torch.cuda.Stream())
        from pdmux_triton.greenctx import split_green

        spec.check_green(torch.cuda.get_device_capability(0)[0])
        if spec.split_first == "prefill":
            split = split_green(spec.prefill_sms, spec.decode_sms)
            prefill, decode = split.first, split.rest
        else:
            split = split_green(spec.decode_sms, spec.prefill_sms)
            decode, prefill = split.first, split.rest
        return cls(spec, prefill.stream, decode.stream, split, prefill.sms, decode.sms)

    def close(self) -> None:
        if self._green is not None:
            self._green.close()
            self._green = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
