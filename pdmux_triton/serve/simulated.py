"""A simulated executor: the scheduler's loop on a clock driven by the cost model (`step_cost`).

Two timelines, one per side, as two CUDA streams would be, and the host's clock. A decode step
costs its bytes over the rate its SMs reach (the S_SAT law, or a calibration's measured curve,
alone or beside a prefill that is in flight as the step starts); a prefill costs its FLOPs over
the prefill rate on its share of the SMs. The host spends its share on each decode round and
each eager layer it launches, and mixed steps as the executor runs them (`step_cost.Overheads`,
none by default): an eager step ends no earlier than its launches, and while the host
launches, nothing else is launched. On one rank of a tensor-parallel server (`model` its shard,
`parallel.shard`) every forward also spends its collectives (`comm`) on the link.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field, replace

import numpy as np

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.parallel import TensorParallel
from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.partition import for_level
from pdmux_triton.serve.executor import Activity
from pdmux_triton.spec.gpus import GPUSpec
from pdmux_triton.spec.models import ModelSpec
from pdmux_triton.spec.traffic import Request


# how far back a split prefill's own launches set the clocks it runs at: bench/
# sustained_corun.py's series slow within ~0.1 s of running on, and a burst after 1 s of idle
# runs at the full clock
SUSTAINED_WINDOW_S = 0.5


def busy_curve(points: tuple[tuple[float, float], ...]) -> tuple[list[float], list[float]]:
    """Measured (busy share, fraction of the way to the sustained rate) points between (0, 0)
    and (1, 1), as `np.interp` reads them."""
    return [0.0, *(s for s, _ in points), 1.0], [0.0, *(f for _, f in points), 1.0]


@dataclass
class SimPrefill:
    """A prefill batch's carry: its requests, when its last launched layer ends, and its
    part-empty GEMM waves' slowdown at each split level it ran at (`wave_slowdown`)."""

    reqs: list[Request]
    ends_at: float = 0.0
    slowdown: dict[int, float] = field(default_factory=dict)


class SimExecutor:
    def __init__(self, gpu: GPUSpec, model: ModelSpec, decode: step_cost.DecodeRate,
                 prefill: step_cost.PrefillRate, kind: str = "grid_cap",
                 overheads: step_cost.Overheads = step_cost.Overheads(),
                 comm: TensorParallel | None = None, kv_arrives: bool = False,
                 prefill_speed: float = 1.0):
        if isinstance(prefill_speed, bool) or not (
                isinstance(prefill_speed, (int, float)) and 0.5 <= prefill_speed <= 2):
            raise PdmuxError(f"prefill_speed must be a number in [0.5, 2] (a card's clocks "
                             f"against the costs' card), got {prefill_speed!r}")
        overheads = overheads.for_kind(kind)  # its split levels' served ratios, where fitted
        if overheads.whole_gpu_prefill_mfu is not None:  # as served, where it was fitted
            prefill = prefill.on_whole_gpu(overheads.whole_gpu_prefill_mfu)
        self.model, self.decode_rate, self.prefill_rate, self.kind = model, decode, prefill, kind
        # the rate a split prefill keeps once it has run on beside decode (clocks under
        # sustained power); the comparison's burst rate after an idle spell
        self.sustained_rate = prefill.sustained(overheads.split_prefill_sustained)
        # how far toward it by the share of the recent past it ran: (0, 0), as measured, (1, 1)
        self.slowdown_curve = busy_curve(overheads.split_prefill_slowdown)
        # the decode step beside it as served over its co-run price, by the same busy share
        # (held at the ends; none given: the price as it is)
        self.decode_by_busy = tuple(zip(*sorted(overheads.split_decode_by_busy))) or None
        # a whole-GPU prefill's served span over its price by the prefills' busy share over
        # the window that ends with it (held at the ends; none given: the price as it is)
        self.whole_by_busy = tuple(zip(*sorted(overheads.whole_gpu_prefill_by_busy))) or None
        # the prefills' spans are kept where any term reads their busy share
        self.tracks_busy = bool(overheads.split_prefill_sustained or self.decode_by_busy
                                or self.whole_by_busy)
        self.overheads = overheads
        # how fast this card runs compute-bound work (prefills, mixed steps) against the card
        # the costs were fitted to: their GPU times are divided by it; decode steps (bound by
        # memory, not clocks) and the link's are not. Cards of one model run prefill a few
        # percent apart (bench/NOTES.md)
        self.prefill_speed = prefill_speed
        self.comm = comm or TensorParallel.of(model, 1)  # one GPU: no collectives
        if self.comm.tp > 1:  # (a rank's layers reduce between their launches: none replayed)
            self.overheads = replace(self.overheads, later_layer_s=None)
        # a disaggregated decode server: a request's KV comes over the link (`router`), so its
        # prefill computes nothing here
        self.kv_arrives = kv_arrives
        self.total_sms, self.cc_major, self.num_layers = gpu.sms, gpu.cc_major, model.layers
        self.kv_capacity_tokens = step_cost.kv_capacity_tokens(gpu, model)
        self.kv_page_tokens = step_cost.KV_PAGE_TOKENS  # as the GPU executor's
        # (a run saved before today's chunked steps is replayed as it ran)
        self.chunked_steps = overheads.chunked_steps
        self._reset()

    def _reset(self) -> None:
        """The clock at 0, both sides idle on the whole GPU, nothing launched."""
        self.t = 0.0
        self.free = {"decode": 0.0, "prefill": 0.0}
        self.sms = {"decode": self.total_sms, "prefill": self.total_sms}
        self.busy = array("d")  # start, end of every launch, flat
        self.prefill_spans: list[tuple[float, float]] = []  # the prefill side's recent launches
        self.decode_steps = array("d")
        self.drains = array("d")
        self.decode_ends = 0.0  # when the last decode step waited for ends
        self.launched_decode = None  # a step launched, not yet waited for: (KV, batch, start)

    # --- timelines -------------------------------------------------------------------
    def _enqueue(self, side: str, seconds: float, at: float | None = None) -> float:
        start = max(self.t if at is None else at, self.free[side])
        end = self.free[side] = start + seconds
        self.busy.append(start)
        self.busy.append(end)
        return end

    def _drain(self) -> None:
        self.t = max(self.t, *self.free.values())

    def now(self) -> float:
        return self.t

    def start(self, warm: list[Request]) -> None:
        self._reset()  # an executor serves run after run, each on its own clock
        for r in warm:  # already decoding: the prompt is in the cache, the first token out
            r.context = r.prompt_len

    def set_level(self, level: sglang_rules.Level) -> None:
        self.drains.append(max(0.0, max(self.free.values()) - self.t))
        self._drain()
        spec = for_level(level, self.kind, self.total_sms)
        self.sms = {"decode": spec.decode_sms, "prefill": spec.prefill_sms}

    def idle_until(self, t: float) -> None:
        self.t = max(self.t, t)

    # --- decode ----------------------------------------------------------------------
    def launch_decode(self, reqs: list[Request]):
        # priced when waited for: the round's prefill layers are launched in between, and
        # decode co-runs when the prefill side is busy as the step starts
        held = sum(r.context for r in reqs)
        self.t += self.overheads.decode_round_host_s(len(reqs), held, self._split())
        self.launched_decode = (held, len(reqs), max(self.t, self.free["decode"]))
        return list(reqs), self.t

    def decode_price_s(self, context_tokens: int, decode_sms: int, corun: bool, batch: int,
                       busy: float | None) -> float:
        """A decode step as this executor prices it (its collectives aside): the served step
        at its SMs, beside a split prefill or not, and beside one, the served ratio at the
        prefill's busy share (`busy`; None: without it)."""
        step = step_cost.served_decode_step_s(self.model, self.decode_rate, self.overheads,
                                              context_tokens, decode_sms, corun, batch)
        if corun and busy is not None and self.decode_by_busy:
            step *= float(np.interp(busy, *self.decode_by_busy))
        return step

    def wait_decode(self, pending):
        reqs, launched = pending
        start = max(launched, self.free["decode"])
        corun = self.free["prefill"] > start
        busy = self._prefill_busy(start) if corun and self.decode_by_busy else None
        step = self.decode_price_s(sum(r.context for r in reqs), self.sms["decode"], corun,
                                   len(reqs), busy)
        step += self.comm.decode_s(step_cost.padded_batch(len(reqs)))  # the link keeps its pace
        self.decode_steps.append(step)
        self.launched_decode = None
        self.decode_ends = self._enqueue("decode", step, launched)
        self.t = max(self.t, self.decode_ends)
        return self.t, None

    # --- prefill ---------------------------------------------------------------------
    def begin_prefill(self, reqs: list[Request]) -> SimPrefill:
        # the batch made and uploaded; on the whole GPU (prefill-first) the host then blocks on
        # it, so its eager step holds the tokens' read-back too, which a split batch's wait for
        # decode hides
        self.t += (self.overheads.split_prefill_batch_s() if self._split()
                   else self.overheads.eager_step_s)
        return SimPrefill(list(reqs))

    def _launch_layers(self, layers: int) -> tuple[float, float]:
        """The host launches `layers` eager layers: when it began, and when it is done."""
        began = self.t
        self.t += self.overheads.launch_layers_s(layers)
        return began, self.t

    def launch_prefill(self, carry: SimPrefill, start: int, end: int) -> None:
        if self.kv_arrives:
            carry.ends_at = self.t
            return
        # each prompt's tokens past its cached prefix, attending over the whole prompt
        seqs = [(r.prompt_len - r.cached_len, r.cached_len) for r in carry.reqs]
        samples = end == self.num_layers  # the LM head samples each prompt's first token
        talk = self.comm.layers_s(sum(n for n, _ in seqs), end - start)
        if samples:
            talk += self.comm.logits_s(len(carry.reqs))
        began, launched = self._launch_layers(end - start)
        # on a split, decode steps run beside it; on the whole GPU, nothing does
        beside_decode = self._split()
        if beside_decode:
            sms = self.sms["prefill"]
            if sms not in carry.slowdown:  # the batch's, at this level: not at every launch
                carry.slowdown[sms] = self.wave_slowdown(seqs, sms)
            seconds = self._split_prefill_s(
                self._flops(seqs, end - start, samples) * carry.slowdown[sms], began, launched)
            # (and its kernels' ramps and tails on the level's SMs, a layer at a time)
            seconds += (end - start) * self.overheads.split_prefill_layer_s / self.prefill_speed
        else:
            seconds = self.whole_gpu_prefill_s(seqs, end - start, samples)
            if self.whole_by_busy:
                at = max(began, self.free["prefill"])
                busy = self._prefill_busy(at + seconds, (at, at + seconds))
                seconds *= float(np.interp(busy, *self.whole_by_busy))
        seconds += talk
        ran_until = self._enqueue("prefill", seconds, began)
        if self.tracks_busy:
            # every later look is at or after the host's clock, less at most the round's own
            # launches for a decode step launched before this prefill: a window's margin
            self.prefill_spans = [(a, b) for a, b in self.prefill_spans
                                  if b > self.t - 2 * SUSTAINED_WINDOW_S]
            self.prefill_spans.append((ran_until - seconds, ran_until))
        # the last layer runs after its launch: a prefill bound by its launches ends later
        carry.ends_at = max(ran_until, launched + seconds / (end - start))
        self.free["prefill"] = carry.ends_at

    def _split_prefill_s(self, flops: float, began: float, launched: float) -> float:
        """A split prefill's GPU time: at its co-run rate while a decode step runs beside it
        (slowed toward its sustained rate as the GPU stays busy), at its rate alone while the
        decode side waits for the host to launch these layers (from the end of the round's
        decode step to the launches' end: the next step cannot be launched before). Decode
        is taken to run beside it after that, though the next round's host share keeps it
        idle a little longer, and the part alone keeps the burst's rate: both err slow."""
        sms = self.sms["prefill"]
        corun = step_cost.compute_s(flops, self.prefill_rate, sms, True)
        if self.overheads.split_prefill_sustained:
            slow = step_cost.compute_s(flops, self.sustained_rate, sms, True)
            corun += self._slowdown(self._prefill_busy(max(began, self.free["prefill"]))) * (
                slow - corun)
        if corun <= 0:
            return 0.0
        alone = step_cost.compute_s(flops, self.prefill_rate, sms, False)
        start = max(began, self.free["prefill"])
        decode_ends = self._decode_ends()
        beside = min(corun, max(0.0, decode_ends - start))  # the round's step still runs
        idle = max(0.0, launched - max(start, decode_ends))
        left = 1.0 - beside / corun  # the share of the work still to do
        if left * alone <= idle:
            return beside + left * alone
        return beside + idle + (left - idle / alone) * corun

    def wave_slowdown(self, seqs, prefill_sms: int) -> float:
        """How much slower per FLOP than the prompt its MFU was timed on a split prefill batch
        (`seqs`: (new, cached) tokens each) runs on `prefill_sms` (`step_cost.wave_slowdown`):
        1 without tile times or that prompt."""
        tiles = self.overheads.mixed.tiles if self.overheads.mixed else None
        timed = self.prefill_rate.timed_tokens
        if tiles is None or timed is None:
            return 1.0
        return step_cost.wave_slowdown(self.model, seqs, tiles, prefill_sms, timed)

    def _split(self) -> bool:
        """Whether the level splits the GPU: a prefill then runs beside decode."""
        return self.sms["prefill"] < self.total_sms

    def _decode_ends(self) -> float:
        """When the round's decode step ends: a step launched and not yet waited for is
        expected as priced at its level now (beside a prefill where the level splits the GPU),
        priced only here, where a split prefill needs it."""
        if self.launched_decode is None:
            return self.decode_ends
        held, batch, start = self.launched_decode
        return start + self.decode_price_s(held, self.sms["decode"], self._split(), batch, None) + \
            self.comm.decode_s(step_cost.padded_batch(batch))

    def _flops(self, seqs, layers: int, samples: bool) -> float:
        """A prefill batch's FLOPs over `layers` layers (`seqs`: each prompt's (new, cached)
        tokens), with its LM head where it `samples`, over this card's prefill speed: what its
        price at the costs' rates stretches or shrinks by."""
        return step_cost.batch_flops(self.model, seqs, layers, samples) / self.prefill_speed

    def whole_gpu_prefill_s(self, seqs, layers: int, samples: bool) -> float:
        """A prefill batch's GPU time with the whole GPU to itself (`_flops`' arguments): at
        the whole GPU's MFU, or by its kernels' tiles where the host costs hold them
        (`step_cost.tiled_layers_s`), whichever is longer. The one MFU misses short prompts'
        partial waves, the tiles long prompts' attention: a batch takes at least each."""
        seconds = step_cost.compute_s(self._flops(seqs, layers, samples), self.prefill_rate,
                                      self.total_sms, False)
        tiles = self.overheads.mixed.tiles if self.overheads.mixed else None
        if tiles is None:
            return seconds
        tiled = step_cost.tiled_layers_s(self.model, sum(n for n, _ in seqs), seqs, tiles,
                                         self.total_sms, layers)
        return max(seconds, (tiled or 0.0) / self.prefill_speed)  # None: the skinny tile's

    def _prefill_busy(self, at: float, also: tuple[float, float] | None = None) -> float:
        """The share of the `SUSTAINED_WINDOW_S` before `at` that prefills ran (their spans,
        and `also` where given): how far the GPU's clocks have come down from an idle
        spell's."""
        since = at - SUSTAINED_WINDOW_S
        spans = [*self.prefill_spans, also] if also else self.prefill_spans
        ran = sum(min(b, at) - max(a, since) for a, b in spans if a < at and b > since)
        return min(1.0, max(0.0, ran / SUSTAINED_WINDOW_S))

    def _slowdown(self, busy: float) -> float:
        """How far from its burst toward its sustained rate a split prefill that ran `busy` of
        the recent past has slowed: as measured at some shares (the clocks hold while it idles
        often enough), else in proportion."""
        return float(np.interp(busy, *self.slowdown_curve))

    def prefill_result(self, carry: SimPrefill, wait: bool):
        # the host sees a finished prefill when it next looks, after the decode it waited for
        if wait:
            self.t = max(self.t, carry.ends_at)
        return (self.t, None) if carry.ends_at <= self.t else None

    def mixed(self, decoding: list[Request], prompt: Request, start: int, n: int):
        self._drain()
        last = start + n == prompt.prompt_len
        fit = self.overheads.mixed
        step = float(step_cost.mixed_step_s(self.model, self.decode_rate, self.prefill_rate,
                                            self.total_sms, sum(r.context for r in decoding),
                                            len(decoding), n, start, samples_chunk=last,
                                            phases=fit,
                                            decode_contexts=[r.context for r in decoding]))
        step /= self.prefill_speed
        step += (self.comm.layers_s(len(decoding) + n, self.num_layers)
                 + self.comm.logits_s(len(decoding) + last))
        # the batch made and uploaded, its tokens read back (as fitted, or an eager step's),
        # then the layers as the host launches them and the GPU runs them
        self.t += fit.fixed_s if fit is not None else self.overheads.eager_step_s
        self.t += step_cost.layer_pipeline_s(step, self.num_layers, self.overheads.layer_launch_s,
                                             self.overheads.later_layer_s)
        self._enqueue("decode", step, self.t - step)  # its last layer ends the round
        return self.t, None, None

    def release(self, r: Request) -> None:
        pass

    def keep_prefix(self, r: Request, start: int, end: int) -> None:
        return None  # no pages: the cache's bookkeeping is the loop's

    def drop_prefix(self, handle: None) -> None:
        pass

    def finish(self) -> Activity:
        self._drain()
        # handed over, not copied (a long run launches millions of times)
        busy, steps, drains = self.busy, self.decode_steps, self.drains
        self.busy, self.decode_steps, self.drains = array("d"), array("d"), array("d")
        return Activity(np.frombuffer(busy).reshape(-1, 2), (0.0, self.t),
                        np.frombuffer(steps), np.frombuffer(drains))
