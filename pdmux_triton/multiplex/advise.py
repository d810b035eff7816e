"""PD-mux levels for an ITL target, from measured decode bandwidth.

SGLang's default levels split the SMs evenly between two fixed bounds, whatever decode needs.
Given the decode-step bandwidth a calibration measured at each SM budget (beside a running
prefill), this picks, for each range of decode batch sizes, the split that gives prefill the
most SMs while a decode step still fits the ITL target, and writes them as SGLang's
`manual_divisions`. Pure: the bandwidth curve is passed in (a `step_cost.DecodeRate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.spec.models import ModelSpec

MAX_ADVISED_BATCH = 1 << 16


def max_batch(spec: ModelSpec, context: int, itl_s: float, rate: step_cost.DecodeRate,
              decode_sms: int) -> int:
    """Largest decode batch at `context` tokens whose captured step beside a prefill (weights,
    KV and the rows of the size that runs it) fits `itl_s`; a step grows with its batch, so
    bisect."""
    def fits(batch: int) -> bool:
        return step_cost.captured_decode_step_s(spec, rate, batch * context, decode_sms, True,
                                                batch) <= itl_s
    lo, hi = 0, 1
    while hi <= MAX_ADVISED_BATCH and fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return min(lo, MAX_ADVISED_BATCH)


def green_splits(total_sms: int, major: int) -> list[sglang_rules.Level]:
    """Every (prefill SMs, decode SMs) split green contexts allow, fewest prefill SMs first."""
    min_part, granularity = sglang_rules.arch_constraints(major)
    splits = [(p, total_sms - p) for p in range(min_part, total_sms - min_part + 1, granularity)
              if total_sms - p >= min_part]
    if not splits:
        raise PdmuxError(f"no green-context split of {total_sms} SMs on compute capability "
                         f"{major}.x")
    return splits


def split_levels(total_sms: int, major: int) -> list[sglang_rules.Level]:
    """Every split as levels, the whole GPU at both ends (the order SGLang's levels take)."""
    return [(total_sms, 0), *reversed(green_splits(total_sms, major)), (0, total_sms)]


@dataclass(frozen=True)
class AdvisedLevel:
    prefill_sms: int
    decode_sms: int
    first_batch: int  # the level serves decode batches first_batch..last_batch
    last_batch: int
    itl_ms: float  # predicted decode step at last_batch


def advise(rate: step_cost.DecodeRate, spec: ModelSpec, total_sms: int, major: int,
           itl_ms: float, context: int, levels: int = 6) -> list[AdvisedLevel]:
    """Up to `levels` splits covering decode batches 1..the largest any split can serve, each
    judged by the decode step's rate beside a running prefill."""
    if itl_ms <= 0 or context < 1 or levels < 1:
        raise PdmuxError(f"need an ITL target > 0 ms, context >= 1 and levels >= 1, got "
                         f"{itl_ms}, {context}, {levels}")
    splits = green_splits(total_sms, major)

    def step_ms(batch: int, decode_sms: int) -> float:
        return step_cost.captured_decode_step_s(spec, rate, batch * context, decode_sms, True,
                                                batch) * 1e3

    serve = {d: max_batch(spec, context, itl_ms / 1e3, rate, d) for _, d in splits}
    top = max(serve.values())
    if top < 1:
        d = max(serve)
        raise PdmuxError(f"no split meets {itl_ms} ms: even {d} decode SMs take "
                         f"{step_ms(1, d):.1f} ms for one request at {context} tokens")
    bounds = sorted({1 + (top * k) // levels for k in range(levels)})
    advised: list[AdvisedLevel] = []
    for first, nxt in zip(bounds, [*bounds[1:], top + 1]):
        last = nxt - 1
        # the most prefill SMs whose decode share still serves the whole range in time
        p, d = max((s for s in splits if serve[s[1]] >= last), key=lambda s: s[0])
        step = step_ms(last, d)
        if advised and advised[-1].decode_sms == d:
            prev = advised.pop()
            first = prev.first_batch
        advised.append(AdvisedLevel(p, d, first, last, step))
    return advised


def as_config(advised: list[AdvisedLevel], base: sglang_rules.PDMuxConfig) -> sglang_rules.PDMuxConfig:
    """SGLang config with these levels: each level's threshold is its first batch size."""
    return sglang_rules.PDMuxConfig(
        sm_group_num=len(advised) + 2,
        manual_divisions=[[a.prefill_sms, a.decode_sms, a.first_batch] for a in advised],
        split_forward_token_budget=base.split_forward_token_budget,
        decode_bs_divisor=base.decode_bs_divisor)
