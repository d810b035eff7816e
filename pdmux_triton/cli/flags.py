"""The command line's arguments: every flag, its type, its default and what it allows.

Types validate at the edge (`parsing`), so a bad value is one line naming it. Flags are
registered with no default of their own: after parsing, `given` says which the user passed (so
a flag that would do nothing can be refused) and the documented defaults are filled in. The
subcommands' prose is in `help_text`.
"""

from __future__ import annotations

import argparse

from pdmux_triton import __version__
from pdmux_triton.cli import help_text
from pdmux_triton.cli.parsing import (EFFICIENCY, FRACTION, Parser, choice, compute_capability,
                                      integer, listed, number)
from pdmux_triton.cost.parallel import LINKS
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments import capacity_search
from pdmux_triton.experiments.capacity_search import STEADY_POINTS
from pdmux_triton.experiments.repeats import MAX_REPEATS
from pdmux_triton.experiments.settings import (LENGTHS, LEVEL_POLICIES, MAX_SPEED, MAX_TP,
                                               MAX_WARM, PREFIX_CACHE, WORKLOADS, RunSettings)
from pdmux_triton.experiments.variants import DEFAULT_STRATEGIES, variant
from pdmux_triton.measure.calibration_sweep import DECODE_WORKLOADS
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.partition import DEFAULT_KINDS, SPLIT_KINDS

KINDS_HELP = (f"{', '.join(SPLIT_KINDS)} (pinned: SM-id gated kernels, so far slower than green "
              "contexts of as many SMs: bench/RESULTS.md)")
from pdmux_triton.results import read_json
from pdmux_triton.serve import scheduler
from pdmux_triton.spec.gpus import GPUS, MAX_SMS
from pdmux_triton.spec.models import MODELS
from pdmux_triton.spec.traffic import LENGTH_PRESETS

MAX_COUNT = 100_000  # requests in one run
MIN_CAPACITY_COUNT = 50  # requests a capacity point needs at least
DEFAULT_CAPACITY_COUNT = 1000  # requests a point, unless --count says (bench/stream_length.py)
MAX_CTAS = 32  # programs per SM Hopper can hold


def _gpu_flags(p: Parser, shown: str = "h100-sxm", where: str = "") -> None:
    p.flag("--gpu", default="h100-sxm", shown=shown,
           help=f"GPU preset ({', '.join(GPUS)}) or 'local' for the GPU torch sees{where}")
    p.flag("--sms", type=integer(1, MAX_SMS), help="override the GPU's SM count")
    p.flag("--cc", type=compute_capability, help="override the compute capability, e.g. 9.0")
    p.flag("--config", metavar="FILE",
           help="SGLang pdmux YAML (--pdmux-config-path) to take levels from")
    p.flag("--json", action="store_true", help="print machine-readable JSON")


def _weights_flag(p: Parser) -> None:
    p.flag("--weights", type=choice(("random", "hf")), default="random",
           help="measured runs: random (seeded; a step's time does not depend on values) or hf "
                "(the safetensors of the --model directory)")


def _model_flag(p: Parser, group=None) -> None:
    p.flag("--model", default="qwen3-8b", group=group,
           help=f"model preset ({', '.join(MODELS)}), or a Hugging Face model directory or "
                f"config.json (Qwen3, Llama 3, Qwen2, Mistral)")


def _sm_group_flag(p: Parser) -> None:
    p.flag("--sm-group-num", type=integer(3, sglang_rules.MAX_SM_GROUP_NUM),
           default=sglang_rules.DEFAULT_SM_GROUP_NUM,
           help=f"number of levels, 3-{sglang_rules.MAX_SM_GROUP_NUM}: SGLang's sm_group_num "
                f"(conflicts with --config)")


def _levels_flags(p: Parser, what: str) -> None:
    _sm_group_flag(p)
    p.flag("--write-config", metavar="FILE", help=f"write {what} as an SGLang pdmux YAML")


def _advise_flags(p: Parser, on_levels: bool) -> None:
    """advise's flags: on `advise`, --calibration and --itl-ms under "required arguments"; on
    `levels`, all under --calibration, which makes it advise. Not argparse's required=True:
    cli.cmd_advise checks them for both and names what is missing in its own words."""
    if on_levels:
        need = rest = p.add_argument_group(
            "with --calibration (levels is then advise, kept as an alias: see advise --help)")
    else:
        need, rest = p.add_argument_group("required arguments"), None
    p.flag("--calibration", metavar="FILE", group=need,
           help="calibrate-<gpu>.json: the decode step measured beside a prefill per SM budget")
    p.flag("--itl-ms", metavar="MS", type=number(), group=need,
           help="the decode step time (ms) to stay under")
    _model_flag(p, rest)
    p.flag("--context", type=integer(1), default=2048, group=rest,
           help="context of the decoding requests")
    p.flag("--context-dist", type=choice(tuple(LENGTH_PRESETS)), group=rest,
           help=f"instead of --context: contexts of a traffic preset's decoding requests "
                f"({', '.join(LENGTH_PRESETS)}); writes the manual divisions that best follow "
                f"the slo level policy on it")
    p.flag("--max-batch", type=integer(1, 1024), default=scheduler.DEFAULT_MAX_RUNNING,
           group=rest, help="with --context-dist: the largest decode batch to cover")
    p.flag("--kind", type=choice(SPLIT_KINDS), default="green", group=rest,
           help=f"which measured curve to trust: {', '.join(SPLIT_KINDS)}")


def _measure_flags(p: Parser) -> None:
    p.flag("--out", default="pdmux-results", help="folder for JSON, points and plots")
    _model_flag(p)
    p.flag("--batch", type=integer(1), default=32, help="decode batch size")
    p.flag("--context", type=integer(1), default=2048, help="context of each decoding request")
    p.flag("--prefill-tokens", type=integer(1), default=8192,
           help="prompt length of the prefill running beside decode")


def _stream_flags(p: Parser) -> None:
    p.flag("--burstiness", type=number(0.0, 100.0), default=1.0,
           help="gamma shape of the gaps between arrivals: 1 is Poisson, lower is burstier")
    p.flag("--lengths", type=choice(LENGTHS), default="sharegpt",
           help=f"prompt and output lengths: {', '.join(LENGTHS)}")
    p.flag("--prompt-mean", type=integer(1), default=1024, help="exponential: mean prompt tokens")
    p.flag("--prompt-max", type=integer(1), default=8192, help="exponential: longest prompt")
    p.flag("--output-mean", type=integer(1), default=128, help="exponential: mean output tokens")
    p.flag("--output-max", type=integer(1), default=512, help="exponential: longest output")
    p.flag("--seed", type=integer(0, 2**32 - 1), default=0, help="seed of the requests")


def _trace_flags(p: Parser) -> None:
    p.flag("--trace", metavar="FILE",
           help="trace: a CSV of arrival_s,prompt_tokens,output_tokens per row, or a trace as "
                "published (Azure LLM inference, BurstGPT, Mooncake JSONL)")
    p.flag("--trace-model", metavar="NAME",
           help="trace: a BurstGPT log's rows of this model only (its Model column, e.g. GPT-4)")
    p.flag("--trace-start", type=integer(0), default=0,
           help="trace: the first row served (in arrival order)")
    p.flag("--trace-count", type=integer(1, MAX_COUNT), shown="to the trace's end",
           help="trace: how many rows are served from --trace-start")


def _level_flags(p: Parser) -> None:
    p.flag("--itl-slo-ms", type=number(), shown="--slo-tpot-ms",
           help="slo levels: the decode step beside a prefill (predicted from --calibration) "
                "to stay under")
    p.flag("--hysteresis", type=number(0.0, 0.99, above=False), default=0.1,
           help="slo levels: the margin a level with more prefill SMs must leave under the target")
    p.flag("--relevel-at-layers", action="store_true", default=False,
           help="slo levels: also switch between layers of a split prefill when the batch changed")


# what a link may be: from a slow network's to past any NVLink's (GB/s), from a fast switch's
# latency to a millisecond (us)
LINK_BOUNDS = {"--link-gbps": (0.01, 1e5), "--link-latency-us": (1e-3, 1e3)}


def _parallel_flags(p: Parser) -> None:
    p.flag("--tp", type=integer(1, MAX_TP), default=1,
           help="simulated: GPUs of one tensor-parallel server, each serving a shard of the "
                "model; its collectives are priced on --link")
    p.flag("--replicas", type=integer(1, MAX_TP), default=1,
           help="simulated: independent servers (of --tp GPUs each) behind a round-robin router")
    p.flag("--link", type=choice(tuple(LINKS)), default="nvlink4",
           help=f"with --tp or disaggregation: how the GPUs reach each other ({', '.join(LINKS)})")
    for name, what, field in (
            ("--link-gbps", "the link's bus bandwidth (collectives, KV pages), GB/s", "busbw_gbps"),
            ("--link-latency-us", "the time of a small collective or transfer on the link, us",
             "latency_us")):
        p.flag(name, type=number(*LINK_BOUNDS[name], above=False), help=what,
               shown="the --link preset's: " + ", ".join(
            f"{link} {getattr(spec, field):g}" for link, spec in LINKS.items()))


def _efficiency_flags(p: Parser) -> None:
    p.flag("--bw-eff", type=EFFICIENCY, default=0.85, help="achieved fraction of HBM bandwidth")
    p.flag("--mfu", type=EFFICIENCY, default=0.5, help="achieved fraction of bf16 FLOP/s")


def _served_flags(p: Parser) -> None:
    """What `run` and `capacity` share after their workload's flags."""
    p.flag("--simulate", action="store_true",
           help="use the cost-model clock even when a GPU is present")
    p.flag("--max-prefill-tokens", type=integer(1), default=scheduler.DEFAULT_PREFILL_TOKENS,
           help="tokens in one prefill batch at most (SGLang's --max-prefill-tokens)")
    p.flag("--max-running", type=integer(1, 1024), default=scheduler.DEFAULT_MAX_RUNNING,
           help="requests in the running batch at most (SGLang's --max-running-requests)")
    p.flag("--prefix-cache", type=choice(PREFIX_CACHE), default="on",
           help="on (as SGLang serves): a prompt reads the KV of the 512-token blocks it shares "
                "with earlier prompts (same tokens: a trace's hash ids, as Mooncake's give "
                "them) and computes the rest; off: every prompt computes all of its tokens")
    p.flag("--repeats", type=integer(1, MAX_REPEATS), default=1,
           help="measured: serve each strategy's requests this many times in one process; "
                "figures are the medians, with their spread (highest - lowest, %% of the median)")
    p.flag("--warm-requests", type=integer(0, MAX_WARM), default=RunSettings.warm_requests,
           help="measured: serve each strategy's first this many requests once untimed "
                "before its points (the allocator then holds what the traffic's batches need; "
                "what a measured point still allocates is counted in its row)")
    _level_flags(p)
    _cost_flags(p)
    _parallel_flags(p)


def _cost_flags(p: Parser) -> None:
    p.flag("--s-sat", type=number(1.0, MAX_SMS, above=False), default=66.0,
           help="decode S_SAT (SMs) of the estimate and of a simulation without --calibration")
    _efficiency_flags(p)
    p.flag("--calibration", metavar="FILE", help="calibrate-<gpu>.json: measured decode curves")
    p.flag("--compare", metavar="FILE", help="compare-<gpu>.json: measured prefill rates")
    p.flag("--host-costs", metavar="FILE",
           help="host-costs-<gpu>.json (calibrate --host-costs): the host's share of a round")


def strategy(text: str) -> str:
    """A capacity strategy's name, as variants.variant knows them."""
    try:
        variant(text)
    except PdmuxError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


CHAPTER_FLAGS = ("batch", "context", "prompt", "decode_tokens")
TRACE_FLAGS = ("trace", "trace_model", "trace_start", "trace_count", "speed")
SWEEP_FLAGS = ("workloads", "kinds", "ctas", "budgets", "decode_batches", "decode_contexts",
               "no_corun", "remeasure",
               "batch", "context", "prefill_tokens")  # calibrate's, unused by --host-costs
STREAM_FLAGS = ("rate", "count", "burstiness", "lengths")
EXPONENTIAL_FLAGS = ("prompt_mean", "prompt_max", "output_mean", "output_max")
REPLAY_KEEPS = ("replay", "out", "json", "simulate")  # what --replay leaves to the command line


def build_parser() -> Parser:
    parser = Parser(prog="pdmux-triton", description=help_text.DESCRIPTION,
                    epilog=help_text.GLOSSARY)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("levels", **help_text.parser_texts("levels"))
    _gpu_flags(p, help_text.GPU_OF_CALIBRATION)
    _levels_flags(p, "these levels (with manual_divisions)")
    _advise_flags(p, on_levels=True)

    p = sub.add_parser("advise", usage="%(prog)s --calibration FILE --itl-ms MS [options]",
                       **help_text.parser_texts("advise"))
    _advise_flags(p, on_levels=False)
    _gpu_flags(p, help_text.GPU_OF_CALIBRATION)
    _levels_flags(p, "the advised levels")

    p = sub.add_parser("estimate", **help_text.parser_texts("estimate"))
    _gpu_flags(p)
    _model_flag(p)
    p.flag("--batch", type=integer(1), default=32, help="requests decoding")
    p.flag("--context", type=integer(1), default=2048, help="context of each decoding request")
    p.flag("--prompt", type=integer(1), default=8192, help="tokens of the arriving prompt")
    p.flag("--chunks", type=listed(integer(1), "chunk size"), default=(2048, 512),
           help="chunk sizes, e.g. 2048,512")
    p.flag("--s-sat", type=listed(number(1.0, MAX_SMS, above=False), "S_SAT"),
           default=(44.0, 66.0, 88.0),
           help="S_SAT values (SMs) to try, e.g. 44,66,88")
    _efficiency_flags(p)
    p.flag("--bandwidth-tbps", type=number(0.01, 1e3, above=False),
           help="override the GPU's HBM TB/s")
    p.flag("--tflops", type=number(1.0, 1e6, above=False),
           help="override the GPU's dense bf16 TFLOP/s")
    _sm_group_flag(p)

    p = sub.add_parser("calibrate", **help_text.parser_texts("calibrate"))
    _measure_flags(p)
    p.flag("--workloads", type=listed(choice(DECODE_WORKLOADS), "workload"),
           default=DECODE_WORKLOADS, help=f"what to sweep: {', '.join(DECODE_WORKLOADS)}")
    p.flag("--kinds", type=listed(choice(SPLIT_KINDS), "kind"), default=DEFAULT_KINDS,
           help=f"partition kinds: {KINDS_HELP}")
    p.flag("--ctas", type=listed(integer(1, MAX_CTAS), "CTAs per SM"), default=(1, 2, 4),
           help="CTAs per SM to sweep")
    p.flag("--budgets", type=listed(integer(1, MAX_SMS), "budget"), help="SM budgets",
           shown="every multiple of the GPU's SM granularity, and all its SMs")
    p.flag("--decode-batches", type=listed(integer(1, 4096), "batch"), default=(),
           help="also measure decode_step (one CTA per SM) at these batches: the simulator "
                "prices a step of another batch by them")
    p.flag("--decode-contexts", type=listed(integer(1), "context"), default=(),
           help="also measure decode_step (one CTA per SM, at --batch) at these contexts a "
                "request: what a step's KV reads cost as contexts grow")
    p.flag("--no-corun", action="store_true", help="skip the runs beside a prefill")
    p.flag("--remeasure", action="store_true",
           help="measure this sweep's points again though saved (after a kernel change); "
                "saved points outside the sweep stay")
    p.flag("--host-costs", action="store_true", default=False,
           help="instead of the sweep, time what the host spends per round (eager layers, "
                "captured decode rounds) and write host-costs-<gpu>.json: the --host-costs "
                "input of run and capacity")

    p = sub.add_parser("run", **help_text.parser_texts("run"))
    _gpu_flags(p, help_text.GPU_OF_FILES, help_text.MEASURED_GPU)
    _model_flag(p)
    _weights_flag(p)
    p.flag("--workload", type=choice(WORKLOADS), default="chapter",
           help="chapter (a batch decoding, one prompt arrives), stream (requests arriving at "
                "--rate) or trace (a CSV of arrivals and lengths)")
    p.flag("--replay", metavar="FILE", help="serve again the inputs saved in a run-<gpu>.json")
    p.flag("--batch", type=integer(1), default=32, help="chapter: requests decoding")
    p.flag("--context", type=integer(1), default=2048, help="chapter: their context")
    p.flag("--prompt", type=integer(1), default=8192, help="chapter: the arriving prompt")
    p.flag("--decode-tokens", type=integer(2, 1_000_000), default=96,
           help="chapter: tokens each decodes")
    p.flag("--rate", type=number(0.0, 1e6), default=2.0, help="stream: requests per second")
    p.flag("--count", type=integer(1, MAX_COUNT), default=64, help="stream: requests")
    _stream_flags(p)
    _trace_flags(p)
    p.flag("--speed", type=number(0.0, MAX_SPEED), default=1.0,
           help="trace: arrivals this many times as fast as recorded (2: twice the rate)")
    p.flag("--chunks", type=listed(integer(1), "chunk size"), default=(2048, 512),
           help="chunked prefill sizes")
    p.flag("--kinds", type=listed(choice(SPLIT_KINDS), "kind"), default=DEFAULT_KINDS,
           help=f"partition kinds for pd-mux: {KINDS_HELP}")
    for target in ("TTFT", "TPOT"):
        p.flag(f"--slo-{target.lower()}-ms", type=number(), shown="none: no attainment or goodput",
               help=f"{target} target of SLO attainment and goodput (give both targets)")
    p.flag("--level-policies", type=listed(choice(LEVEL_POLICIES), "level policy"),
           default=("sglang",), help="how pd-mux picks its level: sglang (the config's rule), "
                                      "slo (the split an ITL target needs)")
    _served_flags(p)
    p.flag("--out", metavar="DIR", shown="none: nothing written",
           help="folder for run-<gpu>.json and the ITL timeline plot")

    p = sub.add_parser("capacity", **help_text.parser_texts("capacity"))
    _gpu_flags(p, help_text.GPU_OF_FILES, help_text.MEASURED_GPU)
    _model_flag(p)
    _weights_flag(p)
    p.flag("--count", type=integer(1, MAX_COUNT), default=DEFAULT_CAPACITY_COUNT,
           help=f"requests per point: at least {MIN_CAPACITY_COUNT}; a capacity read where "
                f"a point's later half of requests met the SLOs more than "
                f"{STEADY_POINTS * 100:g} points apart from "
                f"the whole is labelled a burst (its attainment still moved with the stream's "
                f"length: not a steady state)")
    _stream_flags(p)
    _trace_flags(p)
    p.flag("--slo-ttft-ms", type=number(), default=2000.0, help="TTFT target")
    p.flag("--slo-tpot-ms", type=number(), default=25.0, help="TPOT target")
    p.flag("--attainment", type=FRACTION, default=0.9,
           help="share of requests that must meet both targets (goodput capacity)")
    p.flag("--max-sched-delay-s", type=number(), default=2.0,
           help="median scheduling delay allowed, s (Sarathi capacity)")
    p.flag("--strategies", type=listed(strategy, "strategy"), default=DEFAULT_STRATEGIES,
           help=help_text.strategies(SPLIT_KINDS))
    p.flag("--rates", type=listed(number(0.0, 1e4), "rate"),
           help="measured: serve these rates (req/s) instead of searching")
    p.flag("--offline", action="store_true",
           help="read every point measured in --out's store again (no GPU needed), each "
                "strategy's at whatever rates it was measured, and simulate beside them again")
    p.flag("--start-rate", type=number(capacity_search.LOWEST_RATE, capacity_search.HIGHEST_RATE,
                                       above=False), default=1.0,
           help="where the search starts, req/s (it searches within these bounds)")
    p.flag("--tol", type=number(0.0, 1.0), default=0.05, help="the search's relative tolerance")
    _served_flags(p)
    p.flag("--out", default="pdmux-results",
           help="folder for capacity-<gpu>.json, its points (resumed on rerun) and plot")

    p = sub.add_parser("compare", **help_text.parser_texts("compare"))
    _measure_flags(p)
    p.flag("--kinds", type=listed(choice(SPLIT_KINDS), "kind"), default=DEFAULT_KINDS,
           help=f"partition kinds to measure at each level (errors against green need green): "
                f"{KINDS_HELP}")
    return parser


MEASURED_FILES = ("calibration", "compare", "host_costs")


def _gpu_named_by_files(args, given: set[str]) -> None:
    """Without --gpu, its default is the preset of the GPU the measured files passed were
    measured on (--sms and --cc reshape it): passing calibrate-h200.json means the H200. Files
    that name different GPUs, or one without a preset, leave the default, and their loader
    says which to pass."""
    if "gpu" in given or not hasattr(args, "gpu"):
        return
    names = {read_json(getattr(args, f), f.replace("_", " ")).get("gpu")
             for f in MEASURED_FILES if getattr(args, f, None)}
    if len(names) == 1 and (name := names.pop()) in GPUS:
        args.gpu = name


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, set[str]]:
    """The parsed arguments with their defaults, and the names of those the user gave: what the
    commands read and never change."""
    parser = build_parser()
    args = parser.parse_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]
    for action in sub._actions:  # an empty value (`--out ''`) is no path, name or list
        value = getattr(args, action.dest, None)
        if isinstance(value, str) and not value.strip() and action.option_strings:
            sub.error(f"argument {action.option_strings[0]}: expected a value, got {value!r}")
    # (an identity test: a flag given as 0 equals False, and was given all the same)
    given = {dest for dest in sub.documented_defaults
             if getattr(args, dest) is not None and getattr(args, dest) is not False}
    for dest, default in sub.documented_defaults.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    _gpu_named_by_files(args, given)
    return args, given
