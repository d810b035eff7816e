"""The strategies a run or a capacity search serves, each a row of its tables: built from the
settings' chunks, partition kinds and level policies (`variants`), or parsed from a row's name
(`variant`, as `--strategies` gives them). A strategy names the scheduler's loop that serves it
(`Variant.loop`) and that loop's parameters."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex.partition import SPLIT_KINDS

DEFAULT_STRATEGIES = ("prefill_first", "chunked_512", "chunked_2048", "pdmux_grid_cap")


@dataclass(frozen=True)
class Variant:
    name: str  # decode_only, prefill_first, chunked_2048, pdmux_grid_cap, pdmux_slo_green, ...
    loop: str  # the scheduler's loop that serves it (scheduler.LOOPS, or disagg: a router)
    chunk: int = 0
    kind: str = "grid_cap"  # partition kind of the pd-mux levels
    levels: str = "sglang"  # how pd-mux picks its level (level_policy)
    # disaggregated (loop "disagg"): prefill servers and decode servers (router)
    prefill_servers: int = 0
    decode_servers: int = 0


def disagg_variant(prefill_servers: int, decode_servers: int) -> Variant:
    return Variant(f"disagg_{prefill_servers}p{decode_servers}d", "disagg",
                   prefill_servers=prefill_servers, decode_servers=decode_servers)


def pdmux_variant(kind: str, levels: str = "sglang") -> Variant:
    name = f"pdmux_{kind}" if levels == "sglang" else f"pdmux_{levels}_{kind}"
    return Variant(name, "pdmux", kind=kind, levels=levels)


def variants(chunks: tuple[int, ...], kinds: tuple[str, ...],
             level_policies: tuple[str, ...] = ("sglang",)) -> list[Variant]:
    out = [Variant("decode_only", "prefill_first"), Variant("prefill_first", "prefill_first")]
    out += [Variant(f"chunked_{c}", "chunked", chunk=c) for c in chunks]
    out += [pdmux_variant(k, p) for p in level_policies for k in kinds]
    return out


def variant(name: str) -> Variant:
    """A strategy by its row name: prefill_first, chunked_<tokens>, pdmux_<kind> (SGLang's
    levels), pdmux_slo_<kind> (levels for an ITL target), kind grid_cap or green, or
    disagg_<P>p<D>d (P prefill servers, D decode servers; simulated)."""
    if name == "prefill_first":
        return Variant(name, "prefill_first")
    if name.startswith("chunked_") and name[8:].isdigit() and int(name[8:]) > 0:
        return Variant(name, "chunked", chunk=int(name[8:]))
    servers = re.fullmatch(r"disagg_([1-9][0-9]*)p([1-9][0-9]*)d", name)
    if servers:
        return disagg_variant(int(servers[1]), int(servers[2]))
    for levels in ("sglang", "slo"):
        for kind in SPLIT_KINDS:
            v = pdmux_variant(kind, levels)
            if name == v.name:
                return v
    pdmux = ", ".join(pdmux_variant(kind, levels).name for levels in ("sglang", "slo")
                      for kind in SPLIT_KINDS)
    raise PdmuxError(f"unknown strategy {name!r}: prefill_first, chunked_<tokens>, {pdmux} or "
                     f"disagg_<P>p<D>d")


def served_by(names: tuple[str, ...]) -> dict:
    """The settings that serve these strategies: their chunk sizes, partition kinds and level
    policies (a chunk of 2048, grid capping and SGLang's levels where none names one)."""
    chosen = [variant(n) for n in names]
    return {"chunks": tuple(v.chunk for v in chosen if v.loop == "chunked") or (2048,),
            "kinds": tuple(dict.fromkeys(v.kind for v in chosen if v.loop == "pdmux"))
            or ("grid_cap",),
            "level_policies": tuple(dict.fromkeys(v.levels for v in chosen if v.loop == "pdmux"))
            or ("sglang",)}
