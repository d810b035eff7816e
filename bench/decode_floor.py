"""The decode step against its bandwidth floor, and pinned partitions against green contexts,
on one GPU (issue 26's figures; bench/results/decode-floor-<gpu>.json).

Measured in one process: the streaming read over 2 GiB buffers on the whole GPU (the floor's
rate); the whole decode step of the Qwen3-8B preset, 32 requests x 2048 tokens, captured, on the
whole GPU as served (launches overlapped), without the GEMMs' early weight lines, with each
launch after the last, with stream-K on every program (no aligned split), with decode attention
at 2-3 programs an SM, with decode attention's first segment fetching no or two early K/V blocks,
without attention's prologue kernel (its values wrong: the most a fold of it could save), and
its kernels (counted and timed by the profiler in one eager step); the
same bytes as streaming reads, a launch per weight (`stream_equivalent`: what a step of separate
kernels could reach); the decode step on each of SGLang's levels' decode SMs (20-60 on an H200)
on green contexts and on pinned SMs at 1-3 CTAs per SM and as a served decode side runs, alone
and beside a prefill on the rest (at one CTA an SM also the prefill's own time beside the decode
step: what a decode-side setting costs the other side), with the SMs each side's kernels ran on
(pinned at one also with the claiming gate instead of the one-a-site one and on the SMs green's
decode side ran on, and at one, three and as served with the tagged gates: the gap to green by
cause; each pinned row counts the probe's slots that ran off their side's SMs); decode
attention on 16 pinned SMs at 1-3 CTAs per SM. The kernel benchmark's and a run's figures
(decode linears and attention against the streaming read, pd-mux's ITL and prefill at 80/52)
come from their files when given.

    python bench/decode_floor.py --out bench/results [--kernels FILE] [--run FILE]
        [--turns "1,1 claiming"]   # only those pinned turns: decode-floor-turns-<gpu>.json
"""

from __future__ import annotations

import contextlib
import importlib
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch
from common import (MODEL, Results, require_gpu, same_bytes_buffers, sites_headed_by,
                    stream_same_bytes, t_graph)
from script import bench_parser, run_script

from pdmux_triton.cli.parsing import choice, listed
from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu import decoder
from pdmux_triton.gpu.streams import PartitionStreams, kernel_args
from pdmux_triton.kernels import decode_attention, gemm, linear, stream_read
from pdmux_triton.kernels._pinned import pinned_gate, site_order
from pdmux_triton.measure.telemetry import probe
from pdmux_triton.measure.timing import time_alone, time_corun
from pdmux_triton.measure.workloads import DecodeAttention, DecodeStep, PrefillLayers
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.multiplex.partition import Budget, for_level
from pdmux_triton.results import read_json
from pdmux_triton.spec.gpus import detect_gpu

BATCH, CONTEXT = 32, 2048
CTAS = (1, 2, 3)
STREAM_BYTES = 1 << 31


def eager_step_kernels(step: DecodeStep, budget: Budget,
                       steps: int = 5) -> list[tuple[str, float]]:
    """The kernels an eager decode step launches, in order: (name, GPU ms), each launch's
    median over `steps` profiled steps (the profiler's CUDA kernels). Give a budget without
    PDL: a kernel launched early under it waits for the one before, and the profiler counts
    that wait as its own time."""
    from torch.profiler import ProfilerActivity, profile

    step.run(budget)
    torch.cuda.synchronize()
    runs = []
    for _ in range(steps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step.run(budget)
            torch.cuda.synchronize()
        runs.append(sorted((e.time_range.start, e.name, e.time_range.elapsed_us() / 1e3)
                           for e in prof.events()
                           if e.device_type == torch.autograd.DeviceType.CUDA))
    return median_launches([[(name, ms) for _, name, ms in run] for run in runs])


def median_launches(runs: list[list[tuple[str, float]]]) -> list[tuple[str, float]]:
    """Launch by launch, the median time of several runs of the same launches."""
    names = [name for name, _ in runs[0]]
    if any([name for name, _ in run] != names for run in runs):
        raise PdmuxError("the profiled steps launched different kernels; their times cannot "
                         "be taken launch by launch")
    return [(name, statistics.median(run[i][1] for run in runs)) for i, name in enumerate(names)]


# the weights an eager step's skinny GEMMs read, in launch order (decoder's layer: qkv, o,
# gate-up, down; then the LM head)
LAYER_WEIGHTS = ("qkv", "o", "gate_up", "down")


def gemm_times_by_weight(events, weight_bytes: dict[str, int], layers: int,
                         tbps: float) -> dict[str, dict] | None:
    """An eager step's skinny-GEMM launches (`events`: (name, ms) in launch order) by the
    weight each reads: launches, GPU ms and the share of the streaming read (`tbps`) that
    its bytes got. None where the launches do not follow the layer's order (a decoder that
    launches otherwise: no label is guessed)."""
    gemms = [ms for name, ms in events if name.startswith("skinny_kernel")]
    order = [*LAYER_WEIGHTS * layers, "lm_head"]
    if len(gemms) != len(order):
        return None
    by_weight = {}
    for weight, ms in zip(order, gemms):
        row = by_weight.setdefault(weight, {"launches": 0, "ms": 0.0})
        row["launches"] += 1
        row["ms"] += ms
    for weight, row in by_weight.items():
        read_s = row["launches"] * weight_bytes[weight] / (tbps * 1e12)
        row["vs_stream_read"] = read_s * 1e3 / row["ms"]
    return by_weight


def kernel_times(events) -> dict[str, list]:
    """(name, ms) events as {name: [launches, ms]}, longest first; copies and memsets are not
    kernels."""
    by_name = {}
    for name, ms in events:
        if not name.lower().startswith(("memcpy", "memset")):
            n, total = by_name.get(name, (0, 0.0))
            by_name[name] = [n + 1, total + ms]
    return dict(sorted(by_name.items(), key=lambda kv: -kv[1][1]))


def stream_equivalent(step: DecodeStep):
    """The step's reads as streaming reads, one launch each in the step's order (per layer the
    QKV weight, the layer's K/V bytes, o, gate-up, down; then the LM head), overlapped as
    served (PDL): what a step of one kernel per weight, each reading at a streaming read's
    rate, takes on this GPU. Returns it and the bytes it reads (the floor's)."""
    w = step.model.w
    per_layer_kv = int(step_cost.kv_bytes(MODEL, BATCH * CONTEXT)) // MODEL.layers
    # one buffer of a layer's K/V bytes for all layers: far larger than L2, so each read of it
    # comes from memory as each layer's own cache would
    kv = torch.randint(-2**31, 2**31 - 1, (per_layer_kv // 4,), dtype=torch.int32, device="cuda")
    reads = [r for layer in w.layers
             for r in (layer["qkv"], kv, layer["o"], layer["gate_up"], layer["down"])]
    reads.append(w.lm_head)
    return (lambda: [stream_read(r, pdl=True) for r in reads],
            sum(r.numel() * r.element_size() for r in reads))


# (the module by its name: the package's `decode_attention` is the function)
ATTENTION = importlib.import_module("pdmux_triton.kernels.decode_attention")
ROPE_STORE_KV = decoder.rope_store_kv


def _no_rope(*args, **kwargs) -> None:
    """Attention's prologue skipped (a turn's step then computes wrong values: only its time
    is read)."""


# decode attention's early K/V blocks (PDL) of each turn besides the shipped setting
ATTENTION_PREFETCH = (0, 2)


def _settings(lines: int | None = None, split: float | None = None,
              blocks: int | None = None, rope: bool | None = None) -> dict:
    """The kernels' module settings a turn varies (the GEMM's early weight lines and aligned
    split's threshold, decode attention's early K/V blocks, whether the step launches
    attention's prologue): set those given, return them all."""
    if rope is not None:
        decoder.rope_store_kv = ROPE_STORE_KV if rope else _no_rope
    for module, name, value in ((gemm, "PDL_PREFETCH_LINES", lines),
                                (gemm, "ALIGNED_SPLIT_BUSY", split),
                                (ATTENTION, "PDL_PREFETCH_BLOCKS", blocks)):
        if value is not None:
            setattr(module, name, value)
    return {"lines": gemm.PDL_PREFETCH_LINES, "split": gemm.ALIGNED_SPLIT_BUSY,
            "blocks": ATTENTION.PDL_PREFETCH_BLOCKS, "rope": decoder.rope_store_kv is ROPE_STORE_KV}


def whole_gpu(res: Results, step: DecodeStep, sms: int) -> None:
    bufs = same_bytes_buffers(STREAM_BYTES, 60 << 20)
    tbps = stream_same_bytes(bufs, STREAM_BYTES, sms)
    # as served on the whole GPU (launches overlapped: PDL, the GEMMs' first weight lines
    # fetched while the kernel before drains), PDL without that prefetch, and each launch after
    # the last has finished; in turns, so that drift hits all alike
    # (and with decode attention at 2 and 3 programs an SM: a plain launch on the whole GPU
    # places them as asked, unlike a grid cap of fewer SMs)
    served, apart = Budget(pdl=True), Budget()
    shipped = _settings()
    turns = [("served", served, {}), ("no_prefetch", served, {"lines": 0}),
             ("apart", apart, {}),
             # stream-K on every program, tiles cut unevenly, instead of the aligned split
             ("unaligned", served, {"split": 2.0})]
    turns += [(f"attention_c{c}", Budget(pdl=True, attention_ctas_per_sm=c), {}) for c in (2, 3)]
    # (and more of each weight row's first lines fetched early: is PDL_PREFETCH_LINES enough?)
    turns += [(f"prefetch_{n}", served, {"lines": n}) for n in (16, 32)]
    # (and decode attention's first segment with no early K/V block, or with two)
    turns += [(f"attention_prefetch_{b}", served, {"blocks": b}) for b in ATTENTION_PREFETCH]
    # (and without attention's prologue kernel, q/k norm, rope and the KV store: the most that
    # folding it into a neighbour's epilogue could save; that step computes wrong values, only
    # its time is read)
    turns.append(("without_prologue", served, {"rope": False}))
    # (and the step's bytes as streaming reads, a launch a weight: `stream_equivalent`)
    streamed, streamed_bytes = stream_equivalent(step)
    times = {name: [] for name, *_ in turns}
    times["stream_equivalent"] = []
    try:
        for _ in range(3):
            for name, budget, changed in turns:
                _settings(**{**shipped, **changed})
                times[name].append(t_graph(lambda: step.run(budget)))
            times["stream_equivalent"].append(t_graph(streamed))
    finally:
        _settings(**shipped)
    ms, no_prefetch_ms, apart_ms, unaligned_ms, c2_ms, c3_ms, streamed_ms = (
        statistics.median(times[k]) for k in ("served", "no_prefetch", "apart", "unaligned",
                                              "attention_c2", "attention_c3",
                                              "stream_equivalent"))
    floor_ms = step_cost.decode_step_bytes(MODEL, BATCH * CONTEXT) / (tbps * 1e12) * 1e3
    # the step by decode attention's early K/V blocks (the served step: PDL_PREFETCH_BLOCKS)
    by_prefetch = {b: statistics.median(times[f"attention_prefetch_{b}"])
                   for b in ATTENTION_PREFETCH}
    without_prologue_ms = statistics.median(times["without_prologue"])
    # the eager step's kernels (each launched after the last), the GEMMs by weight and decode
    # attention against the streaming read of their bytes: which of them holds the step back
    events = eager_step_kernels(step, apart)
    w = step.model.w
    by_weight = gemm_times_by_weight(
        events, {**{k: w.layers[0][k].numel() * w.layers[0][k].element_size()
                    for k in LAYER_WEIGHTS},
                 "lm_head": w.lm_head.numel() * w.lm_head.element_size()}, MODEL.layers, tbps)
    attention_ms = [ms for name, ms in events if name.startswith("decode_kernel")]
    attention_share = (step_cost.kv_bytes(MODEL, BATCH * CONTEXT) / (tbps * 1e9)
                       / sum(attention_ms)) if len(attention_ms) == MODEL.layers else None
    res.row(section="whole gpu", stream_read_tbps=tbps, decode_only_step_ms=ms,
            decode_step_pdl_no_prefetch_ms=no_prefetch_ms, decode_step_without_pdl_ms=apart_ms,
            decode_step_unaligned_split_ms=unaligned_ms,
            decode_step_attention_c2_ms=c2_ms, decode_step_attention_c3_ms=c3_ms,
            stream_equivalent_step_ms=streamed_ms,
            stream_equivalent_bytes=streamed_bytes, decode_step_bytes=step.amount,
            decode_step_by_attention_prefetch_ms=by_prefetch,
            decode_step_without_prologue_ms=without_prologue_ms,
            step_ms_by_turn=times, decode_step_floor_ms=floor_ms,
            kernels=kernel_times(events), gemm_by_weight=by_weight,
            eager_attention_vs_stream_read=attention_share)
    res.data["summary"].update(stream_read_tbps=tbps, decode_only_step_ms=ms,
                               decode_step_pdl_no_prefetch_ms=no_prefetch_ms,
                               decode_step_without_pdl_ms=apart_ms,
                               decode_step_unaligned_split_ms=unaligned_ms,
                               decode_step_attention_c2_ms=c2_ms,
                               decode_step_attention_c3_ms=c3_ms,
                               decode_step_by_attention_prefetch_ms=by_prefetch,
                               decode_step_without_prologue_ms=without_prologue_ms,
                               decode_step_floor_ms=floor_ms, decode_step_vs_floor=floor_ms / ms,
                               stream_equivalent_step_ms=streamed_ms,
                               stream_equivalent_vs_floor=floor_ms / streamed_ms,
                               decode_step_vs_stream_equivalent=streamed_ms / ms,
                               eager_gemm_vs_stream_read=by_weight and {
                                   k: v["vs_stream_read"] for k, v in by_weight.items()},
                               eager_attention_vs_stream_read=attention_share,
                               **kernel_figures(res.data["rows"][-1]["kernels"], ms))
    res.save()


def kernel_figures(kernels: dict[str, list], step_ms: float) -> dict:
    """The summary's launch count and what the step's kernels take one after another (an
    eager step's kernel time) against the captured step: where that share is low, the step
    loses its time between and around kernels, not inside them."""
    kernel_ms = sum(ms for _, ms in kernels.values())
    return {"launches_per_decode_step": sum(n for n, _ in kernels.values()),
            "eager_step_kernel_ms": kernel_ms, "eager_kernel_ms_vs_step": kernel_ms / step_ms}


# pinned turns that take a product turn's budget another way, to split the gap to green by
# cause: the claiming gate (kernels/_pinned.py) instead of the one-a-site one that one program
# an SM takes (on both sides), and the product's gate on the very SMs green's decode side ran
# on, the prefill side on the rest (placement apart from the gate); and the tagged gates
# (`_pinned.TAGGED_SITES`: only the programs on a side's sites write) at one, three and as
# served
CLAIMING_TURN, ON_GREEN_SMS_TURN = "1 claiming", "1 on green's SMs"
TAGGED_TURNS = {"1 tagged": 1, "3 tagged": 3, "served tagged": "served"}
DIAGNOSTIC_TURNS = (CLAIMING_TURN, ON_GREEN_SMS_TURN, *TAGGED_TURNS)
# each diagnostic turn's figures in the summary: f"{name}_vs_green_max_error_pct", ...
DIAGNOSTIC_NAMES = {CLAIMING_TURN: "pinned_claiming", ON_GREEN_SMS_TURN: "pinned_on_green_sms",
                    **{t: f"pinned_tagged_{'c' if v != 'served' else ''}{v}"
                       for t, v in TAGGED_TURNS.items()}}
# the pinned turns of a level by label, each with green's turn it is compared with
VERSUS = {**{str(c): c for c in CTAS}, "served": "served", CLAIMING_TURN: 1,
          ON_GREEN_SMS_TURN: 1, **TAGGED_TURNS}
TURNS = tuple(VERSUS)


def compared_turns(only: tuple[str, ...], kind: str) -> set[str]:
    """The turns of a `kind` partition to run for the pinned turns `only`: those for pinned;
    for green, each one's turn to compare with and the same without PDL."""
    if kind == "pinned":
        return set(only)
    versus = {str(VERSUS[t]) for t in only}
    return versus | {f"{t} no pdl" for t in versus}


def green_decode_sms(part: PartitionStreams, probe_x: torch.Tensor,
                     weight: torch.Tensor) -> list[int]:
    """The SMs a decode GEMM's programs ran on on green's decode side, in program order (the
    GEMM the site order is measured with: one program an SM); launched three times and the
    last counts, as `site_order` does (a cold GPU's first launches can place otherwise)."""
    ids = torch.full((part.decode_sms,), -1, dtype=torch.int32, device="cuda")
    with torch.cuda.stream(part.decode_stream):
        for _ in range(3):
            linear(probe_x[:BATCH], weight, sm_ids=ids, **kernel_args(part.decode_budget))
    torch.cuda.synchronize()
    return list(dict.fromkeys(sm for sm in ids.tolist() if sm >= 0))


def pinned_sms(budget) -> list[int]:
    """A pinned side's SMs: its range of the device's site order (the one in force)."""
    order, _ = site_order(torch.device("cuda", torch.cuda.current_device()), budget.site_head)
    return order[budget.first_site:budget.first_site + budget.num_sms]


def levels(res: Results, step: DecodeStep, prefill: PrefillLayers, gpu,
           only: tuple[str, ...] | None = None) -> None:
    """Each middle level up to 60 decode SMs: green (one CTA per SM: a grid of the budget) and
    pinned at each c for every kernel, and as a served decode side runs (decode attention at
    the split's served CTAs per SM, the other kernels at one), the decode step alone and
    beside the prefill; green at one and as served also without PDL; pinned at one also with
    the claiming gate and on green's decode SMs, and at one, three and as served with the tagged
    gates (`DIAGNOSTIC_TURNS`).
    `only`: the pinned turns to run (`TURNS`), and green's that they are compared with."""
    groups = [g for g in sglang_rules.stream_groups(gpu.sms, gpu.cc_major)[1:-1] if g[1] <= 60]
    probe_x = torch.randn(4096, MODEL.hidden, dtype=torch.bfloat16, device="cuda")
    probe_q = torch.randn(BATCH, MODEL.q_heads, MODEL.head_dim, dtype=torch.bfloat16,
                          device="cuda")
    gate_up = prefill.model.w.layers[0]["gate_up"]
    dm, db = step.model, step.batch
    for level in groups:
        green, green_sms = {}, []
        for kind in ("green", "pinned"):
            with PartitionStreams.open(for_level(level, kind, gpu.sms)) as part:
                pbud = part.prefill_budget
                p_alone = time_alone(lambda: prefill.run(pbud), part.prefill_stream, graph=False,
                                     repeats=1)
                served = replace(part.decode_budget,
                                 attention_ctas_per_sm=part.spec.served_attention_ctas)
                # (label, decode budget, green's turn to compare with, how the turn runs)
                turns = [*((c, replace(part.decode_budget, ctas_per_sm=c), c, None)
                           for c in CTAS), ("served", served, "served", None)]
                if kind == "green":
                    if part.decode_budget.pdl:  # also without overlapped launches, which pinned
                        # launches cannot have (the gap's part that is PDL's, not the gate's)
                        turns += [(f"{c} no pdl", replace(b, pdl=False), f"{c} no pdl", None)
                                  for c, b, *_ in turns if c in (1, "served")]
                    green_sms = green_decode_sms(part, probe_x, gate_up)
                else:
                    switch = {CLAIMING_TURN: pinned_gate("claiming"),
                              ON_GREEN_SMS_TURN: sites_headed_by(green_sms,
                                                                 part.decode_budget.site_head),
                              **{label: pinned_gate("tagged") for label in TAGGED_TURNS}}
                    base = {label: budget for label, budget, *_ in turns}
                    turns += [(label, base[VERSUS[label]], VERSUS[label], switch[label])
                              for label in DIAGNOSTIC_TURNS]
                if only is not None:
                    run_these = compared_turns(only, kind)
                    turns = [t for t in turns if str(t[0]) in run_these]
                for c, dbud, versus, how in turns:
                    with how or contextlib.nullcontext():
                        alone = time_alone(lambda: step.run(dbud), part.decode_stream,
                                           graph=True)
                        co = time_corun(lambda: step.run(dbud), part.decode_stream, True, alone,
                                        lambda: prefill.run(pbud), part.prefill_stream, False,
                                        p_alone)
                        # the other side of the co-run, at one CTA an SM and in the diagnostic
                        # turns: what a decode-side setting costs the prefill beside it
                        pco = time_corun(lambda: prefill.run(pbud), part.prefill_stream, False,
                                         p_alone, lambda: step.run(dbud), part.decode_stream,
                                         True, alone) if versus == 1 else None
                        used = probe(part, lambda ids: linear(probe_x, gate_up, sm_ids=ids,
                                                              **kernel_args(pbud)),
                                     lambda ids: decode_attention(
                                         probe_q, dm.cache.k[0], dm.cache.v[0], db.page_table,
                                         db.seq_lens, dm.cache.page_size, db.max_seq_len,
                                         sm_ids=ids, **kernel_args(dbud, attention=True)),
                                     grid_cap=gpu.sms * max(CTAS),
                                     sides=(pinned_sms(pbud), pinned_sms(dbud))
                                     if kind == "pinned" else None)
                    row = res.row(section="level", kind=kind, prefill_sms=level[0],
                                  decode_sms=part.decode_sms, ctas_per_sm=c,
                                  attention_ctas_per_sm=dbud.attention_ctas_per_sm,
                                  alone_ms=alone, corun_ms=co.ms, covered=co.covered, **used)
                    if pco is not None:
                        row.update(prefill_alone_ms=p_alone, prefill_corun_ms=pco.ms,
                                   prefill_covered=pco.covered)
                    if kind == "green":
                        green[c] = row
                        if c == 1:  # (fewer than decode_sms where two shared an SM)
                            row["decode_sm_ids"] = green_sms
                    else:
                        row["vs_green_alone_pct"] = (green[versus]["alone_ms"] / alone - 1) * 100
                        row["vs_green_corun_pct"] = (green[versus]["corun_ms"] / co.ms - 1) * 100
                        if pco is not None:
                            row["prefill_vs_green_corun_pct"] = (
                                green[versus]["prefill_corun_ms"] / pco.ms - 1) * 100
                        if f"{versus} no pdl" in green:
                            row["vs_green_no_pdl_alone_pct"] = (
                                green[f"{versus} no pdl"]["alone_ms"] / alone - 1) * 100
                    res.save()


def attention_16(res: Results, gpu) -> None:
    """Decode attention (32 x 8192) on 16 pinned SMs, the first sites (decode's), at each c."""
    work = DecodeAttention(MODEL, batch=32, context=8192)
    stream = torch.cuda.Stream()
    rates = {}
    for c in CTAS:
        budget = Budget(16, c, first_site=0, site_head=16)
        ms = time_alone(lambda: work.run(budget), stream, graph=True)
        rates[c] = work.rate(ms)
        res.row(section="decode attention 16 SMs", kind="pinned", ctas_per_sm=c, ms=ms,
                tbps=rates[c])
    res.data["summary"]["decode_attention_16sm_best_c_gain"] = max(rates.values()) / rates[1]
    res.save()


def file_figures(kernels: str | None, run: str | None) -> dict:
    """The kernel benchmark's and a run's figures, where their files are given: read before
    anything is measured, so a wrong file ends the script at once and not after its GPU work."""
    s = {}
    if kernels:
        data = read_json(kernels, "kernel benchmark")
        k = data.get("summary")
        if not isinstance(k, dict) or not {"decode_linear_bw_frac",
                                           "decode_attention_bw_frac"} <= k.keys():
            raise PdmuxError(f"{kernels} is not bench/bench_kernels.py's file (its summary's "
                             f"decode_linear_bw_frac and decode_attention_bw_frac)")
        s.update(decode_linear_min_bw_frac=k["decode_linear_bw_frac"],
                 decode_attention_min_bw_frac=k["decode_attention_bw_frac"], kernels_file=kernels,
                 kernels_gpu=data.get("gpu"))
    if run:
        data = read_json(run, "run result")
        rows = data.get("rows")
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "strategy" in r
                                                 for r in rows):
            raise PdmuxError(f"{run} is not a `pdmux-triton run` result (its rows, a strategy "
                             f"each)")
        if data.get("unserved"):  # a run stopped midway: its best kind may be among them
            raise PdmuxError(f"{run} is a run stopped before {', '.join(data['unserved'])}: "
                             f"serve it whole")
        pdmux = {r["strategy"]: r for r in rows if r["strategy"].startswith("pdmux_")}
        try:
            if pdmux:
                best = min(pdmux, key=lambda n: pdmux[n]["itl_during_prefill_p50_ms"])
                s.update(pdmux_best_kind=best,
                         pdmux_itl_in_prefill_ms=pdmux[best]["itl_during_prefill_p50_ms"],
                         pdmux_prefill_ms=pdmux[best]["prefill_ms"], run_file=run,
                         run_gpu=data.get("gpu"))
        except KeyError as missing:
            raise PdmuxError(f"{run}: its pd-mux rows lack {missing}") from None
    return s


def check_files_gpu(figures: dict, gpu_name: str) -> None:
    """The files' figures are this GPU's: another card's would sit in this card's summary as
    if measured beside its floor."""
    for what in ("kernels", "run"):
        if f"{what}_file" in figures and figures[f"{what}_gpu"] != gpu_name:
            raise PdmuxError(f"{figures[f'{what}_file']} was measured on "
                             f"{figures[f'{what}_gpu']!r}, not on this GPU ({gpu_name!r}): "
                             f"give this GPU's file or none")


def from_files(res: Results, figures: dict) -> None:
    """The kernel benchmark's and a run's figures (`file_figures`) into the summary."""
    res.data["summary"].update(figures)
    res.save()


def _worst(rows: list[dict]) -> float:
    """The largest |pinned vs green| over rows, alone or beside the prefill."""
    return max(max(abs(r["vs_green_alone_pct"]), abs(r["vs_green_corun_pct"])) for r in rows)


def _prefill_beside(s: dict, name: str, rows: list[dict]) -> None:
    """The prefill beside a pinned turn: its slowest level against the prefill beside green's
    decode side (negative: slower); rows from before the prefill was timed beside lack it."""
    pcts = [r["prefill_vs_green_corun_pct"] for r in rows if "prefill_vs_green_corun_pct" in r]
    if pcts:
        s[f"{name}_prefill_vs_green_min_pct"] = min(pcts)


def summarize(res: Results) -> None:
    """Pinned against green: the product's turns at 1-3 CTAs an SM, the served side, the SMs
    the sides shared, the gap left without PDL, each diagnostic turn's own figure, and the
    prefill beside each turn at one CTA an SM. A run of some turns (`--turns`) gets the figures
    of those it ran."""
    pinned = [r for r in res.data["rows"] if r["section"] == "level" and r["kind"] == "pinned"]
    rows = [r for r in pinned if r["ctas_per_sm"] not in DIAGNOSTIC_TURNS]
    s = res.data["summary"]
    by_c = [r for r in rows if r["ctas_per_sm"] != "served"]
    if by_c:
        s["pinned_vs_green_max_error_pct"] = _worst(by_c)
    served = [r for r in rows if r["ctas_per_sm"] == "served"]
    if served:
        s["served_pinned_vs_green_max_error_pct"] = _worst(served)
    if rows:
        s["pinned_shared_sms"] = max(r["shared_sms"] for r in rows)
    _prefill_beside(s, "pinned", [r for r in rows if r["ctas_per_sm"] == 1])
    no_pdl = [abs(r["vs_green_no_pdl_alone_pct"]) for r in rows
              if "vs_green_no_pdl_alone_pct" in r]
    if no_pdl:  # the gap left with green's launches apart too: the gate's
        s["pinned_vs_green_without_pdl_max_alone_pct"] = max(no_pdl)
    for turn, key in DIAGNOSTIC_NAMES.items():
        diagnostic = [r for r in pinned if r["ctas_per_sm"] == turn]
        if diagnostic:
            s[f"{key}_vs_green_max_error_pct"] = _worst(diagnostic)
            _prefill_beside(s, key, diagnostic)
    res.save()


def run(args) -> int:
    figures = file_figures(args.kernels, args.run)
    require_gpu("bench/decode_floor.py")
    gpu = detect_gpu()
    check_files_gpu(figures, gpu.name)
    # (a run of some turns is not the floor's whole file: it gets its own name)
    name = "decode-floor-turns" if args.turns else "decode-floor"
    res = Results(Path(args.out) / f"{name}-{gpu.name}.json", gpu.name)
    res.data["inputs"] = {"model": MODEL.name, "batch": BATCH, "context": CONTEXT,
                          "ctas": list(CTAS), "stream_bytes": STREAM_BYTES,
                          "turns": list(args.turns or TURNS)}
    step = DecodeStep(MODEL, BATCH, CONTEXT)
    whole_gpu(res, step, gpu.sms)
    attention_16(res, gpu)
    levels(res, step, PrefillLayers(MODEL, 8192, layers=2), gpu, args.turns)
    summarize(res)
    from_files(res, figures)
    print(f"wrote {res.path}")
    for key, value in res.data["summary"].items():
        print(f"{key:36s} {value:.4g}" if isinstance(value, float) else f"{key:36s} {value}")
    return 0


def main(argv=None) -> int:
    p = bench_parser("decode_floor.py", __doc__)
    p.add_argument("--kernels", help="bench/bench_kernels.py's kernels-<gpu>.json")
    p.add_argument("--run", help="`pdmux-triton run --kinds ...`'s run-<gpu>.json")
    p.add_argument("--turns", type=listed(choice(TURNS), "turn"),
                   help="only these pinned turns at each level, and green's they are compared "
                        f"with (default: all of {', '.join(TURNS)})")
    return run_script(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
