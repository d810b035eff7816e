"""The chapter's first-order estimate of prefill-first, chunked prefill and PD multiplexing for
one prompt arriving while a batch decodes, from the shared cost model (`step_cost`).

A calibration replaces the S_SAT law with the measured decode-step curve, and a comparison
replaces the fixed MFU with the one each level's prefill reached co-running (`calibrated`).
Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import Calibration, Comparison
from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.serve import scheduler
from pdmux_triton.spec.gpus import GPUSpec, gpu_preset
from pdmux_triton.spec.models import ModelSpec, model_preset


@dataclass(frozen=True)
class Scenario:
    """A decode batch in flight when one prompt arrives (the chapter's defaults)."""

    gpu: GPUSpec = field(default_factory=lambda: gpu_preset("h100-sxm"))
    model: ModelSpec = field(default_factory=lambda: model_preset("qwen3-8b"))
    decode_batch: int = 32
    context: int = 2048
    prompt: int = 8192
    chunk_sizes: tuple[int, ...] = (2048, 512)
    s_sat: tuple[float, ...] = (44, 66, 88)
    bw_efficiency: float = 0.85
    mfu: float = 0.5
    pdmux: sglang_rules.PDMuxConfig = field(default_factory=sglang_rules.PDMuxConfig)
    decode_curve: step_cost.MeasuredCurve | None = None  # measured: replaces the S_SAT law
    prefill_curve: step_cost.PrefillRate | None = None  # measured MFU by prefill SMs: replaces mfu

    def __post_init__(self):
        for name, value, minimum in (
            ("decode batch", self.decode_batch, 1),
            ("context", self.context, 0),
            ("prompt", self.prompt, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise PdmuxError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if not self.chunk_sizes or any(c < 1 for c in self.chunk_sizes):
            raise PdmuxError(f"chunk sizes must be positive integers, got {self.chunk_sizes}")
        if not self.s_sat or any(not 0 < s < float("inf") for s in self.s_sat):
            raise PdmuxError(f"S_SAT values must be positive SM counts, got {self.s_sat}")
        for name, values in (("chunk sizes", self.chunk_sizes), ("S_SAT values", self.s_sat)):
            if len(set(values)) != len(values):
                raise PdmuxError(f"{name} {', '.join(f'{v:g}' for v in values)} repeat one: "
                                 f"give each once")
        for name, value in (("bandwidth efficiency", self.bw_efficiency), ("MFU", self.mfu)):
            if not 0 < value <= 1:
                raise PdmuxError(f"{name} must be in (0, 1], got {value}")
        if self.gpu.hbm_tbps is None or self.gpu.bf16_tflops is None:
            raise PdmuxError(
                f"GPU {self.gpu.name!r} has no bandwidth/FLOP-rate preset; pass "
                "--bandwidth-tbps and --tflops"
            )
        step_cost.check_fits(self.gpu, self.model, self.decode_batch * self.context + self.prompt,
                             f"{self.decode_batch} requests at {self.context} tokens and a "
                             f"{self.prompt}-token prompt")
        scheduler.check_chunks_beside(self.chunk_sizes, self.decode_batch)

    def decode_rate(self, s_sat: float) -> step_cost.DecodeRate:
        if self.decode_curve is not None:
            return self.decode_curve
        return step_cost.SaturationLaw(self.gpu.hbm_tbps * self.bw_efficiency,
                                       min(s_sat, self.gpu.sms))

    @property
    def prefill_rate(self) -> step_cost.PrefillRate:
        return self.prefill_curve or step_cost.PrefillRate.fixed(self.gpu.bf16_tflops, self.gpu.sms,
                                                                 self.mfu)

    @property
    def level(self) -> sglang_rules.Level:
        """The PD-mux level SGLang picks for this decode batch while the prompt prefills."""
        levels = self.pdmux.levels(self.gpu.sms, self.gpu.cc_major)
        return levels[self.pdmux.choose_level(levels, self.decode_batch, True)]

    def decode_step_s(self, sms: int, corun: bool, s_sat: float | None = None) -> float:
        rate = self.decode_rate(self.s_sat[0] if s_sat is None else s_sat)
        return step_cost.decode_step_s(self.model, rate, self.decode_batch * self.context, sms, corun,
                                       self.decode_batch)

    def prefill_s(self, sms: int, corun: bool) -> float:
        return step_cost.compute_s(step_cost.prefill_flops(self.model, self.prompt),
                                   self.prefill_rate, sms, corun)


@dataclass
class Row:
    approach: str
    itl_ms: float  # the inter-token latency decode sees while the prompt is prefilled
    prefill_ms: float | None
    tokens_during_prefill: int | None  # decode tokens each request gets during the prefill
    steps: int | None = None
    prefill_sms: int | None = None
    decode_sms: int | None = None
    s_sat: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _decode_only(sc: Scenario) -> Row:
    step = sc.decode_step_s(sc.gpu.sms, corun=False)
    return Row("decode_only", step * 1e3, None, None, prefill_sms=0, decode_sms=sc.gpu.sms)


def _prefill_first(sc: Scenario) -> Row:
    prefill = sc.prefill_s(sc.gpu.sms, corun=False)
    step = sc.decode_step_s(sc.gpu.sms, corun=False)
    # decode waits for the whole prefill: one step of prefill + decode, no tokens meanwhile
    return Row("prefill_first", (prefill + step) * 1e3, prefill * 1e3, 0, steps=1)


def _chunked(sc: Scenario, chunk: int) -> Row:
    take = scheduler.fewest_chunk_tokens(chunk, sc.decode_batch)  # the loop's, beside fixed rows
    starts = np.arange(0, sc.prompt, take, dtype=float)  # every chunk at once: any count is fast
    sizes = np.minimum(take, sc.prompt - starts)
    steps = step_cost.mixed_step_s(sc.model, sc.decode_rate(sc.s_sat[0]), sc.prefill_rate, sc.gpu.sms,
                                   sc.decode_batch * sc.context, sc.decode_batch, sizes, starts,
                                   samples_chunk=starts + sizes == sc.prompt)
    total = float(np.sum(steps))
    return Row(f"chunked_{chunk}", total / len(starts) * 1e3, total * 1e3, len(starts),
               steps=len(starts))


def _pdmux(sc: Scenario, s_sat: float) -> Row:
    prefill_sms, decode_sms = sc.level
    step = sc.decode_step_s(decode_sms, corun=True, s_sat=s_sat)
    prefill = sc.prefill_s(prefill_sms, corun=True)
    return Row(f"pdmux_ssat{s_sat:g}", step * 1e3, prefill * 1e3, round(prefill / step),
               prefill_sms=prefill_sms, decode_sms=decode_sms, s_sat=s_sat)


def estimate(sc: Scenario) -> list[Row]:
    """Every approach for one scenario, in the chapter's order."""
    rows = [_decode_only(sc), _prefill_first(sc)]
    rows += [_chunked(sc, chunk) for chunk in sc.chunk_sizes]
    rows += [_pdmux(sc, s) for s in sc.s_sat]
    return rows


def calibrated(sc: Scenario, calibration: Calibration, kind: str = "grid_cap",
               comparison: Comparison | None = None) -> Scenario:
    """The scenario with decode's rate from a calibration (its measured decode-step curves,
    read between budgets; the S_SAT fit beside a prefill names the row) and, given a
    comparison, the MFU each level's prefill reached co-running (read between levels), and
    alone for a prefill with the GPU to itself."""
    fit = calibration.decode_fit(kind, "corun")
    out = replace(sc, bw_efficiency=min(1.0, fit["peak_tbps"] / sc.gpu.hbm_tbps),
                  s_sat=(round(fit["s_sat_fit"], 1),),
                  decode_curve=calibration.decode_curve(kind))
    if comparison is not None:
        rate = comparison.prefill_rate(kind, sc.gpu.bf16_tflops, sc.gpu.sms)
        out = replace(out, prefill_curve=rate, mfu=rate.mfu_at(out.level[0]))
    return out
