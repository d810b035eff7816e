"""Requests to serve: the chapter's scenario and Poisson streams, reproducible from a seed.

Prompts are numpy arrays of token ids (4 bytes a token: a long context costs little to make).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pdmux_triton.errors import PdmuxError


@dataclass
class Request:
    rid: int
    prompt: np.ndarray | list[int]  # token ids
    output_len: int  # tokens to generate, the first one included
    arrival: float | None  # seconds from the start; None: arrives after `after_steps` decode steps
    after_steps: int | None = None
    warm: bool = False  # prefilled before the clock starts (a batch already decoding)
    # filled in while serving
    context: int = 0  # tokens in the KV cache
    tokens: list[int] = field(default_factory=list)  # generated token ids
    token_times: list[float] = field(default_factory=list)
    prefill_start: float | None = None
    prefill_end: float | None = None

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.output_len

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None


def _tokens(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    return rng.integers(0, vocab, n, dtype=np.int32)


CHAPTER_ARRIVAL_STEPS = 8  # the prompt arrives after this many decode steps


def chapter_scenario(vocab: int, batch: int = 32, context: int = 2048, prompt: int = 8192,
                     decode_tokens: int = 64, arrive_after_steps: int = CHAPTER_ARRIVAL_STEPS,
                     seed: int = 0) -> list[Request]:
    """`batch` requests already decoding at `context` tokens (prefilled before the clock
    starts) when one `prompt`-token request arrives, after `arrive_after_steps` decode steps.
    The decoding requests run long enough to decode through the whole prefill."""
    for name, value, low in (("batch", batch, 1), ("context", context, 1), ("prompt", prompt, 1),
                             ("decode tokens", decode_tokens, 2)):
        if value < low:
            raise PdmuxError(f"{name} must be >= {low}, got {value}")
    if decode_tokens <= arrive_after_steps:
        raise PdmuxError(f"the decoding requests finish their {decode_tokens} tokens before the "
                         f"prompt arrives (after {arrive_after_steps} decode steps): decode at "
                         f"least {arrive_after_steps + 1} tokens")
    rng = np.random.default_rng(seed)
    reqs = [Request(i, _tokens(rng, context, vocab), decode_tokens, 0.0, warm=True)
            for i in range(batch)]
    reqs.append(Request(batch, _tokens(rng, prompt, vocab), max(2, decode_tokens // 4), None,
                        after_steps=arrive_after_steps))
    return reqs


def poisson(vocab: int, rate: float, count: int, prompt_mean: int, prompt_max: int,
            output_mean: int, output_max: int, seed: int = 0) -> list[Request]:
    """`count` requests arriving at `rate` per second; prompt and output lengths drawn from
    geometric-like (exponential, rounded, clipped) distributions with the given means."""
    if rate <= 0 or count < 1:
        raise PdmuxError(f"a Poisson stream needs rate > 0 and count >= 1, got {rate} and {count}")
    if not 1 <= prompt_mean <= prompt_max or not 1 <= output_mean <= output_max:
        raise PdmuxError("lengths need 1 <= mean <= max for prompts and outputs")
    rng = np.random.default_rng(seed)
    t, reqs = 0.0, []
    for i in range(count):
        t += float(rng.exponential(1 / rate))
        p = min(prompt_max, max(1, round(float(rng.exponential(prompt_mean)))))
        o = min(output_max, max(2, round(float(rng.exponential(output_mean)))))
        reqs.append(Request(i, _tokens(rng, p, vocab), o, t))
    return reqs
