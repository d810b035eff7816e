"""`pdmux-triton run`: one workload served by every strategy, measured or simulated.

Each strategy gets a fresh copy of the same requests (same seed) and a fresh executor; the
result rows are what the README's table shows, and what bench/results/run-<gpu>.json keeps,
together with the run's inputs (`RunSettings`), so `run --replay` can serve it again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

from pdmux_triton import cost, estimate, metrics, policy, scheduler, traffic
from pdmux_triton.errors import PdmuxError
from pdmux_triton.hardware import GPUSpec, ModelSpec
from pdmux_triton.partition import SPLIT_KINDS
from pdmux_triton.results import load_calibration, load_compare, provenance
from pdmux_triton.simulate import SimExecutor

WORKLOADS = ("chapter", "poisson")
MAX_CHUNK_STEPS = 65_536  # chunked steps per prompt: a run's work stays bounded
MAX_GPU_RUN_S = 3600  # arrivals of a measured Poisson run must come within this


@dataclass(frozen=True)
class RunSettings:
    """Everything a run depends on; saved in its result as `inputs`."""

    gpu: GPUSpec
    model: ModelSpec
    workload: str = "chapter"
    simulate: bool = False
    seed: int = 0
    # chapter: `batch` requests decoding at `context`, one `prompt`-token prompt arrives
    batch: int = 32
    context: int = 2048
    prompt: int = 8192
    decode_tokens: int = 96
    # poisson: `count` requests at `rate` per second
    rate: float = 2.0
    count: int = 64
    prompt_mean: int = 1024
    prompt_max: int = 8192
    output_mean: int = 128
    output_max: int = 512
    chunks: tuple[int, ...] = (2048, 512)
    kinds: tuple[str, ...] = SPLIT_KINDS
    config: policy.PDMuxConfig = field(default_factory=policy.PDMuxConfig)
    # the simulated clock's cost model, unless a calibration / comparison replaces it
    s_sat: float = 66.0
    bw_eff: float = 0.85
    mfu: float = 0.5
    calibration: str | None = None
    compare: str | None = None

    def __post_init__(self):
        if self.workload not in WORKLOADS:
            raise PdmuxError(f"unknown workload {self.workload!r}; known: {', '.join(WORKLOADS)}")
        for kind in self.kinds:
            if kind not in SPLIT_KINDS:
                raise PdmuxError(f"partition kinds are {' and '.join(SPLIT_KINDS)}, got {kind!r}")
        for name in ("chunks", "kinds"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise PdmuxError(f"--{name} lists {', '.join(map(str, values))}: each at most once")
        if any(c < 1 for c in self.chunks):
            raise PdmuxError(f"chunk sizes must be >= 1 token, got {self.chunks}")
        if self.compare and not self.calibration:
            raise PdmuxError("--compare calibrates the prefill rate beside --calibration's decode "
                             "curve: pass --calibration too")
        if not self.kinds:
            raise PdmuxError("--kinds needs at least one partition kind for pd-mux: "
                             f"{', '.join(SPLIT_KINDS)}")
        longest = self.prompt if self.workload == "chapter" else self.prompt_max
        for chunk in self.chunks:
            if -(-longest // chunk) > MAX_CHUNK_STEPS:
                raise PdmuxError(f"--chunks {chunk} cuts a {longest}-token prompt into "
                                 f"{-(-longest // chunk):,} steps; at most {MAX_CHUNK_STEPS:,}")
        self._check_fits()
        if self.calibration:  # read now: a bad file fails before minutes of serving
            load_calibration(self.calibration, self.gpu.name)
        if self.compare:
            load_compare(self.compare, self.gpu.name)
        if not self.simulate and self.workload == "poisson" and self.count / self.rate > MAX_GPU_RUN_S:
            raise PdmuxError(f"{self.count} requests at {self.rate:g}/s arrive over "
                             f"~{self.count / self.rate:,.0f} s, longer than a measured run may "
                             f"take ({MAX_GPU_RUN_S} s): raise --rate or lower --count")

    def _check_fits(self) -> None:
        if self.workload == "chapter":
            if self.decode_tokens <= traffic.CHAPTER_ARRIVAL_STEPS:
                raise PdmuxError(f"--decode-tokens {self.decode_tokens}: the decoding requests "
                                 f"would finish before the prompt arrives (after "
                                 f"{traffic.CHAPTER_ARRIVAL_STEPS} decode steps); decode at "
                                 f"least {traffic.CHAPTER_ARRIVAL_STEPS + 1}")
            tokens = (self.batch * (self.context + self.decode_tokens) + self.prompt
                      + self.decode_tokens)
            what = (f"{self.batch} requests decoding {self.decode_tokens} tokens after "
                    f"{self.context} and a {self.prompt}-token prompt")
        else:
            if not 1 <= self.prompt_mean <= self.prompt_max:
                raise PdmuxError(f"--prompt-mean {self.prompt_mean} must be at most --prompt-max "
                                 f"{self.prompt_max}")
            if not 1 <= self.output_mean <= self.output_max:
                raise PdmuxError(f"--output-mean {self.output_mean} must be at most --output-max "
                                 f"{self.output_max}")
            tokens = self.prompt_max + self.output_max
            what = f"a request of {self.prompt_max} prompt and {self.output_max} output tokens"
        cost.check_fits(self.gpu, self.model, tokens, what)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["gpu"]["cc"] = list(self.gpu.cc)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "RunSettings":
        """The settings a result was made with (its `inputs`)."""
        try:
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(data) - known)
            if unknown:
                raise PdmuxError(f"unknown run inputs {', '.join(unknown)}")
            values = dict(data)
            values["gpu"] = GPUSpec(**{**data["gpu"], "cc": tuple(data["gpu"]["cc"])})
            values["model"] = ModelSpec(**data["model"])
            values["config"] = policy.parse_config(data["config"], "the run's pdmux config")
            values["chunks"], values["kinds"] = tuple(data["chunks"]), tuple(data["kinds"])
            return cls(**values)
        except (KeyError, TypeError) as err:
            raise PdmuxError(f"the run inputs are incomplete or malformed ({err})") from None


def make_requests(s: RunSettings) -> list[traffic.Request]:
    if s.workload == "chapter":
        return traffic.chapter_scenario(s.model.vocab, s.batch, s.context, s.prompt,
                                        s.decode_tokens, seed=s.seed)
    return traffic.poisson(s.model.vocab, s.rate, s.count, s.prompt_mean, s.prompt_max,
                           s.output_mean, s.output_max, s.seed)


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
        out.append((title, estimate.calibrated(sc, cal, s.kinds[0] if s.kinds else "grid_cap",
                                               cmp)))
    return [(title, scenario, estimate.estimate(scenario)) for title, scenario in out]


@dataclass(frozen=True)
class Variant:
    name: str  # decode_only, prefill_first, chunked_2048, pdmux_grid_cap, ...
    strategy: str
    chunk: int = 0
    kind: str = "grid_cap"  # partition kind of the pd-mux levels


def variants(chunks: tuple[int, ...], kinds: tuple[str, ...]) -> list[Variant]:
    out = [Variant("decode_only", "prefill_first"), Variant("prefill_first", "prefill_first")]
    out += [Variant(f"chunked_{c}", "chunked", chunk=c) for c in chunks]
    out += [Variant(f"pdmux_{k}", "pdmux", kind=k) for k in kinds]
    return out


def simulated_executors(s: RunSettings) -> Callable[[Variant], SimExecutor]:
    """The cost model's clock for each variant: the S_SAT law and a fixed MFU, or the measured
    decode curves of a calibration (each pd-mux kind its own) and a comparison's MFU."""
    cal = load_calibration(s.calibration, s.gpu.name) if s.calibration else None
    cmp = load_compare(s.compare, s.gpu.name) if s.compare else None

    def make(v: Variant) -> SimExecutor:
        kind = v.kind if v.strategy == "pdmux" else "grid_cap"
        decode = (cal.decode_curve(kind) if cal else
                  cost.SaturationLaw(s.gpu.hbm_tbps * s.bw_eff, min(s.s_sat, s.gpu.sms)))
        prefill = (cmp.prefill_rate(kind, s.gpu.bf16_tflops, s.gpu.sms) if cmp else
                   cost.PrefillRate.fixed(s.gpu.bf16_tflops, s.gpu.sms, s.mfu))
        return SimExecutor(s.gpu, s.model, decode, prefill, kind)
    return make


def run_all(requests: list[traffic.Request], make_executor: Callable[[Variant], object],
            config: policy.PDMuxConfig, chunks: tuple[int, ...], kinds: tuple[str, ...],
            log=print, warmup: bool = False) -> tuple[list[dict], dict[str, scheduler.RunResult]]:
    """Serve `requests` once per variant. decode_only serves the requests that are decoding
    from the start without the arriving prompts: the ITL baseline.

    With `warmup` each variant is served once untimed first, so kernel compilation and graph
    capture (once per shape) stay out of the measured run."""
    rows, results = [], {}
    for v in variants(chunks, kinds):
        reqs = copy.deepcopy(requests)
        if v.name == "decode_only":
            reqs = [r for r in reqs if r.warm]
            if not reqs:
                continue
        if warmup:
            log(f"warming up {v.name} ...")
            scheduler.run(v.strategy, make_executor(v), copy.deepcopy(reqs), chunk=v.chunk,
                          config=config)
        log(f"running {v.name} ...")
        result = scheduler.run(v.strategy, make_executor(v), reqs, chunk=v.chunk, config=config)
        summary = metrics.summarize(result)
        summary["strategy"] = v.name
        rows.append(summary)
        results[v.name] = result
    return rows, results


def run_experiment(s: RunSettings, log=print) -> tuple[dict, dict[str, scheduler.RunResult],
                                                       list[tuple]]:
    """Serve the settings' workload with every strategy; returns the result JSON, each
    strategy's run and the estimates of the scenario (chapter workload only)."""
    requests = make_requests(s)
    # estimates first: a bad calibration or comparison file fails before minutes of measuring
    estimates = chapter_estimates(s) if s.workload == "chapter" else []
    if s.simulate:
        make_executor = simulated_executors(s)
        rows, results = run_all(requests, make_executor, s.config, s.chunks, s.kinds, log)
    else:
        # torch is needed only where a GPU measures
        from pdmux_triton.execute import ModelExecutor

        def make_executor(v: Variant):
            return ModelExecutor.shared(s.model, s.gpu, v.kind, page_size=16)
        try:
            rows, results = run_all(requests, make_executor, s.config, s.chunks, s.kinds, log,
                                    warmup=True)
        finally:
            ModelExecutor.release_shared()  # green contexts and graphs
    levels = s.config.levels(s.gpu.sms, s.gpu.cc_major)
    prefill_sms = levels[s.config.choose_level(levels, s.batch, True)][0]
    out = {"mode": "simulated" if s.simulate else "gpu", **provenance(s.gpu.name),
           "model": s.model.name, "workload": s.workload, "inputs": s.as_dict(), "rows": rows,
           "details": {name: metrics.details(res) for name, res in results.items()}}
    if estimates:
        out["estimate"] = {title: [r.as_dict() for r in est] for title, _, est in estimates}
    # errors against the last estimate: the calibrated one when a calibration is given
    out["summary"] = summary(rows, s.gpu.sms, prefill_sms,
                             out["estimate"][estimates[-1][0]] if estimates else None)
    return out, results, estimates


SUMMARY_KEYS = ("itl_p50_ms", "itl_p99_ms", "itl_during_prefill_p50_ms", "decode_gpu_p50_ms",
                "prefill_ms", "tokens_during_prefill", "ttft_p50_ms", "gpu_idle_frac")


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
    """The issue's ratios: pd-mux ITL during prefill vs decode-only and vs chunked-512, and
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
