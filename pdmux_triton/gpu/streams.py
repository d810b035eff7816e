"""Open partitions: the CUDA streams a `PartitionSpec` plans, and the budgets their kernels get.

`grid_cap` and `pinned` run on two ordinary streams, `whole` on one, `green` on a stream in
each of two green contexts (`green_contexts`), whose realized SM counts become the budgets. A
`PartitionPool` keeps partitions open across runs, as SGLang creates its stream groups once at
start-up, and gives every ordinary partition the same streams. `kernel_args` turns a side's
budget into the arguments every kernel takes.
"""

from __future__ import annotations

import functools

import torch

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.green_contexts import split_green
from pdmux_triton.kernels._pinned import Pinned
from pdmux_triton.multiplex.partition import KINDS, Budget, PartitionSpec


# partition kinds on ordinary streams (a green context makes its own)
ORDINARY_KINDS = tuple(kind for kind in KINDS if kind != "green")


@functools.lru_cache(maxsize=None)
def _pinned(first_site: int, sms: int, head: int | None) -> Pinned:
    return Pinned(first_site, sms, head=head)


def kernel_args(budget: Budget, attention: bool = False) -> dict:
    """The launch arguments of every kernel for a budget: the grid cap, or a pinned side's SMs
    (`num_sms` is then the partition's, not the kernel's); `attention`: decode attention's,
    whose programs an SM the budget may set apart."""
    ctas = budget.ctas_per_sm
    if attention and budget.attention_ctas_per_sm is not None:
        ctas = budget.attention_ctas_per_sm
    if budget.first_site is None:
        return {"num_sms": budget.num_sms, "ctas_per_sm": ctas, "pdl": budget.pdl}
    return {"num_sms": None, "ctas_per_sm": ctas,
            "pinned": _pinned(budget.first_site, budget.num_sms, budget.site_head)}


class PartitionStreams:
    """Open streams of a spec. Use as a context manager; green contexts are freed on close."""

    def __init__(self, spec: PartitionSpec, prefill_stream, decode_stream, green=None,
                 prefill_sms: int | None = None, decode_sms: int | None = None):
        self.spec = spec
        self.pdl = spec.overlaps_launches(torch.cuda.get_device_capability(0)[0])
        self.prefill_stream = prefill_stream
        self.decode_stream = decode_stream
        self._green = green
        # the budgets kernels use: what the driver realized for green contexts
        self.prefill_sms = prefill_sms or spec.prefill_sms
        self.decode_sms = decode_sms or spec.decode_sms

    @property
    def prefill_budget(self) -> Budget:
        return Budget(self.prefill_sms, first_site=self.spec.first_sites[0],
                      pdl=self.pdl, site_head=self.spec.site_head)

    @property
    def decode_budget(self) -> Budget:
        return Budget(self.decode_sms, first_site=self.spec.first_sites[1],
                      pdl=self.pdl, site_head=self.spec.site_head)

    @classmethod
    def open(cls, spec: PartitionSpec, ordinary: tuple | None = None) -> "PartitionStreams":
        """`ordinary`: the (prefill, decode) streams a grid-capped, pinned or whole partition
        runs on (new ones where not given); a green context makes its own."""
        if not torch.cuda.is_available():
            raise PdmuxError(f"a {spec.kind} partition needs a CUDA GPU; torch sees none")
        device_sms = torch.cuda.get_device_properties(0).multi_processor_count
        if spec.total_sms != device_sms:
            raise PdmuxError(f"the partition is planned for {spec.total_sms} SMs but the GPU has "
                             f"{device_sms}")
        if spec.kind in ORDINARY_KINDS:
            prefill, decode = ordinary or (torch.cuda.Stream(), torch.cuda.Stream())
            # (a whole partition runs both sides on its prefill stream: one at a time)
            return cls(spec, prefill, prefill if spec.kind == "whole" else decode)
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


class PartitionPool:
    """Partitions opened on first use and kept until `close`. Every grid-capped, pinned and
    whole partition runs on one pair of streams: their SMs are kernel arguments, not the
    stream's, levels never overlap (a level change drains the GPU), and the caching allocator
    keeps freed memory for the stream that took it, so one prefill stream's pool, grown once
    by the warm-up, serves every level (a stream a level would grow its own, inside measured
    runs). Green contexts bring their own streams."""

    def __init__(self):
        self._open: dict[PartitionSpec, PartitionStreams] = {}
        self._ordinary: tuple | None = None

    def get(self, spec: PartitionSpec) -> PartitionStreams:
        if spec not in self._open:
            if spec.kind in ORDINARY_KINDS and self._ordinary is None:
                self._ordinary = (torch.cuda.Stream(), torch.cuda.Stream())
            self._open[spec] = PartitionStreams.open(
                spec, self._ordinary if spec.kind in ORDINARY_KINDS else None)
        return self._open[spec]

    def stream_names(self) -> dict[int, str]:
        """Each open stream's handle and what runs on it ("grid_cap prefill, 80/112 SMs":
        the partitions sharing it)."""
        runs: dict[int, dict[str, list[int]]] = {}
        for part in self._open.values():
            kind = part.spec.kind
            sides = ((part.prefill_stream, "the whole GPU", part.prefill_sms),) \
                if kind == "whole" else ((part.prefill_stream, f"{kind} prefill", part.prefill_sms),
                                         (part.decode_stream, f"{kind} decode", part.decode_sms))
            for stream, role, sms in sides:
                runs.setdefault(stream.cuda_stream, {}).setdefault(role, []).append(sms)
        return {handle: "; ".join(role if role == "the whole GPU" else
                                  f"{role}, {'/'.join(map(str, sorted(set(sms))))} SMs"
                                  for role, sms in roles.items())
                for handle, roles in runs.items()}

    def close(self) -> None:
        for part in self._open.values():
            part.close()
        self._open.clear()
