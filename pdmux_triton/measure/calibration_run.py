"""S_SAT calibration on the GPU: measure every point of a sweep plan not yet in the store, each
workload on its SM budget (grid cap or green context), alone and beside a prefill on the
other SMs. Points are saved as they are measured (`results.PointStore`), each with the SM
clock NVML saw while it was timed (a sweep keeps the GPU busy: its clocks are not an idle
GPU's, and a served step is priced against them)."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from pdmux_triton.gpu.streams import PartitionStreams
from pdmux_triton.measure.calibration_sweep import STATES, PointKey, SweepPlan
from pdmux_triton.measure.clocks import Clocks
from pdmux_triton.measure.timing import time_alone, time_corun
from pdmux_triton.measure.workloads import PrefillLayers, make_decode_workload
from pdmux_triton.multiplex.partition import for_level
from pdmux_triton.results import PointStore
from pdmux_triton.spec.models import resolve_model


def run_sweep(plan: SweepPlan, store: PointStore, log=print) -> None:
    """Measure every point of the plan not already in the store, one decode batch (and
    context) at a time: each one's workloads hold their own weights and KV cache, and several
    large ones together need more memory than the GPU has."""
    todo = [k for k in plan.keys() if not store.has(k)]
    log(f"calibrate: {len(todo)} points to measure ({len(list(plan.keys())) - len(todo)} already saved)")
    if not todo:
        return
    spec = resolve_model(plan.model)
    prefill = PrefillLayers(spec, plan.prefill_tokens, layers=2) if plan.corun else None
    progress = _Progress(len(todo), log)
    with Clocks() as clocks:
        for batch, context in sorted({(k.batch, k.context) for k in todo}):
            keys = [k for k in todo if (k.batch, k.context) == (batch, context)]
            workloads = {name: make_decode_workload(name, spec, batch or plan.batch,
                                                    context or plan.context)
                         for name in dict.fromkeys(k.workload for k in keys)}  # one of each
            _measure(plan, store, keys, workloads, prefill, progress, clocks)
            del workloads
            torch.cuda.empty_cache()


class _Progress:
    def __init__(self, total: int, log):
        self.total, self.log, self.done, self.started = total, log, 0, time.time()

    def point(self, key: PointKey, point: dict) -> None:
        self.done += 1
        eta = (time.time() - self.started) / self.done * (self.total - self.done)
        at = (f" batch {key.batch}" if key.batch else "") + (
            f" context {key.context}" if key.context else "")
        self.log(f"[{self.done}/{self.total} eta {eta:.0f}s] {key.workload}{at} {key.kind} "
                 f"ctas={key.ctas_per_sm} {key.state} {key.sms} SMs: {point['tbps']:.2f} TB/s")


def _clock(clocks: Clocks, since: float) -> dict:
    """The SM clock's median (MHz) over the samples since `since`, where NVML was read."""
    mhz = clocks.between(since, time.perf_counter())["sm_clock_mhz_median"]
    return {} if mhz is None else {"sm_clock_mhz": mhz}


def _own_context(store: PointStore, key: PointKey) -> dict:
    """For a step at another context, the own context's rate on the same SMs as this run
    measured it (before: `run_sweep` takes the own context first): the step's saving is read
    against it, so its rows pair with their own session's curve wherever they are merged."""
    own = store.get(replace(key, context=0)) if key.context else None
    return {"own_context_tbps": own["tbps"]} if own and "tbps" in own else {}


def _measure(plan: SweepPlan, store: PointStore, todo: list[PointKey], workloads: dict,
             prefill: PrefillLayers | None, progress: _Progress, clocks: Clocks) -> None:
    total = torch.cuda.get_device_properties(0).multi_processor_count
    by_partition: dict[tuple, list[PointKey]] = {}
    for key in todo:
        by_partition.setdefault((key.kind, key.sms), []).append(key)
    # coarse coverage first (every other budget, both kinds), so a cut-short run still has
    # whole curves to fit; the rerun fills in the rest
    order = list(plan.budgets[::2]) + list(plan.budgets[1::2])
    for (kind, sms), keys in sorted(by_partition.items(),
                                    key=lambda item: (order.index(item[0][1]), item[0][0])):
        # decode split off first, so its budget can be any multiple of the granularity
        spec_p = for_level((total - sms, sms), kind, total, split_first="decode")
        # alone points first: a corun point reuses its alone time
        keys.sort(key=lambda k: STATES.index(k.state))
        with PartitionStreams.open(spec_p) as part:
            prefill_alone = None
            pbudget = part.prefill_budget
            for key in keys:
                wl = workloads[key.workload]
                budget = replace(part.decode_budget, ctas_per_sm=key.ctas_per_sm)
                alone_key = replace(key, state="alone")
                if store.has(alone_key):
                    alone = store.get(alone_key)["ms"]
                else:
                    began = time.perf_counter()
                    alone = time_alone(lambda: wl.run(budget), part.decode_stream, graph=True)
                    store.add(alone_key, ms=alone, tbps=wl.rate(alone), realized_sms=part.decode_sms,
                              **_own_context(store, alone_key), **_clock(clocks, began))
                if key.state == "corun":
                    if prefill_alone is None:
                        prefill_alone = time_alone(lambda: prefill.run(pbudget),
                                                   part.prefill_stream, graph=False, repeats=1)
                    began = time.perf_counter()
                    co = time_corun(lambda: wl.run(budget), part.decode_stream, True, alone,
                                    lambda: prefill.run(pbudget), part.prefill_stream, False,
                                    prefill_alone)
                    store.add(key, ms=co.ms, tbps=wl.rate(co.ms), covered=co.covered,
                              alone_tbps=wl.rate(alone), prefill_sms=part.prefill_sms,
                              realized_sms=part.decode_sms, **_own_context(store, key),
                              **_clock(clocks, began))
                progress.point(key, store.get(key))
