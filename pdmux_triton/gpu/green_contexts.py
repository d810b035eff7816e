"""Real SM partitions: CUDA green contexts through `cuda.bindings.driver`, as torch streams.

`split_green(first_sms)` splits the device the way SGLang does: one share is split off first
(on the architecture's granularity), the rest of the SMs form the second partition. Kernels
launched on a returned stream run only on that partition's SMs, whatever their grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pdmux_triton.errors import PdmuxError


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        raise PdmuxError("green contexts need cuda-bindings: pip install 'pdmux-triton[green]'") from None
    return driver


def _check(driver, call: str, result):
    """cuda.bindings returns (CUresult, *values); raise a clear error unless CUDA_SUCCESS."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        hint = ""
        if err in (driver.CUresult.CUDA_ERROR_NOT_SUPPORTED, driver.CUresult.CUDA_ERROR_NOT_FOUND):
            hint = " (green contexts need CUDA 12.4+ drivers and a Volta or newer GPU)"
        raise PdmuxError(f"{call} failed: {name.decode() if name else err}{hint}")
    return values[0] if len(values) == 1 else values


@dataclass
class GreenPartition:
    """One green context and a stream on it; `sms` is what the driver actually gave."""

    sms: int
    stream: torch.cuda.ExternalStream
    _ctx: object = field(repr=False)
    _raw_stream: object = field(repr=False)


@dataclass
class GreenSplit:
    first: GreenPartition  # the share split off
    rest: GreenPartition  # the remainder
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        """Destroy the streams and contexts (after their work is done)."""
        if self._closed:
            return
        driver = _driver()
        for part in (self.first, self.rest):
            self._destroy_one(driver, part)
        self._closed = True

    @staticmethod
    def _destroy_one(driver, part: GreenPartition) -> None:
        part.stream.synchronize()
        _check(driver, "cuStreamDestroy", driver.cuStreamDestroy(part._raw_stream))
        _check(driver, "cuGreenCtxDestroy", driver.cuGreenCtxDestroy(part._ctx))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _partition(driver, device, resource, sms_expected: int | None, what: str) -> GreenPartition:
    desc = _check(driver, "cuDevResourceGenerateDesc", driver.cuDevResourceGenerateDesc([resource], 1))
    ctx = _check(driver, "cuGreenCtxCreate", driver.cuGreenCtxCreate(
        desc, device, driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
    raw = _check(driver, "cuGreenCtxStreamCreate", driver.cuGreenCtxStreamCreate(
        ctx, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
    sms = resource.sm.smCount
    if sms_expected is not None and sms != sms_expected:
        raise PdmuxError(f"the driver gave the {what} green context {sms} SMs, not the "
                         f"{sms_expected} asked for (rounded to its SM granularity)")
    return GreenPartition(sms, torch.cuda.ExternalStream(int(raw)), ctx, raw)


def split_green(first_sms: int, rest_sms: int | None = None, device_index: int = 0) -> GreenSplit:
    """Split the GPU: first_sms for the first partition, the remainder for the second.

    With rest_sms given, the remainder must be exactly that many SMs.
    """
    if not torch.cuda.is_available():
        raise PdmuxError("green contexts need an NVIDIA GPU; torch sees no CUDA device")
    driver = _driver()
    torch.cuda.init()  # the primary context must exist before streams are wrapped for torch
    _check(driver, "cuInit", driver.cuInit(0))
    device = _check(driver, "cuDeviceGet", driver.cuDeviceGet(device_index))
    resource = _check(driver, "cuDeviceGetDevResource", driver.cuDeviceGetDevResource(
        device, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    total = resource.sm.smCount
    if not 0 < first_sms < total:
        raise PdmuxError(f"a green-context split needs 0 < SMs < {total}, got {first_sms}")
    parts, count, remaining = _check(driver, "cuDevSmResourceSplitByCount",
                                     driver.cuDevSmResourceSplitByCount(1, resource, 0, first_sms))
    if count < 1:
        raise PdmuxError(f"the driver could not split {first_sms} SMs off this GPU")
    first = _partition(driver, device, parts[0], first_sms, "first")
    try:
        rest = _partition(driver, device, remaining, rest_sms, "remaining")
    except PdmuxError:
        GreenSplit._destroy_one(driver, first)
        raise
    return GreenSplit(first, rest)
