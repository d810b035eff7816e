"""Measured chunked-prefill rounds against the price the simulator puts on them, by the chunk's
place in its prompt, the decode rows, the longest decode row and the side that bound the round.

Reads measured capacity folders' diagnostics of a trace (`capacity-diagnostics-<gpu>.jsonl`
beside their settings, e.g. bench/results/prefix-cache/conv-3000-200-on): every chunked
point's rounds (chunk, decode batch, its context sum, seconds) and its host's launch times (a
round's first layer and, in a run since replays, each later one).
Each round's decode rows' own contexts are replayed from the point's prefills in order and the
trace's output lengths (each round's batch and context sum must come back exactly, or the
point is refused): they check the replay and band the rounds by their longest decode row
(today's price reads only their sum, as decode attention reads their KV; a round saved before
they left the extend kernel prices each row's context in its tiles too, as it ran). The round
is priced as
`SimExecutor.mixed` prices it on the run's host
(`Overheads.on_host`; its later layers at the run's own time, every layer at the first's in a
run measured before replays): with the host-costs file given and, with `--against`, a second
one beside it. Writes <out>/mixed-rounds-<gpu>.json; prints measured / priced, time-weighted.

    python bench/mixed_rounds.py bench/results/prefix-cache/conv-3000-200-on/capacity-diagnostics-h200.jsonl \\
        --against OLD-HOST-COSTS.json --out /tmp/x
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
from script import MEASURED_ON_H200, bench_parser, finish, run_script

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.measured_inputs import load_calibration, load_compare, load_host_costs
from pdmux_triton.errors import PdmuxError
from pdmux_triton.experiments.capacity import PointKey
from pdmux_triton.experiments.settings import RunSettings
from pdmux_triton.results import PointStore, provenance, read_json
from pdmux_triton.serve.metrics import later_layer_s, rows_in_extend_tiles
from pdmux_triton.spec.models import ModelSpec, model_preset
from pdmux_triton.spec.traces import load_trace

CHUNK = re.compile(r"chunk (\d+)\+(\d+)")
BANDS = {"chunk_start": (0, 4096, 8192, 16384, 32768),
         "decode_rows": (0, 1, 5, 9, 17),
         "longest_row": (0, 1, 8192, 16384, 32768)}


def served(folder: Path, gpu: str) -> tuple[RunSettings, list]:
    """The folder's settings and its trace's requests as served: arrival order, each within
    the model's context length (what the measuring run held them to)."""
    saved = read_json(folder / f"capacity-settings-{gpu}.json", "capacity settings")
    if saved.get("workload") != "trace":
        raise PdmuxError(f"{folder} did not serve a trace: its rounds cannot be replayed")
    s = RunSettings.from_dict({**RunSettings.defaults(), **saved, "simulate": True})
    model = ModelSpec(**{**saved["model"], "max_context": model_preset(s.model.name).max_context})
    trace = load_trace(s.trace, model.max_context, "context", s.trace_model).replayed(
        s.trace_start, s.trace_count, s.speed)
    return s, trace.requests(model.vocab, s.seed)


def replayed_rounds(point: dict, requests: list) -> list[dict]:
    """Each chunked round of a measured point with its decode rows' own contexts."""
    lengths = [p[2] + p[4] for p in point["prefills"]]  # computed + cached: the prompt
    pool, outputs = list(requests), []
    for n in lengths:  # served first come, first served: the first unserved of that length
        r = next((q for q in pool if q.prompt_len == n), None)
        if r is None:
            raise PdmuxError(f"{point['strategy']} at {point['rate']:g} req/s served a "
                             f"{n}-token prompt the trace does not hold")
        pool.remove(r)
        outputs.append(r.output_len)
    r = point["rounds"]
    labels = [r["labels"][i] for i in r["label"]]
    decoding, prompt, start, done, rows = [], -1, None, False, []
    for i, label in enumerate(labels):
        contexts = [c for c, _ in decoding]
        if len(contexts) != r["decode_bs"][i] or sum(contexts) != r["decode_context"][i]:
            raise PdmuxError(f"{point['strategy']} at {point['rate']:g} req/s: round {i}'s "
                             f"decode batch does not replay from its prefills")
        joined = None
        if (m := CHUNK.fullmatch(label)) is not None:
            first, n = map(int, m.groups())
            if start is None or first <= start or done:
                prompt += 1
            start, done = first, first + n == lengths[prompt]
            if done:
                joined = [lengths[prompt], outputs[prompt] - 1]
            rows.append({"start": first, "chunk": n, "last": done, "contexts": contexts,
                         "seconds": (r["end_us"][i] - r["start_us"][i]) / 1e6})
        decoding = [[c + 1, left - 1] for c, left in decoding if left > 1]
        if joined is not None and joined[1] > 0:
            decoding.append(joined)
    return rows


def priced(rounds: list[dict], s: RunSettings, host, host_s: float,
           later_s: float | None, before: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each round's price as `SimExecutor.mixed` sets it on a host launching a round's first
    layer in `host_s` and each later one in `later_s` (the run's own; None: as the first, a
    run measured before replays), and whether its GPU phases (not its launches) bound it.
    `before`: a run saved before a mixed step's decode rows left the extend kernel, priced as
    it ran (its rows' replayed contexts in the extend tiles too: `Overheads.served_on(0)`)."""
    cal, cmp = load_calibration(s.calibration, s.gpu.name), load_compare(s.compare, s.gpu.name)
    decode = cal.decode_curve("grid_cap")
    prefill = cmp.prefill_rate("grid_cap", s.gpu.bf16_tflops, s.gpu.sms)
    if host.whole_gpu_prefill_mfu is not None:
        prefill = prefill.on_whole_gpu(host.whole_gpu_prefill_mfu)
    moved = (host.served_on(0) if before else host).on_host(host_s)
    fit, layers = moved.mixed, s.model.layers
    gpu = np.array([float(step_cost.mixed_step_s(
        s.model, decode, prefill, s.gpu.sms, sum(r["contexts"]), len(r["contexts"]), r["chunk"],
        r["start"], r["last"], phases=fit, decode_contexts=r["contexts"]))
        for r in rounds])
    return (fit.fixed_s + np.array([step_cost.layer_pipeline_s(g, layers, host_s, later_s)
                                    for g in gpu]),
            gpu > layers * (host_s if later_s is None else later_s))  # the later layers pace


def band_rows(rounds, prices: dict[str, np.ndarray], bound: np.ndarray) -> list[dict]:
    keys = {"chunk_start": [r["start"] for r in rounds],
            "decode_rows": [len(r["contexts"]) for r in rounds],
            "longest_row": [max(r["contexts"], default=0) for r in rounds]}
    seconds = np.array([r["seconds"] for r in rounds])
    out = []
    groups = [("all", "", np.ones(len(rounds), dtype=bool)),
              ("bound", "GPU", bound), ("bound", "launches", ~bound)]
    for name, edges in BANDS.items():
        key = np.array(keys[name])
        for lo, hi in zip(edges, (*edges[1:], None)):
            groups.append((name, f"{lo}-{'' if hi is None else hi - 1}",
                           (key >= lo) & (True if hi is None else key < hi)))
    for name, band, sel in groups:
        if sel.any():
            out.append({"by": name, "band": band, "rounds": int(sel.sum()),
                        "measured_ms": float(seconds[sel].mean() * 1e3),
                        **{f"measured_over_{k}": float(seconds[sel].sum() / p[sel].sum())
                           for k, p in prices.items()},
                        **{f"median_abs_error_{k}": float(np.median(
                            np.abs(p[sel] - seconds[sel]) / seconds[sel]))
                           for k, p in prices.items()}})
    return out


def run(args) -> int:
    points = []
    for path in args.diagnostics:
        path = Path(path)
        gpu = path.stem.removeprefix("capacity-diagnostics-")
        s, requests = served(path.parent, gpu)
        hosts = {"given": load_host_costs(args.host_costs, s.gpu.name)}
        if args.against:
            hosts["against"] = load_host_costs(args.against, s.gpu.name)
        for point in PointStore(path, PointKey).points.values():
            if not (point["strategy"].startswith("chunked_") and point.get("host_layer_us")):
                continue
            before = rows_in_extend_tiles(point["strategy"], point)
            rounds = replayed_rounds(point, requests)
            host_s, later_s = point["host_layer_us"] / 1e6, later_layer_s(point)
            prices = {k: priced(rounds, s, h, host_s, later_s, before) for k, h in hosts.items()}
            points.append({"folder": path.parent.name, "strategy": point["strategy"],
                           "rate": point["rate"], "host_layer_ms": host_s * 1e3,
                           "saved_before_decode_rows_left_the_extend_kernel": before,
                           "bands": band_rows(rounds, {k: p for k, (p, _) in prices.items()},
                                              prices["given"][1])})
    if not points:
        raise PdmuxError("the diagnostics hold no measured chunked point whose run timed its "
                         "host")
    lines = []
    for p in points:
        lines.append(f"{p['folder']} {p['strategy']} at {p['rate']:g} req/s (host "
                     f"{p['host_layer_ms']:.2f} ms a layer"
                     + ("; saved before decode rows left the extend kernel, priced as it ran"
                        if p["saved_before_decode_rows_left_the_extend_kernel"] else "")
                     + "): measured / priced, time-weighted")
        for b in p["bands"]:
            cells = "  ".join(f"{k} {b[f'measured_over_{k}']:.3f} (|error| median "
                              f"{b[f'median_abs_error_{k}']:.1%})"
                              for k in ("given", "against") if f"measured_over_{k}" in b)
            lines.append(f"  {b['by']:<12} {b['band']:<12} {b['rounds']:>5} rounds "
                         f"{b['measured_ms']:6.1f} ms  {cells}")
    out = Path(args.out) / f"mixed-rounds-{gpu}.json"
    return finish(out, {**provenance(gpu), "host_costs": args.host_costs,
                        "against": args.against, "points": points}, "\n".join(lines))


def main(argv=None) -> int:
    p = bench_parser("mixed_rounds.py", __doc__)
    p.add_argument("diagnostics", nargs="+", help="measured capacity folders' diagnostics "
                   "(capacity-diagnostics-<gpu>.jsonl) of a trace")
    p.add_argument("--host-costs", default=MEASURED_ON_H200["host_costs"])
    p.add_argument("--against", help="a second host-costs file to price the rounds with")
    return run_script(p, run, argv)


if __name__ == "__main__":
    sys.exit(main())
