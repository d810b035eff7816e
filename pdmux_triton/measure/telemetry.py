"""Which SMs each side's kernels ran on: the check that grid capping does not pin SMs.

Kernels record `%smid` per program when given an `sm_ids` buffer. `sm_usage` turns the two
sides' records into sets, their overlap and their spread over TPCs (pairs of SMs sharing a
texture unit; on Hopper consecutive SM ids 2k, 2k+1). GPC membership is not exposed by the
driver, so spread is reported per TPC, not per GPC.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable


def sm_usage(prefill_ids: Iterable[int], decode_ids: Iterable[int],
             sides: tuple[Collection[int], Collection[int]] | None = None) -> dict:
    """Summary of two sides' recorded SM ids (negative entries: programs that never ran);
    `sides`, each side's own SMs (a pinned partition's), adds how many of each side's records
    (programs, or a pinned launch's slots) ran off them."""
    prefill_ids = [int(i) for i in prefill_ids if int(i) >= 0]
    decode_ids = [int(i) for i in decode_ids if int(i) >= 0]
    prefill, decode = set(prefill_ids), set(decode_ids)
    shared = prefill & decode
    off = {}
    if sides is not None:
        off = {f"{name}_off_side": sum(i not in own for i in ids)
               for name, ids, own in (("prefill", prefill_ids, set(sides[0])),
                                      ("decode", decode_ids, set(sides[1])))}
    return {**off,
        "prefill_sms_used": len(prefill),
        "decode_sms_used": len(decode),
        "shared_sms": len(shared),
        "shared_sm_ids": sorted(shared),
        "prefill_tpcs": len({i // 2 for i in prefill}),
        "decode_tpcs": len({i // 2 for i in decode}),
        "shared_tpcs": len({i // 2 for i in prefill} & {i // 2 for i in decode}),
    }


def probe(partition, prefill_fn, decode_fn, grid_cap: int,
          sides: tuple[Collection[int], Collection[int]] | None = None) -> dict:
    """Run one prefill-side and one decode-side kernel at once on the partition's streams with
    SM-id recording; `prefill_fn(sm_ids)` / `decode_fn(sm_ids)` launch them (`sides`:
    `sm_usage`'s)."""
    import torch

    ids_p = torch.full((grid_cap,), -1, dtype=torch.int32, device="cuda")
    ids_d = torch.full((grid_cap,), -1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(partition.prefill_stream):
        prefill_fn(ids_p)
    with torch.cuda.stream(partition.decode_stream):
        decode_fn(ids_d)
    torch.cuda.synchronize()
    return sm_usage(ids_p.tolist(), ids_d.tolist(), sides)
