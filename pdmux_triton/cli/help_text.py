"""The command line's prose: what each subcommand does, one example of it, and the glossary
of the top-level help. The flags' own help lives beside them in `flags`."""

from __future__ import annotations

DESCRIPTION = """\
Measure and tune PD multiplexing: prefill and decode of an LLM at the same time on split SMs
of one GPU, as SGLang's --enable-pdmux with its --pdmux-config-path YAML. The planning
commands (levels, advise, estimate; run and capacity when simulated) need no GPU; calibrate,
compare and a measured run or capacity need an NVIDIA GPU."""

GLOSSARY = """\
glossary:
  level             one of SGLang's (prefill SMs, decode SMs) splits of the GPU; a pdmux
                    config has sm_group_num of them: level 0 all-prefill, the last
                    all-decode, green-context splits between. While a prefill runs, the
                    decode batch size picks the level (decode_bs_divisor, or the
                    manual_divisions thresholds)
  S_SAT             the SM count past which decode's memory bandwidth stops growing
  TBT / ITL         time between two tokens of one request (ITL and TBT are the same here)
  TTFT              time to first token: from a request's arrival to its first token
  TPOT              per request: (E2E - TTFT) / (output tokens - 1)
  goodput           requests that meet both the TTFT and the TPOT target, per second of
                    arrivals (DistServe's; from the first arrival to the last)
  goodput capacity  DistServe's: the highest request rate at which at least --attainment
                    (90%) of requests meet both targets
  Sarathi capacity  Sarathi-Serve's: the highest request rate with P99 TBT under the TPOT
                    target and median scheduling delay under --max-sched-delay-s (2 s)
  grid_cap, green   partition kinds: persistent Triton kernels whose grid is capped to the
                    level's SM count (the hardware places their CTAs), or CUDA green contexts (a
                    fixed set of SMs, as SGLang)

example:
  pdmux-triton levels --gpu h200
  pdmux-triton <command> --help     what a command does, every flag and its default"""

# name: (one-line help, description, example)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "levels": (
        "SGLang's PD-mux levels for a GPU and which decode batch picks which",
        "SGLang's level table for a GPU: the (prefill SMs, decode SMs) split of each level,\n"
        "from SGLang's rule or a --config YAML, and which decode batch size picks which level\n"
        "while a prefill runs. --write-config writes them as a pdmux YAML with explicit\n"
        "manual_divisions, ready to edit. With --calibration it is `advise` (kept as an alias).",
        "pdmux-triton levels --gpu h200 --write-config pdmux.yaml"),
    "advise": (
        "the splits that meet an ITL target, from a calibration",
        "From a calibration (the decode step measured beside a prefill at every SM budget): for\n"
        "each range of decode batch sizes, the split that leaves prefill the most SMs while the\n"
        "decode step stays under --itl-ms; --write-config writes them as SGLang\n"
        "manual_divisions. --context-dist instead follows the slo level policy on a traffic's\n"
        "contexts.",
        "pdmux-triton advise --calibration bench/results/calibrate-h200.json --itl-ms 20 "
        "--write-config pdmux.yaml"),
    "estimate": (
        "the chapter's cost model: ITL and prefill time by approach",
        "The first-order cost model of decode-only, prefill-first, chunked prefill and PD-mux\n"
        "(at each --s-sat) for one prompt arriving while a batch decodes. No GPU needed.",
        "pdmux-triton estimate --gpu h200 --batch 32 --prompt 8192 --s-sat 44,66,88"),
    "calibrate": (
        "measure decode bandwidth vs SMs and S_SAT (needs a GPU)",
        "Sweep the SM budget for a streaming read, decode attention, the decode linears and a\n"
        "whole decode step, under grid capping and green contexts, alone and beside a prefill\n"
        "on the other SMs; every point is saved as measured and a rerun resumes. Writes\n"
        "calibrate-<gpu>.json (the decode curves and S_SAT) and a plot. With --host-costs it\n"
        "times the executor's host costs instead: host-costs-<gpu>.json, run's --host-costs.",
        "pdmux-triton calibrate --out results --decode-batches 1,8,64,72,128"),
    "run": (
        "serve a workload with every strategy: ITL, TTFT, TPOT",
        "Serve one workload with every strategy (decode-only, prefill-first, chunked prefill,\n"
        "PD-mux with each partition kind) on the same requests: measured on the local GPU, or\n"
        "simulated on the cost model's clock with --simulate or without a GPU.",
        "pdmux-triton run --workload stream --rate 4 --count 200 --slo-ttft-ms 2000 "
        "--slo-tpot-ms 25"),
    "capacity": (
        "per strategy, the highest request rate within the SLOs",
        "Per strategy, the highest request rate it serves within the SLOs, as goodput capacity\n"
        "and Sarathi capacity: simulated it searches the rate; on a GPU it searches too or\n"
        "serves --rates, with the simulation beside it. Points are saved and a rerun resumes.\n"
        "With --trace, the trace's own arrivals are sped up or slowed down to each rate, and\n"
        "each capacity is also a multiple of the rate it was recorded at.",
        "pdmux-triton capacity --simulate --gpu h200 --strategies "
        "prefill_first,chunked_2048,pdmux_grid_cap --out results"),
    "compare": (
        "grid capping vs green contexts at every level (needs a GPU)",
        "At every middle level of SGLang's levels, a decode step and a prefill run together\n"
        "under grid capping and under green contexts: rates alone and co-running, the\n"
        "emulation's error and where the CTAs ran. Writes compare-<gpu>.json and a plot.",
        "pdmux-triton compare --out results"),
}

# where --gpu's default comes from (flags.parse), and what a measurement takes
GPU_OF_CALIBRATION = "the GPU the --calibration file was measured on, else h100-sxm"
GPU_OF_FILES = ("the GPU the --calibration/--compare/--host-costs files were measured on, else "
                "h100-sxm")
MEASURED_GPU = ("; a measured run (a GPU here, no --simulate) uses the local GPU, so this names "
                "what a simulation runs on")


def strategies(kinds: tuple[str, ...]) -> str:
    """capacity --strategies' help: every name variants.variant accepts."""
    return (f"prefill_first, chunked_<tokens>, pdmux_<kind> (SGLang's levels), pdmux_slo_<kind> "
            f"(levels for --itl-slo-ms), disagg_<P>p<D>d (P prefill and D decode servers, KV "
            f"pages sent over --link; simulated only); kind {' or '.join(kinds)}")


def parser_texts(name: str) -> dict[str, str]:
    """`add_parser` keywords of a subcommand: its help, description and example epilog."""
    help, description, example = COMMANDS[name]
    return {"help": help, "description": description, "epilog": f"example:\n  {example}"}
