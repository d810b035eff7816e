"""Fits what the simulator's cost model lacks to measurements of this tool's executor, and adds
it to a host-costs file (`calibrate --host-costs`'s):

- eager_step: the host's fixed cost of an eager step (its batch made and uploaded, its tokens
  read back), as a whole-GPU prefill batch pays it too: the median chunked round of the
  smallest chunk size bound by its launches less those launches; fitted in turn with the
  whole-GPU MFU and the mixed step (which tells the rounds bound by their launches) until the
  MFU is read with the step the file holds;
- prefill_batch: a split prefill's batch made and uploaded before its layers launch: the
  median time from a pd-mux batch taken to its first layers' round, over the batches of
  split levels;
- decode_round_served: the host's share of a served decode round (its wall less its step's
  GPU time, in rounds that launched nothing else), fixed + per request + per token of KV
  + more at a level that splits the GPU (there a decode-only round also polls the prefill's
  batch or finishes it; the rounds that launch layers are not fitted, and the simulator charges
  them the same), by least absolute deviations over every such round;
- decode_step_extra: per captured size, a decode step's GPU time beyond its bytes at the
  calibration's whole-GPU rate alone and its batch term: the median over the served
  whole-GPU steps where each size holds enough, else from the file's captured decode rounds;
- mixed_step: a chunked-prefill step's fixed cost (`step_cost.MixedStepFit`), by least squares
  over every chunked round measured, each priced as it ran (a round saved before a mixed
  step's decode rows left the extend kernel with them in its tiles, the batch's context
  shared evenly: `MixedStepFit.decode_rows_in_extend`); a round lasts that cost
  and its layers as the host launches them and the GPU runs them
  (`step_cost.layer_pipeline_s`). Its GPU phases are priced by the kernels' tiles
  (`step_cost.TileTimes`: GEMM waves, the extend attention's tiles, a layer's other kernels
  per token), fitted first to the captured kernel benchmarks of bench/prefill_rate.py
  (`--prefill-rate`, the whole GPU's rows), and the decode rows' KV read at the decode rate;
- split_prefill_sustained: what each level's prefill keeps of the comparison's burst rate when
  it runs on beside its decode (`--sustained`, bench/sustained_corun.py's file: the sustained
  run's median call over the burst, the mean over its batches), since served PD-mux prefills
  run on for seconds at the clocks a GPU under sustained power holds; with `--busy` (a
  sustained_corun.py file with `--busy-shares` rows), how far toward that rate a prefill busy
  a share of the time has slowed (`slowdown_by_busy_share`: the clocks hold while it idles
  often enough);
- split_prefill_served: what each level's prefill keeps of the comparison's burst rate as
  served on a busy GPU (bench/split_batches.py: grid-capped pd-mux's large batches after
  their prefill was busy, each batch's co-run price over its compute span, the median by
  prefill SMs at the levels holding enough batches), which prices the split prefill instead of the
  sustained bench's ratios (read between the levels fitted and held beyond them, as those
  are): the bench runs one long prompt, served batches many; with them, the GPU time each
  layer takes beyond that rate (`layer_s`, fitted on the batches under 4096 tokens in turns
  with the ratios: split_batches.joint_fit), which every kind's split prefill pays;
- decode_beside_prefill: the decode step beside a split prefill as served over its co-run
  price (the calibration's, with the extras above), by the prefill's busy share over the
  half second before it: medians in busy-share bins (bench/corun_rounds.py's rounds) over the
  grid-capped pd-mux points that kept their launches' spans (trace_fidelity's); the co-run
  calibration is timed at clocks the served rounds hold only part of the time;
- by_kind: the two entries above again for each other partition kind (OTHER_KINDS: green
  contexts), fitted on that kind's pd-mux points alone where they allow it: a green
  context's split prefill keeps less of its own burst rate than a capped grid's, and its
  decode beside it runs at another ratio; the top-level entries are the grid cap's. Where
  its large batches are too few to read two levels apart but enough in all, its split
  prefill is the grid cap's levels scaled by the median of its batches' ratios over the grid
  cap's at their SMs (split_batches.scaled_levels);
- whole_gpu_prefill: the MFU at which prefill-first's prefill batches bound by their GPU were
  served (each batch's FLOPs over its span less its eager step), where the measurements hold
  them (trace_fidelity's points): the comparison times prefill alone on at most its levels'
  prefill SMs, so the whole GPU is otherwise priced at its largest level's MFU.

The rounds come from a measured `pdmux-triton run --workload stream` (its rounds' decode
context read from it or, in runs saved before rounds recorded it, replayed from its requests)
or from bench/trace_fidelity.py's measured points or a measured capacity folder's diagnostics
(each run's rounds and the speeds its host launched a launch's first eager layer and each
later one at, which replays the first's launches; a run measured before replays launched every
layer as the first); several files are pooled (fit on the traces, not on one window). Host
times are put in the file's host (its first eager layer's launch time): a run on a host that
launched k times slower paid k times its fixed costs, as `Overheads.on_host` prices it (except
a mixed step's).
Prints each fit and the mixed step's error over the rounds.

    python bench/fit_host_costs.py bench/results/trace-fidelity/points-h200.jsonl \\
        bench/results/capacity-diagnostics-h200.jsonl \\
        bench/results/capacity-conv/capacity-diagnostics-h200.jsonl \\
        bench/results/host-costs-h200.json --calibration bench/results/calibrate-h200.json \\
        --compare bench/results/compare-h200.json \\
        --sustained bench/results/sustained-corun-h200.json \\
        --busy bench/results/sustained-busy-h200.json
"""

from __future__ import annotations

import re
import sys
from bisect import bisect_left
from dataclasses import replace
from pathlib import Path

import numpy as np
from script import run_script

from pdmux_triton.cli.parsing import Parser
from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import host_costs_from, load_calibration, load_compare
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments.settings import RunSettings, make_requests
from pdmux_triton.results import PointStore, read_json, write_json
from pdmux_triton.serve.metrics import later_layer_s, rows_in_extend_tiles
from pdmux_triton.serve.simulated import SUSTAINED_WINDOW_S
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import ModelSpec, model_preset

CHUNK = re.compile(r"chunk (\d+)\+(\d+)")
# bench/prefill_rate.py's files by GPU: eager GEMM rows and captured layers (H200: sessions
# 24, 27, 28; H100: session 49)
PREFILL_RATE = {"h200": ("bench/results/prefill-rate-h200.json",
                         "bench/results/prefill-rate-long-h200.json",
                         "bench/results/prefill-rate-budgets-h200.json"),
                "h100-sxm": ("bench/results/prefill-rate-h100-sxm.json",)}
# the shortest launches a tile time is fitted to: a GEMM's (64-row tiles from 65 rows, 128 from
# 257) and a captured layer's (shorter ones run their o and down GEMMs on the skinny schedule,
# which whole waves do not describe)
GEMM_MIN_TOKENS, LAYER_MIN_TOKENS = 256, 512
MIN_PREFILLS = 10  # GPU-bound prefill batches a whole-GPU MFU is fitted to, at the fewest
JOINT_FIT_ROUNDS = 20  # the prefill MFU, mixed step and eager step refitted in turn, at the most
MIN_BUSY_BATCHES = 20  # of them in a busy-share bin for its ratio to be kept
GPU_BOUND_MARGIN = 2  # a batch whose GPU time is this many times its launches is bound by it
MIN_ROUNDS = 100  # served decode rounds a round's host share is fitted to, at the fewest
# served whole-GPU steps of one captured size its extra is read from, at the fewest (a size's
# median mixes contexts; the GPU's step is not monotonic in rows: a whole 128-row tile)
MIN_STEPS = 100
WHOLE_GPU_LOOPS = ("prefill_first", "chunked_")  # strategies whose decode has every SM
# partition kinds whose split levels are fitted apart from the grid cap's (`by_kind`)
OTHER_KINDS = ("green",)
# what it fits to served runs (split_prefill_sustained, which it also adds, is carried from a
# measurement of its own: a held-out judgement keeps it)
FITTED = ("eager_step", "decode_step_extra", "whole_gpu_prefill", "mixed_step",
          "decode_beside_prefill", "decode_round_served", "prefill_batch", "split_prefill_served",
          "by_kind")
# calibrate --host-costs' decode rounds: 512-token prompts, 30 steps (files before it said so)
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


def chunk_rounds(run: dict, host_s: float) -> list[dict]:
    """Every chunked round of a stream run's chunked strategies: its chunk, prefix, decode batch
    and context, whether its decode rows ran in the extend kernel's tiles (`extend_rows`: a run
    saved before they left it, `rows_in_extend_tiles`), its measured seconds, and the
    host's launch time of a launch's first eager layer (the run's where its rows timed
    it, else `host_s`) and of each later one (`later_s`, the run's; None: every layer as the
    first, a run measured before replays)."""
    timed = {row["strategy"]: (row.get("host_layer_p50_ms"), row.get("host_later_layer_p50_ms"))
             for row in run.get("rows", [])}
    rows = []
    for name in run["details"]:
        if not name.startswith("chunked_"):
            continue
        before = rows_in_extend_tiles(name, run["details"][name])
        first_ms, later_ms = timed.get(name, (None, None))
        host = first_ms / 1e3 if first_ms else host_s
        later = later_ms / 1e3 if first_ms and later_ms else None
        for r, held in zip(run["details"][name]["rounds"], round_contexts(run, name)):
            if (m := CHUNK.fullmatch(r["prefill"])) is not None:
                rows.append({"size": int(name.split("_")[1]), "prefix": int(m.group(1)),
                             "chunk": int(m.group(2)), "batch": r["decode_bs"], "context": held,
                             "extend_rows": before, "seconds": r["end_s"] - r["start_s"],
                             "host_s": host, "later_s": later})
    return rows


CAPACITY_DIAGNOSTICS = "capacity-diagnostics-"  # a capacity folder's (`capacity.open_diagnostics`)


def capacity_settings(path: Path) -> tuple:
    """(GPU, model, saved settings) of the capacity folder a diagnostics file is in."""
    from pdmux_triton.experiments.capacity import measured_gpu

    name = path.stem.removeprefix(CAPACITY_DIAGNOSTICS)
    saved = read_json(path.with_name(f"capacity-settings-{name}.json"), "capacity settings")
    return measured_gpu(path.parent, name), ModelSpec(**saved["model"]), saved


def timed_points(path: str) -> list[tuple[dict, float]]:
    """Measured points whose run timed its host, each ({"strategy", "diagnostics"}, the host's
    launch time per eager layer): bench/trace_fidelity.py's points, or a capacity folder's
    diagnostics (`pdmux-triton capacity` measured on a GPU)."""
    if Path(path).name.startswith(CAPACITY_DIAGNOSTICS):
        from pdmux_triton.experiments.capacity import PointKey

        points = [{"strategy": d["strategy"], "diagnostics": d}
                  for d in PointStore(path, PointKey).points.values()]
    else:
        from trace_fidelity import Key

        points = list(PointStore(path, Key).points.values())
    timed = [(p, p["diagnostics"]["host_layer_us"] / 1e6) for p in points
             if p.get("diagnostics", {}).get("host_layer_us")]
    if not timed:
        raise PdmuxError(f"{path} holds no measured point whose run timed its host: measure "
                         f"with bench/trace_fidelity.py or `pdmux-triton capacity` on a GPU")
    return timed


def fidelity_rounds(points: list[tuple[dict, float]]) -> list[dict]:
    """Every chunked round of the points (`timed_points`), as `chunk_rounds` gives them, each
    with the launch times its run's host timed."""
    rows = []
    for point, host in points:
        if not point["strategy"].startswith("chunked_"):
            continue
        before = rows_in_extend_tiles(point["strategy"], point["diagnostics"])
        r = point["diagnostics"]["rounds"]
        for start, end, label, batch, held in zip(r["start_us"], r["end_us"], r["label"],
                                                  r["decode_bs"], r["decode_context"]):
            if (m := CHUNK.fullmatch(r["labels"][label])) is not None:
                rows.append({"size": int(point["strategy"].split("_")[1]),
                             "prefix": int(m.group(1)), "chunk": int(m.group(2)),
                             "batch": batch, "context": held, "extend_rows": before,
                             "seconds": (end - start) / 1e6,
                             "host_s": host, "later_s": later_layer_s(point["diagnostics"])})
    return rows


def fidelity_prefills(points: list[tuple[dict, float]], requests_of=None) -> list[dict]:
    """Each prefill-first batch of the points (`timed_points`): its prompts, tokens, each
    prompt's (new, cached) tokens (`seqs`), span, the host's launch times (a launch's first
    layer, each later one), and the share of the `SUSTAINED_WINDOW_S` that ends with it that
    its run's batches took (`busy`, its own span included), as the simulator reads it. A
    point keeps a batch's totals only: its prompts are the run's requests taken in arrival
    order (`requests_of(point)`: the requests it served, made again), or, where those do not
    add up or a prefix was cached, its tokens shared evenly (uneven prompts attend over more
    than even ones)."""
    from corun_rounds import covered_s  # it reads rounds with this file's helpers
    from trace_fidelity import taken_batches

    rows = []
    for point, host in points:
        if point["strategy"] != "prefill_first":
            continue
        batches, taken = taken_batches(point["diagnostics"],
                                       requests_of(point) if requests_of else None)
        # one after another on the whole GPU: sorted, disjoint
        spans = np.array([(start / 1e6, end / 1e6) for end, (start, *_) in batches])
        for i, (end, (start, tokens, prompts, cached)) in enumerate(batches):
            seqs = ([(q.prompt_len, 0) for q in taken[i]] if taken and not cached else
                    [(tokens // prompts, cached // prompts)] * prompts)
            ran = covered_s(spans, end / 1e6 - SUSTAINED_WINDOW_S, end / 1e6)
            rows.append({"tokens": tokens, "prompts": prompts, "cached": cached, "seqs": seqs,
                         "seconds": (end - start) / 1e6, "host_s": host,
                         "later_s": later_layer_s(point["diagnostics"]),
                         "busy": min(1.0, ran / SUSTAINED_WINDOW_S)})
    return rows


def decode_steps(points: list[tuple[dict, float]]):
    """Every decode step of the points (`timed_points`), matched to the round that launched
    it, as (point, its host's launch time, the round's index, the step's GPU seconds): a
    round with requests decoding launches one, except chunked prefill's mixed rounds, which
    step decode in their forward; a point whose steps match neither count is refused."""
    from trace_fidelity import launched_rounds

    for point, host in points:
        launched = launched_rounds(point["diagnostics"], point["strategy"])
        for i, step in zip(launched, point["diagnostics"]["decode_step_us"]):
            yield point, host, i, step / 1e6


def served_decode_rounds(points: list[tuple[dict, float, object]]) -> list[dict]:
    """Every round of the points that stepped decode and launched nothing else (each point with
    its run's host launch time and its levels' (prefill SMs, decode SMs), as
    `corun_rounds.Pricer.sms` gives them): its requests, their KV, whether its level split the
    GPU, what it took beyond its decode step's GPU time (the host's share: inputs made and
    uploaded, tokens back, the loop's bookkeeping) and the run's host launch time."""
    rows = []
    for point, host, level_sms in points:
        r = point["diagnostics"]["rounds"]
        for _, _, i, step in decode_steps([(point, host)]):
            if r["labels"][r["label"][i]] == "":
                rows.append({"batch": r["decode_bs"][i], "context": r["decode_context"][i],
                             "split": level_sms(r["level"][i])[0] > 0, "host_s": host,
                             "seconds": (r["end_us"][i] - r["start_us"][i]) / 1e6 - step})
    return rows


def whole_gpu_decode_steps(points: list[tuple[dict, float]]) -> list[dict]:
    """Every decode step of the points (`timed_points`) of the loops that give decode the
    whole GPU (prefill-first, chunked prefill's decode-only rounds; pd-mux's split levels are
    the calibration's to price): its requests, their KV and its GPU time."""
    return [{"batch": point["diagnostics"]["rounds"]["decode_bs"][i],
             "context": point["diagnostics"]["rounds"]["decode_context"][i], "seconds": step}
            for point, _, i, step in decode_steps(points)
            if point["strategy"].startswith(WHOLE_GPU_LOOPS)]


def served_decode_extra(rows: list[dict], model, decode, sms: int) -> list[dict] | None:
    """Per captured size, the median served step less its bytes at the calibration's rate and
    the captured size's batch term (`step_cost.captured_decode_step_s`, as the simulator
    prices it): what `Overheads.decode_extra_s` adds, read from
    the steps themselves where each size holds MIN_STEPS of them. None with fewer than two such
    sizes (the captured rounds' four then stand)."""
    by_size: dict[int, list[float]] = {}
    for r in rows:
        by_size.setdefault(step_cost.padded_batch(r["batch"]), []).append(
            r["seconds"] - step_cost.captured_decode_step_s(model, decode, r["context"], sms,
                                                            False, r["batch"]))
    extra = [{"batch": size, "extra_s": float(np.median(left)), "steps": len(left)}
             for size, left in sorted(by_size.items()) if len(left) >= MIN_STEPS]
    return extra if len(extra) >= 2 else None


def fit_prefill_batch(points: list[tuple[dict, float, object]],
                      layer_launch_s: float) -> dict | None:
    """A split prefill batch made and uploaded before its layers launch, on a host launching
    an eager layer in `layer_launch_s`: over pd-mux's served batches (the points, each with
    its run's host launch time and its levels' (prefill SMs, decode SMs) by level, as
    `corun_rounds.Pricer.sms` gives them) whose first layers ran at a split level (a
    whole-GPU level's batch pays the eager step), the median time from the batch being taken
    to the start of the round that launches its first layers, each moved to that host (a
    level switch's drain is in it too, mostly none: both sides are idle when a batch is
    taken). None with fewer than MIN_PREFILLS batches."""
    gaps = []
    for point, host, level_sms in points:
        if not point["strategy"].startswith("pdmux"):
            continue
        d = point["diagnostics"]
        r = d["rounds"]
        firsts = [(start, level) for start, label, level in
                  zip(r["start_us"], r["label"], r["level"])
                  if r["labels"][label].startswith("layers 0-")]
        starts = [start for start, _ in firsts]
        for taken in sorted({batch[0] for batch in d["prefills"]}):
            i = bisect_left(starts, taken)
            if i < len(firsts) and level_sms(firsts[i][1])[0] > 0:
                gaps.append((firsts[i][0] - taken) / 1e6 * layer_launch_s / host)
    if len(gaps) < MIN_PREFILLS:
        return None
    return {"seconds": float(np.median(gaps)), "batches": len(gaps)}


def fit_served_decode_round(rows: list[dict], layer_launch_s: float) -> dict | None:
    """The host's share of a served decode round on a host launching an eager layer in
    `layer_launch_s`: fixed + per request x batch + per KV token x context, + more at a level
    that splits the GPU where MIN_ROUNDS such rounds and MIN_ROUNDS others are there (else
    none: `split_s` left out, which prices as 0), each round moved to
    that host first (a run's host that launched k times slower paid k times). Least absolute
    deviations (iteratively reweighted least squares): a round the GPU or the collector
    stretched is an outlier, not a mean to follow. None with fewer than MIN_ROUNDS rounds or a
    single batch size."""
    if len(rows) < MIN_ROUNDS or len({r["batch"] for r in rows}) < 2:
        return None
    split = sum(r["split"] for r in rows)
    # (all split, the column is the constant one's: the fixed cost would be shared out blindly)
    columns = 4 if MIN_ROUNDS <= split <= len(rows) - MIN_ROUNDS else 3
    a = np.array([[1.0, r["batch"], r["context"], float(r["split"])][:columns] for r in rows])
    y = np.array([r["seconds"] * layer_launch_s / r["host_s"] for r in rows])
    scale = a.max(axis=0)  # columns of one size, for a well-conditioned solve
    w = np.ones(len(y))
    for _ in range(50):
        coef = np.linalg.lstsq(a / scale * w[:, None], y * w, rcond=None)[0] / scale
        w = 1 / np.sqrt(np.maximum(np.abs(y - a @ coef), 1e-6))
    coef = np.maximum(coef, 0.0)  # a term the rounds do not show costs nothing, not less
    error = np.abs(a @ coef - y)
    fit = {"fixed_s": float(coef[0]), "per_request_s": float(coef[1]),
           "per_kv_token_s": float(coef[2])}
    if columns == 4:
        fit["split_s"] = float(coef[3])
    return {**fit, "rounds": len(rows), "split_rounds": int(split),
            "median_abs_error_s": float(np.median(error))}


def fit_whole_gpu_prefill(rows, model, prefill, overheads,
                          tiles: step_cost.TileTimes | None = None) -> tuple[float, dict] | None:
    """Least squares (through 0) of a batch's span less its eager step (on the run's host) =
    its FLOPs / (peak x MFU), over the batches bound by their GPU at the fitted MFU (their
    layers take GPU_BOUND_MARGIN times their launches or longer), each over its prompts' own
    lengths (`fidelity_prefills`' seqs). Then each bound batch's GPU time over its price as the
    simulator makes it (the longer of the MFU's and, with `tiles`, its kernels' tiles), over
    the median of that ratio among batches within a factor of two of its tokens, by the busy
    share its row holds (`fidelity_prefills`): medians in `corun_rounds.BUSY` bins of
    MIN_BUSY_BATCHES or more (`ratio_by_busy_share`, where two bins hold that many).
    None where fewer than MIN_PREFILLS batches are bound by their GPU."""
    peak = prefill.peak_tflops * 1e12
    flops = np.array([step_cost.batch_flops(model, r["seqs"]) for r in rows]) / peak
    host = np.array([r["host_s"] for r in rows])
    launches = np.array([step_cost.launch_layers_s(model.layers, r["host_s"], r.get("later_s"))
                         for r in rows])
    gpu = np.array([r["seconds"] for r in rows]) - overheads.eager_step_s * host / \
        overheads.layer_launch_s
    mfu = prefill.mfu_at(prefill.total_sms, corun=False)
    bound = np.zeros(len(rows), dtype=bool)
    for _ in range(len(rows) + 1):  # the batches bound by their GPU at this MFU, then its MFU
        now = flops / mfu > GPU_BOUND_MARGIN * launches
        if now.sum() < MIN_PREFILLS:
            return None
        if (now == bound).all():
            break
        bound = now
        mfu = float((flops[bound] ** 2).sum() / (flops[bound] * gpu[bound]).sum())
        if not 0 < mfu <= 1:
            raise PdmuxError(f"the whole-GPU prefill fit is unphysical (MFU {mfu:.2f})")
    error = np.abs(flops[bound] / mfu - gpu[bound]) / gpu[bound]
    quality = {"batches": int(bound.sum()), "median_abs_error": float(np.median(error))}
    from corun_rounds import BUSY

    # a batch after decode rounds runs at higher clocks than one after prefills
    price = flops / mfu
    if tiles is not None:
        for i in np.flatnonzero(bound):  # (only the bound batches' ratios are read)
            r = rows[i]
            tiled = step_cost.tiled_layers_s(model, r["tokens"], r["seqs"], tiles,
                                             prefill.total_sms)
            price[i] = max(price[i], tiled or 0.0)  # None: the skinny tile's
    ratio = gpu[bound] / price[bound]
    # over the median of batches of about its size (within a factor of two in tokens): the
    # MFU prices long and short batches apart, so the busy share is read within a size
    size = np.floor(np.log2([r["tokens"] for r in rows]))[bound]
    for s in np.unique(size):
        ratio[size == s] /= np.median(ratio[size == s])
    busy = np.array([r.get("busy", np.nan) for r in rows])[bound]
    bins = np.digitize(busy, BUSY)
    kept = [b for b in np.unique(bins[np.isfinite(busy)])
            if ((bins == b) & np.isfinite(busy)).sum() >= MIN_BUSY_BATCHES]
    if len(kept) >= 2:  # one bin says nothing about the busy share
        quality["ratio_by_busy_share"] = [[float(np.median(busy[bins == b])),
                                           float(np.median(ratio[bins == b]))] for b in kept]
    return mfu, quality


def fit_tile_times(paths, model, programs: int) -> tuple[step_cost.TileTimes, dict]:
    """The eager forward's tile times (`step_cost.TileTimes`) on the whole GPU of `programs`
    SMs, from bench/prefill_rate.py's files: per tile shape a GEMM wave and a partial wave's
    share, by least squares (relative) over the eager GEMM rows of >= GEMM_MIN_TOKENS tokens
    whose tiles fill a wave (each problem's fastest over the files: an eager row's host launch
    can only slow it), the share held in [0, 1] (a whole wave where no row ends in a partial
    one); then least squares of each captured layer (whole prompts, batches, new tokens after a
    cached prefix; >= LAYER_MIN_TOKENS tokens) less its GEMM waves = the extend attention's
    busiest program's cached and new key steps, and the tokens' other kernels."""
    rows = [r for path in paths for r in read_json(path, "prefill-rate file")["rows"]]
    if any(model.name != read_json(path, "prefill-rate file")["inputs"].get("model", model.name)
           for path in paths):
        raise PdmuxError(f"the prefill-rate files were not all measured with {model.name}")
    named = dict(zip(("qkv", "o", "gate_up", "down"), step_cost.layer_gemms(model)))
    fastest: dict[tuple, float] = {}
    for r in rows:
        if r["section"] == "gemm" and r["tokens"] >= GEMM_MIN_TOKENS:
            key = (r["tokens"], r["shape"])
            fastest[key] = min(fastest.get(key, np.inf), r["ms"] / 1e3)
    per_tile: dict[tuple, list] = {}
    for (tokens, shape), seconds in fastest.items():
        tile, (n, k) = step_cost.gemm_tile(tokens), named[shape]
        count = -(-tokens // tile[0]) * -(-n // tile[1])
        if count >= programs:
            rest = count % programs
            # seconds = wave x (waves' K units) + wave x share x (1 - f) K units of the last
            per_tile.setdefault(tile, []).append(
                (count / programs * k / 4096, (1 - rest / programs) * k / 4096 if rest else 0.0,
                 seconds))
    if not per_tile:
        raise PdmuxError("the prefill-rate files hold no eager GEMM row that fills a wave")
    waves = []
    for tile, points in sorted(per_tile.items()):
        x, y = np.array([p[:2] for p in points]), np.array([p[2] for p in points])
        weights = 1 / y[:, None]  # relative errors
        (wave, tail), *_ = np.linalg.lstsq(x * weights, np.ones(len(y)), rcond=None)
        share = tail / wave if x[:, 1].any() else 1.0  # no partial wave measured: a whole one
        if not 0 <= share <= 1:  # a partial wave costs between nothing and a whole one
            share = min(1.0, max(0.0, share))
            column = x[:, 0] + share * x[:, 1]
            wave = float((column / y).sum() / (column * column / (y * y)).sum())
        waves.append((tile[0], tile[1], float(wave), float(share)))
    waves = tuple(waves)
    layers = [r for r in rows if r["section"] in ("layers", "batch", "prefix")
              and r.get("sms") in (None, programs) and r["tokens"] >= LAYER_MIN_TOKENS]
    unit = 1e-3  # a step's seconds as a tile time the law takes
    design, target = [], []
    for r in layers:
        prompts = r.get("prompts", 1)
        seqs = [(r["tokens"] // prompts, r.get("prefix", 0))] * prompts
        steps = [step_cost.extend_attention_s(model, seqs, step_cost.TileTimes(waves, *t, 0.0),
                                              programs) / model.layers / unit
                 for t in ((unit, 0.0), (0.0, unit))]
        design.append([*steps, r["tokens"]])  # its coefficient: the other kernels a token
        target.append(r["ms"] / 1e3 / r["layers"] - step_cost.gemm_layer_s(
            model, r["tokens"], step_cost.TileTimes(waves, 0.0, 0.0, 0.0), programs))
    if len(layers) < 4:
        raise PdmuxError("the prefill-rate files hold too few captured layers on the whole GPU")
    design, target = np.array(design, dtype=float), np.array(target)
    (prefix, new, small), *_ = np.linalg.lstsq(design, target, rcond=None)
    tiles = step_cost.TileTimes(waves, float(prefix), float(new), float(small))
    whole = np.array([r["ms"] / 1e3 / r["layers"] for r in layers])
    error = np.abs(design @ np.array([prefix, new, small]) - target) / whole
    return tiles, {"layers": len(layers), "gemm_rows": sum(map(len, per_tile.values())),
                   "max_abs_layer_error": float(error.max()),
                   "median_abs_layer_error": float(np.median(error))}


def tile_times_json(tiles: step_cost.TileTimes, source: str, quality: dict) -> dict:
    return {"gemm_wave_s": [list(t) for t in tiles.gemm_wave_s],
            "attention_prefix_s": tiles.attention_prefix_s,
            "attention_new_s": tiles.attention_new_s,
            "small_s_per_token": tiles.small_s_per_token, "source": source, **quality}


def fit_mixed(rows, model, decode, prefill, total_sms, tiles: step_cost.TileTimes
              ) -> tuple[step_cost.MixedStepFit, np.ndarray, dict]:
    """The fixed cost of measured = fixed + the layers' pipeline of the GPU phases (the tiles'
    law) and the run's launches (`step_cost.layer_pipeline_s`): one for every host (fitted
    with a term for the host's speed, it came out at or below zero). The mean once each round
    is known to be bound by its GPU or by its launches: solved again until no round changes
    sides."""
    measured = np.array([r["seconds"] for r in rows])
    host = np.array([r["host_s"] for r in rows])
    n = model.layers
    # a run since replays launches its later layers faster than its first: they pace the GPU
    launches = np.array([step_cost.launch_layers_s(n, r["host_s"], r.get("later_s"))
                         for r in rows])
    pace = np.array([r["host_s"] if r.get("later_s") is None else r["later_s"] for r in rows])
    # each round's GPU phases as it ran: a round saved before with its decode rows in the
    # extend tiles too (their contexts unknown but for the sum: shared evenly)
    laws = {before: step_cost.MixedStepFit(0.0, tiles, decode_rows_in_extend=before)
            for before in (False, True)}
    gpu = np.array([step_cost.mixed_step_s(model, decode, prefill, total_sms, r["context"],
                                           r["batch"], r["chunk"], r["prefix"], samples_chunk=0,
                                           phases=laws[bool(r.get("extend_rows"))])
                    for r in rows])
    by_launches = np.zeros(len(rows), dtype=bool)  # first as if no round's launches bound it
    for _ in range(len(rows) + 1):
        # launch-bound: n launches and one layer of GPU; GPU-bound: the GPU and the first launch
        fixed = float((measured - np.where(by_launches, launches + gpu / n, gpu + host)).mean())
        now = pace > gpu / n
        if (now == by_launches).all():
            break
        by_launches = now
    else:
        raise PdmuxError("the mixed-step fit did not settle which rounds their launches bound")
    if not fixed >= 0:
        raise PdmuxError(f"the mixed-step fit is unphysical (fixed {fixed * 1e3:.2f} ms)")
    priced = fixed + np.array([step_cost.layer_pipeline_s(g, n, r["host_s"], r.get("later_s"))
                               for g, r in zip(gpu, rows)])
    error = np.abs(priced - measured) / measured
    return step_cost.MixedStepFit(fixed, tiles), by_launches, {
        "rounds": len(rows),
        "rounds_saved_before": sum(bool(r.get("extend_rows")) for r in rows),
        "launch_bound_share": float(by_launches.mean()),
        "median_abs_error": float(np.median(error)),
        "p90_abs_error": float(np.percentile(error, 90))}


def main(argv=None) -> int:
    p = Parser(prog="bench/fit_host_costs.py", description=__doc__.splitlines()[0])
    p.add_argument("measured", nargs="+", help="measured stream runs (run-<gpu>.json), "
                   "bench/trace_fidelity.py's measured points (points-<gpu>.jsonl) or measured "
                   "capacity folders' diagnostics (capacity-diagnostics-<gpu>.jsonl), of one GPU "
                   "and model: every round and batch of all of them is fitted at once")
    p.add_argument("host_costs", help="calibrate --host-costs' file, updated in place")
    p.add_argument("--calibration", required=True)
    p.add_argument("--compare", required=True)
    p.add_argument("--prefill-rate", nargs="+",
                   help="bench/prefill_rate.py's files the mixed step's tile times are fitted "
                        "to (default: those committed for the measurements' GPU)")
    p.add_argument("--sustained", help="bench/sustained_corun.py's file: each level's prefill "
                   "sustained beside decode against its burst (default: the ratios already in "
                   "the host-costs file, if any)")
    p.add_argument("--busy", help="bench/sustained_corun.py's file with --busy-shares rows: "
                   "how far toward the sustained rate a prefill busy a share of the time slows "
                   "(default: what the host-costs file holds, if anything; else in proportion "
                   "to the share)")
    return run_script(p, fit)


def sustained_rows(path: str, gpu: str) -> dict[tuple, dict]:
    """A bench/sustained_corun.py file's rows by (prefill SMs, tokens, prompts, mode), refused
    where it was measured on another GPU."""
    data = read_json(path, "sustained co-run file")
    if data.get("gpu") != gpu:
        raise PdmuxError(f"{path} was measured on {data.get('gpu')!r}, the rounds on {gpu!r}")
    return {(r.get("prefill_sms"), r.get("tokens"), r.get("prompts"), r.get("mode")): r
            for r in data.get("rows", []) if isinstance(r, dict)}


def busy_slowdown(path: str, gpu: str) -> list[list[float]]:
    """For each busy share the file measured, how far a level's prefill had slowed from its
    burst toward its sustained-beside-decode rate: (call - burst) / (sustained - burst), the
    mean over its levels and batches (each against the same run's burst and sustained rows),
    held to [0, 1]."""
    by_key = sustained_rows(path, gpu)
    fractions: dict[float, list[float]] = {}
    for (sms, tokens, prompts, mode), row in by_key.items():
        burst = by_key.get((sms, tokens, prompts, "burst"), {}).get("ms_median")
        slow = by_key.get((sms, tokens, prompts, "sustained beside decode"), {}).get("ms_median")
        if row.get("busy_share") and row.get("ms_median") and burst and slow and slow > burst:
            fractions.setdefault(float(row["busy_share"]), []).append(
                (row["ms_median"] - burst) / (slow - burst))
    if not fractions:
        raise PdmuxError(f"{path} holds no busy row beside a burst and a slower sustained row "
                         f"(made by bench/sustained_corun.py --busy-shares)")
    return [[share, float(np.clip(np.mean(f), 0.0, 1.0))]
            for share, f in sorted(fractions.items())]


def sustained_ratios(path: str, gpu: str) -> dict:
    """Each level's sustained-beside-decode rate over its burst, by prefill SMs (the mean over
    the file's batches), as the host-costs file holds it."""
    by_key = sustained_rows(path, gpu)
    ratios: dict[int, list[float]] = {}
    for (sms, tokens, prompts, mode), row in by_key.items():
        burst = by_key.get((sms, tokens, prompts, "burst"))
        if mode == "sustained beside decode" and burst and row.get("ms_median") and \
                burst.get("ms_median"):
            ratios.setdefault(int(sms), []).append(burst["ms_median"] / row["ms_median"])
    if not ratios:
        raise PdmuxError(f"{path} holds no level with both a burst and a sustained-beside-decode "
                         f"row (made by bench/sustained_corun.py)")
    return {"ratio_by_prefill_sms": [[sms, float(np.mean(r))] for sms, r in sorted(ratios.items())],
            "batches_a_level": min(len(r) for r in ratios.values()), "source": Path(path).name}


def measured_rounds(measured: str, host: dict, overheads) -> tuple:
    """(GPU, model, chunked rounds, prefill-first batches or None) of the measurements named:
    a stream run's file (no batches), a capacity folder's diagnostics (the folder's model and
    GPU), or bench/trace_fidelity.py's points (its model, on the host-costs file's GPU)."""
    path = Path(measured)
    folder = path.name.startswith(CAPACITY_DIAGNOSTICS)
    if folder or path.suffix == ".jsonl":
        from split_batches import point_requests  # it reads points with this file's helpers
        from trace_fidelity import MODEL

        gpu, model = (capacity_settings(path)[:2] if folder
                      else (gpu_preset(host.get("gpu", "")), model_preset(MODEL)))
        timed = timed_points(measured)
        return gpu, model, fidelity_rounds(timed), fidelity_prefills(
            timed, lambda point: point_requests(measured, point, gpu.name))
    run = read_json(measured, "run result")
    if not isinstance(run.get("inputs"), dict) or not isinstance(run.get("details"), dict):
        raise PdmuxError(f"{measured} holds no inputs and rounds of a run (made by "
                         f"`pdmux-triton run --out`)")
    settings = RunSettings.from_dict(run["inputs"])
    if settings.simulate:
        raise PdmuxError(f"{measured} is a simulation: fit to a run measured on the GPU")
    if run.get("unserved"):
        print(f"note: {measured} stopped before {', '.join(run['unserved'])}: its rounds are "
              f"those of the strategies it served")
    return settings.gpu, settings.model, chunk_rounds(run, overheads.layer_launch_s), None


def pooled_rounds(measured: list[str], host: dict, overheads) -> tuple:
    """`measured_rounds` of several files, pooled: (GPU, model, every chunked round, every
    prefill-first batch or None where no file holds them). The files must agree on the GPU and
    the model, since one set of costs is fitted to them all."""
    pooled, rows, prefills = None, [], None
    for path in measured:
        gpu, model, more_rows, more_prefills = measured_rounds(path, host, overheads)
        if pooled is None:
            pooled = (gpu, model, path)
        elif (gpu.name, replace(model, max_context=None)) != (pooled[0].name, replace(
                pooled[1], max_context=None)):  # older settings files did not save the limit
            raise PdmuxError(f"{path} was measured with {model.name} on the {gpu.name}, "
                             f"{pooled[2]} with {pooled[1].name} on the {pooled[0].name}: fit "
                             f"files of one GPU and model")
        rows += more_rows
        if more_prefills is not None:
            prefills = (prefills or []) + more_prefills
    if not rows:
        raise PdmuxError("the measurements hold no chunked strategy's rounds: measure chunked "
                         "strategies (bench/trace_fidelity.py, `pdmux-triton capacity`, or "
                         "`run --workload stream --chunks`)")
    return pooled[0], pooled[1], rows, prefills


def fitted(measured: list[str], host_costs: str, calibration: str,
           compare: str, prefill_rate=None, sustained: str | None = None,
           busy: str | None = None) -> tuple[dict, list]:
    """The host-costs file's data with every fit the measurements allow (`measured`: stream
    runs, trace_fidelity's points or capacity folders' diagnostics), and the lines that say
    what each fit gave."""
    host = read_json(host_costs, "host-costs file")
    # (read without its mixed step, which this replaces: one fitted by an older law is refused)
    unmixed = {k: v for k, v in host.items() if k != "mixed_step"}
    overheads = host_costs_from(unmixed, host_costs)
    gpu, model, rows, prefills = pooled_rounds(measured, host, overheads)
    if prefill_rate is None:  # the GPU's committed files
        if gpu.name not in PREFILL_RATE:
            raise PdmuxError(f"no bench/prefill_rate.py files are committed for the {gpu.name}: "
                             f"measure them there and name them (--prefill-rate)")
        prefill_rate = PREFILL_RATE[gpu.name]
    decode = load_calibration(calibration, gpu.name).decode_curve("grid_cap")
    prefill = load_compare(compare, gpu.name).prefill_rate("grid_cap", gpu.bf16_tflops, gpu.sms)
    host_costs_from(unmixed, host_costs, gpu.name)  # measured on the GPU the rounds ran on
    names = ", ".join(f"{Path(m).parent.name}/{Path(m).name}" for m in measured)  # folders differ
    source = f"{names} with {Path(calibration).name}, {Path(compare).name}"

    # a captured step's time beyond its bytes and the calibration's batch term: from the
    # served whole-GPU steps by captured size where the measurements hold enough, else from
    # the file's captured rounds (calibrate --host-costs: four sizes at one short context)
    by_file = {m: timed_points(m) for m in measured if m.endswith(".jsonl")}
    timed = [point for points in by_file.values() for point in points]
    extra = served_decode_extra(whole_gpu_decode_steps(timed), model, decode, gpu.sms)
    host["decode_step_extra"] = extra or [
        {"batch": r["batch"], "extra_s": r["gpu_s"] - step_cost.decode_step_s(
            model, decode, r["batch"] * r.get("context", HOST_COSTS_DECODE_CONTEXT),
            gpu.sms, False, r["batch"])} for r in host["decode_round"]]
    # the served decode step beside a split prefill over its co-run price with these extras,
    # by the prefill's busy share, where the points kept their launches' spans
    from corun_rounds import Pricer, ratio_by_busy  # they read rounds with this file's helpers

    priced = replace(overheads, split_decode_by_busy=(), by_kind=(), decode_step_extra=tuple(
        (r["batch"], r["extra_s"]) for r in host["decode_step_extra"]))
    # each kind's own (a green context's decode and prefill are not a capped grid's): the
    # grid cap's at the top, another kind's under by_kind where its points allow a fit
    host.pop("decode_beside_prefill", None)
    by_kind = {kind: {} for kind in OTHER_KINDS}
    for kind in ("grid_cap", *OTHER_KINDS):
        beside = ratio_by_busy([m for m in measured if m.endswith(".jsonl")], calibration,
                               compare, priced, gpu.name, kind=kind)
        # two bins at least, or none: a ratio fitted before, to other extras, does not stay
        if len(beside["ratio_by_busy_share"]) >= 2:
            (by_kind[kind] if kind in by_kind else host)["decode_beside_prefill"] = {
                **beside, "files": [f"{Path(m).parent.name}/{Path(m).name}"
                                    for m in beside["files"]],
                "calibration": Path(calibration).name, "compare": Path(compare).name}

    # each file's levels: a capacity folder's own, trace_fidelity's the default
    with_levels = []
    for path, points in by_file.items():
        level_sms = Pricer(path, calibration, compare, overheads, gpu.name).sms
        with_levels += [(point, host, level_sms) for point, host in points]
    # the host's share of a served decode round, by its requests, their KV and its level, where
    # the measurements timed their hosts (a captured round alone lacks the loop's bookkeeping)
    served = fit_served_decode_round(served_decode_rounds(with_levels), overheads.layer_launch_s)
    host.pop("decode_round_served", None)  # one fitted to other rounds does not stay
    if served is not None:
        host["decode_round_served"] = {**served, "source": names}

    # an eager step's fixed cost: the smallest chunks' rounds less their launches, in the file's
    # host, over the rounds their launches bound (first over all, to start the fits below)
    size = min(r["size"] for r in rows)
    small = np.array([r["size"] == size for r in rows])
    less_launches = np.array([(r["seconds"] - step_cost.launch_layers_s(
                                   model.layers, r["host_s"], r.get("later_s")))
                              * overheads.layer_launch_s / r["host_s"] for r in rows])
    overheads = replace(overheads, eager_step_s=_eager_step_s(less_launches[small], size,
                                                              model, overheads))
    # a split prefill batch's upload: from pd-mux's served batches where the points hold them
    batch = fit_prefill_batch(with_levels, overheads.layer_launch_s)
    host.pop("prefill_batch", None)
    if batch is not None:
        host["prefill_batch"] = {**batch, "source": names}
    tiles, tile_quality = fit_tile_times(prefill_rate, model, gpu.sms)
    tile_source = ", ".join(Path(p).name for p in prefill_rate)
    # the whole GPU's prefill MFU (over batches less the eager step), the mixed step (its
    # linears at that MFU, which tells the rounds bound by their launches) and the eager step
    # (over those rounds) fitted in turn until the eager step the MFU was read with is the one
    # the file holds: the simulator charges a whole-GPU batch that step
    whole_mfu = host.get("whole_gpu_prefill", {}).get("mfu")  # the file's, where none is fitted
    for _ in range(JOINT_FIT_ROUNDS):
        whole = (fit_whole_gpu_prefill(prefills, model, prefill, overheads, tiles)
                 if prefills is not None else None)
        mfu = whole[0] if whole is not None else whole_mfu
        # (the mixed steps' linears run at that MFU)
        on_whole = prefill if mfu is None else prefill.on_whole_gpu(mfu)
        mixed, by_launches, quality = fit_mixed(rows, model, decode, on_whole, gpu.sms, tiles)
        bound = small & by_launches
        if not bound.any():
            raise PdmuxError(f"no chunked_{size} round was bound by its launches: an eager "
                             f"step's fixed cost cannot be read from them")
        step = _eager_step_s(less_launches[bound], size, model, overheads)
        # (no MFU fitted: nothing was read with the step, so one round settles it)
        settled = step == overheads.eager_step_s or whole is None
        overheads = replace(overheads, eager_step_s=step)
        if settled:
            break
    else:
        raise PdmuxError(f"the whole GPU's prefill MFU, the mixed step and the eager step did "
                         f"not settle in {JOINT_FIT_ROUNDS} rounds of fitting one with the "
                         f"others (the eager step moved to {step * 1e3:.3f} ms in the last): "
                         f"these measurements do not pin them down together")
    if whole is not None:
        host["whole_gpu_prefill"] = {"mfu": whole[0], "source": source, **whole[1]}
    host["mixed_step"] = {"fixed_s": mixed.fixed_s, "source": source, **quality,
                          "tiles": tile_times_json(tiles, tile_source, tile_quality)}
    # a level's prefill on a busy GPU as served, priced with this fit's batch upload and tiles,
    # where two levels hold enough large batches (one fitted to other batches does not stay:
    # the sustained bench's ratios then price it)
    from split_batches import served_sustained

    host.pop("split_prefill_served", None)
    served_by_kind = {}
    # (the busy curve this file will hold prices the short batches the layer time is fitted on)
    slowdown = busy_slowdown(busy, gpu.name) if busy else None
    priced = replace(overheads, mixed=mixed, by_kind=(), prefill_batch_s=(batch or {}).get(
        "seconds", overheads.prefill_batch_s), split_prefill_slowdown=tuple(
            map(tuple, slowdown)) if slowdown else overheads.split_prefill_slowdown)
    for kind in ("grid_cap", *OTHER_KINDS):
        # another kind whose levels are too thin alone: the grid cap's, scaled by its batches
        # (and a layer's fixed time, the grid cap's where it stays: one for every kind)
        grid = served_by_kind.get("grid_cap")
        base, layer_s = (None, None) if grid is None else (
            grid["ratio_by_prefill_sms"],
            grid["layer_s"] if len(grid["ratio_by_prefill_sms"]) >= 2 else 0.0)
        kept = served_by_kind[kind] = served_sustained(list(by_file), calibration, compare,
                                                       priced, gpu.name, kind, base, layer_s)
        if len(kept["ratio_by_prefill_sms"]) >= 2:
            (by_kind[kind] if kind in by_kind else host)["split_prefill_served"] = {
                **kept, "calibration": Path(calibration).name, "compare": Path(compare).name}
    host.pop("by_kind", None)  # one fitted to other points does not stay
    if any(by_kind.values()):
        host["by_kind"] = {kind: fits for kind, fits in by_kind.items() if fits}
    host["eager_step"] = {"seconds": step, "source": f"{names}: median "
                          f"chunked_{size} round bound by its launches less its {model.layers} "
                          f"layer launches, on this file's host", "rounds": int(bound.sum())}
    if sustained:  # a busy curve the file holds stays (it scales whichever ratios)
        held = {k: v for k, v in host.get("split_prefill_sustained", {}).items()
                if k in ("slowdown_by_busy_share", "busy_source")}
        host["split_prefill_sustained"] = {**held, **sustained_ratios(sustained, gpu.name)}
    if busy:
        if "split_prefill_sustained" not in host:
            raise PdmuxError("--busy needs the sustained ratios it scales: give --sustained too")
        host["split_prefill_sustained"].update(slowdown_by_busy_share=slowdown,
                                               busy_source=Path(busy).name)
    split_term = (f"{served['split_s'] * 1e6:.0f} us at a split level"
                  if served is not None and "split_s" in served else "nothing at a split level")
    lines = [f"eager step {step * 1e3:.2f} ms",
             (f"a split prefill batch's upload {batch['seconds'] * 1e3:.2f} ms (median over "
              f"{batch['batches']} pd-mux batches)" if batch is not None else
              "a split prefill batch's upload: an eager step's (too few pd-mux batches)"),
             "a served decode round's host share: " + (
                 f"{served['fixed_s'] * 1e6:.0f} us + {served['per_request_s'] * 1e6:.2f} us a "
                 f"request + {served['per_kv_token_s'] * 1e9:.2f} ns a token of KV + "
                 f"{split_term} ({served['split_rounds']} of its rounds at a split level) over "
                 f"{served['rounds']} rounds (|error| median "
                 f"{served['median_abs_error_s'] * 1e6:.0f} us)" if served is not None else
                 "not fitted (too few decode rounds with their hosts timed): the captured "
                 "rounds' median"),
             "decode step beyond its bytes: " + ", ".join(
                 f"batch {r['batch']} {r['extra_s'] * 1e3:+.2f} ms"
                 for r in host["decode_step_extra"])]
    if whole is not None:
        lines.append(f"prefill on the whole GPU: MFU {whole[0]:.3f} over {whole[1]['batches']} "
                     f"batches bound by their GPU, |error| median "
                     f"{whole[1]['median_abs_error']:.1%}")
        lines.append("  its span over that price by the prefills' busy share: " + (", ".join(
            f"{share:.0%} busy {ratio:.3f}" for share, ratio in whole[1]["ratio_by_busy_share"])
            if "ratio_by_busy_share" in whole[1] else "not fitted (fewer than two busy-share "
            f"bins of {MIN_BUSY_BATCHES} batches)"))
    elif "whole_gpu_prefill" in host:
        lines.append(f"prefill on the whole GPU: MFU {host['whole_gpu_prefill']['mfu']:.3f} kept "
                     f"from the file, as read with the eager step it held (these measurements "
                     f"hold too few prefill-first batches bound by their GPU)")
    for kind, kept in served_by_kind.items():
        lines.append(f"a level's prefill on a busy GPU as served over its burst ({kind}): "
                     + _served_line(kind, kept))
        if kept["points_left_out"]:
            lines.append(f"pd-mux points ({kind}) whose batches and requests disagree, left "
                         f"out: " + ", ".join(kept["points_left_out"]))
    if "split_prefill_sustained" in host:
        lines.append("a level's prefill sustained beside decode over its burst (the bench): "
                     + ", ".join(f"{sms} SMs {ratio:.3f}" for sms, ratio
                                 in host["split_prefill_sustained"]["ratio_by_prefill_sms"]))
        if "slowdown_by_busy_share" in host["split_prefill_sustained"]:
            lines.append("slowed toward it when busy a share of the time: " + ", ".join(
                f"{share:.0%} busy {fraction:.2f}" for share, fraction
                in host["split_prefill_sustained"]["slowdown_by_busy_share"]))
    if "decode_beside_prefill" in host:
        lines.append("the decode step beside a split prefill as served over its co-run price, by "
                     "the prefill's busy share: " + ", ".join(
                         f"{share:.0%} {ratio:.3f}" for share, ratio
                         in host["decode_beside_prefill"]["ratio_by_busy_share"])
                     + f" ({host['decode_beside_prefill']['rounds']} rounds)")
    else:
        lines.append("the decode step beside a split prefill: no busy ratio fitted (no two "
                     "busy-share bins of pd-mux rounds with their launch spans): its co-run "
                     "price as it is")
    for kind, fits in host.get("by_kind", {}).items():
        if "decode_beside_prefill" in fits:
            lines.append(f"the same on {kind}: " + ", ".join(
                f"{share:.0%} {ratio:.3f}" for share, ratio
                in fits["decode_beside_prefill"]["ratio_by_busy_share"])
                + f" ({fits['decode_beside_prefill']['rounds']} rounds)")
    lines.append("tile times: GEMM waves " + ", ".join(
        f"{a}x{b} {t * 1e6:.1f} us (a partial one {share:.2f} +)"
        for a, b, t, share in tiles.gemm_wave_s)
        + f"; attention tile steps {tiles.attention_prefix_s * 1e6:.2f} us cached, "
        f"{tiles.attention_new_s * 1e6:.2f} us new; other kernels "
        f"{tiles.small_s_per_token * 1e9:.1f} ns a token a layer (captured layers |error| "
        f"max {tile_quality['max_abs_layer_error']:.1%})")
    lines.append(f"mixed step: fixed {mixed.fixed_s * 1e3:.2f} ms, the tiles' law; over "
                 f"{quality['rounds']} rounds ({quality['rounds_saved_before']} saved before a "
                 f"mixed step's decode rows left the extend kernel, priced as they ran) "
                 f"({quality['launch_bound_share']:.0%} bound by their launches) |error| median "
                 f"{quality['median_abs_error']:.1%}, p90 {quality['p90_abs_error']:.1%}")
    return host, lines


def _served_line(kind: str, kept: dict) -> str:
    """What the fit read of a kind's split prefill as served (`served_sustained`'s `kept`,
    stored where it holds two levels)."""
    if len(kept["ratio_by_prefill_sms"]) < 2:
        if kind == "grid_cap":
            return "not fitted (too few large pd-mux batches at two levels): the sustained bench's"
        return ("not fitted (too few large pd-mux batches at two levels, or in all): the grid "
                "cap's")
    scaled = (f"; too few at each level to read them apart: the grid cap's x "
              f"{kept['scaled_from_base_by']:.3f}" if "scaled_from_base_by" in kept else "")
    layer = (f"; a layer {kept['layer_s'] * 1e6:.0f} us beyond them over {kept['short_batches']} "
             f"batches under {kept['min_tokens']} tokens" if kept["short_batches"] else "")
    return (", ".join(f"{sms} SMs {ratio:.3f}" for sms, ratio in kept["ratio_by_prefill_sms"])
            + f" ({kept['batches']} batches{scaled}{layer})")


def _eager_step_s(less_launches: np.ndarray, size: int, model, overheads) -> float:
    """The median of chunked rounds less their layers' launches; refused where it is negative
    (the rounds took less than their launches at the host's launch time)."""
    step = float(np.median(less_launches))
    if step < 0:
        raise PdmuxError(f"chunked_{size}'s rounds took less than {model.layers} launches at the "
                         f"host's launch time ({overheads.layer_launch_s * 1e3:.2f} ms a layer, "
                         f"the file's where the run did not time its own): fit to a run that "
                         f"timed its host")
    return step


def fit(args) -> int:
    host, lines = fitted(args.measured, args.host_costs, args.calibration, args.compare,
                         args.prefill_rate, args.sustained, args.busy)
    write_json(args.host_costs, host)
    print("\n".join(lines))
    print(f"wrote {args.host_costs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
