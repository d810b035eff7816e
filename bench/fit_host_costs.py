"""Fits what the simulator's cost model lacks to measurements of this tool's executor, and adds
it to a host-costs file (bench/host_costs.py's):

- eager_step: the host's fixed cost of an eager step (its batch made and uploaded, its tokens
  read back), as pd-mux pays it before each prefill: the median chunked round of the smallest
  chunk size less its layers' launches;
- decode_step_extra: per batch size, a captured decode step's GPU time (the file's decode
  rounds) beyond its bytes at the calibration's whole-GPU rate alone;
- mixed_step: a chunked-prefill step's fixed cost and the MFU of its padded decode-row
  attention (`step_cost.MixedStepFit`), by least squares over every chunked round of a measured
  run, its other phases taken from the calibration and the comparison.

The run is `pdmux-triton run --workload stream` measured on the GPU; each round's decode
context is read from it (or, in runs saved before rounds recorded it, replayed from its
requests). Prints each fit and the mixed step's error over the rounds.

    python bench/fit_host_costs.py bench/results/stream-h200.json bench/results/host-costs-h200.json \\
        --calibration bench/results/calibrate-h200.json --compare bench/results/compare-h200.json
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

import numpy as np
from script import run_script

from pdmux_triton.cli.parsing import Parser
from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_calibration, load_compare, load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments.settings import RunSettings, make_requests
from pdmux_triton.results import read_json, write_json

CHUNK = re.compile(r"chunk (\d+)\+(\d+)")
# bench/host_costs.py's decode rounds: 512-token prompts, 30 steps (files before it said so)
HOST_COSTS_DECODE_CONTEXT = 512 + 15


def round_contexts(run: dict, strategy: str) -> list[int]:
    """Each round's decode context: as recorded, or replayed from the run's requests (FCFS
    prompts, chunk by chunk; every request decodes one token a round until its output ends)."""
    details = run["details"][strategy]
    rounds = details["rounds"]
    if "rounds_total" in details:  # the file keeps the first rounds only
        raise PdmuxError(f"{strategy}: the run file keeps {len(rounds):,} of its "
                         f"{details['rounds_total']:,} rounds; fit to a shorter run")
    if all("decode_context" in r for r in rounds):
        return [r["decode_context"] for r in rounds]
    queue = sorted(make_requests(RunSettings.from_dict(run["inputs"])), key=lambda r: r.arrival)
    prompt, decoding, out = None, [], []  # decoding: [request, tokens out]
    for i, r in enumerate(rounds):
        if r["decode_bs"] != len(decoding):
            raise PdmuxError(f"{strategy} round {i}: {r['decode_bs']} decoding, the replay has "
                             f"{len(decoding)}: the run's requests cannot be replayed")
        out.append(sum(q.prompt_len + n for q, n in decoding))
        joined = None
        if (m := CHUNK.fullmatch(r["prefill"])) is not None:
            start, n = map(int, m.groups())
            if start == 0:
                prompt = queue.pop(0)
            if start + n == prompt.prompt_len:
                joined, prompt = prompt, None
        decoding = [[q, n + 1] for q, n in decoding if n + 1 < q.output_len]
        if joined is not None and joined.output_len > 1:
            decoding.append([joined, 1])
    return out


def chunk_rounds(run: dict) -> list[dict]:
    """Every chunked round of the run's chunked strategies: its chunk, prefix, decode batch and
    context, and its measured seconds."""
    rows = []
    for name in run["details"]:
        if not name.startswith("chunked_"):
            continue
        for r, held in zip(run["details"][name]["rounds"], round_contexts(run, name)):
            if (m := CHUNK.fullmatch(r["prefill"])) is not None:
                rows.append({"prefix": int(m.group(1)), "chunk": int(m.group(2)),
                             "batch": r["decode_bs"], "context": held,
                             "seconds": r["end_s"] - r["start_s"]})
    if not rows:
        raise PdmuxError("the run has no chunked rounds: measure a stream with --chunks")
    return rows


def fit_mixed(rows, model, decode, prefill, total_sms, tile) -> tuple[step_cost.MixedStepFit, dict]:
    """Least squares of measured = fixed + (compute + read) + row tiles' FLOPs / (peak x MFU)."""
    base = np.array([step_cost.mixed_step_s(model, decode, prefill, total_sms, r["context"],
                                            r["batch"], r["chunk"], r["prefix"], samples_chunk=0,
                                            phases=step_cost.MixedStepFit(0.0, 1.0)) for r in rows])
    tiles = np.array([step_cost.decode_row_attention_flops(model, r["context"], tile)
                      for r in rows]) / (prefill.peak_tflops * 1e12)
    measured = np.array([r["seconds"] for r in rows])
    (fixed, inverse), *_ = np.linalg.lstsq(np.vstack([np.ones_like(tiles), tiles]).T,
                                           measured - base, rcond=None)
    if not (fixed >= 0 and inverse >= 1):
        raise PdmuxError(f"the mixed-step fit is unphysical (fixed {fixed * 1e3:.2f} ms, decode "
                         f"rows at {1 / inverse if inverse else float('inf'):.2f} of peak)")
    fit = step_cost.MixedStepFit(float(fixed), float(1 / inverse))
    error = np.abs(fixed + base + tiles * inverse - measured) / measured
    return fit, {"rounds": len(rows), "median_abs_error": float(np.median(error)),
                 "p90_abs_error": float(np.percentile(error, 90))}


def main(argv=None) -> int:
    p = Parser(prog="bench/fit_host_costs.py", description=__doc__.splitlines()[0])
    p.add_argument("run", help="a measured stream run (run-<gpu>.json)")
    p.add_argument("host_costs", help="bench/host_costs.py's file, updated in place")
    p.add_argument("--calibration", required=True)
    p.add_argument("--compare", required=True)
    return run_script(p, fit)


def fit(args) -> int:
    run, host = read_json(args.run, "run result"), read_json(args.host_costs, "host-costs file")
    if not isinstance(run.get("inputs"), dict) or not isinstance(run.get("details"), dict):
        raise PdmuxError(f"{args.run} holds no inputs and rounds of a run (made by "
                         f"`pdmux-triton run --out`)")
    settings = RunSettings.from_dict(run["inputs"])
    gpu, model = settings.gpu, settings.model
    if settings.simulate:
        raise PdmuxError(f"{args.run} is a simulation: fit to a run measured on the GPU")
    decode = load_calibration(args.calibration, gpu.name).decode_curve("grid_cap")
    prefill = load_compare(args.compare, gpu.name).prefill_rate("grid_cap", gpu.bf16_tflops,
                                                               gpu.sms)
    overheads = load_host_costs(args.host_costs, gpu.name)
    source = f"{Path(args.run).name} with {Path(args.calibration).name}, {Path(args.compare).name}"

    chunk = min(settings.chunks)
    small = [r["end_s"] - r["start_s"]
             for r in run["details"].get(f"chunked_{chunk}", {}).get("rounds", [])
             if r["prefill"].startswith("chunk")]
    if not small:
        raise PdmuxError(f"{args.run} has no chunked_{chunk} rounds: measure a stream with "
                         f"--chunks")
    step = statistics.median(small) - model.layers * overheads.layer_launch_s
    host["eager_step"] = {"seconds": step, "source": f"{Path(args.run).name}: median "
                          f"chunked_{chunk} round ({statistics.median(small) * 1e3:.2f} ms) "
                          f"less {model.layers} layer launches", "rounds": len(small)}

    host["decode_step_extra"] = [
        {"batch": r["batch"], "extra_s": r["gpu_s"] - step_cost.decode_step_s(
            model, decode, r["batch"] * r.get("context", HOST_COSTS_DECODE_CONTEXT),
            gpu.sms, False, r["batch"])} for r in host["decode_round"]]

    mixed, quality = fit_mixed(chunk_rounds(run), model, decode, prefill, gpu.sms,
                               overheads.decode_row_tile)
    host["mixed_step"] = {"fixed_s": mixed.fixed_s, "decode_row_mfu": mixed.decode_row_mfu,
                          "source": source, **quality}
    write_json(args.host_costs, host)
    print(f"eager step {step * 1e3:.2f} ms")
    print("decode step beyond its bytes: " + ", ".join(
        f"batch {r['batch']} {r['extra_s'] * 1e3:+.2f} ms" for r in host["decode_step_extra"]))
    print(f"mixed step: fixed {mixed.fixed_s * 1e3:.2f} ms, decode rows at "
          f"{mixed.decode_row_mfu:.2f} of peak; over {quality['rounds']} rounds |error| median "
          f"{quality['median_abs_error']:.1%}, p90 {quality['p90_abs_error']:.1%}")
    print(f"wrote {args.host_costs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
