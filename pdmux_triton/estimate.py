"""The chapter's first-order cost model of prefill-first, chunked prefill and PD multiplexing.

Decode is bandwidth-bound: a step reads every weight once and the whole KV cache of the batch,
at the HBM rate times an efficiency, scaled down by min(1, SMs / S_SAT) when decode has fewer
SMs than it needs to saturate memory (or, calibrated, at the rate measured at that budget).
Prefill is compute-bound: linear FLOPs plus causal attention FLOPs at the bf16 rate times an
MFU, in proportion to its share of the SMs.
Pure Python; `scheduler`'s simulated executor drives its clock with these same functions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from pdmux_triton import policy
from pdmux_triton.errors import PdmuxError
from pdmux_triton.hardware import GPUSpec, ModelSpec, gpu_preset, model_preset


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
    pdmux: policy.PDMuxConfig = field(default_factory=policy.PDMuxConfig)
    # measured decode-step TB/s by SM budget, (sms, tbps) pairs (a calibration's curve beside
    # a prefill); when given, a step's rate is read off it instead of the S_SAT model
    decode_tbps: tuple[tuple[int, float], ...] = ()

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
        if not self.s_sat or any(s <= 0 for s in self.s_sat):
            raise PdmuxError(f"S_SAT values must be positive SM counts, got {self.s_sat}")
        for name, value in (("bandwidth efficiency", self.bw_efficiency), ("MFU", self.mfu)):
            if not 0 < value <= 1:
                raise PdmuxError(f"{name} must be in (0, 1], got {value}")
        if self.gpu.hbm_tbps is None or self.gpu.bf16_tflops is None:
            raise PdmuxError(
                f"GPU {self.gpu.name!r} has no bandwidth/FLOP-rate preset; pass "
                "--bandwidth-tbps and --tflops"
            )

    @property
    def bytes_per_s(self) -> float:
        return self.gpu.hbm_tbps * 1e12 * self.bw_efficiency

    @property
    def flops_per_s(self) -> float:
        return self.gpu.bf16_tflops * 1e12 * self.mfu


def decode_step_bytes(model: ModelSpec, batch: int, context: int) -> float:
    """bf16 weights once plus every request's KV cache."""
    return 2 * model.linear_params + batch * context * model.kv_bytes_per_token()


def prefill_flops(model: ModelSpec, tokens: int, start: int = 0) -> float:
    """`tokens` new tokens after `start` cached ones: linears plus causal attention."""
    attention = 4 * model.layers * model.hidden * (tokens * start + tokens * tokens / 2)
    return 2 * model.linear_params * tokens + attention


def decode_step_s(sc: Scenario, sms: int, s_sat: float) -> float:
    step_bytes = decode_step_bytes(sc.model, sc.decode_batch, sc.context)
    if sc.decode_tbps:
        budgets, rates = zip(*sc.decode_tbps)
        return step_bytes / (float(np.interp(sms, budgets, rates)) * 1e12)
    return step_bytes / (sc.bytes_per_s * min(1.0, sms / s_sat))


def prefill_s(sc: Scenario, tokens: int, start: int = 0, sms: int | None = None) -> float:
    share = 1.0 if sms is None else sms / sc.gpu.sms
    return prefill_flops(sc.model, tokens, start) / (sc.flops_per_s * share)


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
    step = decode_step_s(sc, sc.gpu.sms, sc.gpu.sms)
    return Row("decode_only", step * 1e3, None, None, prefill_sms=0, decode_sms=sc.gpu.sms)


def _prefill_first(sc: Scenario) -> Row:
    prefill = prefill_s(sc, sc.prompt)
    step = decode_step_s(sc, sc.gpu.sms, sc.gpu.sms)
    # decode waits for the whole prefill: one step of prefill + decode, no tokens meanwhile
    return Row("prefill_first", (prefill + step) * 1e3, prefill * 1e3, 0, steps=1)


def _chunked(sc: Scenario, chunk: int) -> Row:
    decode = decode_step_s(sc, sc.gpu.sms, sc.gpu.sms)
    decode_linear_flops = 2 * sc.model.linear_params * sc.decode_batch
    steps = []
    for start in range(0, sc.prompt, chunk):
        tokens = min(chunk, sc.prompt - start)
        compute = (prefill_flops(sc.model, tokens, start) + decode_linear_flops) / sc.flops_per_s
        steps.append(max(compute, decode))
    total = sum(steps)
    return Row(f"chunked_{chunk}", total / len(steps) * 1e3, total * 1e3, len(steps),
               steps=len(steps))


def _pdmux(sc: Scenario, s_sat: float) -> Row:
    levels = sc.pdmux.levels(sc.gpu.sms, sc.gpu.cc_major)
    index = policy.choose_group(levels, sc.decode_batch, True, sc.pdmux.decode_bs_divisor,
                                sc.pdmux.manual_divisions or None)
    prefill_sms, decode_sms = levels[index]
    step = decode_step_s(sc, decode_sms, s_sat)
    prefill = prefill_s(sc, sc.prompt, sms=prefill_sms)
    return Row(f"pdmux_ssat{s_sat:g}", step * 1e3, prefill * 1e3, round(prefill / step),
               prefill_sms=prefill_sms, decode_sms=decode_sms, s_sat=s_sat)


def estimate(sc: Scenario) -> list[Row]:
    """Every approach for one scenario, in the chapter's order."""
    rows = [_decode_only(sc), _prefill_first(sc)]
    rows += [_chunked(sc, chunk) for chunk in sc.chunk_sizes]
    rows += [_pdmux(sc, s) for s in sc.s_sat]
    return rows


def decode_step_points(calibration: dict, kind: str, state: str) -> tuple[tuple[int, float], ...]:
    """A calibration's measured decode-step curve, (sms, TB/s) by budget, at one CTA per SM."""
    return tuple(sorted((p["sms"], p["tbps"]) for p in calibration.get("rows", [])
                        if p.get("workload") == "decode_step" and p.get("kind") == kind
                        and p.get("state") == state and p.get("ctas_per_sm") == 1))


def calibrated(sc: Scenario, calibration: dict, kind: str = "grid_cap",
               compare_levels: list[dict] | None = None) -> Scenario:
    """The scenario with decode's rate from a calibration (the decode-step curve beside a
    prefill, the state PD-mux decodes in: measured points, read between budgets; its S_SAT
    fit names the row) and, given a comparison's levels, the MFU its prefill reached
    co-running at the level this scenario picks (interpolated in prefill SMs between the
    measured levels, held at the ends).

    The curve, not peak * SMs / S_SAT: near S_SAT the measured rate bends below that line
    (H200, decode step at 52 SMs: 1.76 TB/s measured, 2.06 on the line)."""
    try:
        fit = calibration["summary"]["decode_step"][kind]["corun"]
        peak, s_sat = fit["peak_tbps"], fit["s_sat_fit"]
    except (KeyError, TypeError):
        raise PdmuxError(f"the calibration has no decode_step / {kind} / corun fit") from None
    out = replace(sc, bw_efficiency=min(1.0, peak / sc.gpu.hbm_tbps), s_sat=(round(s_sat, 1),),
                  decode_tbps=decode_step_points(calibration, kind, "corun"))
    if compare_levels:
        levels = sc.pdmux.levels(sc.gpu.sms, sc.gpu.cc_major)
        index = policy.choose_group(levels, sc.decode_batch, True, sc.pdmux.decode_bs_divisor,
                                    sc.pdmux.manual_divisions or None)
        prefill_sms = levels[index][0]
        try:
            measured = sorted((lv["prefill_sms"], lv["prefill"][kind]["corun_tflops"]
                               / (sc.gpu.bf16_tflops * lv["prefill_sms"] / sc.gpu.sms))
                              for lv in compare_levels)
        except (KeyError, TypeError):
            raise PdmuxError(f"the comparison's levels lack prefill / {kind} / corun_tflops") from None
        sms, mfu = zip(*measured)
        out = replace(out, mfu=min(1.0, float(np.interp(prefill_sms, sms, mfu))))
    return out


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(sc: Scenario, rows: list[Row]) -> str:
    head = (f"{sc.model.name} on {sc.gpu.name} ({sc.gpu.sms} SMs): {sc.decode_batch} requests "
            f"decoding at {sc.context} context, one {sc.prompt}-token prompt arrives")
    lines = [head, f"{'approach':<18} {'SMs p/d':>8} {'ITL ms':>8} {'prefill ms':>11} "
                   f"{'tokens during prefill':>22} {'steps':>6}"]
    for r in rows:
        split = f"{r.prefill_sms}/{r.decode_sms}" if r.prefill_sms is not None else "-"
        tokens = "-" if r.tokens_during_prefill is None else str(r.tokens_during_prefill)
        steps = "-" if r.steps is None else str(r.steps)
        lines.append(f"{r.approach:<18} {split:>8} {fmt_ms(r.itl_ms):>8} "
                     f"{fmt_ms(r.prefill_ms):>11} {tokens:>22} {steps:>6}")
    return "\n".join(lines)

