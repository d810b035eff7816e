"""The cost model every consumer shares: what a decode step reads, what a prefill computes, and
the rates both run at on a share of the SMs. Pure Python (numpy for interpolation).

Decode is bandwidth-bound: a step reads every weight once and the whole KV cache of its batch.
Its rate on `sms` SMs is either the chapter's law, peak * min(1, SMs / S_SAT), or a calibration's
measured curve (alone on the GPU, or beside a running prefill); a calibration that also measured
other batches adds what their rows cost beyond their bytes (`BatchTerm`). Prefill is
compute-bound: linear FLOPs, causal attention FLOPs and the LM head over the rows it samples,
at the bf16 rate times an MFU, in proportion to its share of the SMs.

`estimate`, the simulated executor, `advise`, the calibration workloads and the benchmarks all
count bytes and FLOPs here, so an estimate and a simulation of the same scenario agree.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec.gpus import MAX_SMS, GPUSpec
from pdmux_triton.spec.models import ModelSpec

DTYPE_BYTES = 2  # bf16 weights and KV cache


# --- what the work is ----------------------------------------------------------------------

def weight_bytes(model: ModelSpec) -> float:
    """Every weight a decode step reads once: all layers' linears and the LM head."""
    return DTYPE_BYTES * model.linear_params


def kv_bytes(model: ModelSpec, tokens: int) -> float:
    """K and V of `tokens` cached tokens over all layers."""
    return tokens * model.kv_bytes_per_token(DTYPE_BYTES)


def decode_step_bytes(model: ModelSpec, context_tokens: int) -> float:
    """One decode step of a batch whose requests hold `context_tokens` cached tokens in all."""
    return weight_bytes(model) + kv_bytes(model, context_tokens)


def attention_flops(model: ModelSpec, tokens: int, prefix: int = 0, layers: int | None = None) -> float:
    """Causal attention of `tokens` new queries after `prefix` cached keys: QK^T and PV, each
    2 FLOPs per (query, key, q-dimension) pair."""
    layers = model.layers if layers is None else layers
    return 4 * layers * model.q_dim * (tokens * prefix + tokens * tokens / 2)


def layer_flops(model: ModelSpec, tokens: int, prefix: int = 0, layers: int | None = None) -> float:
    """`layers` transformer layers over `tokens` new tokens: linears plus attention."""
    layers = model.layers if layers is None else layers
    return 2 * model.layer_linear_params * tokens * layers + attention_flops(model, tokens, prefix,
                                                                             layers)


def lm_head_flops(model: ModelSpec, rows: int) -> float:
    """The LM head over the rows that sample a token (one per sequence, not every prompt token)."""
    return 2 * model.vocab * model.hidden * rows


def prefill_flops(model: ModelSpec, tokens: int, prefix: int = 0) -> float:
    """A whole prefill of one sequence: every layer, then the LM head over its last row."""
    return layer_flops(model, tokens, prefix) + lm_head_flops(model, 1)


def batch_flops(model: ModelSpec, seqs, layers: int | None = None,
                samples: bool = True) -> float:
    """A prefill batch over `layers` layers (`seqs`: each prompt's (new, cached) tokens),
    with its LM head over one row a prompt where it `samples`: what a batch's price reads."""
    flops = sum(layer_flops(model, n, cached, layers) for n, cached in seqs)
    return flops + (lm_head_flops(model, len(seqs)) if samples else 0.0)


def footprint_bytes(model: ModelSpec, kv_tokens: int) -> float:
    """GPU memory a model holding `kv_tokens` tokens of KV cache needs: every weight (the
    embedding table too, unless the LM head is it) and the cache, activations aside."""
    embedding = 0 if model.tie_embeddings else DTYPE_BYTES * model.vocab * model.hidden
    return weight_bytes(model) + embedding + kv_bytes(model, kv_tokens)


def check_fits(gpu: GPUSpec, model: ModelSpec, kv_tokens: int, what: str) -> None:
    """A clear error when `what` cannot fit on the GPU: weights plus its KV cache."""
    if gpu.memory_gb is None:
        return
    need = footprint_bytes(model, kv_tokens)
    if need > gpu.memory_gb * 1e9:
        raise PdmuxError(
            f"{what} does not fit on the {gpu.name}: {model.name}'s weights and "
            f"{kv_tokens:,} tokens of KV cache need {need / 1e9:,.1f} GB, the GPU has "
            f"{gpu.memory_gb:g} GB")


# Of the memory the weights leave, the KV cache takes this share; activations of a prefill
# batch and the captured decode graphs need the rest (SGLang's mem_fraction_static plays the
# same role).
KV_MEMORY_FRACTION = 0.6
UNBOUNDED_KV_TOKENS = 10**12  # a GPU whose memory is not known
KV_PAGE_TOKENS = 16  # the served KV cache's page: a request holds whole pages of it


def kv_capacity_tokens(gpu: GPUSpec, model: ModelSpec) -> int:
    """Tokens of KV cache a server of this model keeps on this GPU."""
    if gpu.memory_gb is None:
        return UNBOUNDED_KV_TOKENS
    spare = gpu.memory_gb * 1e9 - footprint_bytes(model, 0)
    return max(0, int(spare * KV_MEMORY_FRACTION // model.kv_bytes_per_token(DTYPE_BYTES)))


def decode_flops(model: ModelSpec, batch: int) -> float:
    """The linears and LM head of one decode token for each of `batch` requests."""
    return 2 * model.linear_params * batch


# --- how fast it runs ----------------------------------------------------------------------

class DecodeRate(Protocol):
    def tbps(self, sms: int, corun: bool) -> float:
        """TB/s a decode step reaches on `sms` SMs, alone or beside a running prefill."""

    def batch_extra_s(self, sms: int, corun: bool, batch: int) -> float:
        """Seconds a step of `batch` requests takes beyond its bytes at `tbps`."""

    def context_extra_s(self, sms: int, corun: bool, context: float, kv: float) -> float:
        """Seconds a step's `kv` bytes of KV take beyond them at `tbps` where its requests hold
        `context` tokens each (negative: read faster)."""


@dataclass(frozen=True)
class SaturationLaw:
    """The chapter's model: bandwidth grows linearly with SMs up to S_SAT, then holds."""

    peak_tbps: float
    s_sat: float

    def __post_init__(self):
        _check_positive("decode peak TB/s", self.peak_tbps)
        _check_positive("S_SAT", self.s_sat)

    def tbps(self, sms: int, corun: bool) -> float:
        return self.peak_tbps * min(1.0, sms / self.s_sat)

    def batch_extra_s(self, sms: int, corun: bool, batch: int) -> float:
        return 0.0  # the law knows bytes only

    def context_extra_s(self, sms: int, corun: bool, context: float, kv: float) -> float:
        return 0.0


@dataclass(frozen=True)
class BatchTerm:
    """What a decode step of another batch than the curve's takes beyond its bytes at the
    curve's rate, by SMs, alone and beside a prefill: (batch, SMs, seconds) points. On few SMs
    a step's linears do MMA work in proportion to its rows (padded to the GEMM's row tile), so
    a step's time grows with its batch faster than its KV bytes; at the curve's own batch the
    term is 0. Read between SM budgets, then between batches
    (held past the smallest and largest measured)."""

    own_batch: int
    alone: tuple[tuple[int, int, float], ...]
    corun: tuple[tuple[int, int, float], ...] = ()

    def __post_init__(self):
        for batch, sms, seconds in (*self.alone, *self.corun):
            if not (batch >= 1 and sms >= 1 and np.isfinite(seconds) and abs(seconds) < 10.0):
                raise PdmuxError(f"a decode batch term has a bad point (batch {batch}, {sms} "
                                 f"SMs, {seconds} s)")

    @functools.cached_property
    def _by_batch(self) -> dict[bool, list[tuple[int, tuple | None]]]:
        return _by_setting(self.own_batch, self.alone, self.corun)

    def extra_s(self, sms: int, corun: bool, batch: int) -> float:
        return _read_between(self._by_batch[bool(corun)], sms, batch)


def _by_setting(own: int, alone: tuple, corun: tuple) -> dict[bool, list[tuple[int, tuple | None]]]:
    """Per state (beside a prefill or not), each measured setting's (budgets, values) sorted
    by setting, from (setting, SMs, value) points; None for the own setting, whose term is 0.
    A setting measured beside a prefill too is read there."""
    def group(points) -> dict[int, tuple]:
        out: dict[int, list] = {}
        for setting, budget, value in points:
            out.setdefault(setting, []).append((budget, value))
        return {setting: tuple(zip(*sorted(v))) for setting, v in out.items()}
    first = {own: None, **group(alone)}
    return {False: sorted(first.items()), True: sorted({**first, **group(corun)}.items())}


def _read_between(table: list[tuple[int, tuple | None]], sms: int, setting: float) -> float:
    """A `_by_setting` table read between SM budgets, then between settings (held past the
    ends)."""
    values = [0.0 if curve is None else float(np.interp(sms, *curve)) for _, curve in table]
    return float(np.interp(setting, [s for s, _ in table], values))


@dataclass(frozen=True)
class ContextTerm:
    """What a decode step's KV costs beyond its bytes at the curve's rate where its requests
    hold another context than the curve's, by SMs, alone and beside a prefill: (context a
    request, SMs, seconds a KV byte) points, measured at the curve's own batch. Decode
    attention reads long contexts closer to the streaming rate (fewer pipeline restarts a
    byte), so the term is negative there; at the curve's own context it is 0. Read between SM
    budgets, then between contexts (held past the largest measured, and at 0 below the own)."""

    own_context: int
    alone: tuple[tuple[int, int, float], ...]
    corun: tuple[tuple[int, int, float], ...] = ()

    def __post_init__(self):
        for context, sms, per_byte in (*self.alone, *self.corun):
            if not (context >= 1 and sms >= 1 and np.isfinite(per_byte)
                    and abs(per_byte) < 1e-9):
                raise PdmuxError(f"a decode context term has a bad point (context {context}, "
                                 f"{sms} SMs, {per_byte} s a byte)")

    @functools.cached_property
    def _by_context(self) -> dict[bool, list[tuple[int, tuple | None]]]:
        return _by_setting(self.own_context, self.alone, self.corun)

    def extra_s(self, sms: int, corun: bool, context: float, kv: float) -> float:
        # (below the own context nothing was measured: held at its 0)
        return kv * _read_between(self._by_context[bool(corun)], sms,
                                  max(context, self.own_context))


@dataclass(frozen=True)
class MeasuredCurve:
    """A calibration's decode-step TB/s at measured SM budgets, read between them and held at
    the ends; beside a prefill when that curve was measured, else alone. Near S_SAT the measured
    rate bends below the law's straight line, so a calibrated estimate reads these points."""

    alone: tuple[tuple[int, float], ...]
    corun: tuple[tuple[int, float], ...] = ()
    source: str = ""
    batches: BatchTerm | None = None  # measured at other batches too
    contexts: ContextTerm | None = None  # measured at other contexts a request too

    def __post_init__(self):
        if not self.alone:
            raise PdmuxError(f"a measured decode curve needs points alone on the GPU{self._named}")
        for sms, rate in (*self.alone, *self.corun):
            if not (sms > 0 and np.isfinite(rate) and rate > 0):
                raise PdmuxError(f"a measured decode curve has a bad point ({sms} SMs, {rate} TB/s)"
                                 f"{self._named}")

    @property
    def _named(self) -> str:
        return f" ({self.source})" if self.source else ""

    def tbps(self, sms: int, corun: bool) -> float:
        points = self.corun if corun and self.corun else self.alone
        budgets, rates = zip(*points)
        return float(np.interp(sms, budgets, rates))

    def batch_extra_s(self, sms: int, corun: bool, batch: int) -> float:
        return self.batches.extra_s(sms, corun, batch) if self.batches and batch else 0.0

    def context_extra_s(self, sms: int, corun: bool, context: float, kv: float) -> float:
        return self.contexts.extra_s(sms, corun, context, kv) if self.contexts and kv else 0.0


@dataclass(frozen=True)
class PrefillRate:
    """bf16 FLOP/s a prefill reaches on a share of the SMs: the peak times an MFU times the share.

    `mfu` holds (prefill SMs, MFU) points beside a decode, read between them and held at the
    ends: one point for a fixed MFU, or the MFU a comparison measured co-running at each level;
    `mfu_alone` the same with nothing beside it (a prefill-first or chunked step has the GPU
    to itself), the co-run points where there are none; `timed_tokens` the one uncached
    prompt a comparison timed them on (None: not known)."""

    peak_tflops: float
    total_sms: int
    mfu: tuple[tuple[int, float], ...]
    mfu_alone: tuple[tuple[int, float], ...] = ()
    timed_tokens: int | None = None

    def __post_init__(self):
        _check_positive("peak bf16 TFLOP/s", self.peak_tflops)
        if not self.mfu:
            raise PdmuxError("a prefill rate needs at least one MFU")
        for sms, mfu in self.mfu + self.mfu_alone:
            if not 0 < mfu <= 1:
                raise PdmuxError(f"MFU must be in (0, 1], got {mfu} at {sms} SMs")
        if self.timed_tokens is not None and not (isinstance(self.timed_tokens, int)
                                                  and self.timed_tokens >= 1):
            raise PdmuxError(f"the prompt a prefill rate was timed on needs >= 1 token, got "
                             f"{self.timed_tokens!r}")

    @classmethod
    def fixed(cls, peak_tflops: float, total_sms: int, mfu: float) -> "PrefillRate":
        return cls(peak_tflops, total_sms, ((total_sms, mfu),))

    def mfu_at(self, sms: int, corun: bool = True) -> float:
        budgets, mfus = zip(*sorted(self.mfu if corun or not self.mfu_alone else self.mfu_alone))
        return float(np.interp(sms, budgets, mfus))

    def flops_per_s(self, sms: int, corun: bool = True) -> float:
        return self.peak_tflops * 1e12 * self.mfu_at(sms, corun) * sms / self.total_sms

    def sustained(self, ratios: tuple[tuple[int, float], ...]) -> "PrefillRate":
        """The same rate with each co-run point scaled by the ratio a level's prefill keeps of
        its burst rate when it runs on for seconds beside its decode ((prefill SMs, ratio)
        points, read between them and held at the ends): the comparison times ~60 ms after an
        idle GPU, at clocks a GPU under sustained power does not hold. Alone, as before."""
        if not ratios:
            return self
        budgets, kept = zip(*sorted(ratios))
        return replace(self, mfu=tuple((sms, min(1.0, mfu * float(np.interp(sms, budgets, kept))))
                                       for sms, mfu in self.mfu),
                       mfu_alone=self.mfu_alone or self.mfu)

    def on_whole_gpu(self, mfu: float) -> "PrefillRate":
        """The same rate with the GPU's own MFU alone on all its SMs: a comparison's levels
        leave decode some SMs, so without it the whole GPU reads its largest level's."""
        alone = dict(self.mfu_alone or self.mfu)
        alone[self.total_sms] = mfu
        return replace(self, mfu_alone=tuple(sorted(alone.items())))


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and np.isfinite(value) and value > 0):
        raise PdmuxError(f"{name} must be a finite number > 0, got {value!r}")


# --- the eager forward by its kernels' tiles (a mixed step on the whole GPU) ----------------

def gemm_tile(tokens: int) -> tuple[int, int] | None:
    """The (rows, columns) tile kernels/gemm.py's `default_config` gives a layer's GEMM over
    `tokens` rows on the whole GPU, mirrored here (the cost model imports no triton; a test
    holds the two together); None for 64 rows or fewer (the skinny decode tile)."""
    if tokens <= 64:
        return None
    if tokens <= 256:
        return (64, 128)
    return (128, 128) if tokens <= 1024 else (128, 256)


def layer_gemms(model: ModelSpec) -> tuple[tuple[int, int], ...]:
    """A layer's GEMMs as the executor runs them, (N, K) each: fused q/k/v, o, fused gate/up,
    down."""
    return ((model.q_dim + 2 * model.kv_dim, model.hidden), (model.hidden, model.q_dim),
            (2 * model.intermediate, model.hidden), (model.hidden, model.intermediate))


# the extend attention's tile (kernels/prefill_attention.py `default_config`): query rows of one
# head by keys a step, and the head size its tile times were measured at
EXTEND_TILE_ROWS = 128
EXTEND_TILE_KEYS = 128
TILE_HEAD_DIM = 128


@dataclass(frozen=True)
class TileTimes:
    """What one tile of the eager forward's kernels takes on the whole GPU, from captured
    kernel benchmarks (bench/fit_host_costs.py, `--prefill-rate`): a GEMM's wave (one tile a
    program) per 4096 of its K by tile shape, and what a last, partial wave costs when nearly
    empty, as a share of a full one ((rows, columns, seconds, share) rows: a partial wave of a
    fraction f of the programs costs share + (1 - share) x f of a wave; its tiles have the idle
    SMs' memory bandwidth to themselves); the extend attention's tile (`EXTEND_TILE_ROWS` query
    rows of one head) over `EXTEND_TILE_KEYS` keys read from the cache (`attention_prefix_s`)
    or among the launch's new tokens (`attention_new_s`), at a head size of `TILE_HEAD_DIM`;
    and a layer's other kernels (norms, rotary, the KV store) per token. The attention's
    programs take its tiles longest first, in a zigzag, so its time is the busiest program's."""

    gemm_wave_s: tuple[tuple[int, int, float, float], ...]
    attention_prefix_s: float
    attention_new_s: float
    small_s_per_token: float

    def __post_init__(self):
        if not self.gemm_wave_s:
            raise PdmuxError("tile times need at least one GEMM tile's wave time")
        for rows, cols, seconds, share in self.gemm_wave_s:
            if not (rows >= 1 and cols >= 1 and np.isfinite(seconds) and 0 < seconds < 0.1
                    and 0 <= share <= 1):
                raise PdmuxError(f"a GEMM wave time must be a finite number of seconds in (0, "
                                 f"0.1) for a tile of >= 1 x 1, its partial wave's share in "
                                 f"[0, 1], got {rows} x {cols}: {seconds!r}, {share!r}")
        for name in ("attention_prefix_s", "attention_new_s", "small_s_per_token"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and np.isfinite(value) and 0 <= value < 0.01):
                raise PdmuxError(f"tile time {name} must be a finite number of seconds in [0, "
                                 f"0.01), got {value!r}")

    def wave(self, tile: tuple[int, int]) -> tuple[float, float]:
        """A wave of `tile`s per 4096 of K and a partial wave's share: as measured, else the
        measured tile's nearest in area, its time scaled by area (an extrapolation)."""
        area = tile[0] * tile[1]
        rows, cols, seconds, share = min(
            self.gemm_wave_s, key=lambda t: (abs(np.log(t[0] * t[1] / area)), t[0] * t[1]))
        return (seconds if (rows, cols) == tile else seconds * area / (rows * cols)), share


def gemm_waves(tiles: int, programs: int, share: float) -> float:
    """Waves `tiles` tiles take on `programs` programs, a last partial wave of a fraction f
    of the programs counted as share + (1 - share) x f of one."""
    full, rest = divmod(tiles, programs)
    return full + (share + (1 - share) * rest / programs if rest else 0.0)


def gemm_layer_s(model: ModelSpec, tokens: int, tiles: TileTimes, programs: int) -> float | None:
    """A layer's GEMMs over `tokens` rows on `programs` programs (one per SM), in waves of
    tiles: 513 rows (a 512-token chunk and one decode row) run five row tiles where 512 run
    four, and the o and down projections a second wave. None for 64 rows or fewer (the
    skinny decode tile, which these times do not hold)."""
    tile = gemm_tile(tokens)
    if tile is None:
        return None
    wave, share = tiles.wave(tile)
    return sum(gemm_waves(-(-tokens // tile[0]) * -(-n // tile[1]), programs, share) * k / 4096
               * wave for n, k in layer_gemms(model))


def extend_attention_s(model: ModelSpec, seqs, tiles: TileTimes, programs: int) -> float:
    """The extend attention of every layer over `seqs`, (new tokens, cached tokens) each: one
    tile per `EXTEND_TILE_ROWS` new rows and query head, each stepping over its cached keys and
    then its new ones `EXTEND_TILE_KEYS` at a time; the tiles taken longest first in a zigzag
    over `programs` programs (kernels/prefill_attention), so a few long sequences set the time,
    not the FLOPs over the GPU."""
    per_key = model.head_dim / TILE_HEAD_DIM
    prefix_steps, new_steps, counts = [], [], []
    for new, cached in seqs:
        blocks = -(-int(new) // EXTEND_TILE_ROWS)
        ends = np.minimum(np.arange(1, blocks + 1) * EXTEND_TILE_ROWS, new)
        prefix_steps.append(np.full(blocks, -(-int(cached) // EXTEND_TILE_KEYS)))
        new_steps.append(-(-ends // EXTEND_TILE_KEYS))
        counts.append(np.full(blocks, model.q_heads))
    if not counts:
        return 0.0
    counts = np.concatenate(counts)
    pre, new = np.repeat(np.concatenate(prefix_steps), counts), np.repeat(np.concatenate(new_steps),
                                                                        counts)
    cost = pre * tiles.attention_prefix_s + new * tiles.attention_new_s
    cost = cost[np.argsort(-(pre + new), kind="stable")]  # the kernel's order: most keys first
    width = min(len(cost), programs)
    waves = np.zeros(-(-len(cost) // width) * width)
    waves[:len(cost)] = cost
    waves = waves.reshape(-1, width)
    waves[1::2] = waves[1::2, ::-1]  # odd rounds from the other end
    return float(waves.sum(axis=0).max()) * per_key * model.layers


def tiled_layers_s(model: ModelSpec, tokens: int, seqs, tiles: TileTimes, programs: int,
                   layers: int | None = None, gemm_s: float | None = None) -> float | None:
    """`layers` of the eager forward (all by default) over `tokens` rows by its kernels' tiles:
    each layer's GEMMs in waves of tiles (`gemm_layer_s`; `gemm_s` a layer where given), its
    other kernels per token, and the extend attention over `seqs` ((new, cached) tokens each);
    None where the GEMMs take the skinny tile and no `gemm_s` is given."""
    layers = model.layers if layers is None else layers
    gemms = gemm_layer_s(model, tokens, tiles, programs) if gemm_s is None else gemm_s
    if gemms is None:
        return None
    return (layers * (gemms + tiles.small_s_per_token * tokens)
            + extend_attention_s(model, seqs, tiles, programs) * layers / model.layers)


def tile_s_per_flop(model: ModelSpec, seqs, tiles: TileTimes, programs: int) -> float | None:
    """A prompt batch's (`seqs`: (new, cached) tokens each) layers by its kernels' tiles on
    `programs` SMs (`tiled_layers_s`) over their FLOPs; None where the tiles do not price it
    (the skinny tile)."""
    tiled = tiled_layers_s(model, sum(int(new) for new, _ in seqs), seqs, tiles, programs)
    if not tiled:
        return None
    return tiled / sum(layer_flops(model, int(new), int(cached)) for new, cached in seqs)


def wave_slowdown(model: ModelSpec, seqs, tiles: TileTimes, programs: int,
                  timed_tokens: int) -> float:
    """How much longer than its FLOPs at an MFU timed on one uncached prompt of `timed_tokens`
    a prompt batch (`seqs`: (new, cached) tokens each) takes on `programs` SMs: its time per
    FLOP by the tiles over that prompt's, as a short batch's last wave of GEMM tiles runs part
    empty; at least 1, since the MFU prices batches that fill their waves as served. 1 where
    the tiles do not price the batch (the skinny tile)."""
    batch = tile_s_per_flop(model, seqs, tiles, programs)
    timed = tile_s_per_flop(model, [(timed_tokens, 0)], tiles, programs)
    if not batch or not timed:
        return 1.0
    return max(1.0, batch / timed)


@dataclass(frozen=True)
class MixedStepFit:
    """A mixed step as the executor runs it, fitted to measured chunked rounds: `fixed_s`
    (its batch made and uploaded, its tokens read back, the forward's fixed costs; measured
    rounds do not show it moving with the host's launch speed, so `Overheads.on_host` keeps
    it), then its layers as the host launches them and the GPU runs them
    (`layer_pipeline_s`): a short chunk on a slow host waits on its launches.

    The GPU phases, by the kernels' tiles (`tiles`, `TileTimes`): each layer's GEMMs over the
    chunk's and the decode rows' tokens in whole waves of tiles, its other kernels per token,
    the extend attention of the chunk over its prefix as its busiest program runs it, the LM
    head over the rows that sample, and the decode rows' attention as a decode step's: their
    KV read at the decode rate. `decode_rows_in_extend`: the steps priced ran their decode rows
    in the extend kernel's tiles too, as the executor did before they moved to decode
    attention (each row's own context where `mixed_step_s` is given them, else the batch's
    shared evenly): a run saved then, priced as it ran (fits and replays of its rounds,
    trace_fidelity's points served before; `Overheads.served_on(0)`)."""

    fixed_s: float
    tiles: TileTimes
    decode_rows_in_extend: bool = False

    def __post_init__(self):
        if not (np.isfinite(self.fixed_s) and self.fixed_s >= 0):
            raise PdmuxError(f"a mixed step's fixed cost must be a finite number >= 0 s, got "
                             f"{self.fixed_s!r}")
        if not isinstance(self.tiles, TileTimes):
            raise PdmuxError("a mixed step's fit needs its kernels' tile times")


def launch_layers_s(layers: int, first_s: float, later_s: float | None) -> float:
    """The host's time to launch a call of `layers` eager layers: the first in `first_s` (through
    the kernels' launchers), each later one in `later_s` (replaying the first's launches; None:
    as the first, a host timed before replays)."""
    if layers < 1 or later_s is None:
        return max(layers, 0) * first_s
    return first_s + (layers - 1) * later_s


# today's generation of chunked steps: decode rows through decode attention, counted in the
# chunk (`metrics.chunked_steps_of` reads a saved run's; `Overheads.served_on` an older one's)
CHUNKED_STEPS = 2


@dataclass(frozen=True)
class Overheads:
    """What this tool's executor spends beyond the first-order model: the host's share of a
    decode round (inputs up, replay, tokens back, the loop's bookkeeping: `decode_round_s`
    fixed, `decode_round_per_request_s` a request, `decode_round_per_kv_token_s` a token
    of KV its page tables name and `decode_round_split_s` more at a level that splits the
    GPU, where a round also polls or finishes the prefill's batch), each eager layer's launches (`layer_launch_s` the first of a
    call, which goes through the launchers; `later_layer_s` each later one, which replays the
    first's launches, kernels/_replay.py; None: as the first, a file measured before), an
    eager step's batch (made, uploaded, its tokens read back; a whole-GPU prefill batch pays
    it too), a split prefill's batch made and uploaded before its layers launch
    (`prefill_batch_s`; None: the eager step's), what a captured decode step takes beyond its
    bytes at the calibrated rate (`decode_step_extra`, (batch, seconds) points read between
    them), mixed steps as the executor runs them (`mixed`), and
    the MFU a prefill with the GPU to itself is served at (`whole_gpu_prefill_mfu`, which the
    comparison cannot time: its levels leave decode some SMs) and the served span over that
    price by the share of the recent past, the batch's own span included, that prefills ran
    (`whole_gpu_prefill_by_busy`, (busy share, ratio) points, held at the ends: a batch after
    memory-bound decode rounds runs at higher clocks than one after prefills; none: the MFU's
    price as it is), and what a level's prefill keeps
    of the comparison's burst rate when it runs on beside its decode on a busy GPU
    (`split_prefill_sustained`, (prefill SMs, ratio) points, `PrefillRate.sustained`: as its served
    batches show where fitted, else as a sustained run of one long prompt), and how far toward that
    rate it has slowed when it ran a share of the recent past (`split_prefill_slowdown`, (busy
    share, fraction) points between (0, 0) and (1, 1); none: the fraction is the share), and the
    decode step beside a split prefill as served over its co-run price, by that prefill's busy
    share (`split_decode_by_busy`, (busy share, ratio) points, held at the ends: the clocks
    fall as it keeps the GPU busy; none: the co-run price as it is); those two are the grid
    cap's, and another kind's own where fitted apart (`by_kind`, `for_kind`). Each layer of a
    split prefill also takes `split_prefill_layer_s` of GPU time beyond its FLOPs at that
    rate, on every kind: its kernels' ramps and tails on the level's SMs, which the
    comparison's one long prompt hides and a short batch pays in full. An eager
    step ends no earlier than its launches, and the host launches nothing else meanwhile. None
    by default (the chapter's model); `calibrate --host-costs` measures the host's share of a
    captured round alone, bench/fit_host_costs.py fits the served round's share, the eager
    step, a split prefill's batch, the step extras, the mixed step, the whole GPU's MFU,
    the decode step beside a split prefill and the prefill's served rate and layer time to
    measured runs
    and reads how far a prefill busy part of the time slows from bench/sustained_corun.py's
    files."""

    decode_round_s: float = 0.0
    layer_launch_s: float = 0.0
    eager_step_s: float = 0.0
    decode_step_extra: tuple[tuple[int, float], ...] = ()
    mixed: MixedStepFit | None = None
    whole_gpu_prefill_mfu: float | None = None
    whole_gpu_prefill_by_busy: tuple[tuple[float, float], ...] = ()
    split_prefill_sustained: tuple[tuple[int, float], ...] = ()
    split_prefill_slowdown: tuple[tuple[float, float], ...] = ()
    split_decode_by_busy: tuple[tuple[float, float], ...] = ()
    decode_round_per_request_s: float = 0.0
    decode_round_per_kv_token_s: float = 0.0
    prefill_batch_s: float | None = None
    # another partition kind's split prefill and its decode beside it, where fitted on that
    # kind's own served points: (kind, split_prefill_sustained, split_decode_by_busy); a green
    # context's served prefill keeps less of its burst rate than a grid-capped one's
    # (bench/NOTES.md), so each kind is priced from its own points (`for_kind`)
    by_kind: tuple[tuple[str, tuple, tuple], ...] = ()
    later_layer_s: float | None = None
    split_prefill_layer_s: float = 0.0
    decode_round_split_s: float = 0.0
    # the generation of chunked steps simulated (`served_on`; the loop reads it off the
    # simulated executor): today's, or an older one a saved run was served with
    chunked_steps: int = CHUNKED_STEPS

    def __post_init__(self):
        for name in ("decode_round_s", "layer_launch_s", "eager_step_s",
                     "decode_round_per_request_s", "decode_round_per_kv_token_s",
                     "prefill_batch_s", "later_layer_s", "split_prefill_layer_s",
                     "decode_round_split_s"):
            value = getattr(self, name)
            if value is None and name in ("prefill_batch_s", "later_layer_s"):
                continue
            if not (isinstance(value, (int, float)) and np.isfinite(value) and value >= 0):
                raise PdmuxError(f"overhead {name} must be a finite number >= 0, got {value!r}")
        if self.whole_gpu_prefill_mfu is not None and not 0 < self.whole_gpu_prefill_mfu <= 1:
            raise PdmuxError(f"whole_gpu_prefill_mfu must be in (0, 1], got "
                             f"{self.whole_gpu_prefill_mfu!r}")
        for sms, ratio in self.split_prefill_sustained:
            if not (isinstance(sms, int) and sms >= 1 and np.isfinite(ratio) and 0 < ratio <= 2):
                raise PdmuxError(f"split_prefill_sustained needs prefill SMs >= 1 and ratios in "
                                 f"(0, 2], got ({sms!r}, {ratio!r})")
        for share, fraction in self.split_prefill_slowdown:
            if not (0 < share < 1 and 0 <= fraction <= 1):
                raise PdmuxError(f"split_prefill_slowdown needs busy shares in (0, 1) and "
                                 f"fractions in [0, 1], got ({share!r}, {fraction!r})")
        for name in ("whole_gpu_prefill_by_busy", "split_decode_by_busy"):
            for share, ratio in getattr(self, name):
                if not (0 <= share <= 1 and np.isfinite(ratio) and 0.5 <= ratio <= 2):
                    raise PdmuxError(f"{name} needs busy shares in [0, 1] and ratios in "
                                     f"[0.5, 2], got ({share!r}, {ratio!r})")
        for entry in self.by_kind:
            if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], str)):
                raise PdmuxError(f"by_kind needs (kind, split_prefill_sustained, "
                                 f"split_decode_by_busy) entries, got {entry!r}")
            replace(self, split_prefill_sustained=entry[1], split_decode_by_busy=entry[2],
                    by_kind=())  # checked as the defaults are
        for batch, seconds in self.decode_step_extra:
            if not (batch >= 1 and np.isfinite(seconds) and abs(seconds) < 1.0):
                raise PdmuxError(f"decode_step_extra needs batches >= 1 and finite seconds under "
                                 f"1 s, got ({batch!r}, {seconds!r})")

    def for_kind(self, kind: str) -> "Overheads":
        """These costs for split levels of partition `kind`: its own served ratios where they
        were fitted apart (`by_kind`; an empty one keeps the default's), else the default's,
        the grid cap's: ratios to a burst rate and a co-run price, read against this kind's
        own (the best guess where its points are too few to fit)."""
        for name, sustained, by_busy in self.by_kind:
            if name == kind:
                return replace(self, split_prefill_sustained=sustained or
                               self.split_prefill_sustained, split_decode_by_busy=by_busy or
                               self.split_decode_by_busy, by_kind=())
        return self

    def on_host(self, layer_launch_s: float, later_layer_s: float | None = None) -> "Overheads":
        """The same costs on a host that launches an eager layer in `layer_launch_s`: what
        the host does (a decode round's share, an eager step's batch, a split prefill's batch)
        scaled by how much faster or slower it launches; the GPU's terms and a mixed step's
        fixed cost (`MixedStepFit`) kept. Hosts beside the same GPU launch at different speeds
        (bench/NOTES.md), so a measured run is judged against its own host. `later_layer_s`:
        the host's own time a later layer (a run that timed its replayed launches), where these
        costs' would be scaled, or be missing in costs timed before replays (every layer then
        priced as the first, ~10x slow on such a run)."""
        _check_positive("an eager layer's launch time", layer_launch_s)
        if later_layer_s is not None:
            _check_positive("a later eager layer's launch time", later_layer_s)
        if not self.layer_launch_s:
            raise PdmuxError("overheads without an eager layer's launch time cannot be moved "
                             "to another host")
        f = layer_launch_s / self.layer_launch_s
        return replace(self, decode_round_s=self.decode_round_s * f, layer_launch_s=layer_launch_s,
                       later_layer_s=(later_layer_s if later_layer_s is not None
                                      else None if self.later_layer_s is None
                                      else self.later_layer_s * f),
                       eager_step_s=self.eager_step_s * f,
                       decode_round_per_request_s=self.decode_round_per_request_s * f,
                       decode_round_per_kv_token_s=self.decode_round_per_kv_token_s * f,
                       decode_round_split_s=self.decode_round_split_s * f,
                       prefill_batch_s=(None if self.prefill_batch_s is None
                                        else self.prefill_batch_s * f))

    def served_on(self, steps: int) -> "Overheads":
        """These costs on the executor of that generation of chunked steps (CHUNKED_STEPS
        today): 1 took the whole chunk beside the decode rows, where today's chunk counts them
        (SGLang's mixed chunk); 0 also gave each decode row an extend tile a query head
        (`MixedStepFit.decode_rows_in_extend`) before the rows moved to decode attention."""
        mixed = (None if self.mixed is None
                 else replace(self.mixed, decode_rows_in_extend=steps == 0))
        return replace(self, chunked_steps=steps, mixed=mixed)

    def launch_layers_s(self, layers: int) -> float:
        """The host's time to launch a call of `layers` eager layers."""
        return launch_layers_s(layers, self.layer_launch_s, self.later_layer_s)

    def split_prefill_batch_s(self) -> float:
        """A split prefill's batch made and uploaded: as fitted, else an eager step's."""
        return self.eager_step_s if self.prefill_batch_s is None else self.prefill_batch_s

    def decode_round_host_s(self, batch: int, context_tokens: int, split: bool) -> float:
        """The host's share of a decode round of `batch` requests holding `context_tokens` of
        KV, at a level that splits the GPU or not: the loop's work grows with the requests it
        steps and the pages it lists, and a split level's round also polls or finishes the
        prefill's batch."""
        return (self.decode_round_s + self.decode_round_per_request_s * batch
                + self.decode_round_per_kv_token_s * context_tokens
                + (self.decode_round_split_s if split else 0.0))

    def decode_extra_s(self, batch: int) -> float:
        """Beyond the bytes: a captured step's fixed costs, which its batch's rows move."""
        if not self.decode_step_extra or batch < 1:
            return 0.0
        batches, extra = zip(*sorted(self.decode_step_extra))
        return float(np.interp(batch, batches, extra))


# --- times ---------------------------------------------------------------------------------

def decode_step_s(model: ModelSpec, rate: DecodeRate, context_tokens: int, sms: int,
                  corun: bool, batch: int = 0, requests: int | None = None) -> float:
    """A captured decode step of `batch` requests holding `context_tokens` of KV (batch 0:
    its bytes alone, as a mixed step's decode rows read them; `requests`: how many of the
    batch's rows hold that KV, where the captured size pads it), its KV read at its requests'
    context (`DecodeRate.context_extra_s`). Never faster than its bytes at the rate's best
    (its rate past every SM count, at its context): a batch term measured with a larger
    model, read for a smaller one, would otherwise price a step below zero."""
    nbytes = decode_step_bytes(model, context_tokens)
    holding = requests if requests is not None else batch

    def bytes_s(at: int, beside: bool) -> float:  # its bytes, its KV read at its context
        return (nbytes / (rate.tbps(at, beside) * 1e12)
                + _kv_context_s(model, rate, at, beside, context_tokens, holding))
    return max(bytes_s(sms, corun) + rate.batch_extra_s(sms, corun, batch),
               bytes_s(MAX_SMS, False))


def _kv_context_s(model: ModelSpec, rate: DecodeRate, sms: int, corun: bool,
                  context_tokens: int, rows: int) -> float:
    """What `rows` requests' KV (`context_tokens` in all) costs beyond its bytes at their
    context (`DecodeRate.context_extra_s`; none without rows)."""
    return (rate.context_extra_s(sms, corun, context_tokens / rows,
                                 kv_bytes(model, context_tokens)) if rows else 0.0)


def padded_batch(n: int) -> int:
    """The captured batch size that serves n requests: 1, 2, 4, 8, then multiples of 8 (the
    executor captures a decode graph per size, as SGLang does; the padding rows hold no KV).
    No request (a mixed step's decode rows, read as bytes alone) stays 0."""
    if n < 1:
        return n
    return 1 << (n - 1).bit_length() if n <= 8 else -(-n // 8) * 8


def captured_decode_step_s(model: ModelSpec, rate: DecodeRate, context_tokens: int, sms: int,
                           corun: bool, batch: int) -> float:
    """`decode_step_s` of `batch` requests as the graph captured for them runs it: the batch's
    own KV bytes, the rows' term of the captured size (a step of 33 requests runs the graph of
    40, whose GEMMs pad to 64 rows)."""
    return decode_step_s(model, rate, context_tokens, sms, corun, padded_batch(batch), batch)


def served_decode_step_s(model: ModelSpec, rate: DecodeRate, overheads: Overheads,
                         context_tokens: int, sms: int, corun: bool, batch: int,
                         comm=None) -> float:
    """A decode step as this tool's executor serves it: `captured_decode_step_s`, what a
    captured step costs beyond it (`Overheads.decode_extra_s`) and, on a tensor-parallel rank
    (`model` its shard), its collectives (`comm`, a `parallel.TensorParallel`), each of the
    captured size's rows."""
    rows = padded_batch(batch)
    return (captured_decode_step_s(model, rate, context_tokens, sms, corun, batch)
            + overheads.decode_extra_s(rows) + (comm.decode_s(rows) if comm else 0.0))


def compute_s(flops: float, rate: PrefillRate, sms: int, corun: bool = True) -> float:
    return flops / rate.flops_per_s(sms, corun)


def layer_pipeline_s(gpu_s: float, layers: int, first_launch_s: float,
                     launch_s: float | None = None) -> float:
    """Eager layers from the first launch to the last layer's end, the host launching layer i
    while the GPU runs an earlier one (`gpu_s` over all layers, run evenly): the first layer
    runs once launched (`first_launch_s`), then the slower of the host's later launches
    (`launch_s`, None: as the first) and the GPU paces each later layer, and the last layer
    runs after its own launch."""
    layer = gpu_s / layers
    launch = first_launch_s if launch_s is None else launch_s
    # (first + (layers - 1) x the pace + layer, in an order exact where launch is the first's)
    return layers * max(layer, launch) + min(layer, launch) + (first_launch_s - launch)


def mixed_step_s(model: ModelSpec, decode: DecodeRate, prefill: PrefillRate, total_sms: int,
                 decode_context_tokens: int, decode_batch: int, chunk, chunk_prefix,
                 samples_chunk, phases: MixedStepFit | None = None, decode_contexts=None):
    """One chunked-prefill step on the whole GPU: a prompt chunk and the decode batch in one
    forward, bound by its compute or by reading the weights and the batch's KV, whichever is
    slower. With `phases`, the GPU time of the step as the executor runs it (`MixedStepFit`,
    less its fixed cost). `chunk`, `chunk_prefix` and `samples_chunk` may be arrays (every
    chunk at once) except with `phases`. `decode_contexts`: each decode row's context, which
    `phases.decode_rows_in_extend` (a round saved before the rows moved to decode attention)
    puts in the extend kernel's tiles too, a query head's tile a row; None: the batch's
    context shared evenly between its rows."""
    if phases is not None:
        rows = ()
        if phases.decode_rows_in_extend:
            rows = (decode_contexts if decode_contexts is not None
                    else _even_shares(decode_context_tokens, decode_batch))
        return _mixed_by_tiles(model, decode, prefill, total_sms, decode_context_tokens,
                               decode_batch, int(chunk), int(chunk_prefix), bool(samples_chunk),
                               phases.tiles, rows)
    flops = (decode_flops(model, decode_batch) + layer_flops(model, chunk, chunk_prefix)
             + lm_head_flops(model, np.asarray(samples_chunk, dtype=float)))
    compute = compute_s(flops, prefill, total_sms, corun=False)  # the GPU its own
    memory = (decode_step_s(model, decode, decode_context_tokens, total_sms, False)
              if decode_batch else 0.0)
    return np.maximum(compute, memory)


def _even_shares(total: int, n: int) -> list[int]:
    """`total` split into n integers as evenly as it goes (the first ones one larger)."""
    share, extra = divmod(int(total), n) if n else (0, 0)
    return [share + (i < extra) for i in range(n)]


def _mixed_tiled_s(model, prefill, total_sms, decode_batch, chunk, chunk_prefix, tiles,
                   extend_rows, layers) -> float:
    """A mixed step's `layers` by its kernels' tiles (`mixed_layers_s`), the rows' KV read
    and the LM head aside."""
    tokens = chunk + decode_batch
    # the decode rows attend as a decode step (their KV read at the decode rate, apart), the
    # chunk in the extend kernel's tiles (and, in a round saved before, the decode rows too)
    seqs = [(chunk, chunk_prefix)] + [(1, int(c)) for c in extend_rows]
    tiled = tiled_layers_s(model, tokens, seqs, tiles, total_sms, layers)
    if tiled is None:  # the skinny tile's rows: its linears at the prefill's MFU
        tiled = tiled_layers_s(model, tokens, seqs, tiles, total_sms, layers, gemm_s=compute_s(
            2 * model.layer_linear_params * tokens, prefill, total_sms, corun=False))
    return tiled


def rows_kv_read_s(model: ModelSpec, decode: DecodeRate, total_sms: int, context_tokens: int,
                   rows: int, layers: int | None = None) -> float:
    """A mixed step's `rows` decode rows' KV (`context_tokens` in all) over `layers` (all by
    default), read at the decode rate of the whole GPU at their context
    (`DecodeRate.context_extra_s`, as a decode step's): how their attention is priced."""
    read = (kv_bytes(model, context_tokens) / (decode.tbps(total_sms, False) * 1e12)
            + _kv_context_s(model, decode, total_sms, False, context_tokens, rows))
    return read if layers is None else read * layers / model.layers


def mixed_layers_s(model: ModelSpec, decode: DecodeRate, prefill: PrefillRate, total_sms: int,
                   decode_context_tokens: int, decode_batch: int, chunk: int, chunk_prefix: int,
                   tiles: TileTimes, layers: int | None = None) -> float:
    """`layers` (all by default) of a mixed step's forward as `mixed_step_s` prices them by
    the kernels' tiles, without its LM head: each layer's GEMMs over the chunk's and the
    decode rows' tokens, its other kernels, the chunk's extend attention, and the decode
    rows' KV read at the decode rate."""
    return (_mixed_tiled_s(model, prefill, total_sms, decode_batch, chunk, chunk_prefix, tiles,
                           (), layers)
            + rows_kv_read_s(model, decode, total_sms, decode_context_tokens, decode_batch,
                             layers))


def _mixed_by_tiles(model, decode, prefill, total_sms, decode_context_tokens, decode_batch,
                    chunk, chunk_prefix, samples_chunk, tiles, extend_rows) -> float:
    """`mixed_step_s`'s GPU phases by the kernels' tiles (`MixedStepFit`)."""
    layers = _mixed_tiled_s(model, prefill, total_sms, decode_batch, chunk, chunk_prefix, tiles,
                            extend_rows, None)
    rate = decode.tbps(total_sms, False) * 1e12
    sampled = decode_batch + samples_chunk
    head = (max(compute_s(lm_head_flops(model, sampled), prefill, total_sms, corun=False),
                DTYPE_BYTES * model.vocab * model.hidden / rate) if sampled else 0.0)
    return layers + head + rows_kv_read_s(model, decode, total_sms, decode_context_tokens,
                                          decode_batch)
