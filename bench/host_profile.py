"""Where the host's time goes when it launches an eager layer (issue 27: launch-bound chunked
rounds make the served runs follow the host's speed, which runs in phases no simulator can
know ahead): `calibrate --host-costs`'s eager layer at a few token counts, timed plain with
our launches past Triton's dispatch (kernels/_dispatch.py) and through it, in turns, then
under cProfile, with the functions that take the most of it by their own time and by their
time with what they call; then, through Triton's dispatch, each launch split by clock alone
(no profiler): the dispatch (`JITFunction.run`: binding and specializing the arguments, the
cache key) apart from its launcher (`CudaLauncher.__call__`: TMA descriptors encoded, the
driver's launch), and the rest of the layer (our launchers, torch); and a whole prefill's
layers a call, those after the first replayed (kernels/_replay.py) and launched one by one, in
turns. Writes
<out>/host-profile-<gpu>.json and prints the table.

    python bench/host_profile.py --out /tmp/x [--tokens 16,512] [--layers 200]
"""

from __future__ import annotations

import cProfile
import contextlib
import pstats
import statistics
import sys
import time
from collections import defaultdict

import torch
import triton.backends.nvidia.driver as nvidia_driver
from triton.runtime.jit import JITFunction
from script import bench_parser, finish, run_script

from pdmux_triton.cli.common import measuring_gpu, out_folder
from pdmux_triton.cli.parsing import integer, listed
from pdmux_triton.gpu.model_executor import ModelExecutor
from pdmux_triton.kernels._dispatch import through_triton
from pdmux_triton.measure import host_costs
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.results import provenance
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import Request

TOP = 25  # functions kept per ordering
TURNS = 10  # blocks of layers timed past and through Triton's dispatch in turns


def launch_layers(x: ModelExecutor, carry, layers: int) -> list[float]:
    """Host seconds of each of `layers` one-layer launches (the GPU waited for between them,
    so that each launch finds an idle queue, as a launch-bound round does)."""
    times = []
    for _ in range(layers):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x.model.extend_layers(carry.batch, 0, 1, budget=x.prefill_side.budget)
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return times


def prefill_layers(x: ModelExecutor, carry, calls: int) -> list[tuple[float, float]]:
    """Host seconds of each of `calls` launches of all the model's layers (the GPU waited for
    between them), as a prefill-first round or a chunked round launches them: its first
    layer's (the batch embedded) and a later layer's."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        times.append(host_costs.launch_prefill_layers(x, carry))
    torch.cuda.synchronize()
    return times


def replayed_vs_one_by_one(x: ModelExecutor, carry, calls: int) -> dict:
    """A whole prefill's host time, its layers after the first replayed (kernels/_replay.py)
    and launched one by one, in turns: a layer of the call on average, its first layer (which
    records the launches where they are replayed) and a later layer; then where the replayed
    call's host time goes (cProfile, by own time)."""
    replayed, one_by_one = [], []
    before = x.model.replays_layers
    try:
        for turn in range(TURNS):
            for replays in (turn % 2 == 0, turn % 2 == 1):
                x.model.replays_layers = replays
                (replayed if replays else one_by_one).extend(
                    prefill_layers(x, carry, max(1, calls // TURNS)))
    finally:
        x.model.replays_layers = before
    prof = cProfile.Profile()
    prof.enable()
    prefill_layers(x, carry, max(1, calls // TURNS))
    prof.disable()
    n = x.num_layers
    out = {"layers_a_call": n, "calls_each_way": len(replayed)}
    for name, times in (("replayed", replayed), ("one_by_one", one_by_one)):
        calls_s = [first + (n - 1) * later for first, later in times]
        out[f"{name}_host_ms_a_layer_p50"] = statistics.median(calls_s) / n * 1e3
        out[f"{name}_host_ms_a_layer_p90"] = statistics.quantiles(calls_s, n=10)[-1] / n * 1e3
        out[f"{name}_first_layer_ms_p50"] = statistics.median(f for f, _ in times) * 1e3
        out[f"{name}_later_layer_ms_p50"] = statistics.median(lt for _, lt in times) * 1e3
    out["replayed_over_one_by_one_p50"] = (out["replayed_host_ms_a_layer_p50"]
                                           / out["one_by_one_host_ms_a_layer_p50"])
    out["replayed_by_own_time"] = top_functions(pstats.Stats(prof), "tottime",
                                                max(1, calls // TURNS))
    return out


def top_functions(stats: pstats.Stats, key: str, calls_per: int) -> list[dict]:
    """The TOP functions by `key` ('tottime' or 'cumtime'), their times and calls a layer."""
    rows = []
    for (path, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        rows.append({"function": f"{path.split('site-packages/')[-1]}:{line}({name})",
                     "calls_a_layer": ncalls / calls_per,
                     "own_us_a_layer": tottime / calls_per * 1e6,
                     "with_callees_us_a_layer": cumtime / calls_per * 1e6})
    field = "own_us_a_layer" if key == "tottime" else "with_callees_us_a_layer"
    return sorted(rows, key=lambda r: -r[field])[:TOP]


@contextlib.contextmanager
def timed_launches(spans: dict):
    """Within the block, every Triton launch's host seconds by kernel name into `spans`:
    [run, launcher] pairs, `run` the whole `JITFunction.run` (the launcher within it)."""
    run, launch = JITFunction.run, nvidia_driver.CudaLauncher.__call__
    inner = []

    def timed_run(fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = run(fn, *args, **kwargs)
        spans[fn.__name__].append((time.perf_counter() - t0, inner.pop() if inner else 0.0))
        return out

    def timed_launch(self, *args):
        t0 = time.perf_counter()
        out = launch(self, *args)
        inner.append(time.perf_counter() - t0)
        return out

    JITFunction.run, nvidia_driver.CudaLauncher.__call__ = timed_run, timed_launch
    try:
        yield
    finally:
        JITFunction.run, nvidia_driver.CudaLauncher.__call__ = run, launch


def launch_split(spans: dict, layers: int, layer_s: float) -> dict:
    """Per layer: Triton's dispatch and its launcher by kernel (us a call and calls a layer),
    and what is left of the layer's host time (our launchers, torch)."""
    kernels = {name: {"calls_a_layer": len(pairs) / layers,
                      "dispatch_us_a_call": statistics.median(r - lch for r, lch in pairs) * 1e6,
                      "launcher_us_a_call": statistics.median(lch for _, lch in pairs) * 1e6}
               for name, pairs in spans.items()}
    triton_s = sum(r for pairs in spans.values() for r, _ in pairs) / layers
    return {"kernels": kernels, "layer_us": layer_s * 1e6, "triton_us_a_layer": triton_s * 1e6,
            "launcher_us_a_layer": sum(lch for p in spans.values() for _, lch in p) / layers * 1e6,
            "rest_us_a_layer": (layer_s - triton_s) * 1e6}


def profile_case(x: ModelExecutor, tokens: int, layers: int) -> dict:
    req = Request(10**6, [1] * tokens, 2, 0.0)
    carry = x.begin_prefill([req])
    try:
        launch_layers(x, carry, 10)  # anything first-time out of the way
        plain, triton = [], []
        for turn in range(TURNS):  # each first in every other turn
            for past in (turn % 2 == 0, turn % 2 == 1):
                with contextlib.nullcontext() if past else through_triton():
                    (plain if past else triton).extend(launch_layers(x, carry, layers // TURNS))
        prof = cProfile.Profile()
        prof.enable()
        profiled = launch_layers(x, carry, layers)
        prof.disable()
        spans = defaultdict(list)
        with timed_launches(spans), through_triton():
            split = launch_layers(x, carry, layers)
        whole = replayed_vs_one_by_one(x, carry, max(TURNS, layers // 10))
    finally:
        x.release(req)
    stats = pstats.Stats(prof)
    p50 = statistics.median(plain)
    return {"tokens": tokens, "layers": layers, "layers_timed_each_way": len(plain),
            "host_ms_a_layer_p50": p50 * 1e3,
            "host_ms_a_layer_p90": statistics.quantiles(plain, n=10)[-1] * 1e3,
            "through_triton_host_ms_a_layer_p50": statistics.median(triton) * 1e3,
            "through_triton_host_ms_a_layer_p90": statistics.quantiles(triton, n=10)[-1] * 1e3,
            "past_over_through_triton_p50": p50 / statistics.median(triton),
            "profiled_host_ms_a_layer_p50": statistics.median(profiled) * 1e3,
            "launch_split": launch_split(spans, layers, statistics.mean(split)),
            "whole_prefill": whole,
            "by_own_time": top_functions(stats, "tottime", layers),
            "by_time_with_callees": top_functions(stats, "cumtime", layers)}


def run(args) -> int:
    gpu, spec, out = measuring_gpu(), model_preset("qwen3-8b"), out_folder(args.out)
    x = ModelExecutor.shared(spec, gpu, "grid_cap", cache_tokens=host_costs.CACHE_TOKENS,
                             max_context=host_costs.MAX_CONTEXT)
    try:
        x.warm_up("prefill_first", sglang_rules.PDMuxConfig(), 8, 2 * max(args.tokens), 2048)
        cases = []
        for tokens in args.tokens:
            print(f"host profile: {args.layers} layers of {tokens} tokens ...", flush=True)
            cases.append(profile_case(x, tokens, args.layers))
    finally:
        ModelExecutor.release_shared()
    lines = [f"{'tokens':>7} {'host ms a layer p50':>20} {'p90':>7} {'through Triton p50':>19} "
             f"{'p90':>7} {'ratio':>6} {'profiled':>9}"]
    for c in cases:
        lines.append(f"{c['tokens']:>7} {c['host_ms_a_layer_p50']:>20.3f} "
                     f"{c['host_ms_a_layer_p90']:>7.3f} "
                     f"{c['through_triton_host_ms_a_layer_p50']:>19.3f} "
                     f"{c['through_triton_host_ms_a_layer_p90']:>7.3f} "
                     f"{c['past_over_through_triton_p50']:>6.3f} "
                     f"{c['profiled_host_ms_a_layer_p50']:>9.3f}")
        w = c["whole_prefill"]
        lines.append(f"  a whole prefill ({w['layers_a_call']} layers), host ms a layer p50 "
                     f"(p90): replayed {w['replayed_host_ms_a_layer_p50']:.3f} "
                     f"({w['replayed_host_ms_a_layer_p90']:.3f}), one by one "
                     f"{w['one_by_one_host_ms_a_layer_p50']:.3f} "
                     f"({w['one_by_one_host_ms_a_layer_p90']:.3f}): "
                     f"{w['replayed_over_one_by_one_p50']:.3f}; first layer "
                     f"{w['replayed_first_layer_ms_p50']:.3f} / "
                     f"{w['one_by_one_first_layer_ms_p50']:.3f}, later "
                     f"{w['replayed_later_layer_ms_p50']:.3f} / "
                     f"{w['one_by_one_later_layer_ms_p50']:.3f}; a replayed call's own time, "
                     f"us a call:")
        lines += [f"  {r['own_us_a_layer']:8.1f} ({r['calls_a_layer']:5.1f})  {r['function']}"
                  for r in w["replayed_by_own_time"][:15]]
        sp = c["launch_split"]
        lines.append(f"  through Triton by clock, us a layer: {sp['layer_us']:.0f} = Triton "
                     f"{sp['triton_us_a_layer']:.0f}"
                     f" (its launchers {sp['launcher_us_a_layer']:.0f}) + the rest "
                     f"{sp['rest_us_a_layer']:.0f}; a call, dispatch / launcher (calls a layer):")
        lines += [f"  {k['dispatch_us_a_call']:8.1f} / {k['launcher_us_a_call']:6.1f} "
                  f"({k['calls_a_layer']:.0f})  {name}" for name, k in sp["kernels"].items()]
        lines.append(f"  own time, us a layer (calls), {c['tokens']} tokens:")
        lines += [f"  {r['own_us_a_layer']:8.1f} ({r['calls_a_layer']:5.1f})  {r['function']}"
                  for r in c["by_own_time"][:15]]
    data = {**provenance(gpu.name), "model": spec.name, "cases": cases}
    return finish(out / f"host-profile-{gpu.name}.json", data,
                  "\n".join(lines))


def main(argv=None) -> int:
    parser = bench_parser("host_profile.py", __doc__)
    parser.add_argument("--tokens", type=listed(integer(1, 65536), "token count"),
                        default=(16, 512))
    parser.add_argument("--layers", type=integer(TURNS, 100_000), default=200,
                        help=f"layers timed each way, in {TURNS} turns (rounded down to them)")
    return run_script(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
