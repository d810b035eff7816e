"""Float64 references, paged-cache builders and tolerances shared by the kernel tests."""

from __future__ import annotations

import torch

# ||out - ref|| / ||ref|| allowed per dtype. fp32 on a GPU runs tl.dot in tf32.
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
GPU_FP32_TOL = 2e-3


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    assert not torch.isnan(out).any(), "output has NaN: an element was not written"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    tol = GPU_FP32_TOL if dtype == torch.float32 and out.is_cuda else REL_TOL[dtype]
    err = rel_err(out, ref)
    assert err < tol, f"relative error {err:.3g} over {tol:g} for {dtype}"


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


class PagedKV:
    """Random K/V for requests of given lengths, scattered over shuffled pages of a cache."""

    def __init__(self, lens, kv_heads, head_dim, page_size, dtype, device, spare_pages=3):
        self.lens, self.page_size = list(lens), page_size
        pages_per = [-(-n // page_size) for n in self.lens]
        width = max([1, *pages_per])
        total_pages = sum(pages_per) + spare_pages
        order = torch.randperm(total_pages).tolist()  # non-contiguous pages, as a real pool
        self.page_table = torch.zeros((len(self.lens), width), dtype=torch.int32)
        i = 0
        for b, n in enumerate(pages_per):
            self.page_table[b, :n] = torch.tensor(order[i:i + n], dtype=torch.int32)
            i += n
        slots = total_pages * page_size
        self.k_cache = torch.randn((slots, kv_heads, head_dim), dtype=dtype)
        self.v_cache = torch.randn((slots, kv_heads, head_dim), dtype=dtype)
        self.page_table = self.page_table.to(device)
        self.k_cache, self.v_cache = self.k_cache.to(device), self.v_cache.to(device)

    def slots(self, b: int, start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        pages = self.page_table[b].cpu().long()[pos // self.page_size]
        return pages * self.page_size + pos % self.page_size

    def dense(self, b: int, n: int | None = None):
        s = self.slots(b, 0, self.lens[b] if n is None else n)
        return self.k_cache.cpu()[s].double(), self.v_cache.cpu()[s].double()


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
