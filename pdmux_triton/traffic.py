"""Requests to serve, reproducible from a seed: the chapter's scenario, request streams with
production-like lengths, and users' own traces.

Length presets are (mixtures of) log-normals cut at a cap, fitted to published statistics of
serving traces (Llama-2 tokenizer); each keeps the figures it was fitted to, and `fit_error`
says how far the fit sits from them. Arrivals are Poisson, or gamma with a burstiness (vLLM's
serving benchmark: 1.0 is Poisson, lower is burstier). Prompts are numpy arrays of token ids.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

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


def stream(vocab: int, rate: float, count: int, lengths: LengthPreset | Exponential,
           burstiness: float = 1.0, seed: int = 0) -> list[Request]:
    """`count` requests at `rate` per second on average: gaps between arrivals are gamma
    distributed with shape `burstiness` (exponential, i.e. Poisson arrivals, at 1.0). The same
    seed gives the same lengths at every rate, so points of a rate sweep differ only in time."""
    if not (rate > 0 and math.isfinite(rate)) or count < 1:
        raise PdmuxError(f"a request stream needs a finite rate > 0 and count >= 1, got {rate} "
                         f"and {count}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise PdmuxError(f"burstiness must be a finite number > 0, got {burstiness}")
    rng = np.random.default_rng(seed)
    prompts, outputs = _lengths(lengths, rng, count)
    unit_gaps = rng.gamma(burstiness, 1.0 / burstiness, count)  # mean 1
    arrivals = np.cumsum(unit_gaps) / rate
    return [Request(i, _tokens(rng, int(p), vocab), int(o), float(t))
            for i, (p, o, t) in enumerate(zip(prompts, outputs, arrivals))]


TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")


def read_trace(path: str | Path, vocab: int, seed: int = 0) -> list[Request]:
    """A user's trace: a CSV with columns arrival_s, prompt_tokens, output_tokens (a header
    row, one request a row, arrivals in seconds from the start)."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
            header = rows and list(rows[0]) or None
    except OSError as err:
        raise PdmuxError(f"cannot read trace {path}: {err.strerror}") from None
    except (UnicodeDecodeError, csv.Error):
        raise PdmuxError(f"trace {path} is not a CSV text file") from None
    if not rows:
        raise PdmuxError(f"trace {path} has no requests (a header row {','.join(TRACE_COLUMNS)} "
                         f"and one row per request)")
    missing = [c for c in TRACE_COLUMNS if c not in (header or [])]
    if missing:
        raise PdmuxError(f"trace {path} lacks the column(s) {', '.join(missing)}; it needs "
                         f"{', '.join(TRACE_COLUMNS)}")
    rng = np.random.default_rng(seed)
    reqs = []
    for line, row in enumerate(rows, start=2):
        try:
            arrival = float(row["arrival_s"])
            prompt, output = int(row["prompt_tokens"]), int(row["output_tokens"])
        except (TypeError, ValueError):
            raise PdmuxError(f"{path}:{line}: expected a number of seconds and two token counts, "
                             f"got {row}") from None
        if not (math.isfinite(arrival) and arrival >= 0) or prompt < 1 or output < 1:
            raise PdmuxError(f"{path}:{line}: arrival_s must be >= 0 and token counts >= 1, got "
                             f"{arrival}, {prompt}, {output}")
        reqs.append(Request(len(reqs), _tokens(rng, prompt, vocab), output, arrival))
    return sorted(reqs, key=lambda r: r.arrival)
