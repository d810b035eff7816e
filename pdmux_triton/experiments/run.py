"""`pdmux-triton run`: one workload served by every strategy, measured or simulated.

Each strategy gets a fresh copy of the same requests (same seed) and a fresh executor. A
measured run is trusted only if nothing compiled, was captured or allocated inside it and every
request got its whole output: each row says so (`compiles_during_measurement`, ...,
`requests_lost`), and `warnings` lists any that did not hold.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pdmux_triton.cost import parallel, step_cost
from pdmux_triton.cost.measured_inputs import load_calibration, load_compare, load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments import estimate, repeats
from pdmux_triton.experiments.settings import RunSettings, make_requests
from pdmux_triton.experiments.variants import Variant, variants
from pdmux_triton.multiplex.level_policy import SGLangLevels, SloLevels
from pdmux_triton.results import provenance
from pdmux_triton.serve import metrics, router, scheduler
from pdmux_triton.serve.executor import RunResult
from pdmux_triton.serve.prefix_cache import BLOCK_TOKENS
from pdmux_triton.serve.simulated import SimExecutor
from pdmux_triton.spec.traffic import Request

# what a measured row must show as zero to be trusted
GUARDS = ("compiles_during_measurement", "captures_during_measurement",
          "device_allocations_during_measurement", "requests_lost")
# counts added up over a point's repeats: the guards, and where the allocations are held, what
# the allocator gave back and retried (why allocations came)
SUMMED = (*GUARDS, "device_allocations_by_stream", "device_segments_freed_during_measurement",
          "device_alloc_retries_during_measurement")


def chapter_estimates(s: RunSettings) -> list[tuple[str, estimate.Scenario, list[estimate.Row]]]:
    """The chapter's estimate of the same scenario and, given a calibration, the calibrated one."""
    sc = estimate.Scenario(gpu=s.gpu, model=s.model, decode_batch=s.batch, context=s.context,
                           prompt=s.prompt, chunk_sizes=s.chunks, s_sat=(s.s_sat,),
                           bw_efficiency=s.bw_eff, mfu=s.mfu, pdmux=s.config)
    out = [("the chapter's estimate", sc)]
    if s.calibration:
        cal = load_calibration(s.calibration, s.gpu.name)
        cmp = load_compare(s.compare, s.gpu.name) if s.compare else None
        title = ("the estimate with calibrated bandwidth, S_SAT and prefill rate" if cmp else
                 "the estimate with calibrated bandwidth and S_SAT")
        out.append((title, estimate.calibrated(sc, cal, s.kinds[0], cmp)))
    return [(title, scenario, estimate.estimate(scenario)) for title, scenario in out]


def host_overheads(s: RunSettings) -> step_cost.Overheads:
    """The host costs a simulation of `s` prices with: its --host-costs file's, else none."""
    return load_host_costs(s.host_costs, s.gpu.name) if s.host_costs else step_cost.Overheads()


class Servers:
    """The executors of one run: simulated, or real ones over one model on the GPU."""

    def __init__(self, s: RunSettings, requests: list[Request], log=None,
                 overheads: step_cost.Overheads | None = None, prefill_speed: float = 1.0,
                 served: dict[str, int] | None = None):
        """`overheads`: the host costs a simulation prices with, instead of the settings';
        `prefill_speed`: how fast the simulated card runs prefills against the one its costs
        were fitted to (`SimExecutor`); `served`: the generation of chunked steps each
        strategy of a saved run was served with (`metrics.chunked_steps_of`), which a
        simulation replays as it ran (others: today's)."""
        self.s = s
        self.served = served or {}
        self.log = log  # where a long run's progress lines go (none: silent)
        self.gpu = None
        self.warm: set[str] = set()  # variants served once untimed (GPU)
        self.overheads = overheads or host_overheads(s)
        self.prefill_speed = prefill_speed
        if s.simulate:
            self.cal = load_calibration(s.calibration, s.gpu.name) if s.calibration else None
            self.cmp = load_compare(s.compare, s.gpu.name) if s.compare else None
        else:
            from pdmux_triton.gpu.executors import GpuExecutors  # torch: only where a GPU measures

            self.gpu = GpuExecutors(s.gpu, s.model, requests, s.config, s.levels,
                                    s.prefill_tokens, s.max_running, s.checkpoint)

    def executor(self, v: Variant, kv_arrives: bool = False):
        """`kv_arrives`: a disaggregated decode server's (its prompts' KV comes over the link)."""
        if self.gpu is not None:
            if v.loop == "disagg":
                raise PdmuxError(f"{v.name} needs {v.prefill_servers + v.decode_servers} GPUs; "
                                 f"this tool measures one: simulate it")
            return self.gpu.executor(v.loop, v.kind, v.chunk, self.level_policy(v))
        s, kind = self.s, (v.kind if v.loop == "pdmux" else "grid_cap")
        decode = (self.cal.decode_curve(kind) if self.cal else
                  step_cost.SaturationLaw(s.gpu.hbm_tbps * s.bw_eff, min(s.s_sat, s.gpu.sms)))
        prefill = (self.cmp.prefill_rate(kind, s.gpu.bf16_tflops, s.gpu.sms) if self.cmp else
                   step_cost.PrefillRate.fixed(s.gpu.bf16_tflops, s.gpu.sms, s.mfu))
        overheads = (self.overheads.served_on(self.served[v.name]) if v.name in self.served
                     else self.overheads)
        return SimExecutor(s.gpu, s.rank_model, parallel.rank_rate(decode, s.tp), prefill, kind,
                           overheads, s.comm, kv_arrives, self.prefill_speed)

    @contextmanager
    def watch(self, x) -> Iterator[dict]:
        if self.gpu is None:
            yield {}
            return
        with self.gpu.watch(x) as counts:
            yield counts

    def level_policy(self, v: Variant):
        s = self.s
        if v.levels == "sglang":
            return SGLangLevels(s.config)
        curve = parallel.rank_rate(load_calibration(s.calibration, s.gpu.name)
                                   .decode_curve(v.kind), s.tp)
        return SloLevels(s.rank_model, curve, s.itl_target_ms, s.hysteresis,
                         s.relevel_at_layers, self.overheads, s.comm)

    def serve(self, v: Variant, requests: list[Request]) -> tuple[dict, RunResult]:
        """One variant over a copy of `requests`, `s.repeats` times: its summary row (medians
        and spread over the repeats, `repeats.combined`) and its first run. On the GPU the
        variant's first `s.warm_requests` requests are served once untimed before: the
        allocator then holds memory for the batches this traffic forms (the warm-up compiled
        and captured the rest). A prefix, so a long stream is not served twice; what the
        measured run still allocates is counted in its row."""
        s = self.s
        if v.loop == "disagg" or s.replicas > 1:  # simulated: several servers
            return self._serve_behind_router(v, requests)
        if self.gpu is not None:  # the prompts' ids drawn now, not between timed launches
            for r in requests:  # (every variant's copy shares them)
                r.prompt
        x = self.executor(v)
        if self.gpu is not None and v.name not in self.warm and s.warm_requests:
            self._run(v, v.loop, x, requests[:s.warm_requests])
            self.warm.add(v.name)
        rows, first = [], None
        for _ in range(s.repeats):  # the same requests each time, on the same executor
            with self.watch(x) as counts:
                result = self._run(v, v.loop, x, requests)
            rows.append({**metrics.summarize(result, s.slo), **counts, "strategy": v.name})
            first = first or result
            del result  # one repeat's run held at a time, besides the first
        return repeats.combined(rows, summed=SUMMED), first

    def _run(self, v: Variant, loop: str, x, requests: list[Request],
             computes_prefill: bool = True) -> RunResult:
        """One server's loop over a copy of `requests` (they serve every variant); one that
        does not compute prefills (a disaggregated decode server) has no prefix cache."""
        s = self.s
        cached = s.prefix_cache == "on" and computes_prefill
        return scheduler.run(loop, x, copy.deepcopy(requests), chunk=v.chunk,
                             config=s.config, levels=s.levels, prefill_tokens=s.prefill_tokens,
                             max_running=s.max_running, levels_by=self.level_policy(v),
                             progress=self.log, prefix_block=BLOCK_TOKENS if cached else None)

    def _serve_behind_router(self, v: Variant, requests: list[Request]):
        s = self.s

        def on_new_server(strategy: str, kv_arrives: bool = False):
            return lambda part: self._run(v, strategy, self.executor(v, kv_arrives), part,
                                          computes_prefill=not kv_arrives)
        if v.loop == "disagg":  # prefill servers and decode servers take the whole GPU each
            result = router.serve_disaggregated(
                v.name, on_new_server("prefill_first"), on_new_server("prefill_first", True),
                requests, v.prefill_servers, v.decode_servers,
                s.rank_model.kv_bytes_per_token(step_cost.DTYPE_BYTES), s.model.layers, s.link_spec())
        else:
            result = router.serve_replicas(v.name, on_new_server(v.loop), requests,
                                           s.replicas)
        return {**metrics.summarize(result, s.slo), "strategy": v.name}, result

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()


def warnings(rows: list[dict]) -> list[str]:
    """What makes a row untrustworthy, one line each (device allocations with the streams
    still holding them)."""
    return [f"{r['strategy']}: {key.replace('_', ' ')} {r[key]}"
            + (_by_stream(r["device_allocations_by_stream"])
               if key == "device_allocations_during_measurement"
               and r.get("device_allocations_by_stream") else "")
            for r in rows for key in GUARDS if r.get(key)]


def _by_stream(held: dict[str, dict]) -> str:
    return " (held at its end: " + "; ".join(
        f"{name} {v['segments']} segment{'s' * (v['segments'] != 1)}, {v['mib']:.0f} MiB"
        for name, v in held.items()) + ")"


def run_experiment(s: RunSettings, log=print, keep_runs: bool = True,
                   saved: Callable[[dict], None] | None = None,
                   served: dict[str, int] | None = None
                   ) -> tuple[dict, dict[str, RunResult], list[tuple]]:
    """Serve the settings' workload with every strategy; returns the result JSON, each
    strategy's run (none without `keep_runs`: a long trace's runs are dropped as each ends,
    so memory holds one) and the estimates of the scenario (chapter workload only).
    decode_only serves the requests that decode from the start without the arriving prompt:
    the ITL baseline. `saved`, if given, is called with the result so far before each
    strategy (its `unserved` names the strategies not yet served), so a measured run cut short
    keeps the strategies it finished and no older file passes for its result. `served`: a
    saved run's generations of chunked steps, simulated as they ran (`Servers`)."""
    requests = make_requests(s)
    # the chapter's estimate is of one GPU: none beside a run on several
    one_gpu = s.tp == 1 and s.replicas == 1
    estimates = chapter_estimates(s) if s.workload == "chapter" and one_gpu else []
    prefill_sms = s.levels[s.config.choose_level(s.levels, s.batch, True)][0]
    # what every save of the result holds alike (provenance hashes the sources: once a run)
    head = {"mode": "simulated" if s.simulate else "gpu", **provenance(s.gpu.name),
            "model": s.model.name, "tp": s.tp, "replicas": s.replicas, "workload": s.workload,
            "inputs": s.as_dict()}
    if estimates:
        head["estimate"] = {title: [r.as_dict() for r in est] for title, _, est in estimates}
    # errors against the last estimate: the calibrated one when a calibration is given
    estimate = head["estimate"][estimates[-1][0]] if estimates else None

    def result(unserved: list[str] | None = None) -> dict:
        """The result JSON of the strategies served so far; `unserved`: those still to serve."""
        out = {**head, "rows": list(rows), "warnings": warnings(rows), "details": dict(details),
               "summary": summary(rows, s.gpu.sms, prefill_sms, estimate)}
        if unserved:
            out["unserved"] = unserved
            out["warnings"].append(f"not served (the run ended before them): "
                                   f"{', '.join(unserved)}")
        return out

    todo = [(v, [r for r in requests if r.warm] if v.name == "decode_only" else requests)
            for v in variants(s.chunks, s.kinds, s.level_policies)]
    todo = [(v, reqs) for v, reqs in todo if reqs]
    servers = Servers(s, requests, log, served=served)
    rows, results, details = [], {}, {}
    try:
        for i, (v, reqs) in enumerate(todo):
            if saved is not None:
                saved(result(unserved=[w.name for w, _ in todo[i:]]))
            log(f"running {v.name} ...")
            row, run_result = servers.serve(v, reqs)
            rows.append(row)
            details[v.name] = metrics.details(run_result)
            if keep_runs:
                results[v.name] = run_result
            del run_result  # else alive while the next strategy serves: two runs at the peak
    finally:
        servers.close()
    return result(), results, estimates


SUMMARY_KEYS = ("itl_p50_ms", "itl_p99_ms", "itl_during_prefill_p50_ms", "decode_gpu_p50_ms",
                "host_layer_p50_ms",
                "prefill_ms", "tokens_during_prefill", "ttft_p50_ms", "tpot_p50_ms",
                "e2e_p50_ms", "slo_attainment", "goodput_rps", "slo_met_throughput_rps",
                "gpu_idle_frac", "level_changes",
                "level_drain_ms", "prefix_hit_rate", *GUARDS)


def summary(rows: list[dict], total_sms: int, prefill_sms: int | None,
            estimate_rows: list[dict] | None = None) -> dict:
    """The run's summary: every strategy's headline figures, the targets' ratios and, when an
    estimate of the same scenario is given, its error against the measurement in percent."""
    out = {"strategies": {r["strategy"]: {k: r.get(k) for k in SUMMARY_KEYS} for r in rows},
           "targets": targets(rows, total_sms, prefill_sms)}
    if estimate_rows:
        est = next((e for e in estimate_rows if e["approach"].startswith("pdmux")), None)
        errors = {}
        for name, r in out["strategies"].items():
            if name.startswith("pdmux") and est and r["itl_during_prefill_p50_ms"]:
                errors[name] = {
                    "itl": (est["itl_ms"] - r["itl_during_prefill_p50_ms"])
                    / r["itl_during_prefill_p50_ms"] * 100,
                    "prefill": (est["prefill_ms"] - r["prefill_ms"]) / r["prefill_ms"] * 100}
        out["estimate_error_pct"] = errors
    return out


def targets(rows: list[dict], total_sms: int, prefill_sms: int | None) -> dict:
    """The chapter's ratios: pd-mux ITL during prefill vs decode-only and vs chunked-512, and
    pd-mux prefill time vs prefill-first scaled by the SM share."""
    by = {r["strategy"]: r for r in rows}
    out = {}
    base = by.get("decode_only", {}).get("itl_p50_ms")
    pf = by.get("prefill_first", {}).get("prefill_ms")
    c512 = by.get("chunked_512", {}).get("itl_during_prefill_p50_ms")
    for name, r in by.items():
        if not name.startswith("pdmux"):
            continue
        itl = r.get("itl_during_prefill_p50_ms")
        out[name] = {
            "itl_during_prefill_vs_decode_only": itl / base if itl and base else None,
            "itl_during_prefill_vs_chunked_512": itl / c512 if itl and c512 else None,
            "prefill_vs_prefill_first_scaled": (r["prefill_ms"] / (pf * total_sms / prefill_sms)
                                                if r.get("prefill_ms") and pf and prefill_sms
                                                else None),
        }
    return out
