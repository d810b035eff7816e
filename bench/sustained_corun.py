"""A PD-mux level's prefill beside its decode for seconds on end, against the short burst the
comparison times: whether a prefill that runs on is slower, and whether the clocks say why.

`compare-h200.json` prices each level's prefill from ~60 ms of two layers beside the decode,
after the GPU idled; served PD-mux batches ran slower than that price at every level, at one
per-SM rate, and layer launches that followed an idle prefill stream ran 4-6% faster than those
in a busy one (bench/NOTES.md, session 29). So at each level (grid cap) and for each prefill
batch (`--batches`: one 8192-token prompt; 12288 tokens in 9 prompts of ~1.4K, as Azure's
conversation batches form) this times two prefill layers:
- burst: after a second of idle GPU, as the comparison does (`time_corun`, ~60 ms);
- sustained: back to back for `--seconds` with the decode step replayed the whole time;
- sustained alone: back to back for `--seconds`, nothing beside;
- busy a share of the time (`--busy-shares`): beside the decode, each call followed by an idle
  gap, to find how busy a prefill must be before the clocks fall (the simulator blends the
  burst and sustained rates by the share of the last half second a split prefill ran);
beside a decode, the decode step too (each replay's mean step while the prefills ran);
each call of the sustained runs timed with CUDA events (the first half second's and the last
two seconds' medians kept beside the whole series), with the SM clock, the power draw and the
clock-event (throttle) reasons sampled by NVML every 20 ms. A prefill's rate is also read as
its MFU per SM (its FLOPs against the bf16 peak of its share of the SMs), the unit the served
runs' fit uses. Writes <out>/sustained-corun-<gpu>.json (saved after each level) and prints a
table.

    python bench/sustained_corun.py --out bench/results
    python bench/sustained_corun.py --levels 80 --batches 8192x1 --seconds 3 --out /tmp/s
    python bench/sustained_corun.py --batches 12288x9 --seconds 4 --busy-shares 0.3,0.6,0.8
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from common import MODEL, Results, require_gpu
from script import bench_parser, run_script

from pdmux_triton.cli.parsing import integer, listed, number
from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.streams import PartitionStreams
from pdmux_triton.measure.clocks import Clocks
from pdmux_triton.measure.timing import Repeated, runs_for, time_alone, time_corun
from pdmux_triton.measure.workloads import DecodeStep, PrefillLayers
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.partition import for_level
from pdmux_triton.spec.gpus import detect_gpu

LEVELS = (72, 96, 112)  # prefill SMs of SGLang's levels on the H200 (60, 36, 20 for decode)
BATCHES = ((8192, 1), (12288, 9))  # (tokens, prompts)
DECODE_BATCH, DECODE_CONTEXT = 32, 2048
LAYERS = 2
FIRST_S, LAST_S = 0.5, 2.0  # the windows of a sustained series compared


def sustained(prefill, pbud, pstream, seconds: float, p_ms: float, decode=None,
              share: float = 1.0) -> dict:
    """Prefill calls for about `seconds` (calls of `p_ms` each, as estimated), back to back
    or, with `share` < 1, each followed by an idle gap (the host waits for the call, then
    sleeps) so the prefill stream is busy that share of the time; the decode graph replayed
    beside them the whole time when given ((Repeated, its ms a replay)). Returns each call's
    start (s from the first) and ms, from its own start event (the gap before it not in it;
    only calls that ended while the decode still ran count as beside it) and, beside a
    decode, each replay's mean step ms while the prefills ran."""
    calls = max(4, math.ceil(seconds * share * 1e3 / p_ms))
    gap_s = p_ms / 1e3 * (1 - share) / share
    t0 = torch.cuda.Event(enable_timing=True)
    starts, marks = ([torch.cuda.Event(enable_timing=True) for _ in range(calls)]
                     for _ in range(2))
    torch.cuda.synchronize()
    host0 = time.perf_counter()
    t0.record(pstream)
    decode_marks = []
    if decode is not None:
        replays, replay_ms = decode
        replays.stream.wait_event(t0)
        for _ in range(math.ceil(1.5 * seconds * 1e3 / replay_ms) + 1):  # past the prefills
            replays.launch()
            decode_marks.append(torch.cuda.Event(enable_timing=True))
            decode_marks[-1].record(replays.stream)
    with torch.cuda.stream(pstream):
        for i in range(calls):
            starts[i].record(pstream)
            prefill.run(pbud)
            marks[i].record(pstream)
            if share < 1:
                marks[i].synchronize()
                time.sleep(gap_s)
    torch.cuda.synchronize()
    host1 = time.perf_counter()
    ends = [t0.elapsed_time(m) for m in marks]
    began = [t0.elapsed_time(m) for m in starts]
    replay_ends = [t0.elapsed_time(m) for m in decode_marks]
    covered_ms = replay_ends[-1] if replay_ends else math.inf
    series = [(began[i] / 1e3, ends[i] - began[i]) for i in range(calls)
              if ends[i] <= covered_ms]
    steps = [(b - a) / replays.runs for a, b in zip([0.0] + replay_ends, replay_ends)
             if b <= ends[-1]] if decode is not None else []
    return {"series": series, "host": (host0, host1), "calls": calls,
            "covered_calls": len(series), "decode_step_ms": steps, "gap_ms": gap_s * 1e3}


def summary(series: list[tuple[float, float]]) -> dict:
    """Median ms per call: all of it, its first FIRST_S seconds, its last LAST_S seconds."""
    if not series:
        return {"ms_median": None}
    end = series[-1][0] + series[-1][1] / 1e3
    first = [ms for t, ms in series if t < FIRST_S]
    last = [ms for t, ms in series if t >= end - LAST_S]
    return {"ms_median": statistics.median(ms for _, ms in series),
            "ms_first_median": statistics.median(first) if first else None,
            "ms_last_median": statistics.median(last) if last else None,
            "seconds": end}


def mfu_per_sm(flops: float, ms: float | None, sms: int, gpu) -> float | None:
    """A call's FLOPs against the bf16 peak of `sms` of the GPU's SMs."""
    if ms is None:
        return None
    return flops / (ms / 1e3) / (gpu.bf16_tflops * 1e12 * sms / gpu.sms)


def decode_steps(run: dict, alone_ms: float) -> dict:
    """The decode step beside a sustained run (the median of its replays' mean steps) and
    alone (a captured replay on the level's decode SMs, nothing beside it)."""
    steps = run["decode_step_ms"]
    return {"decode_step_ms_median": statistics.median(steps) if steps else None,
            "decode_step_ms_alone": alone_ms}


def measure_level(res: Results, gpu, level, decode: DecodeStep, prefills: dict, clocks: Clocks,
                  seconds: float, shares: tuple[float, ...]) -> None:
    with PartitionStreams.open(for_level(level, "grid_cap", gpu.sms)) as part:
        dbud, pbud = part.decode_budget, part.prefill_budget

        def run_decode():
            decode.run(dbud)
        d_alone = time_alone(run_decode, part.decode_stream, graph=True)
        replays = Repeated(run_decode, part.decode_stream, runs_for(d_alone, 200.0), True)
        for (tokens, prompts), prefill in prefills.items():
            def run_prefill():
                prefill.run(pbud)
            p_alone = time_alone(run_prefill, part.prefill_stream, graph=False, repeats=1)
            time.sleep(1.0)  # the GPU idle first, as before the comparison's reading
            h0 = time.perf_counter()
            burst = time_corun(run_prefill, part.prefill_stream, False, p_alone, run_decode,
                               part.decode_stream, True, d_alone, target_ms=60)
            rows = {"burst": ({"ms_median": burst.ms, "covered": burst.covered},
                              (h0, time.perf_counter()))}
            co = sustained(prefill, pbud, part.prefill_stream, seconds, burst.ms,
                           (replays, replays.runs * d_alone))
            rows["sustained beside decode"] = ({**summary(co["series"]),
                                                "calls_beside_decode": co["covered_calls"],
                                                "calls": co["calls"],
                                                **decode_steps(co, d_alone)}, co["host"])
            alone = sustained(prefill, pbud, part.prefill_stream, seconds, p_alone)
            rows["sustained alone"] = (summary(alone["series"]), alone["host"])
            for share in shares:  # busy part of the time: where the clocks start to fall
                time.sleep(1.0)
                part_busy = sustained(prefill, pbud, part.prefill_stream, seconds, burst.ms,
                                      (replays, replays.runs * d_alone), share)
                rows[f"busy {share:.2f} beside decode"] = (
                    {**summary(part_busy["series"]), "busy_share": share,
                     "idle_gap_ms": part_busy["gap_ms"],
                     "calls_beside_decode": part_busy["covered_calls"],
                     **decode_steps(part_busy, d_alone)}, part_busy["host"])
                res.data["curves"][f"{level[0]}/{level[1]} {tokens}x{prompts} busy {share:.2f}"] \
                    = {"beside_decode": part_busy["series"]}
            for mode, (figures, (t0, t1)) in rows.items():
                res.row(level=f"{level[0]}/{level[1]}", prefill_sms=level[0], tokens=tokens,
                        prompts=prompts, mode=mode, **figures,
                        mfu_per_sm=mfu_per_sm(prefill.amount, figures["ms_median"], level[0],
                                              gpu),
                        mfu_per_sm_last=mfu_per_sm(prefill.amount, figures.get("ms_last_median"),
                                                   level[0], gpu),
                        **clocks.between(t0, t1))
            res.data["curves"][f"{level[0]}/{level[1]} {tokens}x{prompts}"] = {
                "beside_decode": co["series"], "alone": alone["series"]}
    res.save()


def table(data: dict) -> str:
    lines = [f"{'level':<8} {'batch':<10} {'mode':<24} {'ms':>7} {'first':>7} {'last':>7} "
             f"{'MFU/SM':>7} {'MHz':>6} {'W':>5} {'decode':>7}"]

    def cell(v, spec):
        return "-" if v is None else format(v, spec)
    for r in data["rows"]:
        lines.append(f"{r['level']:<8} {str(r['tokens']) + 'x' + str(r['prompts']):<10} "
                     f"{r['mode']:<24} {cell(r['ms_median'], '7.2f')} "
                     f"{cell(r.get('ms_first_median'), '7.2f')} "
                     f"{cell(r.get('ms_last_median'), '7.2f')} {cell(r['mfu_per_sm'], '7.3f')} "
                     f"{cell(r.get('sm_clock_mhz_median'), '6.0f')} "
                     f"{cell(r.get('power_w_median'), '5.0f')} "
                     f"{cell(r.get('decode_step_ms_median'), '7.2f')}")
    return "\n".join(lines)


def batch_list(text: str) -> tuple[tuple[int, int], ...]:
    """TOKENSxPROMPTS,... (e.g. 8192x1,12288x9)."""
    out = []
    for item in text.split(","):
        try:
            tokens, prompts = (int(v) for v in item.split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--batches takes TOKENSxPROMPTS separated by commas, got {text!r}") from None
        if not 1 <= prompts <= tokens <= 65536:
            raise argparse.ArgumentTypeError(
                f"a batch is 1..65536 tokens in 1..tokens prompts, got {item!r}")
        out.append((tokens, prompts))
    return tuple(out)


def run(args) -> int:
    require_gpu("bench/sustained_corun.py")
    gpu = detect_gpu()
    groups = {p: (p, d) for p, d in sglang_rules.stream_groups(gpu.sms, gpu.cc_major)[1:-1]}
    unknown = [p for p in args.levels if p not in groups]
    if unknown:
        raise PdmuxError(f"--levels {unknown[0]} is not a level's prefill SMs on this GPU; its "
                         f"levels have {', '.join(map(str, sorted(groups)))}")
    res = Results(Path(args.out) / f"sustained-corun-{gpu.name}.json", gpu.name)
    res.data["inputs"] = {"levels": list(args.levels), "batches": [list(b) for b in args.batches],
                          "seconds": args.seconds, "busy_shares": list(args.busy_shares),
                          "layers": LAYERS,
                          "decode": {"batch": DECODE_BATCH, "context": DECODE_CONTEXT},
                          "model": MODEL.name, "kind": "grid_cap"}
    decode = DecodeStep(MODEL, DECODE_BATCH, DECODE_CONTEXT)
    prefills = {b: PrefillLayers(MODEL, b[0], layers=LAYERS, prompts=b[1]) for b in args.batches}
    with Clocks() as clocks:
        res.data["nvml"] = clocks.why or "sampled"
        for p in args.levels:
            measure_level(res, gpu, groups[p], decode, prefills, clocks, args.seconds,
                          args.busy_shares)
    print(table(res.data))
    print(f"wrote {res.path}")
    return 0


def main(argv=None) -> int:
    p = bench_parser("sustained_corun.py", __doc__)
    p.add_argument("--levels", type=listed(integer(1, 10000), "level"), default=LEVELS,
                   help="the levels, by their prefill SMs")
    p.add_argument("--batches", type=batch_list, default=BATCHES)
    p.add_argument("--seconds", type=number(0.5, 60.0, above=False), default=5.0,
                   help="how long each sustained run lasts")
    p.add_argument("--busy-shares", type=listed(number(0.05, 0.95, above=False), "share"),
                   default=(), help="also run each level's prefill busy only this share of the "
                   "time beside decode (idle gaps between its calls), e.g. 0.3,0.6,0.8")
    return run_script(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
