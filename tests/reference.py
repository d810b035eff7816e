"""Float64 references and tolerances shared by the kernel tests (the paged inputs they read
come from pdmux_triton.measure.random_kv, as the benchmarks' and calibration's do)."""

from __future__ import annotations

import torch

# ||out - ref|| / ||ref|| allowed per dtype. fp32 on a GPU runs tl.dot in tf32.
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
GPU_FP32_TOL = 2e-3


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    assert not torch.isnan(out).any(), (
        f"output has NaN at {_first_nan(out)}: an element was not written")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _first_nan(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(torch.isnan(t))[0])


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Relative error in the norm under the dtype's tolerance; a failure names the worst
    element (its index, value and reference)."""
    tol = GPU_FP32_TOL if dtype == torch.float32 and out.is_cuda else REL_TOL[dtype]
    err = rel_err(out, ref)
    if err < tol:
        return
    out64, ref64 = out.double().cpu(), ref.double().cpu().expand_as(out)
    diff = (out64 - ref64).abs()
    worst = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
    raise AssertionError(
        f"relative error {err:.3g} over {tol:g} for {dtype}; worst element {worst}: "
        f"{out64[worst].item():.6g} vs reference {ref64[worst].item():.6g} "
        f"(of {out.numel()} elements, {int((diff > tol * ref64.abs().max()).sum())} off by more "
        f"than the tolerance times the largest reference value)")


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def attention_ref(q, k, v, q_pos=None):
    """q [M, Hq, D], k/v [N, Hkv, D] in float64; causal where q_pos (positions of q rows) given."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.double(), k) * q.shape[-1] ** -0.5
    if q_pos is not None:
        keys = torch.arange(k.shape[0])
        scores = scores.masked_fill(keys[None, None, :] > q_pos[None, :, None], float("-inf"))
    return torch.einsum("hmn,nhd->mhd", scores.softmax(-1), v)


def placements(total: int, ctas: int, first: int, k: int, seed: int):
    """(name, SM of each of ctas x total programs) for pinned launches under test: every SM
    its c programs; crowded on one SM of the range; sparse (some SMs of the range get none);
    none in the range (when the range leaves SMs out); uniformly random."""
    g = torch.Generator().manual_seed(seed)
    programs = ctas * total
    every = torch.arange(total).repeat(ctas)
    yield "every SM c", every[torch.randperm(programs, generator=g)]
    yield "crowded", torch.full((programs,), first + k // 2)
    yield "sparse", torch.tensor([first + (i % max(1, k // 2)) if i % 3 == 0 else
                                  (first + k + i) % total for i in range(programs)])
    outside = [s for s in range(total) if not first <= s < first + k]
    if outside:
        yield "none in range", torch.tensor(outside)[torch.randint(len(outside), (programs,),
                                                                   generator=g)]
    yield "random", torch.randint(total, (programs,), generator=g)
