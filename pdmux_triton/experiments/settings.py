"""What a served run depends on (`RunSettings`), checked before any work starts and saved with
its result as `inputs`, so `run --replay` can serve it again; and the requests it serves."""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from functools import cached_property

from pdmux_triton.cost import parallel, step_cost
from pdmux_triton.cost.measured_inputs import load_calibration, load_compare, load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments.repeats import MAX_REPEATS
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.partition import DEFAULT_KINDS, SPLIT_KINDS
from pdmux_triton.serve import scheduler
from pdmux_triton.serve.metrics import Slo
from pdmux_triton.spec import traces, traffic
from pdmux_triton.spec.gpus import GPUSpec
from pdmux_triton.spec.models import ModelSpec

WORKLOADS = ("chapter", "stream", "trace")
PREFIX_CACHE = ("on", "off")
LEVEL_POLICIES = ("sglang", "slo")
LENGTHS = (*traffic.LENGTH_PRESETS, "exponential")
MAX_CHUNK_STEPS = 65_536  # chunked steps per prompt: a run's work stays bounded
MAX_GPU_RUN_S = 3600  # arrivals of a measured stream must come within this
MAX_TP = 64  # GPUs of one tensor-parallel server
MAX_SPEED = 1e6  # a trace replayed faster than this arrives at once
MAX_WARM = 100_000  # requests served untimed before a measured point


def check_measured_span(count: int, rate: float, remedy: str) -> None:
    """A measured stream of `count` requests at `rate` per second arrives within
    MAX_GPU_RUN_S (`remedy` says what to change)."""
    if count / rate > MAX_GPU_RUN_S:
        raise PdmuxError(f"{count} requests at {rate:g}/s arrive over ~{count / rate:,.0f} s, "
                         f"longer than a measured run may take ({MAX_GPU_RUN_S} s): {remedy}")


@dataclass(frozen=True)
class RunSettings:
    gpu: GPUSpec
    model: ModelSpec
    checkpoint: str | None = None  # a Hugging Face model directory: its weights (else random)
    workload: str = "chapter"
    simulate: bool = False
    seed: int = 0
    # chapter: `batch` requests decoding at `context`, one `prompt`-token prompt arrives
    batch: int = 32
    context: int = 2048
    prompt: int = 8192
    decode_tokens: int = 96
    # stream: `count` requests at `rate` per second, lengths from a preset or exponential
    rate: float = 2.0
    count: int = 64
    burstiness: float = 1.0
    lengths: str = "sharegpt"
    prompt_mean: int = 1024
    prompt_max: int = 8192
    output_mean: int = 128
    output_max: int = 512
    # trace: a file of arrivals and lengths (`traces`), the window of it served (rows
    # [trace_start, trace_start + trace_count) in arrival order; None: to the end) and how
    # much faster than recorded its arrivals come (`speed`)
    trace: str | None = None
    trace_model: str | None = None  # a BurstGPT log: only this model's rows
    trace_start: int = 0
    trace_count: int | None = None
    speed: float = 1.0
    # the strategies
    chunks: tuple[int, ...] = (2048, 512)
    kinds: tuple[str, ...] = DEFAULT_KINDS
    config: sglang_rules.PDMuxConfig = field(default_factory=sglang_rules.PDMuxConfig)
    prefill_tokens: int = scheduler.DEFAULT_PREFILL_TOKENS
    max_running: int = scheduler.DEFAULT_MAX_RUNNING
    # how pd-mux picks its level: SGLang's rule (the config), and/or an ITL target (`slo`)
    level_policies: tuple[str, ...] = ("sglang",)
    itl_slo_ms: float | None = None  # slo: the decode step beside a prefill to stay under
    # (None: the TPOT target)
    hysteresis: float = 0.1
    relevel_at_layers: bool = False
    # measured: each strategy serves the same requests this many times (median and spread)
    repeats: int = 1
    # measured: each strategy first serves this many of the requests untimed (its allocator's
    # memory for the batches the traffic forms); fewer fit a slow trace's point in less time
    warm_requests: int = 100
    # prompts' shared prefixes read from a prefix cache ("on", as SGLang serves) or not ("off")
    prefix_cache: str = "on"
    # SLOs a request must meet to count towards goodput
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    # the simulated clock's cost model, unless a calibration / comparison replaces it
    s_sat: float = 66.0
    bw_eff: float = 0.85
    mfu: float = 0.5
    calibration: str | None = None
    compare: str | None = None
    host_costs: str | None = None  # calibrate --host-costs' file: the host's share of a round
    # tensor parallelism (simulated): each of `tp` GPUs serves a shard, its collectives priced
    # on `link` (a preset of parallel.LINKS), with its bandwidth or latency replaced if given
    tp: int = 1
    link: str = "nvlink4"
    link_gbps: float | None = None
    link_latency_us: float | None = None
    # data parallelism (simulated): this many servers of `tp` GPUs each, behind a round-robin
    # router (`router`)
    replicas: int = 1

    def __post_init__(self):
        if self.workload not in WORKLOADS:
            raise PdmuxError(f"unknown workload {self.workload!r}; known: {', '.join(WORKLOADS)}")
        if self.lengths not in LENGTHS:
            raise PdmuxError(f"unknown length preset {self.lengths!r}; known: {', '.join(LENGTHS)}")
        if (self.workload == "trace") != (self.trace is not None):
            raise PdmuxError("--workload trace needs --trace FILE, and --trace needs "
                             "--workload trace")
        if not (isinstance(self.trace_start, int) and self.trace_start >= 0):
            raise PdmuxError(f"--trace-start {self.trace_start}: a row number >= 0")
        if self.trace_count is not None and not (isinstance(self.trace_count, int)
                                                 and self.trace_count >= 1):
            raise PdmuxError(f"--trace-count {self.trace_count}: a number of requests >= 1")
        if not (0 < self.speed <= MAX_SPEED and math.isfinite(self.speed)):
            raise PdmuxError(f"--speed {self.speed}: a finite factor > 0 and at most "
                             f"{MAX_SPEED:g}")
        for kind in self.kinds:
            if kind not in SPLIT_KINDS:
                raise PdmuxError(f"partition kinds are {', '.join(SPLIT_KINDS)}, got {kind!r}")
        if not self.kinds:
            raise PdmuxError(f"--kinds needs at least one partition kind: {', '.join(SPLIT_KINDS)}")
        for name in ("chunks", "kinds"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise PdmuxError(f"--{name} lists {', '.join(map(str, values))}: each at most once")
        if any(c < 1 for c in self.chunks):
            raise PdmuxError(f"chunk sizes must be >= 1 token, got {self.chunks}")
        for name in self.level_policies:
            if name not in LEVEL_POLICIES:
                raise PdmuxError(f"level policies are {' and '.join(LEVEL_POLICIES)}, got {name!r}")
        if not self.level_policies or len(set(self.level_policies)) != len(self.level_policies):
            raise PdmuxError(f"--level-policies needs each of {', '.join(LEVEL_POLICIES)} at most "
                             f"once, got {self.level_policies}")
        if "slo" in self.level_policies and (self.itl_target_ms is None or not self.calibration):
            raise PdmuxError("the slo level policy predicts decode steps from --calibration's "
                             "curve against --itl-slo-ms (or --slo-tpot-ms): pass them")
        if (self.slo_ttft_ms is None) != (self.slo_tpot_ms is None):
            raise PdmuxError("SLO attainment needs both --slo-ttft-ms and --slo-tpot-ms")
        if self.compare and not self.calibration:
            raise PdmuxError("--compare calibrates the prefill rate beside --calibration's decode "
                             "curve: pass --calibration too")
        if self.prefix_cache not in PREFIX_CACHE:
            raise PdmuxError(f"--prefix-cache {self.prefix_cache!r}: {' or '.join(PREFIX_CACHE)}")
        if not (isinstance(self.repeats, int) and 1 <= self.repeats <= MAX_REPEATS):
            raise PdmuxError(f"--repeats {self.repeats!r}: a whole number of runs in "
                             f"1..{MAX_REPEATS}")
        if not (isinstance(self.warm_requests, int) and 0 <= self.warm_requests <= MAX_WARM):
            raise PdmuxError(f"--warm-requests {self.warm_requests!r}: a whole number of "
                             f"requests in 0..{MAX_WARM}")
        if self.repeats > 1 and self.simulate:
            raise PdmuxError(f"--repeats {self.repeats}: a simulation serves the same requests "
                             f"the same way each time; repeats spread only where the GPU "
                             f"measures")
        self._check_parallel()
        self._check_work()
        if self.calibration:  # read now: a bad file fails before minutes of serving
            load_calibration(self.calibration, self.gpu.name)
        if self.compare:
            load_compare(self.compare, self.gpu.name)
        if self.host_costs:
            load_host_costs(self.host_costs, self.gpu.name)

    def _check_parallel(self) -> None:
        if not (isinstance(self.tp, int) and 1 <= self.tp <= MAX_TP):
            raise PdmuxError(f"--tp must be a whole number of GPUs in 1..{MAX_TP}, got {self.tp!r}")
        if self.link not in parallel.LINKS:
            raise PdmuxError(f"unknown link {self.link!r}; known: {', '.join(parallel.LINKS)}")
        if not (isinstance(self.replicas, int) and 1 <= self.replicas <= MAX_TP):
            raise PdmuxError(f"--replicas must be a whole number of servers in 1..{MAX_TP}, "
                             f"got {self.replicas!r}")
        if self.replicas > 1 and not self.simulate:
            raise PdmuxError(f"--replicas {self.replicas}: this tool measures one GPU; simulate "
                             f"servers behind a router with --simulate")
        if self.tp > 1 and not self.simulate:
            raise PdmuxError(f"--tp {self.tp}: this tool measures one GPU (a process per GPU "
                             f"over NCCL is not built); simulate tensor parallelism with "
                             f"--simulate")
        self.link_spec()  # a bandwidth or latency that is not a finite number > 0 fails here

    def link_spec(self) -> parallel.Link:
        """The link between GPUs: the preset, with --link-gbps / --link-latency-us."""
        preset = parallel.LINKS[self.link]
        if self.link_gbps is None and self.link_latency_us is None:
            return preset
        return parallel.Link(
            preset.name, preset.busbw_gbps if self.link_gbps is None else self.link_gbps,
            preset.latency_us if self.link_latency_us is None else self.link_latency_us)

    @property
    def rank_model(self) -> ModelSpec:
        """What one GPU holds and computes: the model, or its shard under --tp."""
        return parallel.shard(self.model, self.tp)

    @property
    def comm(self) -> parallel.TensorParallel:
        """The collectives of a rank's forward (none on one GPU)."""
        return parallel.TensorParallel.of(self.model, self.tp,
                                          self.link_spec() if self.tp > 1 else None)

    def _check_work(self) -> None:
        """The run must fit the GPU's memory and the model's context, and end in bounded time
        (a trace's rows are checked as it is read)."""
        if self.workload == "chapter":
            if self.decode_tokens <= traffic.PROMPT_ARRIVAL_STEPS:
                raise PdmuxError(f"--decode-tokens {self.decode_tokens}: the decoding requests "
                                 f"would finish before the prompt arrives (after "
                                 f"{traffic.PROMPT_ARRIVAL_STEPS} decode steps); decode at "
                                 f"least {traffic.PROMPT_ARRIVAL_STEPS + 1}")
            arriving = self.prompt + traffic.arriving_prompt_output(self.decode_tokens)
            tokens = self.batch * (self.context + self.decode_tokens) + arriving
            longest = self.prompt
            what = (f"{self.batch} requests decoding {self.decode_tokens} tokens after "
                    f"{self.context} and a {self.prompt}-token prompt")
            single = max(arriving, self.context + self.decode_tokens)
            one = (f"the {self.prompt}-token prompt and its output" if single == arriving else
                   f"a request decoding {self.decode_tokens} tokens after {self.context}")
        elif self.workload == "stream":
            self._check_stream()
            if self.lengths == "exponential":
                traffic.Exponential(self.prompt_mean, self.prompt_max, self.output_mean,
                                    self.output_max)
                prompt, output = self.prompt_max, self.output_max
            else:
                preset = traffic.LENGTH_PRESETS[self.lengths]
                prompt, output = preset.prompt.cap, preset.output.cap
            longest = tokens = single = prompt + output
            what = one = f"a request of {prompt} prompt and {output} output tokens"
        else:
            longest = tokens = single = self.loaded_trace.longest
            what = one = f"the longest request ({tokens} tokens)"
        rank = self.rank_model  # under --tp each GPU holds a shard and its share of the cache
        step_cost.check_fits(self.gpu, rank, tokens, what)
        room = step_cost.kv_capacity_tokens(self.gpu, rank)
        if tokens > room:
            raise PdmuxError(f"{what} need {tokens:,} tokens of KV cache; the {self.gpu.name} keeps "
                             f"{room:,} for {rank.name} ({step_cost.KV_MEMORY_FRACTION:.0%} of "
                             f"what its weights leave)")
        if self.workload == "chapter" and self.batch + 1 > self.max_running:
            raise PdmuxError(f"--max-running {self.max_running} leaves no room for the chapter's "
                             f"{self.batch} decoding requests and its prompt: at least "
                             f"{self.batch + 1}")
        if not self.simulate and self.workload == "stream":
            check_measured_span(self.count, self.rate, "raise --rate or lower --count")
        context = self.model.max_context
        if context is not None and single > context:
            raise PdmuxError(f"{one}: {single:,} tokens, more than {self.model.name}'s "
                             f"context length of {context:,} (max_position_embeddings)")
        if self.workload == "chapter":  # (on every server count: the estimate is one GPU's)
            scheduler.check_chunks_beside(self.chunks, self.batch)
        # a step's chunk counts its decode rows: the chapter's batch, else fewer than
        # --max-running (a prompt starts only while the batch has room)
        rows = self.batch if self.workload == "chapter" else self.max_running - 1
        for chunk in self.chunks:
            steps = -(-longest // scheduler.fewest_chunk_tokens(chunk, rows))
            if steps > MAX_CHUNK_STEPS:
                raise PdmuxError(f"--chunks {chunk} beside up to {rows} decode rows cuts a "
                                 f"{longest}-token prompt into up to {steps:,} steps; at most "
                                 f"{MAX_CHUNK_STEPS:,}")

    def _check_stream(self) -> None:
        """A stream's requests are few enough to hold, and arrive while the clock resolves a
        step."""
        if not 1 <= self.count <= traffic.MAX_REQUESTS:
            raise PdmuxError(f"--count {self.count}: a stream holds 1 to "
                             f"{traffic.MAX_REQUESTS:,} requests")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise PdmuxError(f"--rate {self.rate}: requests per second must be a finite "
                             f"number > 0")
        if self.count / self.rate > traffic.MAX_ARRIVAL_S:
            raise PdmuxError(f"{self.count} requests at {self.rate:g}/s arrive over "
                             f"~{self.count / self.rate:.3g} s; {traffic.ARRIVAL_BOUND}")

    @cached_property
    def levels(self) -> list[sglang_rules.Level]:
        """The config's levels on this GPU: made once per run and passed to what serves it."""
        return self.config.levels(self.gpu.sms, self.gpu.cc_major)

    @cached_property
    def loaded_trace(self) -> traces.Trace:
        """The trace, read once, each request within what one may hold (`request_limit`)."""
        return traces.load_trace(self.trace, *self.request_limit(), self.trace_model).replayed(
            self.trace_start, self.trace_count, self.speed)

    def request_limit(self) -> tuple[int, str]:
        """The most prompt and output tokens one request may hold, and what sets it: the
        model's context length, or the KV cache one GPU keeps for it if that is less."""
        rank = self.rank_model
        room = step_cost.kv_capacity_tokens(self.gpu, rank)
        context = self.model.max_context
        if context is not None and context <= room:
            return context, f"{self.model.name}'s context length, max_position_embeddings"
        return room, (f"the KV cache the {self.gpu.name} keeps for {rank.name}: "
                      f"{step_cost.KV_MEMORY_FRACTION:.0%} of what its weights leave")

    @property
    def notes(self) -> tuple[str, ...]:
        """What reading the inputs changed, one line each (a trace's rows served in arrival
        order), for the caller to print."""
        return self.loaded_trace.notes if self.workload == "trace" else ()

    @property
    def itl_target_ms(self) -> float | None:
        """The slo level policy's target: --itl-slo-ms, else the TPOT target."""
        return self.itl_slo_ms if self.itl_slo_ms is not None else self.slo_tpot_ms

    @property
    def slo(self) -> Slo | None:
        return None if self.slo_ttft_ms is None else Slo(self.slo_ttft_ms, self.slo_tpot_ms)

    @staticmethod
    def defaults() -> dict:
        """Each setting's default, where it has a plain one (the model's fields too)."""
        plain = {f.name: f.default for f in fields(RunSettings) if f.default is not MISSING}
        return {**plain, "model": {f.name: f.default for f in fields(ModelSpec)
                                   if f.default is not MISSING}}

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
            values["config"] = sglang_rules.parse_config(data["config"], "the run's pdmux config")
            values["chunks"], values["kinds"] = tuple(data["chunks"]), tuple(data["kinds"])
            return cls(**values)
        except (KeyError, TypeError) as err:
            raise PdmuxError(f"the run inputs are incomplete or malformed ({err})") from None


def make_requests(s: RunSettings, rate: float | None = None) -> list[traffic.Request]:
    """The settings' requests; a stream, or the trace sped up, at `rate` instead of the
    settings' own when given."""
    if s.workload == "chapter":
        return traffic.prompt_during_decode(s.model.vocab, s.batch, s.context, s.prompt,
                                            s.decode_tokens, seed=s.seed)
    if s.workload == "trace":
        trace = s.loaded_trace
        if rate is not None:
            trace = trace.replayed(speed=rate / trace.rate)
        return trace.requests(s.model.vocab, s.seed)
    lengths = (traffic.Exponential(s.prompt_mean, s.prompt_max, s.output_mean, s.output_max)
               if s.lengths == "exponential" else traffic.LENGTH_PRESETS[s.lengths])
    return traffic.stream(s.model.vocab, rate or s.rate, s.count, lengths, s.burstiness, s.seed)
