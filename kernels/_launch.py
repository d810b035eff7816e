"""What every launcher shares: the grid cap, input checks, SM-id telemetry buffers.

The contract: a kernel given `num_sms` launches at most `num_sms * ctas_per_sm` programs and
loops over its tiles, so the grid cap emulates an SM partition. Kernels never read the device's
SM count; only the default budget here does (the whole GPU). Integer arguments that change from
batch to batch (token counts, batch sizes, block counts, page-table strides) are marked
`do_not_specialize`: Triton would otherwise compile a variant per value class (== 1, divisible
by 16) whenever a new batch shape shows up, in the middle of a measured run.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from pdmux_triton.errors import PdmuxError

# The Triton interpreter runs programs one after another on the CPU: a small default grid keeps
# tests fast while still exercising the persistent loop.
INTERPRETER_DEFAULT_SMS = 4


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def _device_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def default_num_sms(device: torch.device) -> int:
    """The whole GPU: the budget a kernel gets when the caller names none."""
    if interpreting() or device.type != "cuda":
        return INTERPRETER_DEFAULT_SMS
    return _device_sms(device.index if device.index is not None else torch.cuda.current_device())


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) on the host: `triton.cdiv` is a constexpr function in triton 3.7, whose
    call costs microseconds a launch."""
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n <= 0, as `triton.next_power_of_2`), without
    its constexpr-function call."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def grid_size(num_tiles: int, num_sms: int | None, ctas_per_sm: int, device: torch.device) -> int:
    """Programs to launch: the SM budget times CTAs per SM, never more than there are tiles."""
    if num_sms is None:
        num_sms = default_num_sms(device)
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 1:
        raise PdmuxError(f"num_sms must be a positive integer, got {num_sms!r}")
    if isinstance(ctas_per_sm, bool) or not isinstance(ctas_per_sm, int) or ctas_per_sm < 1:
        raise PdmuxError(f"ctas_per_sm must be a positive integer, got {ctas_per_sm!r}")
    return max(1, min(num_sms * ctas_per_sm, num_tiles))


def check_tma_rows(name: str, t: torch.Tensor, hint: str = "") -> None:
    """TMA reads a tensor as rows: its start and its row stride must be 16-byte aligned."""
    if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
        raise PdmuxError(
            f"{name} must start on a 16-byte boundary with 16-byte-aligned rows for TMA loads "
            f"(row stride {t.stride(0)} elements of {t.element_size()} bytes){hint}"
        )


@triton.jit
def record_sm(sm_ids_ptr, RECORD_SM: tl.constexpr):
    """Telemetry: store this program's SM id (only when asked; the interpreter has no %smid)."""
    if RECORD_SM:
        tl.store(sm_ids_ptr + tl.program_id(0), tl.extra.cuda.smid())


@triton.jit
def prefetch_l2(ptrs):
    """Fetch the lines at `ptrs` into L2 (a hint: no register waits for them). GPU only: the
    interpreter has no inline asm."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def row_piece(tile, ncols, BLOCK: tl.constexpr):
    """Tile -> (row, column offsets, mask) when every row is cut into BLOCK-wide pieces."""
    pieces = tl.cdiv(ncols, BLOCK)
    cols = (tile % pieces) * BLOCK + tl.arange(0, BLOCK)
    return tile // pieces, cols, cols < ncols


_COUNTERS: dict[tuple, torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []  # CUDA graphs may hold their pointers: never freed


def arrival_counters(n: int, device: torch.device) -> torch.Tensor:
    """n zeroed int32 counters for a kernel whose programs count arrivals at a shared piece
    of output (the last to arrive finishes it, nobody waits) and whose finisher resets the
    count (`shared_counters`)."""
    return shared_counters("arrivals", n, device)


def shared_counters(purpose: str, n: int, device: torch.device) -> torch.Tensor:
    """n zeroed int32 counters that every launch using them leaves zero (its last program
    resets them), so they are made once per (purpose, device, stream), not zeroed per call (a
    memset is one more launch); concurrent streams get their own, and one kernel's purposes
    (arrivals, a pinned gate) theirs.

    Under CUDA graph capture on a stream that has none yet (no call ran on it before the
    capture), each call gets fresh counters zeroed inside the graph: correct at every replay,
    at the cost of a memset per call. Warm up on the capturing stream to avoid it."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    buf = _COUNTERS.get((purpose, device, stream))
    if buf is not None and buf.numel() >= n:
        return buf
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=device)
    if buf is not None:
        _OUTGROWN.append(buf)
    buf = _COUNTERS[(purpose, device, stream)] = torch.zeros(max(n, 1024), dtype=torch.int32,
                                                             device=device)
    return buf


_UNUSED: dict[torch.device, torch.Tensor] = {}


def unused_pointer(device: torch.device) -> torch.Tensor:
    """A placeholder for a pointer argument the kernel compiles away (no telemetry, a plain
    launch's gate), made once per device so launches stay cheap."""
    if device not in _UNUSED:
        _UNUSED[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _UNUSED[device]


def telemetry_args(sm_ids: torch.Tensor | None, grid: int, device: torch.device):
    """(buffer, RECORD_SM flag): a kernel records each program's SM id into `sm_ids`."""
    if sm_ids is None:
        return unused_pointer(device), False
    if interpreting():
        raise PdmuxError("SM-id telemetry needs a GPU (the Triton interpreter has no %smid)")
    if sm_ids.dtype != torch.int32 or sm_ids.device != device or sm_ids.numel() < grid:
        raise PdmuxError(
            f"sm_ids must be an int32 tensor on {device} with at least {grid} entries (one per "
            f"program), got {sm_ids.dtype} on {sm_ids.device} with {sm_ids.numel()}"
        )
    sm_ids[:grid].fill_(-1)
    return sm_ids, True


def check_tensor(name: str, t: torch.Tensor, ndim: int, dtypes: tuple, device: torch.device | None = None,
                 contiguous_last: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise PdmuxError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise PdmuxError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise PdmuxError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; allowed: {allowed}")
    if device is not None and t.device != device:
        raise PdmuxError(f"{name} is on {t.device} but the other inputs are on {device}")
    # (stride()[-1] costs torch less than stride(-1); numel only where the stride is off)
    if contiguous_last and t.stride()[-1] != 1 and t.numel() > 0:
        raise PdmuxError(f"{name} must be contiguous in its last dimension, got strides {t.stride()}")


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
