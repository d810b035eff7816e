"""Requests to serve, reproducible from a seed: the chapter's scenario and request streams with
production-like lengths (users' own traces are read in `traces`).

Length presets are (mixtures of) log-normals cut at a cap, fitted to published statistics of
serving traces (Llama-2 tokenizer); each keeps the figures it was fitted to, and `fit_error`
says how far the fit sits from them. Arrivals are Poisson, or gamma with a burstiness (vLLM's
serving benchmark: 1.0 is Poisson, lower is burstier), and come within `MAX_ARRIVAL_S` of the
start. A request holds its prompt's length; its token ids are drawn when an executor first
asks for them (`Request.prompt`), so simulating a long trace makes none.
"""

from __future__ import annotations

import copy
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from pdmux_triton.errors import PdmuxError

# The clock is float64 seconds: at 1e8 s (~3 years) one step of it is ~15 ns, far below a
# decode step; at 1e16 s it is 2 s and a step's time vanishes into the arrival's.
MAX_ARRIVAL_S = 1e8
ARRIVAL_BOUND = (f"arrivals must come within {MAX_ARRIVAL_S:.0e} s (~3 years) of the start, "
                 f"where the float64 clock still resolves a decode step")
MAX_REQUESTS = 10_000_000  # a run holds every request's bookkeeping in memory


@dataclass(frozen=True)
class TokenIds:
    """Where a workload's prompt ids come from: request `rid`'s are drawn from its own stream
    of `seed`, so they are the same whichever requests are drawn first, or at all."""

    vocab: int
    seed: int

    def draw(self, rid: int, n: int) -> np.ndarray:
        return np.random.default_rng((self.seed, rid)).integers(0, self.vocab, n, dtype=np.int32)

    def blocks(self, hash_ids: Sequence[int], n: int) -> np.ndarray:
        """A prompt of `n` tokens made block by block from a trace's hash ids (one per
        HASH_BLOCK_TOKENS tokens, the last block cut short): the same id gives the same tokens
        in every request, so prompts that share a prefix of ids share those tokens."""
        return np.concatenate([
            np.random.default_rng((self.seed, HASH_STREAM, h)).integers(
                0, self.vocab, HASH_BLOCK_TOKENS, dtype=np.int32) for h in hash_ids])[:n]


HASH_BLOCK_TOKENS = 512  # tokens a hash id stands for (Mooncake's traces)
HASH_STREAM = 0x68617368  # seeds a hash id's tokens apart from every request's own stream


class Request:
    """One request and, as it is served, its output.

    The prompt is given as token ids, or as a length with the `TokenIds` to draw them from when
    an executor first reads `prompt`. Output tokens are counted (`generated`); their ids are
    kept where an executor samples them (`tokens`; None when simulated). Their times are the
    first token's (`first_token_s`, at the end of its prefill; None for a request decoding
    from the start) and then a slice of its server's decode-step log (`step_ends` from `step0`):
    every running request takes one token in every decode step, so a token costs its request
    nothing and a run's step times are kept once (`token_times` lists them)."""

    __slots__ = ("rid", "prompt_len", "_ids", "_draw", "hash_ids", "output_len", "arrival",
                 "after_steps", "warm", "context", "generated", "tokens", "first_token_s",
                 "step_ends", "step0", "prefill_start", "prefill_end", "cached_len", "prefix",
                 "ids_given")

    def __init__(self, rid: int, prompt: Sequence[int] | int, output_len: int,
                 arrival: float | None, after_steps: int | None = None, warm: bool = False, *,
                 draw: TokenIds | None = None, hash_ids: Sequence[int] | None = None,
                 prefill_start: float | None = None, prefill_end: float | None = None):
        self.rid = rid
        given = not isinstance(prompt, (int, np.integer))
        self.prompt_len, self._ids = (len(prompt), prompt) if given else (int(prompt), None)
        self.ids_given = given  # its prompt came as token ids, not a length to draw them for
        self._draw = draw
        # a trace's ids of the prompt's blocks (`TokenIds.blocks`), or None: its own tokens
        self.hash_ids = None if hash_ids is None else tuple(hash_ids)
        if self.hash_ids is not None and len(self.hash_ids) != -(-self.prompt_len //
                                                                  HASH_BLOCK_TOKENS):
            raise PdmuxError(f"request {rid}: {len(self.hash_ids)} hash ids for a "
                             f"{self.prompt_len}-token prompt; one per {HASH_BLOCK_TOKENS} "
                             f"tokens makes {-(-self.prompt_len // HASH_BLOCK_TOKENS)}")
        self.output_len = output_len  # tokens to generate, the first one included
        self.arrival = arrival  # s from the start; None: arrives after `after_steps` decode steps
        self.after_steps = after_steps
        self.warm = warm  # prefilled before the clock starts (a batch already decoding)
        # filled in while serving
        self.context = 0  # tokens in the KV cache
        self.generated = 0
        self.tokens: list[int] | None = None
        self.first_token_s: float | None = None
        self.step_ends: array | None = None
        self.step0 = 0
        self.prefill_start, self.prefill_end = prefill_start, prefill_end
        # set at admission by a prefix cache (`prefix_cache`): the prompt's first `cached_len`
        # tokens are in the KV cache already, in the executor's pages `prefix` (one handle a
        # cached block), and its prefill computes the rest
        self.cached_len = 0
        self.prefix: tuple = ()

    @property
    def prompt(self) -> Sequence[int]:
        """The prompt's token ids (drawn now if only its length was given)."""
        if self._ids is None:
            if self._draw is None:
                raise PdmuxError(f"request {self.rid} holds a prompt length and no token ids")
            self._ids = (self._draw.draw(self.rid, self.prompt_len) if self.hash_ids is None
                         else self._draw.blocks(self.hash_ids, self.prompt_len))
        return self._ids

    @property
    def done(self) -> bool:
        return self.generated >= self.output_len

    @property
    def token_times(self) -> list[float]:
        first = [] if self.first_token_s is None else [self.first_token_s]
        decoded = self.generated - len(first)
        return first + (self.step_ends[self.step0:self.step0 + decoded].tolist() if decoded else [])

    @property
    def first_time(self) -> float | None:
        """When its first token came out (None before)."""
        if self.first_token_s is not None or not self.generated:
            return self.first_token_s
        return self.step_ends[self.step0]

    @property
    def last_time(self) -> float | None:
        """When its latest token came out (None before)."""
        decoded = self.generated - (self.first_token_s is not None)
        return self.step_ends[self.step0 + decoded - 1] if decoded else self.first_token_s

    @property
    def ttft(self) -> float | None:
        first = self.first_time
        return None if first is None else first - self.arrival

    def __deepcopy__(self, memo) -> "Request":
        # shared: the prompt's ids (never written) and the server's step log (only appended
        # to, by the run it belongs to): a copy per request would hold every step once each
        twin = copy.copy(self)
        if self.tokens is not None:
            twin.tokens = list(self.tokens)
        return twin

    def __repr__(self) -> str:
        return (f"Request({self.rid}, prompt {self.prompt_len}, output {self.generated}/"
                f"{self.output_len}, arrival {self.arrival})")


# --- lengths -------------------------------------------------------------------------------

_NORMAL = NormalDist()


@dataclass(frozen=True)
class LengthDist:
    """A mixture of log-normals (weight, mu, sigma of ln tokens) cut at `cap` tokens, drawn at
    least `floor`; `published` holds the statistics it was fitted to."""

    components: tuple[tuple[float, float, float], ...]
    cap: int
    floor: int = 1
    published: dict = field(default_factory=dict)

    def _cdf(self, x: float) -> float:
        return sum(w * _NORMAL.cdf((math.log(x) - m) / s) for w, m, s in self.components)

    def quantile(self, p: float) -> float:
        """The p-quantile of the cut distribution (bisection on its CDF)."""
        target, lo, hi = p * self._cdf(self.cap), -20.0, math.log(self.cap)
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self._cdf(math.exp(mid)) < target else (lo, mid)
        return math.exp((lo + hi) / 2)

    def mean(self) -> float:
        kept = self._cdf(self.cap)
        return sum(w * math.exp(m + s * s / 2) * _NORMAL.cdf((math.log(self.cap) - m - s * s) / s)
                   for w, m, s in self.components) / kept

    def stats(self) -> dict[str, float]:
        return {"median": self.quantile(0.5), "mean": self.mean(), "p90": self.quantile(0.9),
                "p99": self.quantile(0.99)}

    def fit_error(self) -> dict[str, float]:
        """Relative error of the fit against each published figure."""
        mine = self.stats()
        return {k: mine[k] / v - 1 for k, v in self.published.items()}

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        weights = np.array([w for w, _, _ in self.components])
        out = np.empty(0)
        while out.size < n:  # draws past the cap are drawn again
            pick = rng.choice(len(self.components), size=2 * n, p=weights / weights.sum())
            mu = np.array([m for _, m, _ in self.components])[pick]
            sigma = np.array([s for _, _, s in self.components])[pick]
            draw = np.exp(rng.normal(mu, sigma))
            out = np.concatenate([out, draw[draw <= self.cap]])
        return np.maximum(self.floor, np.round(out[:n])).astype(np.int64)


@dataclass(frozen=True)
class LengthPreset:
    name: str
    source: str
    prompt: LengthDist
    output: LengthDist


def _single(mu, sigma, cap, floor, **published):
    return LengthDist(((1.0, mu, sigma),), cap, floor, published)


# Fitted offline to the figures in `published` (minimizing the largest relative error); a
# second component where one log-normal cannot hold a heavy tail and a low median together.
LENGTH_PRESETS = {p.name: p for p in (
    LengthPreset("sharegpt", "ShareGPT as Sarathi-Serve filtered it to 8K tokens",
                 _single(8.6379, 2.0320, 7582, 1, median=1730, mean=2340, p90=5696, p99=7433),
                 _single(7.0283, 1.3880, 998, 2, median=415, mean=439, p90=834, p99=998)),
    LengthPreset("arxiv", "arXiv summarization, 4K filter (Sarathi-Serve)",
                 _single(9.8601, 1.0680, 3887, 1, median=2730, mean=2588, p90=3702),
                 LengthDist(((0.94, 5.0752, 0.5), (0.06, 7.6962, 0.4)), 4096, 2,
                            {"median": 167, "mean": 291, "p90": 372})),
    LengthPreset("conv", "Splitwise conversation trace",
                 _single(6.9316, 0.8960, 4224, 1, median=1020, mean=1155, p90=2734, p99=4142),
                 _single(4.8978, 0.9320, 2206, 2, median=129, mean=211, p90=424)),
    LengthPreset("code", "Splitwise code trace",
                 _single(8.2883, 1.9880, 7001, 1, median=1469, mean=2048, p90=5186),
                 LengthDist(((0.94, 2.4849, 0.9), (0.06, 5.0106, 0.6)), 8192, 2,
                            {"median": 13, "mean": 28, "p90": 55})),
)}


@dataclass(frozen=True)
class Exponential:
    """Exponential lengths with given means, rounded and cut at a maximum."""

    prompt_mean: int
    prompt_max: int
    output_mean: int
    output_max: int

    def __post_init__(self):
        if not 1 <= self.prompt_mean <= self.prompt_max or not 1 <= self.output_mean <= self.output_max:
            raise PdmuxError("lengths need 1 <= mean <= max for prompts and outputs")


def _lengths(lengths, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(lengths, LengthPreset):
        return lengths.prompt.sample(rng, n), lengths.output.sample(rng, n)
    prompts = np.clip(np.round(rng.exponential(lengths.prompt_mean, n)), 1, lengths.prompt_max)
    outputs = np.clip(np.round(rng.exponential(lengths.output_mean, n)), 2, lengths.output_max)
    return prompts.astype(np.int64), outputs.astype(np.int64)


def decoding_contexts(preset: LengthPreset, seed: int = 0):
    """A sampler of the contexts a batch of decoding requests of this traffic holds: each a
    prompt and part of its output (uniform over where the request is in its decode). A request
    decodes for as many steps as it has output tokens, so a batch seen at a random step holds
    requests in proportion to their output length: the draw is weighted by it."""
    rng = np.random.default_rng(seed)

    def draw(batch: int) -> list[int]:
        pool = 16 * batch
        prompts, outputs = preset.prompt.sample(rng, pool), preset.output.sample(rng, pool)
        picked = rng.choice(pool, size=batch, p=outputs / outputs.sum())
        return [int(prompts[i] + rng.integers(0, outputs[i])) for i in picked]
    return draw


# --- workloads -----------------------------------------------------------------------------

PROMPT_ARRIVAL_STEPS = 8  # the prompt arrives after this many decode steps


def arriving_prompt_output(decode_tokens: int) -> int:
    """Tokens the chapter's arriving prompt generates."""
    return max(2, decode_tokens // 4)


def prompt_during_decode(vocab: int, batch: int = 32, context: int = 2048, prompt: int = 8192,
                         decode_tokens: int = 64, arrive_after_steps: int = PROMPT_ARRIVAL_STEPS,
                         seed: int = 0) -> list[Request]:
    """The chapter's scenario (`--workload chapter`; named after the PD-multiplexing chapter
    whose worked example it is): `batch` requests already decoding at `context` tokens
    (prefilled before the clock starts) when one `prompt`-token request arrives, after
    `arrive_after_steps` decode steps. The decoding requests run long enough to decode through
    the whole prefill, so the ITL they see while it runs is every strategy's price for it."""
    for name, value, low in (("batch", batch, 1), ("context", context, 1), ("prompt", prompt, 1),
                             ("decode tokens", decode_tokens, 2)):
        if value < low:
            raise PdmuxError(f"{name} must be >= {low}, got {value}")
    if decode_tokens <= arrive_after_steps:
        raise PdmuxError(f"the decoding requests finish their {decode_tokens} tokens before the "
                         f"prompt arrives (after {arrive_after_steps} decode steps): decode at "
                         f"least {arrive_after_steps + 1} tokens")
    ids = TokenIds(vocab, seed)
    reqs = [Request(i, context, decode_tokens, 0.0, warm=True, draw=ids) for i in range(batch)]
    reqs.append(Request(batch, prompt, arriving_prompt_output(decode_tokens), None,
                        after_steps=arrive_after_steps, draw=ids))
    return reqs


def stream(vocab: int, rate: float, count: int, lengths: LengthPreset | Exponential,
           burstiness: float = 1.0, seed: int = 0) -> list[Request]:
    """`count` requests at `rate` per second on average: gaps between arrivals are gamma
    distributed with shape `burstiness` (exponential, i.e. Poisson arrivals, at 1.0). The same
    seed gives the same lengths at every rate, so points of a rate sweep differ only in time."""
    if not (rate > 0 and math.isfinite(rate)) or not 1 <= count <= MAX_REQUESTS:
        raise PdmuxError(f"a request stream needs a finite rate > 0 and 1 <= count <= "
                         f"{MAX_REQUESTS:,}, got {rate} and {count}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise PdmuxError(f"burstiness must be a finite number > 0, got {burstiness}")
    rng = np.random.default_rng(seed)
    prompts, outputs = _lengths(lengths, rng, count)
    unit_gaps = rng.gamma(burstiness, 1.0 / burstiness, count)  # mean 1
    arrivals = np.cumsum(unit_gaps) / rate
    if not arrivals[-1] <= MAX_ARRIVAL_S:
        raise PdmuxError(f"{count:,} requests at {rate:g}/s arrive over {arrivals[-1]:.3g} s; "
                         f"{ARRIVAL_BOUND}")
    ids = TokenIds(vocab, seed)
    return [Request(i, p, o, t, draw=ids)
            for i, (p, o, t) in enumerate(zip(prompts.tolist(), outputs.tolist(),
                                              arrivals.tolist()))]
