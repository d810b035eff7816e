"""Which PD-mux level a round runs at: SGLang's rule, or one driven by an ITL target.

- `SGLangLevels`: the decode batch size alone picks the level (`PDMuxConfig.choose_level`: the
  divisor rule or manual divisions), as SGLang 0.5.20 does.
- `SloLevels`: predicts the decode step beside a prefill at every split level from a measured
  decode-step curve and this batch's bytes (its weights and its whole KV cache; with the
  executor's measured overheads, what a step costs beyond them), and runs the
  level that leaves prefill the most SMs while the predicted step stays under the target; if
  none does, the one that gives decode the most. Moving to more prefill SMs needs the target
  met with a margin (`hysteresis`), so the choice does not flap between neighbouring levels.

Both change the level where SGLang does (a prefill starts or ends, the batch empties); with
`relevel_at_layers` the scheduler also asks at each round of a split prefill whose decode
batch changed. `approximate` turns an `SloLevels` into the manual divisions (batch-size
thresholds) SGLang can run, for a traffic's contexts. Pure: no torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.spec.models import ModelSpec


class LevelPolicy(Protocol):
    relevel_at_layers: bool

    def choose(self, levels: list[sglang_rules.Level], contexts: Sequence[int], prefilling: bool,
               current: int | None) -> int:
        """The level for a decode batch whose requests hold `contexts` tokens, while a
        prefill is (or is not) in flight; `current` is the level running now, if any."""

    def reachable(self, n_levels: int, max_running: int) -> tuple[set[int], set[int]]:
        """The levels a prefill and a decode step can run at, with up to `max_running`
        requests decoding: what a warm-up must compile and capture."""


@dataclass(frozen=True)
class SGLangLevels:
    config: sglang_rules.PDMuxConfig
    relevel_at_layers: bool = False

    def choose(self, levels, contexts, prefilling, current):
        return self.config.choose_level(levels, len(contexts), prefilling)

    def reachable(self, n_levels, max_running):
        levels = [(0, 0)] * n_levels  # the rule reads only how many levels there are
        prefilling = {self.config.choose_level(levels, n, True) for n in range(max_running + 1)}
        decoding = {self.config.choose_level(levels, n, has)
                    for n in range(1, max_running + 1) for has in (True, False)}
        return prefilling, decoding


@dataclass(frozen=True)
class SloLevels:
    model: ModelSpec
    rate: step_cost.DecodeRate  # the decode step's TB/s by SMs, beside a prefill
    itl_ms: float
    hysteresis: float = 0.1
    relevel_at_layers: bool = False
    overheads: step_cost.Overheads = step_cost.Overheads()  # a captured step's cost beyond its bytes
    comm: object = None  # a tensor-parallel rank's collectives (parallel.TensorParallel)

    def __post_init__(self):
        if not (np.isfinite(self.itl_ms) and self.itl_ms > 0):
            raise PdmuxError(f"the ITL target must be a finite number of ms > 0, got {self.itl_ms}")
        if not 0 <= self.hysteresis < 1:
            raise PdmuxError(f"hysteresis must be in [0, 1), got {self.hysteresis}")

    def reachable(self, n_levels, max_running):
        split = set(range(1, n_levels - 1))  # any split, as the contexts decide
        return split | {0}, split | {n_levels - 1}

    def step_ms(self, decode_sms: int, context_tokens: int, batch: int = 0) -> float:
        return step_cost.served_decode_step_s(self.model, self.rate, self.overheads, context_tokens,
                                              decode_sms, True, batch, self.comm) * 1e3

    def choose(self, levels, contexts, prefilling, current):
        n = len(levels)
        if not contexts:
            return 0 if prefilling else n - 1  # as SGLang: no batch, the whole GPU prefills
        if not prefilling:
            return n - 1
        tokens = sum(contexts) + len(contexts)  # the step reads each request's next slot too

        def meets(i: int, margin: float = 1.0) -> bool:
            return self.step_ms(levels[i][1], tokens, len(contexts)) <= self.itl_ms * margin
        # the split levels come with the most prefill SMs first
        best = next((i for i in range(1, n - 1) if meets(i)), n - 2)
        if (current is not None and 1 <= best < current <= n - 2 and meets(current)
                and not meets(best, 1 - self.hysteresis)):
            return current  # more prefill SMs only with room to spare
        return best


@dataclass(frozen=True)
class Approximation:
    """SGLang manual divisions that follow an `SloLevels` on a traffic, and how often they
    pick another level than it does. `levels` are the config's: the prefill-only and
    decode-only levels and the splits some batch size picks (a split none picks is left out,
    so no threshold is a placeholder)."""

    config: sglang_rules.PDMuxConfig
    levels: list[sglang_rules.Level]
    level_by_batch: dict[int, int]  # index into `levels`
    disagreement: float  # share of sampled batches where the divisions pick another level


def approximate(slo: SloLevels, levels: list[sglang_rules.Level], contexts: Callable[[int], list[int]],
                max_batch: int, base: sglang_rules.PDMuxConfig, samples: int = 64) -> Approximation:
    """For each batch size 1..max_batch, the level of `levels` that `slo` picks most often
    for `samples` batches of that size whose contexts `contexts(b)` draws (a traffic's
    contexts while it decodes), made non-decreasing in the batch size (SGLang's thresholds can
    only rise), as SGLang manual divisions over the levels picked; and the share of sampled
    batches on which they disagree with `slo`."""
    if max_batch < 1 or samples < 1:
        raise PdmuxError(f"need max_batch >= 1 and samples >= 1, got {max_batch} and {samples}")
    picks = {b: [slo.choose(levels, contexts(b), True, None) for _ in range(samples)]
             for b in range(1, max_batch + 1)}
    chosen, top = {}, 1
    for b in range(1, max_batch + 1):
        top = max(top, Counter(picks[b]).most_common(1)[0][0])
        chosen[b] = top
    wrong = sum(p != chosen[b] for b, ps in picks.items() for p in ps)
    picked = sorted(set(chosen.values()))
    kept = [levels[0], *(levels[i] for i in picked), levels[-1]]
    renumbered = {old: new for new, old in enumerate(picked, start=1)}
    by_batch = {b: renumbered[level] for b, level in chosen.items()}
    ranges: list[tuple[int, int | None, int]] = []
    for b, level in by_batch.items():
        if ranges and ranges[-1][2] == level:
            ranges[-1] = (ranges[-1][0], b, level)
        else:
            ranges.append((b, b, level))
    ranges[-1] = (ranges[-1][0], None, ranges[-1][2])
    config = sglang_rules.PDMuxConfig(len(kept), sglang_rules.manual_divisions_for(kept, ranges),
                                      base.split_forward_token_budget, base.decode_bs_divisor)
    return Approximation(config, kept, by_batch, wrong / (max_batch * samples))
