"""The benchmark scripts on a machine without a GPU: the offline compile diagnostic runs (it
needs Triton's bundled ptxas, no GPU), the measuring scripts say they need one."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.serve.metrics import MIXED_CHUNK_ROWS, MIXED_DECODE_ROWS

# what a run saved by today's executor writes of its chunked steps (`metrics.chunked_steps_of`)
TODAY_MARKS = {"mixed_decode_rows": MIXED_DECODE_ROWS, "mixed_chunk_rows": MIXED_CHUNK_ROWS}


def test_decode_kernel_compiles_for_sm90_offline():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "bench/profile_decode.py", "--offline"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "cp.async (to shared)" in out.stdout and "shared buffers" in out.stdout
    assert "128x128xbf16" in out.stdout  # K/V tiles staged in shared memory
    gemms = {line.split(",")[0]: line for line in out.stdout.splitlines() if line.startswith("gemm")}
    assert "TMA bulk tensor copy 0" not in gemms["gemm prefill 128x256x64"]
    # swapped operands: even M = 1 runs on the warpgroup MMA, its loads on cp.async
    decode = gemms["gemm M<=16"]
    assert "wgmma (Hopper) 0" not in decode and "cp.async (to shared) 0" not in decode
    # the attention loop's instructions were counted: HMMA among them, a few hundred in all
    loop = next(line for line in out.stdout.splitlines() if "inner loop (SASS/warp)" in line)
    assert "HMMA" in loop and 100 < int(loop.split()[3].rstrip(":")) < 2000
    # the pinned forms (an SM gate and slots claimed, or one slot a site, or either tagged,
    # around the same body) compile for sm_90, %smid and %gridid included, and their inner
    # loop is the plain one's, give or take a few instructions; the GEMMs compile with every
    # gate
    for gate, flags in (("claiming", ["--pinned"]), ("one-a-site", ["--pinned", "one-a-site"]),
                        ("tagged", ["--pinned", "tagged"]),
                        ("tagged-claiming", ["--pinned", "tagged-claiming"])):
        pinned = subprocess.run([sys.executable, "bench/profile_decode.py", "--offline", *flags],
                                env=env, capture_output=True, text=True, timeout=300)
        assert pinned.returncode == 0, pinned.stderr[-2000:]
        assert f"decode attention ({gate})" in pinned.stdout
        assert f"gemm ({gate}) M<=16, whole GPU" in pinned.stdout
        pinned_loop = next(line for line in pinned.stdout.splitlines()
                           if "inner loop (SASS/warp)" in line)
        assert abs(int(pinned_loop.split()[3].rstrip(":")) - int(loop.split()[3].rstrip(":"))) <= 8
    # overlapped launches (PDL): the skinny GEMMs fetch their first weight lines into L2
    # before they wait for the kernel before; launched plain, they fetch none
    pdl = subprocess.run([sys.executable, "bench/profile_decode.py", "--offline", "--pdl"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert pdl.returncode == 0, pdl.stderr[-2000:]
    assert "L2 prefetches 0" in decode
    assert "L2 prefetches 0" not in next(line for line in pdl.stdout.splitlines()
                                         if line.startswith("gemm (pdl) M<=16"))


def test_inner_loop_is_the_shortest_backward_branch_with_mma():
    sys.path.insert(0, "bench")
    from profile_decode import inner_loop_sass

    listing = "\n".join([
        "Function:k", "LBB4:", "--:-:-:-:1\tIADD3 R9, R9, 1, RZ;", "--:-:-:-:1\tSTG [R9], R0;",
        "--:-:-:-:5\t@P1 BRA LBB4;",  # as short, but only stores (zeroing outputs): not it
        "--:-:-:-:1\tMOV R0, R1;", "LBB2:", "--:-:-:-:1\tIADD3 R1, R1, 1, RZ;",
        "LBB1:", "--:-:-:-:1\tHMMA R2, R4, R6, R2;", "--:-:-:-:1\tLDGSTS [R3], [R8];",
        "--:-:-:-:5\t@!P0 BRA LBB1;", "--:-:-:-:5\tBRA LBB2;", "LBB3:", "--:-:-:-:5\tBRA LBB3;"])
    assert inner_loop_sass(listing) == ["HMMA R2, R4, R6, R2;", "LDGSTS [R3], [R8];",
                                        "@!P0 BRA LBB1;"]


@pytest.mark.parametrize("script, says", [
    ("bench/bench_kernels.py", "torch sees none"), ("bench/decode_occupancy.py", "torch sees none"),
    ("bench/profile_decode.py", "torch sees none"), ("bench/pinned_sites.py", "torch sees none"),
    ("bench/gate_anatomy.py", "torch sees none"),
    ("bench/prefill_rate.py", "torch sees none"), ("bench/sustained_corun.py", "torch sees none"),
    ("bench/mixed_layers.py", "torch sees none"),
    ("bench/trace_fidelity.py", "no CUDA GPU is visible to torch"),
    ("bench/host_profile.py", "no CUDA GPU is visible to torch")])
def test_benchmarks_without_a_gpu_say_so_in_one_line(script, says):
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and says in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,says", [
    (["--rows", "0,x"], "--rows"), (["--rows", "1,1"], "--rows"), (["--rows", "-1"], "--rows"),
    (["--contexts", "0"], "--contexts"), (["--chunk", "0"], "--chunk"),
    (["--chunk", "64"], "--chunk"), (["--prefix", "-1"], "--prefix"),
    (["--rows", "64", "--contexts", "32768"], "tokens of decode KV")])
def test_mixed_layers_refuses_bad_values(argv, says):
    out = subprocess.run([sys.executable, "bench/mixed_layers.py", *argv],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("argv,says", [
    (["--batches", "12x20"], "--batches"), (["--batches", "8192"], "--batches"),
    (["--seconds", "0"], "--seconds"), (["--seconds", "nan"], "--seconds"),
    (["--levels", "0"], "--levels"), (["--levels", "x"], "--levels"),
    (["--busy-shares", "1.2"], "--busy-shares"), (["--busy-shares", "0.5,0.5"], "--busy-shares"),
    (["--busy-shares", "0"], "--busy-shares")])
def test_sustained_corun_refuses_bad_values(argv, says):
    out = subprocess.run([sys.executable, "bench/sustained_corun.py", *argv],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr


def test_sustained_corun_reads_its_series():
    """A sustained run's windows (the first half second, the last two); a rate as MFU per SM
    of the level's share."""
    sys.path.insert(0, "bench")
    import sustained_corun as sc

    series = [(0.1 * i, 40.0 + (i >= 30)) for i in range(50)]  # 5 s, slower after 3 s
    s = sc.summary(series)
    assert s["ms_first_median"] == 40.0 and s["ms_last_median"] == 41.0
    assert s["seconds"] == pytest.approx(4.941) and sc.summary([]) == {"ms_median": None}
    from pdmux_triton.spec.gpus import gpu_preset
    gpu = gpu_preset("h200")
    assert sc.mfu_per_sm(989e12 * 66 / 132 * 0.5 * 1e-3, 1.0, 66, gpu) == pytest.approx(0.5)
    steps = sc.decode_steps({"decode_step_ms": [7.0, 7.4, 7.2]}, 6.5)
    assert steps == {"decode_step_ms_median": 7.2, "decode_step_ms_alone": 6.5}
    assert sc.decode_steps({"decode_step_ms": []}, 6.5)["decode_step_ms_median"] is None


@pytest.mark.parametrize("argv,says", [
    (["--tokens", "0"], "--tokens"), (["--tokens", "1,x"], "--tokens"),
    (["--tokens", "40000"], "--tokens"), (["--tokens", ""], "--tokens"),
    (["--prompts", "65"], "--prompts"), (["--batch-tokens", "4", "--prompts", "8"], "--prompts 8")])
def test_prefill_rate_refuses_bad_lengths(argv, says):
    out = subprocess.run([sys.executable, "bench/prefill_rate.py", *argv],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr


def test_slo_levels_simulated_compares_the_policies(tmp_path):
    """bench/slo_levels.py --simulate on a short stream: every policy at the fixed rate and
    its simulated capacity, the ratios in the summary, measured fields empty."""
    import json

    out = subprocess.run([sys.executable, "bench/slo_levels.py", "--simulate", "--out",
                          str(tmp_path), "--traffic", "sharegpt:8", "--count", "30"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "slo-levels-h200-simulated.json").read_text())
    policies = data["traffic"]["sharegpt"]["policies"]
    assert list(policies) == ["default", "advised", "slo", "slo_relevel"]
    for name, p in policies.items():
        assert p["goodput_capacity_rps"]["simulated"] > 0 and p["goodput_capacity_rps"]["measured"] is None
        assert p["at_rates"]["8"]["simulated"]["requests_served"] == 30, name
    thresholds = [t for _, _, t in policies["advised"]["manual_divisions"]]
    assert thresholds == sorted(thresholds) and policies["default"]["manual_divisions"] == []
    summary = data["summary"]["per_traffic"]["sharegpt"]
    ratio = summary["slo_vs_default_goodput_capacity"]["simulated"]
    assert ratio == policies["slo"]["goodput_capacity_rps"]["simulated"] / policies["default"][
        "goodput_capacity_rps"]["simulated"]
    assert data["summary"]["slo_vs_default_measured"] is False
    assert "slo / default goodput capacity" in out.stdout


def test_slo_levels_keeps_each_policys_simulated_points_in_their_shared_folder(tmp_path):
    """default and slo share a folder: serving slo again must not drop default's points."""
    import json

    for mode in ("--simulate", "--offline"):
        done = subprocess.run([sys.executable, "bench/slo_levels.py", "--out", str(tmp_path),
                               "--count", "30", "--policies", "default,slo", "--traffic",
                               "sharegpt:8", mode], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        points = tmp_path / "slo-levels" / "sharegpt" / "capacity-points-h200.jsonl"
        saved = [json.loads(line) for line in points.read_text().splitlines()]
        assert {p["strategy"] for p in saved} == {"pdmux_grid_cap", "pdmux_slo_grid_cap"}, mode


def test_slo_levels_offline_reads_advised_points_with_the_divisions_they_were_served(tmp_path):
    """An advised folder measured with earlier advice (other manual divisions than today's
    cost model gives) is read back, and simulated beside, with its own divisions, not
    refused; today's advice is kept beside them."""
    import json

    def slo_levels(mode):
        return subprocess.run([sys.executable, "bench/slo_levels.py", "--out", str(tmp_path),
                               "--count", "30", "--policies", "default,advised", "--traffic",
                               "sharegpt:8", mode], capture_output=True, text=True, timeout=300)

    assert slo_levels("--simulate").returncode == 0
    folder = tmp_path / "slo-levels" / "sharegpt-advised"
    settings = json.loads((folder / "capacity-settings-h200.json").read_text())
    earlier = [[p, d, threshold + 1] for p, d, threshold in settings["config"]["manual_divisions"]]
    settings["config"]["manual_divisions"] = earlier
    (folder / "capacity-settings-h200.json").write_text(json.dumps(settings))
    points = folder / "capacity-points-h200.jsonl"
    simulated = json.loads(points.read_text().splitlines()[0])
    with points.open("a") as f:
        f.write(json.dumps({**simulated, "mode": "gpu", "slo_attainment": 0.5}) + "\n")
    out = slo_levels("--offline")
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "slo-levels-h200.json").read_text())["traffic"]["sharegpt"]
    assert data["advised_divisions"] == earlier and data["advised_disagreement"] is None
    assert data["advised_divisions_today"] != earlier
    assert data["policies"]["advised"]["at_rates"]["8"]["gpu"]["slo_attainment"] == 0.5
    again = slo_levels("--simulate")  # simulated beside them: the same divisions, not refused
    assert again.returncode == 0, again.stderr[-2000:]
    data = json.loads((tmp_path / "slo-levels-h200-simulated.json").read_text())
    assert data["traffic"]["sharegpt"]["advised_divisions"] == earlier


def test_slo_levels_offline_reads_the_measured_points_back(tmp_path):
    """--offline takes the measured rows from the folders as they were saved (here: planted
    beside a simulated run) and simulates beside them; a policy never measured is simulated
    only, a rate missing from a measured one is one line."""
    import json

    def slo_levels(*extra):
        return subprocess.run([sys.executable, "bench/slo_levels.py", "--out", str(tmp_path),
                               "--count", "30", "--policies", "default", *extra],
                              capture_output=True, text=True, timeout=300)

    assert slo_levels("--simulate", "--traffic", "sharegpt:8").returncode == 0
    points = tmp_path / "slo-levels" / "sharegpt" / "capacity-points-h200.jsonl"
    simulated = json.loads(points.read_text().splitlines()[0])
    assert simulated["rate"] == 8.0
    unmeasured = slo_levels("--offline", "--traffic", "sharegpt:8")
    assert unmeasured.returncode == 0 and "never measured, simulated only" in unmeasured.stdout
    data = json.loads((tmp_path / "slo-levels-h200.json").read_text())
    assert data["traffic"]["sharegpt"]["policies"]["default"]["measured"] is False
    measured = {**simulated, "mode": "gpu", "slo_attainment": 0.37, "level_changes": 5,
                "level_drain_ms": 1.5}
    with points.open("a") as f:
        f.write(json.dumps(measured) + "\n")
    missing = slo_levels("--offline", "--traffic", "sharegpt:8,9")
    assert missing.returncode == 2 and "9 req/s was never measured" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    out = slo_levels("--offline", "--traffic", "sharegpt:8:8")
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "slo-levels-h200.json").read_text())
    row = data["traffic"]["sharegpt"]["policies"]["default"]
    assert row["at_rates"]["8"]["gpu"]["slo_attainment"] == 0.37
    assert row["at_rates"]["8"]["simulated"]["slo_attainment"] == simulated["slo_attainment"]
    assert row["goodput_capacity_rps"]["measured_at_least"] is False  # 37% fails at 8 req/s
    assert data["analysed_offline"] is True and row["measured"] is True
    assert data["summary"]["per_traffic"]["sharegpt"]["measured_drain_ms_per_level_change"] == 0.3
    both = slo_levels("--offline", "--simulate")
    assert both.returncode == 2 and "pick one" in both.stderr


def test_slo_levels_without_a_gpu_or_with_bad_traffic_says_so_in_one_line(tmp_path):
    import torch

    runs = [["--traffic", "nope:5"], ["--traffic", "sharegpt:-1"], ["--policies", "slo"]]
    if not torch.cuda.is_available():
        runs.append([])
    for extra in runs:
        out = subprocess.run([sys.executable, "bench/slo_levels.py", "--out", str(tmp_path),
                              *extra], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (extra, out.stderr)
        assert out.stderr.strip().splitlines()[-1].startswith(("slo_levels.py: error",
                                                               "bench/slo_levels.py: error"))


def test_the_mixed_step_fit_by_tiles_recovers_a_known_fixed_cost():
    """The GPU phases are the tiles' law and only the fixed cost is fitted: rounds made by a
    known one on hosts of several speeds (some bound by their launches) give it back, exactly."""
    sys.path.insert(0, "bench")
    from fit_host_costs import fit_mixed

    from pdmux_triton.cost import step_cost
    from pdmux_triton.spec.models import model_preset

    qwen = model_preset("qwen3-8b")
    law = step_cost.SaturationLaw(3.4, 60.0)
    rate = step_cost.PrefillRate(989.0, 132, ((132, 0.55),), ((132, 0.65),))
    tiles = step_cost.TileTimes(((64, 128, 25e-6, 1.0), (128, 128, 27e-6, 1.0),
                                 (128, 256, 50e-6, 0.6)), 2.5e-6, 2.3e-6, 7e-8)
    truth = step_cost.MixedStepFit(0.0012, tiles)
    rows = [{"size": 512, "chunk": c, "prefix": p, "batch": b, "context": b * ctx, "host_s": h}
            for c, p, b, ctx, h in [(512, 0, 20, 2500, 0.0008), (512, 8192, 9, 15000, 0.0011),
                                    (256, 0, 8, 900, 0.0012), (2048, 4096, 50, 3000, 0.0008),
                                    (512, 30000, 0, 0, 0.0014), (40, 0, 12, 4000, 0.0008)]]
    bound = []
    for r in rows:
        gpu = step_cost.mixed_step_s(qwen, law, rate, 132, r["context"], r["batch"], r["chunk"],
                                     r["prefix"], samples_chunk=0, phases=truth)
        bound.append(qwen.layers * r["host_s"] > gpu)
        r["seconds"] = truth.fixed_s + step_cost.layer_pipeline_s(gpu, qwen.layers, r["host_s"])
    assert any(bound) and not all(bound)
    fit, by_launches, quality = fit_mixed(rows, qwen, law, rate, 132, tiles)
    assert list(by_launches) == bound and fit.tiles == tiles
    assert fit.fixed_s == pytest.approx(truth.fixed_s, rel=1e-6)
    assert quality["median_abs_error"] < 1e-9


def test_host_cost_rows_carry_a_runs_later_layer_launch_where_it_timed_one():
    """A run since replays times a launch's later layers apart from its first: its chunked
    rounds and prefill-first batches carry that time (`later_s`) and a launch of theirs costs
    the first layer and (layers - 1) later ones; an older run's (no later time) carry None
    and cost every layer as the first, exactly as before."""
    sys.path.insert(0, "bench")
    from fit_host_costs import chunk_rounds, fidelity_prefills, fidelity_rounds

    from pdmux_triton.cost.step_cost import launch_layers_s
    from pdmux_triton.serve.metrics import later_layer_s

    rounds = [{"prefill": "chunk 0+512", "decode_bs": 2, "decode_context": 900, "start_s": 0.0,
               "end_s": 0.03},
              {"prefill": "", "decode_bs": 3, "decode_context": 1500, "start_s": 0.03,
               "end_s": 0.04}]
    today = TODAY_MARKS
    run = {"details": {name: {"rounds": rounds, **today}
                       for name in ("chunked_512", "chunked_1024", "chunked_2048")},
           "rows": [{"strategy": "chunked_512", "host_layer_p50_ms": 0.8},  # before replays
                    {"strategy": "chunked_2048", "host_layer_p50_ms": 1.9,
                     "host_later_layer_p50_ms": 0.13}]}  # chunked_1024's host untimed
    got = {r["size"]: (r["host_s"], r["later_s"]) for r in chunk_rounds(run, 1.1e-3)}
    assert got == {512: (0.8 / 1e3, None), 1024: (1.1e-3, None), 2048: (1.9 / 1e3, 0.13 / 1e3)}
    diag = {"rounds": {"start_us": [0], "end_us": [30000], "label": [0], "decode_bs": [2],
                       "decode_context": [900], "labels": ["chunk 0+512"]},
            "prefills": [[0, 20000, 4000, 1, 0]]}
    points = [({"strategy": strategy, "diagnostics": {**diag, "host_layer_us": us, **more}},
               us / 1e6) for strategy in ("chunked_512", "prefill_first")
              for us, more in ((800, today), (1900, {"host_later_layer_us": 130, **today}))]
    assert [r["later_s"] for r in fidelity_rounds(points)] == [None, 130 / 1e6]
    # a run saved before a mixed step's decode rows left the extend kernel: its rounds are
    # fitted as they ran (`extend_rows`), its prefill-first batches as any
    assert not any(r["extend_rows"] for r in chunk_rounds(run, 1.1e-3))
    # (nor one saved before the chunk counted its rows: its rounds' chunks are their labels')
    run["details"]["chunked_512"].pop("mixed_chunk_rows")
    assert not any(r["extend_rows"] for r in chunk_rounds(run, 1.1e-3))
    run["details"]["chunked_512"].pop("mixed_decode_rows")
    assert {r["size"]: r["extend_rows"] for r in chunk_rounds(run, 1.1e-3)} == {
        512: True, 1024: False, 2048: False}
    before = [({**p, "diagnostics": {k: v for k, v in p["diagnostics"].items()
                                     if k != "mixed_decode_rows"}}, host) for p, host in points]
    assert [r["extend_rows"] for r in fidelity_rounds(before)] == [True, True]
    assert [r["extend_rows"] for r in fidelity_rounds(points)] == [False, False]
    assert len(fidelity_prefills(before)) == 2
    assert [r["later_s"] for r in fidelity_prefills(points)] == [None, 130 / 1e6]
    assert later_layer_s({"host_later_layer_us": None}) is None  # one layer a launch
    assert launch_layers_s(36, 8e-4, None) == 36 * 8e-4  # every layer as the first, as before
    assert launch_layers_s(36, 1.9e-3, 1.3e-4) == pytest.approx(1.9e-3 + 35 * 1.3e-4)


def test_the_mixed_step_fit_prices_a_replayed_runs_later_layers():
    """Rounds of a run since replays (a launch's later layers at their own, faster time) beside
    an older run's (every layer as the first) come back as the known executor made them: a
    replayed round its launches bound lasts its first layer, (layers - 1) later ones and one
    layer of GPU, and its later layers pace the GPU (a round bound by an older host's launches
    is bound by its GPU here); the older rows alone fit as they did."""
    sys.path.insert(0, "bench")
    from fit_host_costs import fit_mixed

    from pdmux_triton.cost import step_cost
    from pdmux_triton.spec.models import model_preset

    qwen = model_preset("qwen3-8b")
    n = qwen.layers
    law = step_cost.SaturationLaw(3.4, 60.0)
    rate = step_cost.PrefillRate(989.0, 132, ((132, 0.55),), ((132, 0.65),))
    tiles = step_cost.TileTimes(((64, 128, 25e-6, 1.0), (128, 128, 27e-6, 1.0),
                                 (128, 256, 50e-6, 0.6)), 2.5e-6, 2.3e-6, 7e-8)
    truth = step_cost.MixedStepFit(0.0095, tiles)
    rows = [{"size": 512, "chunk": c, "prefix": p, "batch": b, "context": b * ctx, "host_s": h,
             "later_s": later}
            for c, p, b, ctx, h, later in [
                (2048, 0, 20, 2500, 0.0008, None), (512, 1024, 35, 1800, 0.0016, None),
                (256, 0, 8, 900, 0.0012, None), (128, 0, 3, 500, 0.0015, None),
                (1024, 4096, 50, 3000, 0.0019, 0.00013), (256, 0, 8, 900, 0.0019, 0.00013),
                (128, 0, 3, 500, 0.0021, 0.0003), (2048, 2048, 0, 0, 0.0021, 0.0003)]]
    bound, gpus = [], []
    for r in rows:
        gpu = step_cost.mixed_step_s(qwen, law, rate, 132, r["context"], r["batch"], r["chunk"],
                                     r["prefix"], samples_chunk=0, phases=truth)
        gpus.append(gpu)
        bound.append(n * (r["later_s"] or r["host_s"]) > gpu)
        r["seconds"] = truth.fixed_s + step_cost.layer_pipeline_s(gpu, n, r["host_s"],
                                                                  r["later_s"])
    replayed = [r["later_s"] is not None for r in rows]
    # bound by launches and by the GPU among both runs' rounds; a replayed round an older
    # host's launches would have bound
    assert {(b, new) for b, new in zip(bound, replayed)} == {(True, True), (False, True),
                                                             (True, False), (False, False)}
    assert n * rows[5]["host_s"] > gpus[5] and not bound[5]
    launch_bound = bound.index(True, 4)
    r = rows[launch_bound]
    assert r["seconds"] == pytest.approx(truth.fixed_s + r["host_s"] + (n - 1) * r["later_s"]
                                         + gpus[launch_bound] / n)
    fit, by_launches, quality = fit_mixed(rows, qwen, law, rate, 132, tiles)
    assert list(by_launches) == bound
    assert fit.fixed_s == pytest.approx(truth.fixed_s, rel=1e-6)
    assert quality["median_abs_error"] < 1e-9 and quality["p90_abs_error"] < 1e-9
    # the older rows: None as their later time fits exactly as rows without one did
    older = rows[:4]
    as_before = fit_mixed([{k: v for k, v in r.items() if k != "later_s"} for r in older],
                          qwen, law, rate, 132, tiles)
    got = fit_mixed(older, qwen, law, rate, 132, tiles)
    assert got[0] == as_before[0] and list(got[1]) == list(as_before[1]) and got[2] == as_before[2]
    assert got[0].fixed_s == pytest.approx(truth.fixed_s, rel=1e-6)


def test_tile_times_come_back_from_layers_they_made(tmp_path):
    """Eager GEMM rows and captured layers made by known tile times (a slower eager copy of
    one GEMM row, and rows on another SM budget, beside them) give the tile times back."""
    sys.path.insert(0, "bench")
    from fit_host_costs import fit_tile_times

    from pdmux_triton.cost import step_cost
    from pdmux_triton.results import write_json
    from pdmux_triton.spec.models import model_preset

    qwen = model_preset("qwen3-8b")
    truth = step_cost.TileTimes(((64, 128, 24e-6, 1.0), (128, 128, 27e-6, 1.0),
                                 (128, 256, 50e-6, 0.6)), 2.5e-6, 2.2e-6, 7.5e-8)
    names = ("qkv", "o", "gate_up", "down")
    gemms, layers = [], []
    for tokens in (256, 512, 1024, 2048, 4096, 8192):
        tile = step_cost.gemm_tile(tokens)
        for name, (n, k) in zip(names, step_cost.layer_gemms(qwen)):
            wave, share = truth.wave(tile)
            waves = step_cost.gemm_waves(-(-tokens // tile[0]) * -(-n // tile[1]), 132, share)
            ms = waves * k / 4096 * wave * 1e3
            gemms.append({"section": "gemm", "tokens": tokens, "shape": name, "ms": ms})
    gemms.append({**gemms[8], "ms": gemms[8]["ms"] * 3})  # launch-bound elsewhere: the fastest
    for tokens, prefix, prompts in ((512, 0, 1), (2048, 0, 1), (8192, 0, 1), (16384, 0, 1),
                                    (4096, 0, 4), (4096, 8192, 1), (4096, 28672, 1)):
        seqs = [(tokens // prompts, prefix)] * prompts
        per_layer = (step_cost.gemm_layer_s(qwen, tokens, truth, 132) + 7.5e-8 * tokens
                     + step_cost.extend_attention_s(qwen, seqs, truth, 132) / qwen.layers)
        layers.append({"section": "prefix" if prefix else "layers", "tokens": tokens,
                       "prefix": prefix, "prompts": prompts, "sms": None, "layers": 2,
                       "ms": 2 * per_layer * 1e3})
    layers.append({**layers[2], "sms": 80, "ms": 99.0})  # another budget: not the whole GPU's
    path = tmp_path / "prefill-rate.json"
    write_json(path, {"inputs": {"model": "qwen3-8b"}, "rows": gemms + layers})
    tiles, quality = fit_tile_times([str(path)], qwen, 132)
    assert [t[:2] for t in tiles.gemm_wave_s] == [t[:2] for t in truth.gemm_wave_s]
    for fitted, made in zip(tiles.gemm_wave_s, truth.gemm_wave_s):  # 64-row tiles: no partial
        assert fitted[2:] == pytest.approx(made[2:], rel=1e-6)     # wave measured, a whole one
    for key in ("attention_prefix_s", "attention_new_s", "small_s_per_token"):
        assert getattr(tiles, key) == pytest.approx(getattr(truth, key), rel=1e-6)
    assert quality["layers"] == 7 and quality["max_abs_layer_error"] < 1e-9


def test_mixed_rounds_replays_and_prices_mooncakes_chunked_rounds(tmp_path):
    """The committed Mooncake chunked-512 point (cache off) replays: every round's decode batch
    and context sum come back from its prefills and the trace, and the shipped tiles' law
    prices its rounds within a few percent where the older law was 10% short: saved before a
    mixed step's decode rows left the extend kernel, priced as it ran (those rows in the
    extend tiles too)."""
    sys.path.insert(0, "bench")
    import mixed_rounds

    diagnostics = "bench/results/prefix-cache/conv-3000-200-off/capacity-diagnostics-h200.jsonl"
    assert mixed_rounds.main([diagnostics, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "mixed-rounds-h200.json").read_text())
    (point,) = [p for p in data["points"] if p["strategy"] == "chunked_512"]
    assert point["saved_before_decode_rows_left_the_extend_kernel"]
    whole = next(b for b in point["bands"] if b["by"] == "all")
    assert whole["rounds"] > 3000 and 0.95 < whole["measured_over_given"] < 1.05
    gpu_bound = next(b for b in point["bands"] if b["band"] == "GPU")
    assert gpu_bound["median_abs_error_given"] < 0.05


def test_mixed_rounds_prices_a_replayed_runs_later_layers(tmp_path, monkeypatch):
    """The committed Mooncake chunked-512 point, measured before replays, is priced as it was:
    every layer's launch at its first's. Given a later layer's time (a run since replays), a
    round its launches bound costs its first layer, (layers - 1) later ones and one layer of
    GPU, one its GPU bounds the GPU and its first launch; the script reads that time off a
    point that kept it."""
    sys.path.insert(0, "bench")
    import mixed_rounds
    from mixed_rounds import priced, replayed_rounds, served

    from pdmux_triton.cost import step_cost
    from pdmux_triton.cost.measured_inputs import load_host_costs
    from pdmux_triton.experiments.capacity import PointKey
    from pdmux_triton.results import PointStore

    path = Path("bench/results/prefix-cache/conv-3000-200-off/capacity-diagnostics-h200.jsonl")
    s, requests = served(path.parent, "h200")
    (point,) = [p for p in PointStore(path, PointKey).points.values()
                if p["strategy"] == "chunked_512"]
    assert point.get("host_later_layer_us") is None  # measured before replays
    rounds = replayed_rounds(point, requests)
    host = load_host_costs("bench/results/host-costs-h200.json", "h200")
    first, n, fixed = point["host_layer_us"] / 1e6, s.model.layers, host.mixed.fixed_s
    priced_gpu, mixed_step_s = [], step_cost.mixed_step_s  # each round's GPU phases
    monkeypatch.setattr(step_cost, "mixed_step_s", lambda *a, **k: priced_gpu.append(
        float(mixed_step_s(*a, **k))) or priced_gpu[-1])
    old, old_gpu_bound = priced(rounds, s, host, first, None, True)
    monkeypatch.undo()
    gpu = np.array(priced_gpu)
    assert list(old) == [fixed + step_cost.layer_pipeline_s(g, n, first) for g in gpu]  # exact
    assert list(old_gpu_bound) == list(gpu > n * first)
    later = first / 2  # some rounds' layers run faster than that on the GPU
    new, gpu_bound = priced(rounds, s, host, first, later, True)
    assert list(gpu_bound) == list(gpu > n * later) and 0 < gpu_bound.sum() < len(rounds)
    assert new[~gpu_bound] == pytest.approx(fixed + first + (n - 1) * later
                                            + gpu[~gpu_bound] / n, rel=1e-12)
    assert new[gpu_bound] == pytest.approx(fixed + gpu[gpu_bound] + first, rel=1e-12)
    # the same point as a run since replays would keep it: its rounds priced shorter (both
    # copies marked as run today, so both are priced by today's law)
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    for where, more in (("before", {}), ("replayed", {"host_later_layer_us": round(later * 1e6)})):
        folder = tmp_path / where / path.parent.name
        folder.mkdir(parents=True)
        (folder / "capacity-settings-h200.json").write_text(
            (path.parent / "capacity-settings-h200.json").read_text())
        (folder / path.name).write_text("".join(json.dumps(
            {**p, **more, **TODAY_MARKS} if p is not None
            and p["strategy"] == "chunked_512" else p) + "\n" for p in kept))
        assert mixed_rounds.main([str(folder / path.name), "--out", str(tmp_path / where)]) == 0
    whole = {where: next(b for p in json.loads(
        (tmp_path / where / "mixed-rounds-h200.json").read_text())["points"]
        if p["strategy"] == "chunked_512" for b in p["bands"] if b["by"] == "all")
        for where in ("before", "replayed")}
    assert whole["replayed"]["measured_over_given"] > whole["before"]["measured_over_given"]


def test_the_whole_gpu_prefill_fit_recovers_a_known_mfu_from_the_batches_it_bounds():
    """Prefill batches of uneven prompts served at a known MFU after their eager step (on
    hosts of two speeds) give it back, exactly (each prompt's attention priced on its own
    length); batches bound by their launches are left out."""
    sys.path.insert(0, "bench")
    from fit_host_costs import MIN_PREFILLS, fit_whole_gpu_prefill

    from pdmux_triton.cost import step_cost
    from pdmux_triton.spec.models import model_preset

    qwen = model_preset("qwen3-8b")
    rate = step_cost.PrefillRate(989.0, 132, ((112, 0.6),))
    host = step_cost.Overheads(layer_launch_s=0.001, eager_step_s=0.002)
    rows = []
    for i in range(MIN_PREFILLS + 2):
        prompts, per_prompt, host_s = 1 + i % 5, 4000 + 700 * i, (0.001, 0.0015)[i % 2]
        cached = (0, 2048)[i % 2]  # each prompt's tokens read from a prefix cache
        seqs = [(per_prompt + 1500 * j, cached) for j in range(prompts)]
        flops = (sum(step_cost.layer_flops(qwen, n, c, qwen.layers) for n, c in seqs)
                 + step_cost.lm_head_flops(qwen, prompts))
        rows.append({"tokens": sum(n for n, _ in seqs), "prompts": prompts, "host_s": host_s,
                     "cached": prompts * cached, "seqs": seqs,
                     "seconds": 0.002 * host_s / 0.001 + flops / (989e12 * 0.52)})
    rows.append({"tokens": 20, "prompts": 1, "cached": 0, "seqs": [(20, 0)], "host_s": 0.001,
                 "seconds": 0.5})  # launch-bound
    mfu, quality = fit_whole_gpu_prefill(rows, qwen, rate, host)
    assert mfu == pytest.approx(0.52, rel=1e-9) and quality["batches"] == MIN_PREFILLS + 2
    assert "ratio_by_busy_share" not in quality  # the rows hold no busy share
    assert fit_whole_gpu_prefill(rows[:MIN_PREFILLS - 1], qwen, rate, host) is None
    assert fit_whole_gpu_prefill(rows[-1:] * (MIN_PREFILLS + 2), qwen, rate, host) is None


def test_a_prefill_batchs_busy_share_is_its_runs_batches_over_the_window_ending_with_it():
    """Each prefill-first batch's busy share: the share of the window that ends with it that
    its own run's batches took, its own span included (another strategy's, another run's and
    earlier history outside the window not counted)."""
    sys.path.insert(0, "bench")
    from fit_host_costs import fidelity_prefills

    from pdmux_triton.serve.simulated import SUSTAINED_WINDOW_S

    ms = 1000  # microseconds
    w = SUSTAINED_WINDOW_S * 1e3  # the window in ms
    run = {"strategy": "prefill_first", "diagnostics": {"prefills": [
        [0, 100 * ms, 4000, 1], [400 * ms, 450 * ms, 1000, 1],
        [(450 + w + 10) * ms, (450 + w + 30) * ms, 500, 1]]}}
    other = {"strategy": "chunked_512", "diagnostics": {"prefills": [[0, 10**6, 9, 1]]}}
    rows = fidelity_prefills([(run, 0.001), (other, 0.001)])
    assert [r["busy"] for r in rows] == pytest.approx([100 / w, 150 / w, 20 / w])
    assert [r["seconds"] for r in rows] == pytest.approx([0.1, 0.05, 0.02])


def test_a_prefill_batchs_prompts_are_the_runs_requests_in_arrival_order():
    """A point keeps each batch's totals only: its prompts' own lengths come back from the
    run's requests taken in arrival order, so a batch of one long and one short prompt counts
    their attention as it ran (more than two prompts of the mean length); where the requests
    do not add up to the batches, or a prefix was cached, the tokens are shared evenly."""
    sys.path.insert(0, "bench")
    from fit_host_costs import fidelity_prefills

    from pdmux_triton.cost import step_cost
    from pdmux_triton.spec.models import model_preset
    from pdmux_triton.spec.traffic import Request

    run = {"strategy": "prefill_first", "diagnostics": {"prefills": [
        [0, 50_000, 5000, 2, 0], [60_000, 80_000, 700, 1, 0]]}}  # (the newer, batched rows)
    served = [Request(i, n, 4, arrival=a) for i, (n, a) in enumerate(((700, 0.5), (4000, 0.0),
                                                                      (1000, 0.1)))]
    rows = fidelity_prefills([(run, 0.001)], lambda point: served)
    assert [r["seqs"] for r in rows] == [[(4000, 0), (1000, 0)], [(700, 0)]]
    qwen = model_preset("qwen3-8b")
    uneven = sum(step_cost.layer_flops(qwen, n, c) for n, c in rows[0]["seqs"])
    assert uneven > 2 * step_cost.layer_flops(qwen, 2500)  # the long prompt's attention
    other = [Request(i, 2500, 4, arrival=i) for i in range(3)]  # the first batch adds up only
    for requests_of in (None, lambda point: served[:2], lambda point: other):
        even = fidelity_prefills([(run, 0.001)], requests_of)
        assert [r["seqs"] for r in even] == [[(2500, 0)] * 2, [(700, 0)]]
    # a batch that read a prefix from the cache is shared evenly; the run's other batches still
    # get their own prompts (the requests are matched on their whole prompts)
    cached = {"strategy": "prefill_first", "diagnostics": {"prefills": [
        [0, 50_000, 3000, 2, 2000], [60_000, 80_000, 700, 1, 0]]}}
    assert [r["seqs"] for r in fidelity_prefills([(cached, 0.001)], lambda point: served)] == [
        [(1500, 1000)] * 2, [(700, 0)]]


def test_the_whole_gpu_prefill_fit_reads_its_ratio_by_busy_share_within_batch_sizes():
    """Batches served 3% faster than their price when prefills ran a tenth of the window and
    3% slower when they ran nine tenths, in two sizes the MFU prices apart (a long batch 10%
    slower than a short one at either share) give the two ratios back, each size read against
    its own median; a busy bin of too few batches is not kept."""
    sys.path.insert(0, "bench")
    from fit_host_costs import MIN_BUSY_BATCHES, fit_whole_gpu_prefill

    from pdmux_triton.cost import step_cost
    from pdmux_triton.spec.models import model_preset

    qwen = model_preset("qwen3-8b")
    rate = step_cost.PrefillRate(989.0, 132, ((112, 0.6),))
    host = step_cost.Overheads(layer_launch_s=0.001, eager_step_s=0.002)
    rows = []
    for busy, ratio in ((0.1, 0.97), (0.9, 1.03)):
        for j in range(2 * MIN_BUSY_BATCHES):
            tokens, slower = (3000 + 10 * j, 1.0) if j % 2 else (9000 + 10 * j, 1.1)
            flops = step_cost.layer_flops(qwen, tokens, 0, qwen.layers) + \
                step_cost.lm_head_flops(qwen, 1)
            rows.append({"tokens": tokens, "prompts": 1, "cached": 0, "seqs": [(tokens, 0)],
                         "host_s": 0.001, "busy": busy,
                         "seconds": 0.002 + flops / (989e12 * 0.5) * ratio * slower})
    _, quality = fit_whole_gpu_prefill(rows, qwen, rate, host)
    assert sum(quality["ratio_by_busy_share"], []) == pytest.approx([0.1, 0.97, 0.9, 1.03],
                                                                    rel=1e-9)
    thin = rows[:2 * MIN_BUSY_BATCHES] + rows[-MIN_BUSY_BATCHES + 1:]  # too few at 0.9
    assert "ratio_by_busy_share" not in fit_whole_gpu_prefill(thin, qwen, rate, host)[1]


def test_the_served_decode_round_fit_recovers_known_terms_on_two_hosts_despite_outliers():
    """Rounds whose host share is fixed + per request + per KV token, + more at a split
    level, on hosts launching at two speeds (each paying in proportion), one round in ten
    stretched by a collection, give the terms back on the reference host; with too few split
    rounds, or none at a whole-GPU level, no split term (priced as 0); too few rounds or one
    batch size give none."""
    sys.path.insert(0, "bench")
    from fit_host_costs import MIN_ROUNDS, fit_served_decode_round

    rng = np.random.default_rng(7)
    rows = []
    for i in range(MIN_ROUNDS * 5):
        batch, host_s = int(rng.integers(1, 128)), (8e-4, 1.2e-3)[i % 2]
        context, split = batch * int(rng.integers(200, 4000)), i % 3 == 0
        seconds = (1e-4 + 4e-6 * batch + 2.5e-9 * context + 7e-5 * split) * host_s / 8e-4
        if i % 10 == 3:
            seconds += 5e-3
        rows.append({"batch": batch, "context": context, "split": split, "host_s": host_s,
                     "seconds": seconds})
    got = fit_served_decode_round(rows, 8e-4)
    assert got["fixed_s"] == pytest.approx(1e-4, rel=1e-2)
    assert got["per_request_s"] == pytest.approx(4e-6, rel=1e-2)
    assert got["per_kv_token_s"] == pytest.approx(2.5e-9, rel=1e-2)
    assert got["split_s"] == pytest.approx(7e-5, rel=1e-2)
    assert got["split_rounds"] == sum(r["split"] for r in rows)
    assert got["rounds"] == len(rows) and got["median_abs_error_s"] < 1e-6
    whole = [r for r in rows if not r["split"]]
    few = whole + [r for r in rows if r["split"]][:MIN_ROUNDS - 1]
    every = [{**r, "split": True} for r in rows]  # the split column the constant one's
    for unfitted in (whole, few, every):
        assert "split_s" not in fit_served_decode_round(unfitted, 8e-4)
    assert fit_served_decode_round(few, 8e-4)["fixed_s"] == pytest.approx(1e-4, rel=0.05)
    assert fit_served_decode_round(rows[:MIN_ROUNDS - 1], 8e-4) is None
    assert fit_served_decode_round([{**r, "batch": 8} for r in rows], 8e-4) is None


def test_served_decode_rounds_match_steps_to_the_rounds_that_launched_them():
    """Every decoding round launched a step (pd-mux, prefill-first), or only the decode-only
    ones (chunked: mixed rounds step decode in their forward); rounds that launched prefill
    layers are left out; a round at a level that gives prefill SMs is a split one; a count
    that matches neither is refused."""
    sys.path.insert(0, "bench")
    from fit_host_costs import served_decode_rounds

    rounds = {"start_us": [0, 10_000, 30_000, 50_000], "end_us": [9_000, 29_000, 48_000, 60_000],
              "decode_bs": [4, 4, 0, 8], "decode_context": [400, 404, 0, 900],
              "label": [0, 1, 1, 0], "labels": ["", "layers 0-36"], "level": [2, 2, 2, 0]}
    level_sms = {-1: (0, 132), 0: (0, 132), 2: (80, 52)}.get  # level 0: decode on the whole GPU
    every = {"strategy": "pdmux_grid_cap",
             "diagnostics": {"rounds": rounds, "decode_step_us": [8_500, 18_000, 9_000]}}
    got = served_decode_rounds([(every, 1e-3, level_sms)])
    assert [(r["batch"], r["context"], r["split"], round(r["seconds"] * 1e6)) for r in got] == [
        (4, 400, True, 500), (8, 900, False, 1_000)]
    chunked = {"strategy": "chunked_512",
               "diagnostics": {"rounds": {**rounds, "labels": ["", "chunk 0+512"],
                                          "level": [-1] * 4},
                               "decode_step_us": [8_000, 9_500]}}
    got = served_decode_rounds([(chunked, 1e-3, level_sms)])
    assert [round(r["seconds"] * 1e6) for r in got] == [1_000, 500] and got[0]["host_s"] == 1e-3
    assert not any(r["split"] for r in got)
    broken = {"strategy": "chunked_512",
              "diagnostics": {"rounds": rounds, "decode_step_us": [8_000]}}
    with pytest.raises(PdmuxError, match="1 decode steps for 3 rounds decoding"):
        served_decode_rounds([(broken, 1e-3, level_sms)])


def test_the_split_prefill_batch_and_step_extra_fits_read_what_they_are_given():
    """A split batch's upload: the median gap from a pd-mux batch taken to its first layers'
    round, on the file's host, over split levels only; the step extras: per captured size, the
    median step less the calibration's price, sizes with too few steps left out."""
    sys.path.insert(0, "bench")
    from fit_host_costs import (MIN_PREFILLS, MIN_STEPS, fit_prefill_batch,
                                served_decode_extra)

    from pdmux_triton.cost import step_cost
    from pdmux_triton.spec.models import model_preset

    rounds = {"start_us": [], "label": [], "level": [], "labels": ["", "layers 0-36"]}
    prefills = []
    for i in range(MIN_PREFILLS + 3):
        taken, level = 100_000 * i, 0 if i == 0 else 6  # the first batch on a whole-GPU level
        prefills.append([taken, taken + 50_000, 1000, 1, 0])
        rounds["start_us"] += [taken + 500 + 100 * i, taken + 20_000]
        rounds["label"] += [1, 0]
        rounds["level"] += [level, level]
    point = {"strategy": "pdmux_grid_cap", "diagnostics": {"rounds": rounds, "prefills": prefills}}
    levels = lambda level: (72, 60) if level > 0 else (0, 132)  # noqa: E731
    got = fit_prefill_batch([(point, 2e-3, levels)], 1e-3)
    gaps = sorted((500 + 100 * i) / 2 for i in range(1, MIN_PREFILLS + 3))  # on a 2x host
    assert got["batches"] == MIN_PREFILLS + 2
    assert got["seconds"] == pytest.approx(np.median(gaps) / 1e6)
    assert fit_prefill_batch([(point, 2e-3, lambda level: (0, 132))], 1e-3) is None

    qwen = model_preset("qwen3-8b")
    law = step_cost.SaturationLaw(4.0, 66.0)
    rows = [{"batch": b, "context": b * 1000,
             "seconds": step_cost.captured_decode_step_s(qwen, law, b * 1000, 132, False, b)
             + extra} for b, extra, n in ((7, 2e-4, MIN_STEPS), (30, 5e-4, MIN_STEPS),
                                          (64, 9e-4, MIN_STEPS - 1)) for _ in range(n)]
    extras = served_decode_extra(rows, qwen, law, 132)
    assert [(e["batch"], e["steps"]) for e in extras] == [(8, MIN_STEPS), (32, MIN_STEPS)]
    assert [e["extra_s"] for e in extras] == [pytest.approx(2e-4), pytest.approx(5e-4)]
    assert served_decode_extra(rows[:MIN_STEPS], qwen, law, 132) is None


def _fit(run: str | list[str], host: Path):
    runs = [run] if isinstance(run, str) else run
    return subprocess.run([sys.executable, "bench/fit_host_costs.py", *runs, str(host),
                           "--calibration", "bench/results/calibrate-h200.json",
                           "--compare", "bench/results/compare-h200.json"],
                          capture_output=True, text=True, timeout=300)


def test_busy_slowdown_is_how_far_each_busy_call_went_toward_the_sustained_rate(tmp_path):
    """Each busy share's fraction is (call - burst) / (sustained - burst) over its levels, the
    mean held to [0, 1]; the committed host-costs file holds the committed busy file's; a file
    without busy rows is refused."""
    import json

    sys.path.insert(0, "bench")
    from fit_host_costs import busy_slowdown


    def row(mode, ms, **more):
        return {"prefill_sms": 96, "tokens": 8, "prompts": 1, "mode": mode, "ms_median": ms,
                **more}
    made = tmp_path / "busy.json"
    made.write_text(json.dumps({"gpu": "h200", "rows": [
        row("burst", 10.0), row("sustained beside decode", 12.0),
        row("busy 0.30 beside decode", 9.8, busy_share=0.3),  # faster than the burst: 0
        row("busy 0.80 beside decode", 11.0, busy_share=0.8),
        {**row("burst", 20.0), "prefill_sms": 72},
        {**row("sustained beside decode", 24.0), "prefill_sms": 72},
        {**row("busy 0.80 beside decode", 23.0, busy_share=0.8), "prefill_sms": 72}]}))
    assert busy_slowdown(str(made), "h200") == [[0.3, 0.0], [0.8, pytest.approx(0.625)]]
    committed = json.loads(Path("bench/results/host-costs-h200.json").read_text())
    assert committed["split_prefill_sustained"]["slowdown_by_busy_share"] == busy_slowdown(
        "bench/results/sustained-busy-h200.json", "h200")
    with pytest.raises(PdmuxError, match="no busy row"):
        busy_slowdown("bench/results/sustained-corun-h200.json", "h200")


def test_corun_rounds_reads_the_busy_share_and_coverage_from_a_points_launches():
    """A pd-mux point's decode rounds pair with its timed steps (one missing: refused by name),
    each beside the prefill or not, with a busy share and a coverage in [0, 1]; covered seconds
    are the spans' seconds inside a window; the committed trace points' co-run rounds read
    faster than their price at a low busy share and slower at a high one (as fitted)."""
    import json


    sys.path.insert(0, "bench")
    from corun_rounds import covered_s, ratio_by_busy

    from pdmux_triton.cost.measured_inputs import load_host_costs

    from corun_rounds import Pricer, decode_rounds


    points = "bench/results/trace-fidelity/points-h200.jsonl"
    point = next(json.loads(line) for line in Path(points).read_text().splitlines()
                 if '"pdmux_grid_cap"' in line and '"busy_us"' in line)
    pricer = Pricer(points, "bench/results/calibrate-h200.json",
                    "bench/results/compare-h200.json", load_host_costs(
                        "bench/results/host-costs-h200.json"), "h200")
    rounds = decode_rounds(point, pricer, "a point")
    assert len(rounds) == len(point["diagnostics"]["decode_step_us"])
    assert {x["corun"] for x in rounds} == {True, False}
    assert all(0 <= x["busy"] <= 1 and 0 <= x["coverage"] <= 1 for x in rounds if x["corun"])
    short = {**point, "diagnostics": {**point["diagnostics"],
                                      "decode_step_us": point["diagnostics"]["decode_step_us"][1:]}}
    with pytest.raises(PdmuxError, match="do not match its timed decode steps"):
        decode_rounds(short, pricer, "a point")
    spans = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 4.5]])
    assert covered_s(spans, 0.5, 2.5) == pytest.approx(1.0)
    assert covered_s(spans, 3.0, 4.0) == 0.0
    assert covered_s(spans, -1.0, 9.0) == pytest.approx(2.5)
    host = "bench/results/host-costs-h200.json"
    fit = ratio_by_busy(["bench/results/trace-fidelity/points-h200.jsonl"],
                        "bench/results/calibrate-h200.json", "bench/results/compare-h200.json",
                        load_host_costs(host), "h200")
    curve = fit["ratio_by_busy_share"]
    assert fit["rounds"] > 5000 and len(curve) >= 3
    assert [b for b, _ in curve] == sorted(b for b, _ in curve)
    assert curve[0][1] < 1.0 < curve[-1][1]


COMMITTED_FIT = ["bench/results/trace-fidelity/points-h200.jsonl",  # what the file was fitted to
                 "bench/results/capacity-conv/capacity-diagnostics-h200.jsonl",
                 "bench/results/capacity-diagnostics-h200.jsonl"]


def test_sustained_ratios_are_each_levels_burst_over_its_sustained_run(tmp_path):
    """The committed host-costs file's ratios are the committed sustained file's, each level's
    burst ms over its sustained-beside-decode ms averaged over its batches; a file of another
    GPU or with no pair of rows is refused."""
    import json

    sys.path.insert(0, "bench")
    from fit_host_costs import sustained_ratios


    path = "bench/results/sustained-corun-h200.json"
    got = sustained_ratios(path, "h200")
    data = json.loads(Path(path).read_text())
    rows = {(r["prefill_sms"], r["tokens"], r["mode"]): r["ms_median"] for r in data["rows"]}
    for sms, ratio in got["ratio_by_prefill_sms"]:
        tokens = [t for s, t, m in rows if s == sms and m == "burst"]
        assert ratio == pytest.approx(sum(rows[sms, t, "burst"] / rows[sms, t,
                                      "sustained beside decode"] for t in tokens) / len(tokens))
        assert 0.85 < ratio < 1.0  # slower sustained, as measured
    committed = json.loads(Path("bench/results/host-costs-h200.json").read_text())
    assert committed["split_prefill_sustained"]["ratio_by_prefill_sms"] == \
        got["ratio_by_prefill_sms"]
    with pytest.raises(PdmuxError, match="measured on 'h200', the rounds on 'h100-sxm'"):
        sustained_ratios(path, "h100-sxm")
    bare = tmp_path / "s.json"
    bare.write_text(json.dumps({"gpu": "h200", "rows": [r for r in data["rows"]
                                                        if r["mode"] == "burst"]}))
    with pytest.raises(PdmuxError, match="no level with both a burst"):
        sustained_ratios(str(bare), "h200")


def test_fit_host_costs_refuses_an_mfu_and_eager_step_that_do_not_settle(tmp_path):
    """Given one round to fit the whole GPU's MFU, the mixed step and the eager step with one
    another, the committed points move the eager step off the first estimate the MFU was read
    with: refused by name, not written as a file whose MFU was read with another step."""
    import shutil

    sys.path.insert(0, "bench")
    import fit_host_costs

    host = tmp_path / "host.json"
    shutil.copy("bench/results/host-costs-h200.json", host)
    with mock.patch.object(fit_host_costs, "JOINT_FIT_ROUNDS", 1), pytest.raises(
            PdmuxError, match="did not settle in 1 rounds"):
        fit_host_costs.fitted(COMMITTED_FIT, str(host), "bench/results/calibrate-h200.json",
                              "bench/results/compare-h200.json")


def test_fit_host_costs_on_the_h200_trace_points_and_stream_run(tmp_path):
    """The committed trace-fidelity points and steady-state capacity folders (each run's host
    timed), pooled, fit the committed host-costs file's eager step, whole-GPU prefill, mixed
    steps, decode step extras, served decode round, split prefill batch and its served rate
    again; the older
    stream run (its host untimed) cannot give an eager step on the file's host, and says so."""
    import json
    import shutil

    host = tmp_path / "host.json"
    shutil.copy("bench/results/host-costs-h200.json", host)
    committed = json.loads(host.read_text())
    out = _fit(COMMITTED_FIT, host)
    assert out.returncode == 0, out.stderr[-2000:]
    fitted = json.loads(host.read_text())
    assert fitted["mixed_step"]["rounds"] > 5000 and fitted["mixed_step"]["median_abs_error"] < 0.1
    assert fitted["mixed_step"]["fixed_s"] == pytest.approx(committed["mixed_step"]["fixed_s"])
    tiles, shipped = fitted["mixed_step"]["tiles"], committed["mixed_step"]["tiles"]
    # (approx: the fit sums floats through numpy, whose summation order moves between releases)
    assert [row[:2] for row in tiles["gemm_wave_s"]] == [row[:2] for row in shipped["gemm_wave_s"]]
    assert sum((row[2:] for row in tiles["gemm_wave_s"]), []) == pytest.approx(
        sum((row[2:] for row in shipped["gemm_wave_s"]), []))
    for key in ("attention_prefix_s", "attention_new_s", "small_s_per_token"):
        assert tiles[key] == pytest.approx(shipped[key])
    assert tiles["max_abs_layer_error"] < 0.1  # the captured layers it was fitted to
    assert fitted["eager_step"]["seconds"] == pytest.approx(committed["eager_step"]["seconds"])
    assert fitted["whole_gpu_prefill"]["batches"] >= 10
    # the MFU was read with the eager step the file holds, the one the simulator charges a
    # whole-GPU batch (not with the first estimate over every small round)
    sys.path.insert(0, "bench")
    from fit_host_costs import (MIN_ROUNDS, PREFILL_RATE, fit_tile_times, fit_whole_gpu_prefill,
                                pooled_rounds)

    from pdmux_triton.cost.measured_inputs import host_costs_from, load_compare

    charged = host_costs_from(fitted, host)
    gpu, model, _, prefills = pooled_rounds(COMMITTED_FIT, fitted, charged)
    rate = load_compare("bench/results/compare-h200.json", gpu.name).prefill_rate(
        "grid_cap", gpu.bf16_tflops, gpu.sms)
    tiles, _ = fit_tile_times(PREFILL_RATE[gpu.name], model, gpu.sms)
    assert fit_whole_gpu_prefill(prefills, model, rate, charged, tiles)[0] == pytest.approx(
        fitted["whole_gpu_prefill"]["mfu"], rel=1e-9)
    assert fitted["whole_gpu_prefill"]["mfu"] == pytest.approx(committed["whole_gpu_prefill"]["mfu"])
    assert sum(fitted["whole_gpu_prefill"]["ratio_by_busy_share"], []) == pytest.approx(
        sum(committed["whole_gpu_prefill"]["ratio_by_busy_share"], []))
    # the captured sizes' extras from the served whole-GPU steps, every size served enough
    assert [r["batch"] for r in fitted["decode_step_extra"]] == [
        r["batch"] for r in committed["decode_step_extra"]]
    assert len(fitted["decode_step_extra"]) > 4 and all(
        r["steps"] >= 30 for r in fitted["decode_step_extra"])
    for key, terms in (("decode_round_served", ("fixed_s", "per_request_s", "per_kv_token_s",
                                                "split_s")),
                       ("prefill_batch", ("seconds",))):
        for term in terms:
            assert fitted[key][term] == pytest.approx(committed[key][term])
    assert fitted["decode_round_served"]["per_request_s"] > 0
    # pd-mux's rounds at split levels pay more of the host than whole-GPU ones
    assert fitted["decode_round_served"]["split_s"] > 0
    assert fitted["decode_round_served"]["split_rounds"] >= MIN_ROUNDS
    assert 0 < fitted["prefill_batch"]["seconds"] < fitted["eager_step"]["seconds"]
    got, shipped = (dict(f["split_prefill_served"]) for f in (fitted, committed))
    assert sorted(got.pop("files")) == sorted(shipped.pop("files")) and got == shipped
    for got, shipped in zip(fitted["decode_beside_prefill"]["ratio_by_busy_share"],
                            committed["decode_beside_prefill"]["ratio_by_busy_share"],
                            strict=True):
        assert got == pytest.approx(shipped)
    # green's own, from its points alone: fitted again as committed, and not the grid cap's
    mine, shipped = fitted["by_kind"]["green"], committed["by_kind"]["green"]
    for key, pairs in (("split_prefill_served", "ratio_by_prefill_sms"),
                       ("decode_beside_prefill", "ratio_by_busy_share")):
        for got, want in zip(mine[key][pairs], shipped[key][pairs], strict=True):
            assert got == pytest.approx(want)
    assert mine["split_prefill_served"]["batches"] < fitted["split_prefill_served"]["batches"]
    assert mine["split_prefill_served"]["ratio_by_prefill_sms"] != \
        fitted["split_prefill_served"]["ratio_by_prefill_sms"]
    # the older stream run did not time its host: its rounds are read on the file's host, and
    # on one twice as slow its launch-bound rounds last less than their 36 launches: refused in
    # one line, the file untouched
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({**fitted, "eager_layer": [
        {**r, "host_s": 2 * r["host_s"]} for r in fitted["eager_layer"]]}))
    before = slow.read_text()
    out = _fit("bench/results/stream-h200.json", slow)
    assert out.returncode == 2 and "fit to a run that timed its host" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert slow.read_text() == before
    # on the file's host it fits; it holds no pd-mux round with launch spans, so the busy ratio
    # fitted to the trace points' rounds (and their extras) goes, and the fit says so
    out = _fit("bench/results/stream-h200.json", host)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "no busy ratio fitted" in out.stdout and "too few large pd-mux batches" in out.stdout
    assert "decode_beside_prefill" not in json.loads(host.read_text())
    assert "split_prefill_served" not in json.loads(host.read_text())
    assert "by_kind" not in json.loads(host.read_text())  # green's fits went with the points
    bad = _fit(str(host), host)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_a_refit_with_sustained_ratios_drops_an_older_fits_decode_clock_factor(tmp_path):
    """A host-costs file an older fit left with the decode clock factor in its sustained entry,
    refitted with --sustained: the entry holds the new ratios and the busy curve it had, not
    the stale keys, and loads."""
    import json
    import shutil

    from pdmux_triton.cost.measured_inputs import load_host_costs

    host = tmp_path / "host.json"
    shutil.copy("bench/results/host-costs-h200.json", host)
    data = json.loads(host.read_text())
    data["split_prefill_sustained"]["decode_step_by_prefill_sms"] = [[72, 1.064]]
    host.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, "bench/fit_host_costs.py", *COMMITTED_FIT, str(host),
                          "--calibration", "bench/results/calibrate-h200.json",
                          "--compare", "bench/results/compare-h200.json",
                          "--sustained", "bench/results/sustained-corun-h200.json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    entry = json.loads(host.read_text())["split_prefill_sustained"]
    assert "decode_step_by_prefill_sms" not in entry
    assert entry["slowdown_by_busy_share"] == data["split_prefill_sustained"][
        "slowdown_by_busy_share"]
    assert load_host_costs(host).split_prefill_sustained


def test_step_errors_prices_each_simulated_step_as_the_simulator_did(tmp_path):
    """On the cost model's clock every decode round pairs with its timed step, and every step
    is priced as the simulator priced it: alone exactly, beside a prefill (the rounds after a
    prefill's last layer too) before its busy-share ratio, which lies between the host-costs
    file's least and largest, or alone where the guess was wrong (the prefill's queue ended
    before the step began); --reprice gives the same prices back; bad policies and a file of
    another kind are one line."""
    import json

    from pdmux_triton.cost import step_cost
    from pdmux_triton.cost.measured_inputs import load_calibration, load_host_costs
    from pdmux_triton.spec.models import model_preset

    curve = load_calibration("bench/results/calibrate-h200.json").decode_curve("grid_cap")
    overheads = load_host_costs("bench/results/host-costs-h200.json")
    alone_ms = lambda r: 1e3 * step_cost.served_decode_step_s(
        model_preset("qwen3-8b"), curve, overheads, r["context_tokens"], r["decode_sms"], False,
        r["batch"])
    host = json.loads(Path("bench/results/host-costs-h200.json").read_text())
    ratios = [r for _, r in host["decode_beside_prefill"]["ratio_by_busy_share"]]
    least, most = min(ratios), max(ratios)
    out = subprocess.run([sys.executable, "bench/step_errors.py", "--simulate", "--rates", "12",
                          "--count", "40", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    path = tmp_path / "step-errors-h200-simulated.json"
    data = json.loads(path.read_text())
    for name in ("default at 12 req/s", "slo at 12 req/s"):
        run = data["runs"][name]
        assert run["served"]["requests_served"] == 40
        corun = [r for r in run["rounds"] if r["corun"]]
        assert corun and run["summary"]["corun_steps"] == len(corun)
        assert len(corun) < len(run["rounds"])
        assert all(abs(r["measured_ms"] / r["predicted_ms"] - 1) < 1e-9
                   for r in run["rounds"] if not r["corun"]), name
        guessed = [r for r in corun if abs(r["measured_ms"] / alone_ms(r) - 1) < 1e-9]
        assert len(guessed) <= len(corun) // 20, name
        assert all(least - 1e-9 < r["measured_ms"] / r["predicted_ms"] < most + 1e-9
                   for r in corun if r not in guessed), name
        assert any(r["measured_ms"] / r["predicted_ms"] > 1.01 for r in corun), name
    again = subprocess.run([sys.executable, "bench/step_errors.py", "--reprice", str(path),
                            "--out", str(tmp_path / "again")], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    repriced = json.loads((tmp_path / "again" / path.name).read_text())
    assert {n: r["rounds"] for n, r in repriced["runs"].items()} == \
        {n: r["rounds"] for n, r in data["runs"].items()}
    wrong = subprocess.run([sys.executable, "bench/step_errors.py", "--reprice",
                            "bench/results/kernels-h200.json", "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "not a step-errors file" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    bad = subprocess.run([sys.executable, "bench/step_errors.py", "--simulate", "--policies",
                          "nope", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "nope" in bad.stderr and "Traceback" not in bad.stderr


def test_multi_gpu_compares_two_gpus_four_ways(tmp_path):
    """bench/multi_gpu.py on a short stream: every setup's capacity, two GPUs for each but the
    reference, and servers behind a router never below one of them alone."""
    import json

    out = subprocess.run([sys.executable, "bench/multi_gpu.py", "--out", str(tmp_path),
                          "--count", "24"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "multi-gpu-h200x2-simulated.json").read_text())
    setups = data["setups"]
    assert list(setups) == ["one_gpu", "tp2", "replicas", "disagg"]
    assert [setups[n]["gpus"] for n in setups] == [1, 2, 2, 2]
    caps = {n: {k: r["goodput_capacity_rps"] for k, r in s["strategies"].items()}
            for n, s in setups.items()}
    assert all(c > 0 for s in caps.values() for c in s.values())
    for strategy in ("pdmux_grid_cap", "pdmux_slo_grid_cap", "chunked_512"):
        assert caps["replicas"][strategy] >= caps["one_gpu"][strategy]
    assert data["summary"]["best_two_gpu"] in {f"{n}/{k}" for n in caps if n != "one_gpu"
                                               for k in caps[n]}
    assert "best on two GPUs" in out.stdout
    # no files named: --gpu's own, as bench/results commits them (the H100's since session 52)
    assert data["inputs"]["calibration"] == "bench/results/calibrate-h200.json"
    sys.path.insert(0, "bench")
    from script import measured_on
    assert all(Path(f).is_file() for gpu in ("h200", "h100-sxm")
               for f in measured_on(gpu).values())


def test_stream_length_reads_capacity_by_count_and_sample(tmp_path):
    """bench/stream_length.py on short streams: every sample's three capacities, the wide
    level set saved with its points, and the by-count ratios those samples give."""
    import json


    out = subprocess.run([sys.executable, "bench/stream_length.py", "--out", str(tmp_path),
                          "--counts", "30,40", "--seeds", "1,2"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "stream-length-h200-simulated.json").read_text())
    assert [(r["count"], r["seed"]) for r in data["samples"]] == [(30, 1), (30, 2), (40, 1),
                                                                 (40, 2)]
    for r in data["samples"]:
        assert set(r["capacity_rps"]) == {"default", "slo", "slo_wide"}
        assert all(c > 0 for c in r["capacity_rps"].values())
    for count in (30, 40):
        ratios = [r["capacity_rps"]["slo"] / r["capacity_rps"]["default"]
                  for r in data["samples"] if r["count"] == count]
        got = data["summary"]["by_count"][str(count)]["slo_vs_default"]
        assert got["median"] == pytest.approx(np.median(ratios))
        assert got["lowest"] == min(ratios) and got["highest"] == max(ratios)
    wide = json.loads((tmp_path / "stream-length" / "40-s2-wide" /
                       "capacity-settings-h200.json").read_text())
    assert [64, 68] in [d[:2] for d in wide["config"]["manual_divisions"]]
    bad = subprocess.run([sys.executable, "bench/stream_length.py", "--out", str(tmp_path),
                          "--counts", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--counts" in bad.stderr and "Traceback" not in bad.stderr


def _fidelity_folder(tmp_path, points: str):
    """A results folder holding committed measured points of bench/trace_fidelity.py."""
    folder = tmp_path / "trace-fidelity"
    folder.mkdir()
    (folder / "points-h200.jsonl").write_text(Path(points).read_text())
    return tmp_path


def test_trace_fidelity_judges_the_committed_conversation_points_offline(tmp_path, monkeypatch,
                                                                        capsys):
    sys.path.insert(0, "bench")
    import trace_fidelity

    # session 18's points, served at the rates of that day's plan
    monkeypatch.setattr(trace_fidelity, "PLAN", {"conv": ((2000, 12000), (12.0, 22.0, 34.0))})
    out = _fidelity_folder(tmp_path, "bench/results/trace-fidelity/untimed-host/points-h200.jsonl")
    assert trace_fidelity.main(["--offline", "--traces", "conv", "--strategies",
                                "prefill_first,pdmux_grid_cap", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ttft_p50_ms" in printed and "capacity measured" in printed
    data = json.loads((out / "trace-fidelity-h200.json").read_text())
    assert data["analysed_offline"] and len(data["points"]) == 2 * 2 * 3
    for p in data["points"]:  # each error is the simulation's against the measured median
        m, s = p["measured"]["tpot_p50_ms"], p["simulated"]["tpot_p50_ms"]
        assert p["error_pct"]["tpot_p50_ms"] == pytest.approx((s - m) / m * 100)
        assert p["repeats"] == 2
    worst = max(abs(p["error_pct"]["ttft_p99_ms"]) for p in data["points"])
    assert data["summary"]["max_abs_error_pct"]["ttft_p99_ms"] == pytest.approx(worst)
    # the stable region's summary: over the points at most 0.8 x their measured capacity
    calm = [p for p in data["points"] if p["inside_stable_region"]]
    caps = {(c["strategy"], c["start"]): c["measured_rps"] for c in data["capacities"]}
    assert calm == [p for p in data["points"] if 0 < caps[p["strategy"], p["start"]] < 34.0
                    and p["rate"] <= 0.8 * caps[p["strategy"], p["start"]]]
    assert data["summary"]["stable_region"]["points"] == len(calm) < len(data["points"])
    assert data["summary"]["stable_region"]["max_abs_error_pct"]["tpot_p50_ms"] == \
        pytest.approx(max(abs(p["error_pct"]["tpot_p50_ms"]) for p in calm))
    assert "inside the stable region" in printed
    # measured before the executor timed its host: judged on the committed host costs alone
    assert data["summary"]["points_on_their_own_host"] == 0
    assert data["summary"]["shipped_host"]["max_abs_error_pct"] == data["summary"][
        "max_abs_error_pct"]
    # a simulated capacity at either end of the rates beside a measured crossing is a bound:
    # pd-mux met the SLOs at every rate simulated, so its error is at least its figure
    for c in data["capacities"]:
        inside = c["measured_rps"] is not None and 0 < c["measured_rps"] < 34.0
        assert c["error_is_a_bound"] == (inside and not 0 < c["simulated_rps"] < 34.0)
    assert data["summary"]["capacity_error_at_least_at"] == [
        f"{c['strategy']} conv@{c['start']}" for c in data["capacities"] if c["error_is_a_bound"]]
    missing = subprocess.run([sys.executable, "bench/trace_fidelity.py", "--offline", "--traces",
                              "code", "--out", str(out)], capture_output=True, text=True,
                             timeout=300)
    assert missing.returncode == 2 and "no point of" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1  # why (what is missing: all of it)
    # another card's points are its own file, priced by its own measured inputs
    other = subprocess.run([sys.executable, "bench/trace_fidelity.py", "--offline", "--gpu",
                            "h100-sxm", "--traces", "conv", "--out", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert other.returncode == 2 and "points-h100-sxm.jsonl" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1


def test_trace_fidelity_judges_a_strategy_at_every_rate_measured_for_it(tmp_path, monkeypatch):
    """A point served at a rate outside the plan (--rates, near a capacity) is simulated and
    judged beside the plan's, for its strategy alone; asked for offline where it was never
    measured, it is named and the rest judged without it."""
    sys.path.insert(0, "bench")
    import trace_fidelity

    monkeypatch.setattr(trace_fidelity, "PLAN", {"conv": ((2000,), (12.0, 24.0, 48.0))})
    out = _fidelity_folder(tmp_path, "bench/results/trace-fidelity/points-h200.jsonl")
    points = out / "trace-fidelity" / "points-h200.jsonl"
    near = next(json.loads(line) for line in points.read_text().splitlines()
                if all(f in line for f in ('"pdmux_grid_cap"', '"start": 2000', '"rate": 48.0')))
    with points.open("a") as f:  # the 48 req/s point's figures, filed as served at 42
        f.write(json.dumps({**near, "rate": 42.0}) + "\n")
    assert trace_fidelity.main(["--offline", "--traces", "conv", "--strategies",
                                "prefill_first,pdmux_grid_cap", "--out", str(out)]) == 0
    data = json.loads((out / "trace-fidelity-h200.json").read_text())
    rates = {c["strategy"]: c["rates_rps"] for c in data["capacities"]}
    # prefill-first at 8 and 18, pd-mux at 30 and 36: measured beside the plan's rates
    assert rates == {"prefill_first": [8.0, 12.0, 18.0, 24.0, 48.0],
                     "pdmux_grid_cap": [12.0, 24.0, 30.0, 36.0, 42.0, 48.0]}
    at_42 = [p for p in data["points"] if p["rate"] == 42.0]
    assert [p["strategy"] for p in at_42] == ["pdmux_grid_cap"]
    assert at_42[0]["measured"]["slo_attainment"] == near["slo_attainment"]
    assert at_42[0]["simulated"]["slo_attainment"] is not None
    cap = next(c for c in data["capacities"] if c["strategy"] == "pdmux_grid_cap")
    assert 36.0 < cap["measured_rps"] < 42.0  # >= 90% at 36, below at "42": crossed between
    missing = subprocess.run([sys.executable, "bench/trace_fidelity.py", "--offline", "--traces",
                              "conv", "--strategies", "prefill_first", "--rates", "30",
                              "--out", str(out)], capture_output=True, text=True, timeout=300)
    # a point asked for offline but never measured is named and judged without
    # (a subprocess: the plan's two windows)
    assert missing.returncode == 0 and "2 points not measured" in missing.stderr
    assert "prefill_first conv@2000 30 req/s, prefill_first conv@12000 30" in missing.stderr
    judged = json.loads((out / "trace-fidelity-h200.json").read_text())
    assert judged["not_measured"] == ["prefill_first conv@2000 30 req/s",
                                      "prefill_first conv@12000 30 req/s"]
    assert [c["rates_rps"] for c in judged["capacities"]] == [[8.0, 12.0, 18.0, 24.0, 48.0]] * 2


def test_trace_fidelity_serves_a_stale_chunked_point_again_and_judges_it_as_it_ran(tmp_path,
                                                                                monkeypatch):
    """A chunked point measured before today's chunked steps (its diagnostics lack a marker)
    is served again on the GPU and, offline, named and judged as it ran (`simulate`'s costs:
    before the decode rows left the extend kernel, with them in its tiles and the whole chunk
    beside them; before the chunk counted them, the whole chunk); one measured since, and other
    strategies' points, are judged as today's executor serves them."""
    import argparse

    sys.path.insert(0, "bench")
    import trace_fidelity
    from trace_fidelity import Key, judged_rates, stale

    from pdmux_triton.results import PointStore

    store = PointStore(tmp_path / "points.jsonl", Key)
    for name, rate, diag in (("chunked_512", 12.0, {}),
                             ("chunked_512", 24.0, {"mixed_decode_rows": MIXED_DECODE_ROWS}),
                             ("chunked_512", 48.0, TODAY_MARKS),
                             ("prefill_first", 12.0, {})):
        store.add(Key("gpu", "conv", 2000, rate, name), diagnostics=diag)
    assert [stale(p) for p in store.points.values()] == [True, True, False, False]
    args = argparse.Namespace(rates=[], offline=True, traces=["conv"], count=100,
                              strategies=["chunked_512", "prefill_first"])
    assert judged_rates(args, store, "conv", 2000, "chunked_512") == [12.0, 24.0, 48.0]
    assert judged_rates(args, store, "conv", 2000, "prefill_first") == [12.0]
    said = []
    named = trace_fidelity.measure(args, store, said.append)  # offline: named, nothing served
    assert "chunked_512 conv@2000 12 req/s" in named and not said
    assert "chunked_512 conv@2000 24 req/s" in named
    assert "chunked_512 conv@2000 48 req/s" not in named
    assert "prefill_first conv@2000 12 req/s" not in named
    # served highest rate first (the warm-up before a strategy's first run forms the largest
    # batches): the plan's rates of a strategy with none measured, in that order
    starts, rates = trace_fidelity.PLAN["conv"]
    assert trace_fidelity.measure(argparse.Namespace(**{**vars(args), "strategies": [
        "chunked_2048"]}), store, said.append) == [
        f"chunked_2048 conv@{start} {r:g} req/s" for start in starts for r in sorted(rates)[::-1]]
    # simulated: the stale point on costs with its decode rows in the extend tiles, the others
    # on today's
    grabbed = {}
    monkeypatch.setattr(trace_fidelity, "run", lambda a: grabbed.setdefault("args", a) and 0)
    trace_fidelity.main(["--offline", "--traces", "conv", "--strategies",
                         "chunked_512,prefill_first"])
    import script
    script.card_inputs(grabbed["args"], measuring=None)  # offline: the H200's points, files
    assert grabbed["args"].gpu == "h200"
    assert grabbed["args"].host_costs == "bench/results/host-costs-h200.json"
    seen = {}  # (rows in the extend tiles, the whole chunk beside them) of each server
    monkeypatch.setattr(trace_fidelity, "_simulated", lambda servers, name, s, rate: (
        seen.setdefault((name, rate), [(x.overheads.mixed.decode_rows_in_extend,
                                        x.overheads.chunked_steps < 2) for x in servers]) and {}))
    trace_fidelity.simulate(grabbed["args"], store)
    assert seen == {("chunked_512", 12.0): [(True, True)], ("chunked_512", 24.0): [(False, True)],
                    ("chunked_512", 48.0): [(False, False)],
                    ("prefill_first", 12.0): [(False, False)]}


def test_bench_scripts_judge_the_points_of_the_card_they_name(monkeypatch):
    """Measuring, the points are this machine's card's (another named is refused); reading
    or planning, the H200's unless named; either way priced by that card's committed files,
    and a card without them, or a card-speeds file of another card, is refused by name."""
    import argparse

    sys.path.insert(0, "bench")
    import script
    import trace_fidelity

    from pdmux_triton.errors import PdmuxError
    from pdmux_triton.spec.gpus import gpu_preset

    def resolved(offline=False, plan=False, **given):
        args = argparse.Namespace(**{"gpu": None, "calibration": None, "compare": None,
                                     "host_costs": None, **given})
        script.card_inputs(args, measuring=None if offline or plan else "no GPU: read them")
        return args

    monkeypatch.setattr(script, "detect_gpu", lambda: gpu_preset("h100-sxm"))
    here = resolved()
    assert (here.gpu, here.calibration, here.compare, here.host_costs) == (
        "h100-sxm", "bench/results/calibrate-h100-sxm.json",
        "bench/results/compare-h100-sxm.json", "bench/results/host-costs-h100-sxm.json")
    with pytest.raises(PdmuxError, match="measured on this machine's GPU, the h100-sxm"):
        resolved(gpu="h200")
    assert resolved(offline=True).gpu == "h200" and resolved(plan=True).gpu == "h200"
    named = resolved(offline=True, gpu="h100-sxm", host_costs="mine.json")
    assert (named.calibration, named.host_costs) == (
        "bench/results/calibrate-h100-sxm.json", "mine.json")  # a file named is kept
    with pytest.raises(PdmuxError, match="a100-80gb has no bench/results/calibrate-a100-80gb"):
        resolved(offline=True, gpu="a100-80gb")
    assert resolved(offline=True, gpu="a100-80gb", calibration="c", compare="m",
                    host_costs="h").calibration == "c"
    with pytest.raises(PdmuxError, match="holds the h200's card speeds"):
        trace_fidelity.card_speeds("bench/results/card-speeds-h200.json", "h100-sxm")
    assert trace_fidelity.card_speeds("bench/results/card-speeds-h200.json", "h200")[0] > 0.9


def test_fit_host_costs_refuses_a_gpu_without_tile_measurements(tmp_path, monkeypatch):
    """The mixed step's tile times are fitted to the measurements' GPU's bench/prefill_rate.py
    files: a GPU with none committed is refused in one line that names the flag."""
    import shutil

    sys.path.insert(0, "bench")
    import fit_host_costs

    from pdmux_triton.errors import PdmuxError

    host = tmp_path / "host-costs-h200.json"
    shutil.copy("bench/results/host-costs-h200.json", host)
    monkeypatch.setattr(fit_host_costs, "PREFILL_RATE", {"h100-sxm": ()})
    with pytest.raises(PdmuxError, match=r"committed for the h200: .*\(--prefill-rate\)"):
        fit_host_costs.fitted(["bench/results/trace-fidelity/points-h200.jsonl"], str(host),
                              "bench/results/calibrate-h200.json",
                              "bench/results/compare-h200.json")


def test_trace_fidelity_prices_each_repeat_on_its_own_host(tmp_path, monkeypatch):
    """A point that kept each repeat's host speed is simulated on each host and judged by the
    median of those simulations (two hosts: their mean); one that kept only its first
    repeat's is simulated on that host, as before."""
    sys.path.insert(0, "bench")
    import trace_fidelity
    from trace_fidelity import repeat_hosts_us

    assert repeat_hosts_us(None) == [] and repeat_hosts_us({"diagnostics": {}}) == []
    assert repeat_hosts_us({"diagnostics": {"host_layer_us": 900}}) == [900]
    assert repeat_hosts_us({"diagnostics": {"host_layer_us": 900}, "repeat_values": {
        "host_layer_p50_ms": [0.9, 1.35]}}) == [900, 1350]
    monkeypatch.setattr(trace_fidelity, "PLAN", {"conv": ((2000,), (12.0,))})
    lines = Path("bench/results/trace-fidelity/points-h200.jsonl").read_text().splitlines()
    point = next(json.loads(line) for line in lines
                 if all(f in line for f in ('"prefill_first"', '"start": 2000', '"rate": 12.0')))
    first_us = point["diagnostics"]["host_layer_us"]

    def judged(hosts_ms: list[float] | None, first: int) -> dict:
        kept = {**point, "diagnostics": {**point["diagnostics"], "host_layer_us": first}}
        # each repeat's hosts where given, else only the first's (as points measured before)
        kept["repeat_values"] = {k: v for k, v in point["repeat_values"].items()
                                 if k != "host_layer_p50_ms"}
        if hosts_ms:
            kept["repeat_values"]["host_layer_p50_ms"] = hosts_ms
        folder = tmp_path / str(hosts_ms or first)
        (folder / "trace-fidelity").mkdir(parents=True)
        (folder / "trace-fidelity" / "points-h200.jsonl").write_text(json.dumps(kept) + "\n")
        assert trace_fidelity.main(["--offline", "--traces", "conv", "--strategies",
                                    "prefill_first", "--out", str(folder)]) == 0
        data = json.loads((folder / "trace-fidelity-h200.json").read_text())
        return data["points"][0]["simulated"]

    slow_us = 2 * first_us
    fast, slow = judged(None, first_us), judged(None, slow_us)
    both = judged([first_us / 1e3, slow_us / 1e3], first_us)
    assert slow["ttft_p50_ms"] > fast["ttft_p50_ms"]  # a slower host serves slower
    for k in ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms"):
        assert both[k] == pytest.approx((fast[k] + slow[k]) / 2)


def test_trace_fidelity_reads_each_error_against_its_repeats_range():
    """The part of an error outside the measured repeats' range, in percent of their median:
    0 inside it; None without two repeats or a scale."""
    sys.path.insert(0, "bench")
    from trace_fidelity import outside_repeats_pct

    assert outside_repeats_pct(105.0, [100.0, 110.0]) == 0.0
    assert outside_repeats_pct(99.0, [100.0, 110.0]) == pytest.approx(1 / 105 * 100)
    assert outside_repeats_pct(121.0, [100.0, 110.0]) == pytest.approx(11 / 105 * 100)
    assert outside_repeats_pct(5.0, [100.0]) is None and outside_repeats_pct(None, [1, 2]) is None
    assert outside_repeats_pct(1.0, [0.0, 0.0]) is None
    # with a band of simulations beside it: the gap between their range and the repeats'
    assert outside_repeats_pct(121.0, [100.0, 110.0], (108.0, 125.0)) == 0.0
    assert outside_repeats_pct(121.0, [100.0, 110.0], (115.0,)) == pytest.approx(5 / 105 * 100)
    assert outside_repeats_pct(99.0, [100.0, 110.0], (90.0,)) == pytest.approx(1 / 105 * 100)
    assert outside_repeats_pct(105.0, [100.0, 110.0], (None,)) is None


def test_trace_fidelity_reads_each_error_beyond_the_cards_speeds(tmp_path, monkeypatch):
    """--card-band: each point's gap between its simulations on the file's slowest card, the
    costs' and its fastest (each as `--prefill-speed` simulates it alone) and its repeats'
    range, never more than the error outside the repeats alone; the window's capacity on
    either card; a file that is not a card-speeds file is refused in one line."""
    sys.path.insert(0, "bench")
    import trace_fidelity
    from trace_fidelity import outside_repeats_pct

    monkeypatch.setattr(trace_fidelity, "PLAN", {"conv": ((2000,), (30.0, 36.0, 48.0))})
    out = _fidelity_folder(tmp_path, "bench/results/trace-fidelity/points-h200.jsonl")
    speeds = tmp_path / "card-speeds.json"
    speeds.write_text(json.dumps({"cards": {"a": {"speed": 0.95}, "b": {"speed": 1.05},
                                            "c": {"speed": 1.0}}}))
    args = ["--offline", "--traces", "conv", "--strategies", "pdmux_grid_cap", "--out", str(out)]

    def points(*more: str) -> list[dict]:
        assert trace_fidelity.main([*args, *more]) == 0
        return json.loads((out / "trace-fidelity-h200.json").read_text())

    slow, fast = (points("--prefill-speed", v) for v in ("0.95", "1.05"))
    data = points("--card-band", str(speeds))
    # the window's crossing on either card is the one simulated on that card alone
    (cap,) = data["capacities"]
    assert cap["simulated_on_cards_rps"] == [slow["capacities"][0]["simulated_rps"],
                                             fast["capacities"][0]["simulated_rps"]]
    assert cap["outside_repeats_and_cards_pct"] == pytest.approx(outside_repeats_pct(
        cap["simulated_rps"], cap["repeat_rps"], tuple(cap["simulated_on_cards_rps"])))
    slow, fast = slow["points"], fast["points"]
    band = data["summary"]["card_band"]
    assert band["card_speeds"] == [0.95, 1.05] and data["inputs"]["card_band"] == str(speeds)
    stored = [json.loads(line) for line in
              (out / "trace-fidelity" / "points-h200.jsonl").read_text().splitlines()]
    gaps = []
    for p, lo, hi in zip(data["points"], slow, fast, strict=True):
        values = next(q for q in stored if (q["strategy"], q["start"], q["rate"]) == (
            p["strategy"], p["start"], p["rate"]))["repeat_values"]
        for k in ("ttft_p50_ms", "tpot_p50_ms"):
            got = p["outside_repeats_and_cards_pct"][k]
            assert got == pytest.approx(outside_repeats_pct(
                p["simulated"][k], values[k], (lo["simulated"][k], hi["simulated"][k])))
            assert got <= p["outside_repeats_pct"][k] + 1e-9
            gaps.append(got)
    assert band["all_points"]["ttft_p50_ms"]["max"] == pytest.approx(max(gaps[0::2]))
    for text in ('{"rows": []}', '{"cards": {"a": 1.0}}', '{"cards": {"a": {"speed": true}}}',
                 '{"cards": {"a": {"speed": 5.0}}}'):
        speeds.write_text(text)
        bad = subprocess.run([sys.executable, "bench/trace_fidelity.py", *args, "--card-band",
                              str(speeds)], capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and "is not a card-speeds file" in bad.stderr, text
        assert len(bad.stderr.strip().splitlines()) == 1


def test_trace_fidelity_prices_a_run_on_its_own_host(tmp_path, monkeypatch, capsys):
    """A point whose run timed its host's eager launches is simulated on that host too, and
    judged there; the committed host costs' errors are kept beside. (The probe's chunked
    point was served before a mixed step's decode rows left the extend kernel: named, and
    judged as it ran.)"""
    sys.path.insert(0, "bench")
    import trace_fidelity

    monkeypatch.setattr(trace_fidelity, "PLAN", {"conv": ((12000,), (12.0,))})
    out = _fidelity_folder(
        tmp_path, "bench/results/trace-fidelity/probes/own-host-12000-12rps-points-h200.jsonl")
    assert trace_fidelity.main(["--offline", "--traces", "conv", "--strategies",
                                "prefill_first,chunked_512", "--out", str(out)]) == 0
    assert "chunked_512 conv@12000 12 req/s" in capsys.readouterr().err
    data = json.loads((out / "trace-fidelity-h200.json").read_text())
    assert data["judged_as_served_before_decode_rows_left_the_extend_kernel"] == [
        "chunked_512 conv@12000 12 req/s"] and data["not_measured"] == []
    s = data["summary"]
    assert s["points_on_their_own_host"] == 2
    assert s["max_abs_error_pct"]["prefill_ms"] != s["shipped_host"]["max_abs_error_pct"][
        "prefill_ms"]


def test_trace_fidelity_judges_each_window_on_host_costs_fitted_to_the_others(tmp_path):
    """--held-out: each window is simulated with host costs fitted to the other windows'
    points alone (green contexts' own ratios too), and its errors, each strategy's capacity
    error among them, are kept beside the in-sample ones."""
    sys.path.insert(0, "bench")
    import trace_fidelity

    out = _fidelity_folder(tmp_path, "bench/results/trace-fidelity/points-h200.jsonl")
    assert trace_fidelity.main(["--offline", "--held-out", "--traces", "conv", "--out",
                                str(out), "--strategies", "prefill_first,chunked_512,"
                                "chunked_2048,pdmux_grid_cap,pdmux_green,"
                                "pdmux_slo_grid_cap"]) == 0
    summary = json.loads((out / "trace-fidelity-h200.json").read_text())["summary"]
    held = summary["held_out"]
    for window, other in (("conv@2000", "conv@12000"), ("conv@12000", "conv@2000")):
        assert other in held[window]["fitted_on"] and window not in held[window]["fitted_on"]
    fits = [h["fit"] for h in held.values()]
    assert fits[0] != fits[1] and all(0 < f["whole_gpu_prefill_mfu"] < 1 for f in fits)
    # each fold's busy ratio is its own fit, not the committed one fitted on every window
    ratios = [f["decode_beside_prefill_by_busy"] for f in fits]
    assert all(len(r) >= 2 for r in ratios) and ratios[0] != ratios[1]
    for h in held.values():
        for k in ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms"):
            assert 0 <= h["median_abs_error_pct"][k] <= h["max_abs_error_pct"][k] < 100
        # every strategy crossing inside its rates, green's priced by its own fold's fit
        assert {"prefill_first", "pdmux_grid_cap", "pdmux_green"} <= set(h["capacity_error_pct"])
        assert max(map(abs, h["capacity_error_pct"].values())) == pytest.approx(
            h["max_abs_error_pct"]["capacity"])
    green = [f["by_kind"]["green"]["decode_beside_prefill_by_busy"] for f in fits]
    assert all(len(r) >= 2 for r in green) and green[0] != green[1] and green[0] != ratios[0]


def _committed_layer_price():
    """launch_bound_hosts' layer prices on the committed H200 inputs, and their host costs."""
    sys.path.insert(0, "bench")
    from corun_rounds import Pricer
    from launch_bound_hosts import LayerPrice

    from pdmux_triton.cost.measured_inputs import load_host_costs

    overheads = load_host_costs("bench/results/host-costs-h200.json")
    return LayerPrice(Pricer("bench/results/trace-fidelity/points-h200.jsonl",
                             "bench/results/calibrate-h200.json",
                             "bench/results/compare-h200.json", overheads, "h200"),
                      overheads), overheads


def test_launch_bound_hosts_reads_the_hosts_launch_from_launches_the_gpu_did_not_bound():
    """A prefill-first point: a short batch's launches bound it (its host time a layer is its
    launch span less one layer's price, over 36; its wall less that span is the batch's own
    host work), a long one's GPU did (left out), a decode round's span is skipped; without
    spans the wall is read; spans that do not match the rounds are refused by name; five
    launches make a point's figures."""
    price, overheads = _committed_layer_price()  # (bench/ on the path)
    from launch_bound_hosts import GPU_BOUND_S, launch_bound, point_row
    short, long = price.whole(100, 1, 0), price.whole(8000, 1, 0)
    assert short < GPU_BOUND_S < long
    launch_us = 36 * 700 + round(short * 1e6)  # 0.7 ms a layer, then the last layer runs
    diag = {"prefills": [[0, 26000, 100, 1, 0], [27000, 300000, 8000, 1, 0]],
            "rounds": {"start_us": [0, 26000, 27000], "end_us": [26000, 27000, 300000],
                       "level": [-1, -1, -1], "decode_bs": [0, 1, 0],
                       "decode_context": [0, 101, 0], "label": [0, 1, 0],
                       "labels": ["whole", ""]},
            "decode_step_us": [900], "host_layer_us": 800,
            "busy_us": [[100, 100 + launch_us], [26100, 27000], [27100, 299900]]}
    point = {"strategy": "prefill_first", "diagnostics": diag}
    launches, own = launch_bound(point, price, "a point")
    assert [t for t, _ in launches] == [0.0]
    assert launches[0][1] == pytest.approx(0.7e-3, abs=1e-6)
    assert own == [pytest.approx((26000 - launch_us) / 1e6)]
    walls, none = launch_bound({**point, "diagnostics": {k: v for k, v in diag.items()
                                                         if k != "busy_us"}}, price, "a point")
    assert walls == [(0.0, pytest.approx(26e-3 / 36))] and none == []
    with pytest.raises(PdmuxError, match="a point: its launch spans do not match its rounds"):
        launch_bound({**point, "diagnostics": {**diag, "busy_us": diag["busy_us"][:2]}}, price,
                     "a point")
    few = point_row(point, 0.8e-3, launches, own, overheads.layer_launch_s)
    assert "median_ms" not in few and few["own_host_work_ms"] == pytest.approx(
        (26000 - launch_us) / 1e3 * overheads.layer_launch_s / 0.8e-3)
    five = point_row(point, 0.8e-3, [(i, 0.7e-3) for i in range(4)] + [(4, 1.4e-3)], [],
                     overheads.layer_launch_s)
    assert five["median_ms"] == pytest.approx(0.7) and five["mean_ms"] == pytest.approx(0.84)
    assert five["median_over_p50"] == pytest.approx(0.875)


def test_launch_bound_hosts_prices_a_chunked_round_saved_before_as_it_ran():
    """A chunked round of a run saved before a mixed step's decode rows left the extend kernel
    costs its layers more (those rows in the extend tiles too, the batch's context shared
    evenly) than today's, and launch_bound asks for that price on such a point only."""
    price, _ = _committed_layer_price()  # (bench/ on the path)
    from launch_bound_hosts import launch_bound
    assert price.mixed(512, 0, 16, 16 * 3000, True) > price.mixed(512, 0, 16, 16 * 3000, False)
    diag = {"prefills": [], "rounds": {"start_us": [0], "end_us": [40000], "level": [-1],
                                       "decode_bs": [16], "decode_context": [48000],
                                       "label": [0], "labels": ["chunk 0+512"]},
            "decode_step_us": [], "host_layer_us": 800}
    asked = []
    with mock.patch.object(type(price), "mixed", lambda self, *a: asked.append(a[-1]) or 1.0):
        for marker in ({}, {"mixed_decode_rows": MIXED_DECODE_ROWS}):
            launch_bound({"strategy": "chunked_512", "diagnostics": {**diag, **marker}}, price,
                         "a point")
    assert asked == [True, False]


def test_launch_bound_hosts_reads_a_replayed_launch_as_its_first_layers_host_time():
    """A run since replays launches a launch's later layers faster than its first: a
    launch-bound launch's host time is read as its first layer's, the later ones at the
    share of the run's medians (an older run's: over its layers, exactly as before), and only
    layers its later launches outpace are left to the host."""
    price, _ = _committed_layer_price()  # (bench/ on the path)
    from launch_bound_hosts import GPU_BOUND_S, launch_bound
    short, medium = price.whole(100, 1, 0), price.whole(300, 1, 0)
    assert short < 0.75 * GPU_BOUND_S < medium < GPU_BOUND_S
    # a first layer of 0.7 ms, 35 later ones at 0.525 (the run's medians: 800 and 600 us)
    spans = {tokens: 700 + 35 * 525 + round(layer * 1e6)
             for tokens, layer in ((100, short), (300, medium))}
    diag = {"prefills": [[0, 26000, 100, 1, 0], [27000, 60000, 300, 1, 0]],
            "rounds": {"start_us": [0, 27000], "end_us": [26000, 60000], "level": [-1, -1],
                       "decode_bs": [0, 0], "decode_context": [0, 0], "label": [0, 0],
                       "labels": ["whole"]},
            "decode_step_us": [], "host_layer_us": 800,
            "busy_us": [[100, 100 + spans[100]], [27100, 27100 + spans[300]]]}
    before = {"strategy": "prefill_first", "diagnostics": diag}
    launches, _ = launch_bound(before, price, "a point")
    assert launches == [(0.0, (spans[100] / 1e6 - short) / 36),  # exactly as before
                        (0.027, (spans[300] / 1e6 - medium) / 36)]
    replayed = {**before, "diagnostics": {**diag, "host_later_layer_us": 600}}
    launches, _ = launch_bound(replayed, price, "a point")  # the medium batch's GPU paces it
    assert [t for t, _ in launches] == [0.0] and launches[0][1] == pytest.approx(0.7e-3, abs=1e-7)


def test_a_batch_prefill_spans_its_first_prompt_taken_to_its_first_token():
    sys.path.insert(0, "bench")
    from trace_fidelity import batch_prefill_ms

    # two requests of one batch (one first-token time, starts a microsecond apart) and one alone
    diag = {"prefills": [[1000, 5000, 300, 1], [1001, 5000, 200, 1], [9000, 11000, 50, 1]]}
    assert batch_prefill_ms(diag) == pytest.approx((4.0 + 2.0) / 2)
    assert batch_prefill_ms({"prefills": []}) is None


def test_fit_host_costs_reads_a_capacity_folders_diagnostics_as_trace_points(tmp_path):
    """A measured capacity folder keeps each point's rounds, prefill batches and host time
    (capacity-diagnostics-<gpu>.jsonl): fitted from there, one window of the committed trace
    points gives what the same points give from trace_fidelity's own file."""
    import json
    import shutil

    window = [json.loads(line) for line in
              open("bench/results/trace-fidelity/points-h200.jsonl")]
    window = [p for p in window if p["mode"] == "gpu" and p["start"] == 12000]
    trace_points = tmp_path / "trace" / "points-h200.jsonl"
    trace_points.parent.mkdir()
    trace_points.write_text("".join(json.dumps(p) + "\n" for p in window))
    folder = tmp_path / "capacity"
    folder.mkdir()
    # the folder's settings are the window's, so its batches' prompts come back from its
    # requests as from the trace points' own
    settings = json.loads(Path("bench/results/capacity-conv/capacity-settings-h200.json")
                          .read_text())
    settings.update(trace_start=12000, trace_count=100, count=100)
    (folder / "capacity-settings-h200.json").write_text(json.dumps(settings))
    (folder / "capacity-diagnostics-h200.jsonl").write_text("".join(
        json.dumps({"mode": "gpu", "strategy": p["strategy"], "rate": p["rate"],
                    **p["diagnostics"]}) + "\n" for p in window))
    fits = []
    for measured in (trace_points, folder / "capacity-diagnostics-h200.jsonl"):
        host = tmp_path / f"host-{measured.parent.name}.json"
        shutil.copy("bench/results/host-costs-h200.json", host)
        out = _fit(str(measured), host)
        assert out.returncode == 0, out.stderr[-2000:]
        fitted = json.loads(host.read_text())
        fits.append({k: fitted[k] for k in ("eager_step", "whole_gpu_prefill", "mixed_step")})
    for fit in fits:  # the sources name their files; the figures must agree
        for part in fit.values():
            part.pop("source")
    assert fits[0] == fits[1] and fits[0]["mixed_step"]["rounds"] > 100
    # pooled with the steady-state folders, the window's rounds and batches count once more
    pooled = tmp_path / "host-pooled.json"
    shutil.copy("bench/results/host-costs-h200.json", pooled)
    out = _fit([str(trace_points), *COMMITTED_FIT[1:]], pooled)
    assert out.returncode == 0, out.stderr[-2000:]
    steady = [json.loads(line) for name in COMMITTED_FIT[1:] for line in open(name)]
    rounds = sum(label.startswith("chunk ") for d in steady if d["strategy"].startswith("chunked")
                 for label in (d["rounds"]["labels"][i] for i in d["rounds"]["label"]))
    assert json.loads(pooled.read_text())["mixed_step"]["rounds"] == \
        fits[0]["mixed_step"]["rounds"] + rounds
    # a folder whose points hold no chunked rounds adds only its prefill batches; alone it is
    # refused, and so is a folder measured with another model
    out = _fit(COMMITTED_FIT[1], tmp_path / "host-trace.json")
    assert out.returncode == 2 and "no chunked strategy's rounds" in out.stderr
    other = tmp_path / "other"
    other.mkdir()
    settings = json.loads(open("bench/results/capacity-conv/capacity-settings-h200.json").read())
    settings["model"]["layers"] = 28
    (other / "capacity-settings-h200.json").write_text(json.dumps(settings))
    shutil.copy(COMMITTED_FIT[1], other)
    out = _fit([COMMITTED_FIT[2], str(other / "capacity-diagnostics-h200.jsonl")], pooled)
    assert out.returncode == 2 and "fit files of one GPU and model" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    empty = folder / "capacity-diagnostics-h200.jsonl"
    empty.write_text("")
    out = _fit(str(empty), tmp_path / "host-trace.json")
    assert out.returncode == 2 and "no measured point whose run timed its host" in out.stderr


def test_decode_floor_sums_an_eager_steps_kernels_by_name():
    sys.path.insert(0, "bench")
    from decode_floor import kernel_figures, kernel_times

    events = [("skinny_kernel", 0.02), ("decode_kernel", 0.07), ("Memcpy HtoD", 0.5),
              ("skinny_kernel", 0.03), ("memset (Device)", 0.1), ("rmsnorm_kernel", 0.004)]
    kernels = kernel_times(events)
    assert list(kernels) == ["decode_kernel", "skinny_kernel", "rmsnorm_kernel"]  # longest first
    assert kernels["skinny_kernel"] == [2, pytest.approx(0.05)]
    figures = kernel_figures(kernels, step_ms=0.2)
    assert figures["launches_per_decode_step"] == 4  # copies and memsets are not kernels
    assert figures["eager_step_kernel_ms"] == pytest.approx(0.124)
    assert figures["eager_kernel_ms_vs_step"] == pytest.approx(0.62)


def test_decode_floor_takes_each_launchs_median_over_profiled_steps():
    sys.path.insert(0, "bench")
    from decode_floor import median_launches

    runs = [[("skinny_kernel", 0.02), ("decode_kernel", 0.07)],
            [("skinny_kernel", 0.05), ("decode_kernel", 0.06)],
            [("skinny_kernel", 0.03), ("decode_kernel", 0.09)]]
    assert median_launches(runs) == [("skinny_kernel", 0.03), ("decode_kernel", 0.07)]
    with pytest.raises(PdmuxError, match="launched different kernels"):
        median_launches([runs[0], [("decode_kernel", 0.07), ("skinny_kernel", 0.02)]])


def test_decode_floor_labels_an_eager_steps_gemms_by_the_weight_they_read():
    """The skinny launches of an eager step in order are each layer's qkv, o, gate-up and down,
    then the LM head: their times by weight against the streaming read of that weight's bytes;
    a step whose GEMM count does not fit that order gets no labels."""
    sys.path.insert(0, "bench")
    from decode_floor import gemm_times_by_weight

    layer = [("skinny_kernel", 0.004), ("rope_kernel", 0.001), ("decode_kernel", 0.05),
             ("skinny_kernel", 0.002), ("skinny_kernel", 0.01), ("skinny_kernel", 0.005)]
    events = [*layer, *layer, ("skinny_kernel", 0.3)]
    sizes = {"qkv": 12e9, "o": 8e9, "gate_up": 30e9, "down": 16e9, "lm_head": 600e9}
    got = gemm_times_by_weight(events, sizes, layers=2, tbps=4.0)
    assert list(got) == ["qkv", "o", "gate_up", "down", "lm_head"]
    assert got["o"]["launches"] == 2 and got["o"]["ms"] == pytest.approx(0.004)
    # 2 x 8 GB at 4 TB/s is 4 ms of streaming read in 0.004 ms: a share of 1000
    assert got["o"]["vs_stream_read"] == pytest.approx(1000)
    assert got["lm_head"]["vs_stream_read"] == pytest.approx(150 / 0.3)  # 600 GB: 150 ms
    assert gemm_times_by_weight(events[:-1], sizes, layers=2, tbps=4.0) is None


@pytest.mark.parametrize("fused", [False, True])
def test_decode_floor_weight_order_is_the_decoders(fused):
    """The order gemm_times_by_weight labels the step's GEMMs by is the one a decode step
    calls them in (each layer's qkv, o, gate-up, down; then the LM head), on both of the
    decoder's layer paths (fused norms or not), recorded from the tiny model's step."""
    from unittest import mock

    import torch
    from test_decoder import DEV, PAGE, make_model, prefill_batch

    sys.path.insert(0, "bench")
    from decode_floor import LAYER_WEIGHTS

    from pdmux_triton.gpu import decoder
    from pdmux_triton.gpu.decoder import DecodeBatch
    from pdmux_triton.kernels import gemm
    from pdmux_triton.multiplex.partition import Budget

    model = make_model()
    names = {model.w.lm_head.data_ptr(): "lm_head"}
    names.update({w.data_ptr(): k for layer in model.w.layers for k, w in layer.items()
                  if k in LAYER_WEIGHTS})
    read = []

    def recording(fn):
        def call(x, weight, *args, **kwargs):
            read.append(names[weight.data_ptr()])
            return fn(x, weight, *args, **kwargs)
        return call

    tokens, pages = [3, 1, 4, 1, 5], [2, 0]
    model.extend_layers(prefill_batch(tokens[:-1], pages), 0, len(model.w.layers),
                        budget=Budget(2))
    n = len(tokens) - 1
    step = DecodeBatch(torch.tensor(tokens[-1:], device=DEV), torch.tensor([n], device=DEV),
                       torch.tensor([pages[n // PAGE] * PAGE + n % PAGE], device=DEV),
                       torch.tensor([pages], dtype=torch.int32, device=DEV),
                       torch.tensor([n + 1], dtype=torch.int32, device=DEV), max_seq_len=n + 1)
    budget = Budget(64) if fused else Budget(2)
    with mock.patch.object(gemm, "whole_tiles", return_value=fused), \
            mock.patch.object(decoder, "linear", recording(decoder.linear)), \
            mock.patch.object(decoder, "swiglu_linear", recording(decoder.swiglu_linear)):
        assert model.fuses_norms(1, budget) == fused
        model.decode_step(step, budget)
    assert read == [*LAYER_WEIGHTS * len(model.w.layers), "lm_head"]


def test_decode_floor_summary_reads_its_rows_and_the_sessions_files(tmp_path):
    """bench/decode_floor.py's pure part: the worst pinned-vs-green error and shared SMs over
    its level rows, the kernel benchmark's and a run's figures from their files (the best pd-mux
    kind by ITL during the prefill); without a GPU it says so in one line, exit 2."""
    sys.path.insert(0, "bench")
    from decode_floor import (TURNS, check_files_gpu, compared_turns, file_figures, from_files,
                              summarize)

    class Saved:  # what the two read and write of common.Results (which needs a GPU to make)
        data = {"summary": {}}
        saves = 0

        def save(self):
            self.saves += 1

    res = Saved()
    res.data["rows"] = [
        {"section": "level", "kind": "green", "alone_ms": 10.0},
        {"section": "level", "kind": "pinned", "ctas_per_sm": 1, "vs_green_alone_pct": -1.5,
         "vs_green_corun_pct": 2.5, "vs_green_no_pdl_alone_pct": -0.5, "shared_sms": 0,
         "prefill_vs_green_corun_pct": -3.0},
        {"section": "level", "kind": "pinned", "ctas_per_sm": 1, "vs_green_alone_pct": 0.5,
         "vs_green_corun_pct": 0.5, "shared_sms": 0, "prefill_vs_green_corun_pct": 1.0},
        {"section": "level", "kind": "pinned", "ctas_per_sm": 2, "vs_green_alone_pct": -4.0,
         "vs_green_corun_pct": 1.0, "shared_sms": 0},
        {"section": "level", "kind": "pinned", "ctas_per_sm": "served",
         "vs_green_alone_pct": -7.0, "vs_green_corun_pct": 3.0,
         "vs_green_no_pdl_alone_pct": -1.25, "shared_sms": 0},
        # the diagnostic turns: each its own figure, none in the product's
        {"section": "level", "kind": "pinned", "ctas_per_sm": "1 claiming",
         "vs_green_alone_pct": -9.0, "vs_green_corun_pct": 0.5, "shared_sms": 3,
         "prefill_vs_green_corun_pct": -40.0},
        {"section": "level", "kind": "pinned", "ctas_per_sm": "1 claiming",
         "vs_green_alone_pct": -2.0, "vs_green_corun_pct": 30.0, "shared_sms": 1,
         "prefill_vs_green_corun_pct": 2.0},
        {"section": "level", "kind": "pinned", "ctas_per_sm": "1 on green's SMs",
         "vs_green_alone_pct": 0.5, "vs_green_corun_pct": -11.0, "shared_sms": 0}]
    summarize(res)
    figures = file_figures("bench/results/kernels-h200.json", "bench/results/run-h200.json")
    check_files_gpu(figures, "h200")
    for other in ({**figures, "kernels_gpu": "h100-sxm"}, {**figures, "run_gpu": None}):
        with pytest.raises(PdmuxError, match="was measured on .*not on this GPU .'h200'"):
            check_files_gpu(other, "h200")  # another card's figures in this card's summary
    check_files_gpu({}, "h100-sxm")  # no files, nothing to check
    stopped = json.loads(Path("bench/results/run-h200.json").read_text())
    stopped["rows"], stopped["unserved"] = stopped["rows"][:4], ["pdmux_grid_cap", "pdmux_green"]
    (tmp_path / "stopped.json").write_text(json.dumps(stopped))
    with pytest.raises(PdmuxError, match="stopped before pdmux_grid_cap, pdmux_green"):
        file_figures(None, str(tmp_path / "stopped.json"))  # its best kind may be unserved
    # --turns: the pinned turns named, and green's each is compared with (with and without PDL)
    assert compared_turns(("2", "1 claiming"), "pinned") == {"2", "1 claiming"}
    assert compared_turns(("2", "1 claiming"), "green") == {"2", "1", "2 no pdl", "1 no pdl"}
    assert compared_turns(("served", "1 on green's SMs"), "green") == {
        "served", "1", "served no pdl", "1 no pdl"}
    assert compared_turns(TURNS, "green") >= {"1", "2", "3", "served", "served no pdl"}
    from_files(res, figures)
    # a run of some turns (--turns) summarizes those it ran: served alone, a diagnostic alone
    for only in ("served", "1 claiming"):
        part = Saved()
        part.data = {"summary": {}, "rows": [
            {"section": "level", "kind": "green", "alone_ms": 10.0},
            {"section": "level", "kind": "pinned", "ctas_per_sm": only,
             "vs_green_alone_pct": -6.0, "vs_green_corun_pct": 4.0, "shared_sms": 0,
             "prefill_vs_green_corun_pct": -2.5}]}
        summarize(part)
        if only == "served":
            assert part.data["summary"] == {"served_pinned_vs_green_max_error_pct": 6.0,
                                            "pinned_shared_sms": 0}
        else:
            assert part.data["summary"] == {
                "pinned_claiming_vs_green_max_error_pct": 6.0,
                "pinned_claiming_prefill_vs_green_min_pct": -2.5}
    s = res.data["summary"]
    assert res.saves == 2
    assert s["pinned_vs_green_max_error_pct"] == 4.0 and s["pinned_shared_sms"] == 0
    assert s["served_pinned_vs_green_max_error_pct"] == 7.0  # as a served decode side runs
    # against green with its launches apart too (the gate's share of the gap)
    assert s["pinned_vs_green_without_pdl_max_alone_pct"] == 1.25
    assert s["pinned_claiming_vs_green_max_error_pct"] == 30.0
    assert s["pinned_on_green_sms_vs_green_max_error_pct"] == 11.0
    # the prefill beside the decode side: its slowest level against green's, per turn; none
    # where the rows lack it (a file from before the prefill was timed beside)
    assert s["pinned_prefill_vs_green_min_pct"] == -3.0
    assert s["pinned_claiming_prefill_vs_green_min_pct"] == -40.0
    assert "pinned_on_green_sms_prefill_vs_green_min_pct" not in s
    assert 0.3 < s["decode_linear_min_bw_frac"] < 1 and 0.5 < s["decode_attention_min_bw_frac"] < 1
    assert s["pdmux_best_kind"] in ("pdmux_grid_cap", "pdmux_green")
    assert s["pdmux_itl_in_prefill_ms"] > 5 and s["pdmux_prefill_ms"] > 100
    if not __import__("torch").cuda.is_available():
        out = subprocess.run([sys.executable, "bench/decode_floor.py", "--out", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    # a wrong file given is refused before anything is measured, GPU or not
    for flag, path, says in (("--kernels", "bench/results/run-h200.json", "bench_kernels.py"),
                             ("--run", "bench/results/kernels-h200.json", "pdmux-triton run"),
                             ("--run", str(tmp_path / "none.json"), "cannot read")):
        out = subprocess.run([sys.executable, "bench/decode_floor.py", "--out", str(tmp_path),
                              flag, path], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and says in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_prefix_cache_compares_capacities_with_the_cache_on_and_off(tmp_path):
    """bench/prefix_cache.py on a short window of Mooncake's synthetic trace, simulated: both
    capacities per strategy, the hit rate at capacity no more than the unbounded count's, and
    a bad window refused in one line."""
    import json

    out = subprocess.run([sys.executable, "bench/prefix_cache.py", "--out", str(tmp_path),
                          "--traces", "syn", "--window", "3000:60", "--strategies",
                          "pdmux_grid_cap"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "prefix-cache-h200-simulated.json").read_text())
    s = data["summary"]["syn"]
    row = s["strategies"]["pdmux_grid_cap"]
    counted = s["counted_hit_rates"]
    assert 0 < counted["lru_at_kv_capacity"] <= counted["unbounded"]
    assert row["goodput_capacity_on_rps"] >= row["goodput_capacity_off_rps"] > 0
    assert 0 < row["hit_rate_at_capacity"] <= counted["unbounded"]
    on = data["traces"]["syn"]["capacity"]["on"]
    assert on["inputs"]["prefix_cache"] == "on" and on["inputs"]["trace_count"] == 60
    assert "pdmux_grid_cap" in out.stdout and "unbounded" in out.stdout
    bad = subprocess.run([sys.executable, "bench/prefix_cache.py", "--out", str(tmp_path),
                          "--window", "10"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--window" in bad.stderr and "Traceback" not in bad.stderr


def test_prefix_cache_ratios_over_a_capacity_below_every_rate_are_lower_bounds(tmp_path):
    """A capacity that failed at every rate served lies below the lowest: a ratio over it is
    read over that rate and marked as a lower bound; --offline with --rates is refused."""
    sys.path.insert(0, "bench")
    from prefix_cache import _ratio

    assert _ratio(2.4, 1.2, None, "k") == {"k": 2.0, "k_at_least": False}
    assert _ratio(2.4, 0.0, 2.0, "k") == {"k": 1.2, "k_at_least": True}
    assert _ratio(0.0, 0.0, 2.0, "k") == {"k": None, "k_at_least": False}
    # a top that met the SLOs at every rate served is at least its highest: so is the ratio;
    # a bottom that did leaves the ratio unbounded from below
    assert _ratio(2.4, 1.2, None, "k", top_at_least=True) == {"k": 2.0, "k_at_least": True}
    assert _ratio(2.4, 0.6, None, "k", bottom_at_least=True) == {"k": None, "k_at_least": False}
    bad = subprocess.run([sys.executable, "bench/prefix_cache.py", "--out", str(tmp_path),
                          "--offline", "--rates", "1"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "--offline" in bad.stderr and "Traceback" not in bad.stderr
    idle = subprocess.run([sys.executable, "bench/prefix_cache.py", "--out", str(tmp_path),
                           "--warm-requests", "40"], capture_output=True, text=True, timeout=120)
    assert idle.returncode == 2 and "--warm-requests 40 does nothing without --rates" in \
        idle.stderr and "Traceback" not in idle.stderr
    side = subprocess.run([sys.executable, "bench/prefix_cache.py", "--out", str(tmp_path),
                           "--cache", "on"], capture_output=True, text=True, timeout=120)
    assert side.returncode == 2 and "--cache on does nothing without --rates" in side.stderr \
        and "Traceback" not in side.stderr


def test_prefix_cache_offline_summarizes_each_side_as_measured(tmp_path):
    """--offline reads each cache side's strategies from its GPU points alone; a strategy
    measured on one side only reads "not measured" on the other, a ratio over a capacity
    below every rate served stays a lower bound, and one met at every rate served reads ">= X"
    with no on/off ratio."""
    import json

    sys.path.insert(0, "bench")
    from prefix_cache import measured_strategies, summarize, table

    points = tmp_path / "capacity-points-h200.jsonl"
    points.write_text("\n".join(json.dumps(r) for r in (
        {"mode": "gpu", "strategy": "chunked_512", "rate": 0.75},
        {"mode": "simulated", "strategy": "prefill_first", "rate": 1.0})) + "\n")
    assert measured_strategies(tmp_path, ("prefill_first", "chunked_512"), "h200") == [
        "chunked_512"]
    assert measured_strategies(tmp_path / "none", ("chunked_512",), "h200") == []
    # another card's points live beside them in their own store: not read for this one
    assert measured_strategies(tmp_path, ("chunked_512",), "h100-sxm") == []

    def side(**strategies):
        return {"mode": "gpu", "summary": {"strategies": strategies}}

    pdmux = {"goodput_capacity_rps": 2.4, "below_rps": {"goodput": None},
             "steady": {"goodput": True}, "prefix_hit_rate": 0.055}
    chunked = {"goodput_capacity_rps": 0.0, "below_rps": {"goodput": 0.75},
               "steady": {"goodput": True}, "prefix_hit_rate": 0.056}
    off = {**pdmux, "goodput_capacity_rps": 0.0, "below_rps": {"goodput": 2.4}}
    traces = {"conv": {"counted_hit_rates": {"unbounded": 0.08, "lru_at_kv_capacity": 0.05},
                       "capacity": {"on": side(pdmux_grid_cap=pdmux, chunked_512=chunked),
                                    "off": side(pdmux_grid_cap=off)}}}
    first = {"goodput_capacity_rps": 0.6, "below_rps": {"goodput": None},
             "at_least": {"goodput": True}, "steady": {"goodput": True}, "prefix_hit_rate": 0.057}
    traces["conv"]["capacity"]["on"]["summary"]["strategies"]["prefill_first"] = first
    traces["conv"]["capacity"]["off"]["summary"]["strategies"]["prefill_first"] = {
        **first, "prefix_hit_rate": None}
    s = summarize(traces)["conv"]
    met = s["strategies"]["prefill_first"]
    assert met["at_least_on"] and met["at_least_off"] and met["on_vs_off"] is None
    assert ">= 0.60" in table(summarize(traces), "h200")
    assert "in the h100-sxm's KV cache" in table(summarize(traces), "h100-sxm")
    row = s["strategies"]["chunked_512"]
    assert row["measured_on"] and not row["measured_off"] and row["below_on_rps"] == 0.75
    assert row["on_vs_off"] is None
    assert s["pdmux_vs_best_chunked_cache_on"] == 2.4 / 0.75
    assert s["pdmux_vs_best_chunked_cache_on_at_least"] and s["measured"]
    assert "not measured" in table(summarize(traces), "h200")
    traces["conv"]["capacity"]["off"] = None  # no strategy measured with the cache off
    assert summarize(traces)["conv"]["strategies"]["pdmux_grid_cap"]["measured_off"] is False


def test_prefix_cache_measures_on_this_machines_card_only(monkeypatch, capsys):
    """Measuring (--rates), the points are this machine's card's: another card named, or no
    GPU, is refused in one line (naming what runs without one) before anything is served."""
    sys.path.insert(0, "bench")
    import prefix_cache
    import script

    from pdmux_triton.errors import PdmuxError
    from pdmux_triton.spec.gpus import gpu_preset

    monkeypatch.setattr(script, "detect_gpu", lambda: gpu_preset("h100-sxm"))
    served = []
    monkeypatch.setattr(prefix_cache, "capacity_run", lambda *a: served.append(a))
    assert prefix_cache.main(["--rates", "1", "--gpu", "h200", "--traces", "syn"]) == 2
    err = capsys.readouterr().err
    assert "--gpu h200: points are measured on this machine's GPU, the h100-sxm" in err
    assert not served and "Traceback" not in err

    def no_gpu():
        raise PdmuxError("no CUDA GPU is visible to torch")
    monkeypatch.setattr(script, "detect_gpu", no_gpu)
    assert prefix_cache.main(["--rates", "1", "--traces", "syn"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU is visible to torch: measuring needs one (without a GPU, drop --rates" \
        in err and not served and "Traceback" not in err


def test_prefill_rate_fit_recovers_a_linear_and_an_attention_rate():
    """bench/prefill_rate.py's rate fit: layer rows timed as linear FLOPs at 600 TFLOP/s and
    attention at 480 give those rates back on each budget, short prompts left out; a budget
    with too few rows has none."""
    sys.path.insert(0, "bench")
    from prefill_rate import FIT_TOKENS, rate_fit

    rows = []
    for sms, scale in ((None, 1.0), (80, 80 / 132)):
        for tokens, prefix in ((512, 0), (2048, 0), (8192, 0), (32768, 0), (4096, 16384)):
            linear, attention = 1e12 * tokens, 2e8 * tokens * (tokens + 2 * prefix)
            ms = (linear / 600e12 + attention / 480e12) / scale * 1e3
            rows.append({"sms": sms, "tokens": tokens, "prompts": 1, "ms": ms,
                         "linear_flops": linear, "attention_flops": attention})
    rows.append({"sms": 20, "tokens": 4096, "prompts": 1, "ms": 1.0, "linear_flops": 1e12,
                 "attention_flops": 1e11})
    fit = rate_fit(rows, 989.0, 132)
    assert fit["132"]["linear_tflops"] == pytest.approx(600) and fit["132"]["rows"] == 4
    assert fit["132"]["attention_tflops"] == pytest.approx(480)
    assert fit["132"]["attention_vs_linear"] == pytest.approx(0.8)
    assert fit["80"]["linear_tflops"] == pytest.approx(600 * 80 / 132)
    assert fit["80"]["linear_mfu"] == pytest.approx(600 / 989)
    assert fit["132"]["max_fit_error_pct"] < 1e-6 and fit["20"] is None
    assert FIT_TOKENS > 512


def _split_point(levels: list[int], prefills: list[list]) -> dict:
    """A pd-mux point of rounds each launching some layers at its level (one round a prompt
    batch, every 0.1 s), and its prompt batches."""
    labels = ["layers 0-18", "layers 18-36"]
    starts = [int(1e5 * i) for i in range(len(levels))]
    return {"strategy": "pdmux_grid_cap", "rate": 1.0, "trace": "conv", "start": 0,
            "diagnostics": {"prefills": prefills, "rounds": {
                "start_us": starts, "end_us": [s + 50_000 for s in starts], "level": levels,
                "label": [i % 2 for i in range(len(levels))], "labels": labels,
                "decode_bs": [8] * len(levels), "decode_context": [8000] * len(levels)}}}


def test_split_batches_read_each_batchs_prompts_level_busy_share_and_price():
    """A pd-mux batch takes the waiting requests in arrival order: each batch's prompts come
    back from the run's requests, its level from the rounds that launched its layers, its busy share
    as the simulator reads it (the split batches' compute spans in the half second before its own
    starts), its compute span less its upload and its price as the simulator's (part-empty GEMM
    waves too); a batch whose layers ran at two levels or
    on the whole GPU is no split batch, and batches that do not add up to the requests give none; a
    batch that read part of its prompts from the prefix cache adds up with its cached tokens and
    gives no row. Only large batches after a busy half second count towards a level's ratio, from
    enough of them."""
    sys.path.insert(0, "bench")
    from corun_rounds import Pricer
    from split_batches import MIN_BUSY, MIN_TOKENS, ratio_by_prefill_sms, split_batches

    from pdmux_triton.cost import step_cost
    from pdmux_triton.cost.measured_inputs import load_host_costs
    from pdmux_triton.spec.traffic import Request

    pricer = Pricer("bench/results/trace-fidelity/points-h200.jsonl",
                    "bench/results/calibrate-h200.json", "bench/results/compare-h200.json",
                    load_host_costs("bench/results/host-costs-h200.json"), "h200")
    lens = [3000, 1500, 2000, 7000, 900, 4100, 5000]
    requests = [Request(i, n, 10, arrival=0.01 * i) for i, n in enumerate(lens)][::-1]
    # batches of 2, 1, 2, 1, 1 prompts; the third ran its layers at two levels, the fourth on
    # the whole GPU (level 0), the last read 1000 tokens from the prefix cache; rounds 0.1 s
    # apart, each batch over two rounds (level 6: 72 SMs)
    levels = [6, 6, 1, 1, 6, 1, 0, 0, 1, 1]
    prefills = [[0, 190_000, 4500, 2, 0], [200_000, 390_000, 2000, 1, 0],
                [400_000, 590_000, 7900, 2, 0], [600_000, 790_000, 4100, 1, 0],
                [800_000, 990_000, 4000, 1, 1000]]
    rows = split_batches(_split_point(levels, prefills), requests, pricer, upload_s=0.001)
    assert [(r["prefill_sms"], r["prompts"], r["tokens"]) for r in rows] == [
        (72, 2, 4500), (112, 1, 2000)]
    slowdown = pricer.sim.wave_slowdown([(3000, 0), (1500, 0)], 72)
    flops = (sum(step_cost.layer_flops(pricer.model, n) for n in (3000, 1500))
             + step_cost.lm_head_flops(pricer.model, 2)) * slowdown
    assert rows[0]["corun_s"] == pytest.approx(
        step_cost.compute_s(flops, pricer.sim.prefill_rate, 72, True))
    waves = pricer.sim.wave_slowdown([(2000, 0)], 112)  # its last GEMM waves part empty
    assert waves > 1 and rows[1]["corun_s"] == pytest.approx(step_cost.compute_s(
        (step_cost.layer_flops(pricer.model, 2000) + step_cost.lm_head_flops(pricer.model, 1))
        * waves, pricer.sim.prefill_rate, 112, True))
    # its first token at 0.19 s ends the round begun at 0.1 s: half of it is the wait
    assert rows[0]["seconds"] == pytest.approx(0.19 - 0.001 - 0.09 / 2)
    # the simulator's busy share: its split prefill's GPU spans before the batch's GPU work
    # starts, here the first batch's compute span (its host span, 0-0.19 s, would read 0.38)
    pricer.sim.prefill_spans = [(0.001, 0.19 - 0.09 / 2)]
    assert rows[0]["busy"] == 0 and rows[1]["busy"] == pytest.approx(
        pricer.sim._prefill_busy(0.2 + 0.001))
    assert rows[1]["busy"] == pytest.approx((0.145 - 0.001) / 0.5)
    short = split_batches(_split_point(levels, prefills[:1] + [[200_000, 390_000, 2001, 1, 0]]),
                          requests, pricer, upload_s=0.001)
    assert short is None
    assert split_batches(_split_point(levels, prefills + [[800_000, 900_000, 100, 1, 0]]),
                         requests, pricer, upload_s=0.001) is None  # more prompts than requests
    # the counting rule: enough tokens, nothing cached, a busy GPU, enough batches a level
    row = {"prefill_sms": 72, "tokens": MIN_TOKENS, "cached": 0, "busy": MIN_BUSY,
           "corun_s": 0.1, "seconds": 0.1, "layers": 36}
    kept = [{**row, "seconds": s} for s in (0.1, 0.11, 0.125)]
    dropped = [{**row, "tokens": MIN_TOKENS - 1}, {**row, "cached": 64},
               {**row, "busy": MIN_BUSY - 0.01}, {**row, "prefill_sms": 112}]
    assert ratio_by_prefill_sms(kept + dropped, min_batches=3) == [
        [72, pytest.approx(0.1 / 0.11), 3]]
    assert ratio_by_prefill_sms(kept + dropped, min_batches=4) == []
    # each span less its layers' fixed time
    assert ratio_by_prefill_sms(kept + dropped, min_batches=3, layer_s=1e-4) == [
        [72, pytest.approx(0.1 / (0.11 - 36e-4)), 3]]


def test_the_joint_fit_parts_a_split_layers_fixed_time_from_the_levels_served_rates():
    """Large busy batches priced at their level's served rate plus 36 layers' fixed time, short
    ones at their busy share's way toward that rate plus the same: `joint_fit` finds both the
    levels and the layer time where the plain ratios read the fixed time into the levels;
    with too few short batches, no layer time and the plain ratios; a fixed time the short
    batches read below 0 is 0."""
    sys.path.insert(0, "bench")
    from split_batches import (MIN_BATCHES, MIN_BUSY, MIN_TOKENS, joint_fit, layer_time,
                               scaled_levels)

    served, layer_s = {72: 1.0, 112: 0.9}, 120e-6
    base = {"cached": 0, "layers": 36}
    large = [{**base, "prefill_sms": sms, "tokens": MIN_TOKENS * 2, "busy": MIN_BUSY,
              "corun_s": corun, "seconds": corun / ratio + 36 * layer_s}
             for sms, ratio in served.items() for corun in np.linspace(0.2, 0.6, MIN_BATCHES)]

    def short(busy, corun, sms=112, fixed=layer_s):
        return {**base, "prefill_sms": sms, "tokens": 800, "busy": busy, "corun_s": corun,
                "seconds": corun + busy * (corun / served[sms] - corun) + 36 * fixed}

    shorts = [short(busy, corun) for busy, corun in zip(np.linspace(0, 1, MIN_BATCHES),
                                                        np.linspace(0.01, 0.03, MIN_BATCHES))]
    levels, layer = joint_fit(large + shorts, ())  # (no measured curve: as far as its share)
    assert layer[0] == pytest.approx(layer_s, abs=1e-6) and layer[1] == MIN_BATCHES
    assert [[sms, ratio] for sms, ratio, _ in levels] == [
        [72, pytest.approx(1.0, rel=1e-3)], [112, pytest.approx(0.9, rel=1e-3)]]
    plain, none = joint_fit(large + shorts[1:], ())
    assert none is None and plain[1][1] < 0.9 * 0.995  # the fixed time read as a slower level
    faster = [short(0.5, 0.02, fixed=-layer_s)] * MIN_BATCHES
    assert layer_time(faster, [[112, 0.9, MIN_BATCHES]], ()) == (0.0, MIN_BATCHES)
    assert layer_time(shorts, [], ()) is None  # no level to price them at
    # a thin kind's levels scaled from the base's, its spans less the given layer time too
    thin = [{**row, "corun_s": 0.8 * (row["seconds"] - 36 * layer_s)} for row in large[:MIN_BATCHES]]
    levels, factor, _ = scaled_levels(thin, [[72, 1.0], [112, 1.0]], layer_s=layer_s)
    assert factor == pytest.approx(0.8) and levels == [[72, pytest.approx(0.8)],
                                                      [112, pytest.approx(0.8)]]


def test_a_kind_too_thin_to_read_level_by_level_scales_the_grid_caps_levels():
    """Another kind's batches too few for two levels of their own: the grid cap's levels
    times the median of each counted batch's ratio over the grid cap's at its SMs (read
    between its levels, held beyond them); None with too few counted batches in all or a base
    of one level. Batches that do not count (too small, cached, after an idle GPU, of no
    span) are not read."""
    sys.path.insert(0, "bench")
    from split_batches import MIN_BUSY, MIN_TOKENS, scaled_levels

    base = [[72, 1.0], [112, 0.9]]
    row = {"tokens": MIN_TOKENS, "cached": 0, "busy": MIN_BUSY, "seconds": 0.1, "layers": 36}
    # 0.9 of the base at 72 SMs; 0.8 at 92, half way between its levels (0.95 there: 0.76
    # over the level below, 0.84 over the one above); 0.85 beyond 112 (0.9 held); the five
    # at 92 hold the median
    rows = ([{**row, "prefill_sms": 72, "corun_s": 0.09}] * 2
            + [{**row, "prefill_sms": 92, "corun_s": 0.1 * 0.95 * 0.8}] * 5
            + [{**row, "prefill_sms": 120, "corun_s": 0.1 * 0.9 * 0.85}] * 2)
    dropped = [{**row, "prefill_sms": 72, "corun_s": 0.5, **bad} for bad in (
        {"tokens": MIN_TOKENS - 1}, {"cached": 16}, {"busy": MIN_BUSY - 0.01}, {"seconds": 0})]
    levels, factor, batches = scaled_levels(rows + dropped, base, min_batches=9)
    assert batches == 9 and factor == pytest.approx(0.8)
    assert levels == [[72, pytest.approx(0.8)], [112, pytest.approx(0.9 * 0.8)]]
    assert scaled_levels(rows + dropped, base, min_batches=10) is None
    assert scaled_levels(rows, base[:1], min_batches=1) is None
    assert scaled_levels(rows, [], min_batches=1) is None


def test_fit_host_costs_scales_the_grid_caps_split_levels_for_the_h100s_thin_green_points(
        tmp_path):
    """The H100's green points hold large split batches at five levels but enough (>= 10)
    at only one: its green split prefill is the grid cap's levels scaled by those batches
    (the file says by how much, and the shipped file holds this fit). A kind with two levels
    of its own is fitted as before: the H200's refit test covers it."""
    host = tmp_path / "host-costs-h100-sxm.json"
    host.write_text(Path("bench/results/host-costs-h100-sxm.json").read_text())
    out = subprocess.run([sys.executable, "bench/fit_host_costs.py",
                          "bench/results/trace-fidelity/points-h100-sxm.jsonl", str(host),
                          "--calibration", "bench/results/calibrate-h100-sxm.json",
                          "--compare", "bench/results/compare-h100-sxm.json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "the grid cap's x" in out.stdout
    fitted = json.loads(host.read_text())
    green, grid = fitted["by_kind"]["green"]["split_prefill_served"], fitted[
        "split_prefill_served"]
    factor = green["scaled_from_base_by"]
    assert 0.8 < factor < 1 and green["batches"] >= 10
    assert [s for s, _ in green["ratio_by_prefill_sms"]] == [
        s for s, _ in grid["ratio_by_prefill_sms"]]
    for (_, mine), (_, theirs) in zip(green["ratio_by_prefill_sms"], grid["ratio_by_prefill_sms"]):
        assert mine == pytest.approx(theirs * factor)
    shipped = json.loads(Path("pdmux_triton/measured/host-costs-h100-sxm.json").read_text())
    assert shipped["by_kind"]["green"]["split_prefill_served"]["ratio_by_prefill_sms"] == [
        [s, pytest.approx(r)] for s, r in green["ratio_by_prefill_sms"]]
    # the grid cap's layer time, fitted on its short batches, taken off green's spans as given
    assert green["layer_s"] == grid["layer_s"] > 0 and green["short_batches"] == 0
    assert grid["short_batches"] >= 10
    assert grid["layer_s"] == pytest.approx(shipped["split_prefill_served"]["layer_s"])


def test_served_split_prefill_ratios_from_the_committed_points(tmp_path):
    """The committed points' served batches (every pd-mux point's prompts recovered, the
    prefix-cache folders' too) give a ratio within 0.8-1.05 of the comparison's burst at two
    levels at least; the script prints them pooled, and a points file without pd-mux batches
    is refused in one line that names it."""
    sys.path.insert(0, "bench")
    from split_batches import served_sustained

    from pdmux_triton.cost.measured_inputs import load_host_costs

    files = [p for p in COMMITTED_FIT if p.endswith(".jsonl")]
    got = served_sustained(files, "bench/results/calibrate-h200.json",
                           "bench/results/compare-h200.json",
                           load_host_costs("bench/results/host-costs-h200.json"), "h200")
    assert got["batches"] > 100 and len(got["ratio_by_prefill_sms"]) >= 2
    assert got["points_left_out"] == []
    assert all(0.8 < ratio < 1.05 for _, ratio in got["ratio_by_prefill_sms"])
    out = subprocess.run([sys.executable, "bench/split_batches.py", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pooled" in out.stdout and "left out" not in out.stdout
    assert (tmp_path / "split-batches-h200.json").is_file()
    only_chunked = tmp_path / "points-h200.jsonl"
    only_chunked.write_text("".join(line for line in open(files[0])
                                    if '"strategy": "pdmux' not in line))
    out = subprocess.run([sys.executable, "bench/split_batches.py", str(only_chunked), "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "no pdmux_grid_cap point" in out.stderr
    assert str(only_chunked) in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    # green contexts' own batches, priced at green's burst rate, where its points are
    green = subprocess.run([sys.executable, "bench/split_batches.py", files[0], "--kind", "green",
                            "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert green.returncode == 0, green.stderr[-2000:]
    data = json.loads((tmp_path / "split-batches-green-h200.json").read_text())
    assert data["inputs"]["kind"] == "green"
    assert data["pooled"] and all(0.8 < ratio < 1.05 for _, ratio, _ in data["pooled"])
    # the levels with enough batches, each span less the grid cap's layer time, are what the
    # committed file's green fit holds
    shipped = json.loads(Path("bench/results/host-costs-h200.json").read_text())
    fitted = shipped["by_kind"]["green"]["split_prefill_served"]["ratio_by_prefill_sms"]
    assert data["fitted"]["layer_s"] == shipped["split_prefill_served"]["layer_s"] > 0
    kept = data["fitted"]["ratio_by_prefill_sms"]
    assert [sms for sms, _ in kept] == [sms for sms, _ in fitted]
    for (_, got), (_, want) in zip(kept, fitted):
        assert got == pytest.approx(want)


def test_prompt_batches_take_the_waiting_requests_in_arrival_order():
    """Batches of (prompts, tokens) take the requests in arrival order; batches that do not
    add up to them are refused (None)."""
    sys.path.insert(0, "bench")
    from trace_fidelity import batch_prompts

    from pdmux_triton.spec.traffic import Request

    reqs = [Request(i, n, 4, arrival) for i, (n, arrival) in
            enumerate([(300, 0.2), (100, 0.0), (700, 0.5), (50, 0.4)])]
    got = batch_prompts([(1, 100), (2, 350), (1, 700)], reqs)
    assert [[q.rid for q in b] for b in got] == [[1], [0, 3], [2]]
    assert batch_prompts([(1, 100), (2, 351)], reqs) is None  # tokens disagree
    assert batch_prompts([(5, 1150)], reqs) is None  # more prompts than requests


def test_a_cards_prefill_speed_is_its_long_batches_price_over_their_gpu_time(tmp_path):
    """A prefill-first run whose batches took their simulated price over 0.8 (plus the eager
    step on its host) ran at 0.8, read off its batches of MIN_TOKENS tokens or more alone and
    none read from a prefix cache; a run whose batches do not add up to its requests has none;
    a card's speed is the median over its runs' batches, by the commit they were served at."""
    sys.path.insert(0, "bench")
    import card_speeds
    from card_speeds import (MIN_TOKENS, batch_speeds, card_of, card_speed, measured_speeds,
                             point_name)
    from corun_rounds import Pricer
    from split_batches import point_requests
    from trace_fidelity import Key, taken_batches

    from pdmux_triton.cost.measured_inputs import load_host_costs
    from pdmux_triton.results import PointStore

    path = "bench/results/trace-fidelity/points-h200.jsonl"
    measured = {k: "bench/results/" + v for k, v in (("calibration", "calibrate-h200.json"),
                                                     ("compare", "compare-h200.json"))}
    overheads = load_host_costs("bench/results/host-costs-h200.json")
    pricer = Pricer(path, measured["calibration"], measured["compare"], overheads, "h200")
    point = PointStore(Path(path), Key).get(Key("gpu", "conv", 2000, 24.0, "prefill_first"))
    requests = point_requests(path, point, pricer.gpu.name)
    host = overheads.on_host(point["diagnostics"]["host_layer_us"] / 1e6)
    sim = pricer.sim
    batches, taken = taken_batches(point["diagnostics"], requests)
    long = [t >= MIN_TOKENS for _, (_, t, *_) in batches]
    assert 4 <= sum(long) < len(batches)  # some batches are too short to count

    def retimed(speed: float, cached_first_long: bool = False) -> dict:
        prefills, first = [], long.index(True)
        for i, ((_, (start, tokens, prompts, cached)), reqs) in enumerate(zip(batches, taken)):
            price = sim.whole_gpu_prefill_s([(q.prompt_len, 0) for q in reqs], sim.num_layers,
                                            True)
            # a short batch far off its price: a speed that read it would not be `speed`
            took = price / (speed if long[i] else 0.3) + host.eager_step_s
            if cached_first_long and i == first:  # as if it read 16 tokens from a cache
                tokens, cached = tokens - 16, 16
            prefills.append([start, start + round(took * 1e6), tokens, prompts, cached])
        return {**point, "diagnostics": {**point["diagnostics"], "prefills": prefills}}

    speeds = batch_speeds(retimed(0.8), requests, sim, host)
    assert len(speeds) == sum(long) and all(x == pytest.approx(0.8, rel=1e-3) for x in speeds)
    assert len(batch_speeds(retimed(0.8, cached_first_long=True), requests, sim, host)) == \
        sum(long) - 1
    assert batch_speeds(retimed(0.8), requests[1:], sim, host) is None
    # a card's speed: the median over its runs' batches, each run once under its own name
    cards = measured_speeds([path], measured["calibration"], measured["compare"], overheads,
                            "h200")
    card = card_of(point)
    assert point_name(path, point) in cards[card] and len(cards[card]) >= 2
    assert card_speed(cards[card]) == pytest.approx(statistics.median(
        x for run in cards[card].values() for x in run))
    assert card_speed({"one run": [1.0, 1.0, 1.0]}) is None  # fewer batches than MIN_BATCHES
    assert card_speeds.main([path, "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "card-speeds-h200.json").read_text())
    assert saved["cards"][card]["speed"] == pytest.approx(card_speed(cards[card]))
    assert set(saved["cards"]) == {c for c in cards if card_speed(cards[c]) is not None}


def test_trace_fidelity_simulates_a_card_of_another_prefill_speed(tmp_path, monkeypatch,
                                                                  capsys):
    """--prefill-speed: every point simulated on a card that runs prefills that much faster
    or slower (its decode steps as calibrated); the speeds the measured cards ran at are
    printed and kept; a speed outside [0.5, 2] is refused in one line."""
    sys.path.insert(0, "bench")
    import trace_fidelity

    monkeypatch.setattr(trace_fidelity, "PLAN", {"conv": ((2000,), (24.0,))})
    out = _fidelity_folder(tmp_path, "bench/results/trace-fidelity/points-h200.jsonl")
    judged = {}
    for speed in ("1", "0.8"):
        assert trace_fidelity.main(["--offline", "--traces", "conv", "--strategies",
                                    "prefill_first,pdmux_grid_cap", "--rates", "24",
                                    "--prefill-speed", speed, "--out", str(out)]) == 0
        data = json.loads((out / "trace-fidelity-h200.json").read_text())
        assert data["inputs"]["prefill_speed"] == float(speed)
        judged[speed] = {(p["strategy"], p["rate"]): p["simulated"] for p in data["points"]}
    assert "cards' prefill speed" in capsys.readouterr().out
    assert data["summary"]["prefill_speed_by_commit"]
    for key, slow in judged["0.8"].items():
        assert slow["prefill_ms"] > judged["1"][key]["prefill_ms"]
    for value in ("3", "0.49", "nan"):
        bad = subprocess.run([sys.executable, "bench/trace_fidelity.py", "--offline",
                              "--prefill-speed", value, "--out", str(out)],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "--prefill-speed" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) <= 2 and "Traceback" not in bad.stderr


def test_a_replayed_host_prices_each_launch_on_the_host_of_its_moment():
    """The timeline is the median of the launches within its window of a moment, the
    nearest launch's where none is near; an executor following it prices a launch-bound mixed
    round at each moment as a plain one on that moment's host would."""
    sys.path.insert(0, "bench")
    from host_replay import HOST_WINDOW_S, HostFollowing, HostTimeline

    from pdmux_triton.cost import step_cost
    from pdmux_triton.serve.simulated import SimExecutor
    from pdmux_triton.spec.gpus import gpu_preset
    from pdmux_triton.spec.models import model_preset
    from pdmux_triton.spec.traffic import Request

    timeline = HostTimeline([(0.0, 1e-3), (0.2, 3e-3), (0.4, 2e-3), (10.0, 4e-3)])
    assert timeline(0.2) == 2e-3  # the three within +-1 s
    assert timeline(10.0 + HOST_WINDOW_S) == 4e-3 and timeline(6.0) == 4e-3
    assert timeline(2.0) == 2e-3  # none near: the nearest (0.4 s)
    with pytest.raises(PdmuxError, match="one launch"):
        HostTimeline([])
    qwen, h200 = model_preset("qwen3-8b"), gpu_preset("h200")
    law = step_cost.SaturationLaw(4.0, 60.0)
    rate = step_cost.PrefillRate.fixed(h200.bf16_tflops, h200.sms, 0.5)
    tiles = step_cost.TileTimes(((64, 128, 25e-6, 1.0), (128, 128, 27e-6, 1.0)), 2.5e-6, 2.3e-6,
                                7e-8)
    host = step_cost.Overheads(layer_launch_s=1e-3, eager_step_s=3e-3, decode_round_s=1e-4,
                               mixed=step_cost.MixedStepFit(2e-3, tiles))

    def round_at(x, t: float) -> float:
        x.start([])
        x.idle_until(t)
        decoding = [Request(1, 500, 8, 0.0)]
        decoding[0].context = 500
        began = x.t
        x.mixed(decoding, Request(2, 64, 4, 0.0), 0, 64)  # a short chunk: its launches bind
        return x.t - began

    following = HostFollowing.of(SimExecutor(h200, qwen, law, rate, overheads=host), timeline)
    for t in (0.2, 10.0):
        plain = SimExecutor(h200, qwen, law, rate, overheads=host.on_host(timeline(t)))
        assert round_at(following, t) == pytest.approx(round_at(plain, t), rel=1e-12)
    assert round_at(following, 10.0) > 1.9 * round_at(following, 0.2)  # 4 ms a layer against 2


def test_host_replay_judges_each_first_repeat_on_both_hosts(tmp_path):
    """Every point of the committed trace points that kept enough launch-bound launches, each
    on both hosts against its first repeat; a points file that is not there is one line."""
    sys.path.insert(0, "bench")
    import host_replay

    missing = subprocess.run([sys.executable, "bench/host_replay.py", "--points",
                              str(tmp_path / "none.jsonl"), "--out", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no such points file" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1

    bad = tmp_path / "fidelity.json"
    for text in ('{"points": []}', '{"points": [{"trace": "conv"}]}', '{"points": 3}'):
        bad.write_text(text)
        out = subprocess.run([sys.executable, "bench/host_replay.py", "--fidelity", str(bad),
                              "--out", str(tmp_path)], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 2 and "is not bench/trace_fidelity.py's file" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    # each point replayed as it ran: the committed chunked points (served before a mixed
    # step's decode rows left the extend kernel) with those rows in the extend tiles
    as_ran, replayed = {}, host_replay.replayed
    with mock.patch.object(host_replay, "replayed", lambda args, point, launches, o: (
            as_ran.setdefault(point["strategy"], set()).add(o.mixed.decode_rows_in_extend)
            or replayed(args, point, launches, o))):
        assert host_replay.main(["--out", str(tmp_path)]) == 0
    assert {k: v for k, v in as_ran.items() if k.startswith("chunked_")} and all(
        v == {k.startswith("chunked_")} for k, v in as_ran.items())
    data = json.loads((tmp_path / "host-replay-h200.json").read_text())
    assert data["summary"]["all_points"]["points"] == len(data["points"]) > 10
    # a timeline that holds the median host throughout is the median host: the replay only
    # moves the host (a prefill-first and a chunked point: decode rounds, eager prefills and
    # mixed rounds all priced through it)
    from trace_fidelity import Key

    from pdmux_triton.cost.measured_inputs import load_host_costs
    from pdmux_triton.results import PointStore

    import script
    args = host_replay.parser().parse_args([])
    script.card_inputs(args, measuring=None)
    overheads = load_host_costs(args.host_costs)
    points = PointStore(host_replay.POINTS.format(gpu="h200"), Key).points.values()
    for name in ("prefill_first", "chunked_512"):
        point = next(p for p in points if p["strategy"] == name and p["trace"] == "code")
        median = point["diagnostics"]["host_layer_us"] / 1e6
        row = host_replay.replayed(args, point, [(0.0, median), (30.0, median)], overheads)
        assert row["host_timeline"]["simulated"] == row["median_host"]["simulated"]
    # a run that kept every launch is read as kept, an older one off its launch-bound rounds
    kept = {**point, "diagnostics": {**point["diagnostics"],
                                     "host_layers_us": [[1_000_000, 700], [2_500_000, 900]]}}
    assert host_replay.host_launches(kept, None, "a point") == (
        [(1.0, 0.0007), (2.5, 0.0009)], "every launch, as the run kept it")
    assert data["points"] and all(r["launches_from"] == "launch-bound launches, from the rounds"
                                  for r in data["points"])


def test_host_profile_splits_a_layer_between_triton_and_the_rest():
    """Each kernel's launches: Triton's dispatch is its run less the launcher inside it; what
    the layer's host time holds beyond every run is the rest (our launchers, torch)."""
    sys.path.insert(0, "bench")
    from host_profile import launch_split

    spans = {"gemm": [(40e-6, 10e-6)] * 8, "rmsnorm": [(20e-6, 5e-6)] * 4}
    split = launch_split(spans, layers=4, layer_s=200e-6)
    assert split["kernels"]["gemm"] == {"calls_a_layer": 2, "dispatch_us_a_call": pytest.approx(30),
                                        "launcher_us_a_call": pytest.approx(10)}
    assert split["kernels"]["rmsnorm"]["calls_a_layer"] == 1
    assert split["triton_us_a_layer"] == pytest.approx(100)  # 2 x 40 + 20
    assert split["launcher_us_a_layer"] == pytest.approx(25)
    assert split["rest_us_a_layer"] == pytest.approx(100)


def test_the_decode_step_is_judged_level_by_level():
    """A pd-mux run's decode steps mix levels, so its median jumps between them as the mix
    moves: judged level by level (each level's median, weighted by its measured steps) the
    error is the price's alone. Levels with too few steps in either run are left out; a run
    with none kept has no such error; a run whose steps match no rounds is refused."""
    sys.path.insert(0, "bench")
    from trace_fidelity import MIN_LEVEL_STEPS, launched_rounds, level_step_error_pct

    def run(levels: list[int], step_us: dict[int, float]) -> dict:
        return {"rounds": {"level": levels, "decode_bs": [4] * len(levels),
                           "label": [0] * len(levels), "labels": [""]},
                "decode_step_us": [step_us[lv] for lv in levels]}

    n = MIN_LEVEL_STEPS
    # measured: 3n steps at the whole GPU (level 7, 5 ms), 2n at a split level (10 ms); the
    # simulation 2% slow at the whole GPU, 5% fast at the split, in another mix (its median
    # flips to the split level's)
    measured = run([7] * (3 * n) + [5] * (2 * n) + [3] * (n - 1), {7: 5000, 5: 10000, 3: 12000})
    simulated = run([7] * (2 * n) + [5] * (3 * n) + [3] * n, {7: 5100, 5: 9500, 3: 20000})
    assert statistics.median(simulated["decode_step_us"]) / statistics.median(
        measured["decode_step_us"]) > 1.5  # the medians' error is the mix's
    got = level_step_error_pct(measured, simulated, "pdmux")
    assert got == pytest.approx((3 * 2.0 + 2 * -5.0) / 5)  # level 3: too few measured steps
    assert level_step_error_pct(run([7] * (n - 1), {7: 5000}), run([7] * n, {7: 6000}),
                                "thin") is None
    # chunked prefill: mixed rounds step decode in their forward, only the plain rounds launch
    mixed = {"rounds": {"level": [0, 0, 0], "decode_bs": [2, 2, 0], "label": [1, 0, 0],
                        "labels": ["", "chunk 0+512"]}, "decode_step_us": [7000]}
    assert launched_rounds(mixed, "chunked") == [1]
    with pytest.raises(PdmuxError, match="chunked: 3 decode steps for 2 rounds decoding"):
        launched_rounds({**mixed, "decode_step_us": [7000, 7000, 7000]}, "chunked")


def test_source_commit_finds_the_commit_whose_sources_a_result_names(tmp_path, capsys):
    """A result's source_sha256 (`results.source_digest`) is found among a repository's
    commits: the first commit with those sources and the last (later ones that changed
    nothing under them share it); a digest no commit has exits 1; a missing file or one
    without a digest is one line and exit 2."""
    sys.path.insert(0, "bench")
    import source_commit

    from pdmux_triton.results import source_digest

    repo = tmp_path / "repo"
    (repo / "pdmux_triton" / "sub").mkdir(parents=True)
    (repo / "kernels").mkdir()

    def commit(message: str) -> str:
        for args in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit",
                                     "-q", "-m", message]):
            subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "pdmux_triton" / "a.py").write_text("A = 1\n")
    (repo / "pdmux_triton" / "sub" / "b.json").write_text("{}\n")
    (repo / "kernels" / "k.py").write_text("K = 1\n")
    (repo / "notes.md").write_text("one\n")
    first = commit("first")
    at_first = source_digest(repo)
    (repo / "pdmux_triton" / "a.py").write_text("A = 2\n")
    second = commit("second")
    at_second = source_digest(repo)
    (repo / "notes.md").write_text("two\n")  # outside the sources: the same digest
    third = commit("third")
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"source_sha256": at_first, "commit": f"{third}+dirty"}))
    assert source_commit.main([str(result), at_second, "--repo", str(repo)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{result}: {first} ") and "the last" not in out[0]
    assert out[1].startswith(f"{at_second}: {second} ") and f"the last: {third} " in out[1]
    assert source_commit.main(["0" * 64, "--repo", str(repo)]) == 1
    assert "no commit of the last 3" in capsys.readouterr().out
    for bad, message in ((tmp_path / "missing.json", "cannot read"),
                         (tmp_path / "notes.json", "carries no source_sha256")):
        if bad.name == "notes.json":
            bad.write_text("{}")
        assert source_commit.main([str(bad), "--repo", str(repo)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]


def test_a_fit_on_a_run_stopped_midway_says_which_strategies_it_lacks(tmp_path, capsys):
    sys.path.insert(0, "bench")
    from fit_host_costs import measured_rounds

    from pdmux_triton.cost.measured_inputs import load_host_costs

    stopped = json.loads(Path("bench/results/run-h100-sxm.json").read_text())
    stopped["rows"], stopped["unserved"] = stopped["rows"][:2], ["chunked_2048", "chunked_512"]
    path = tmp_path / "run-h100-sxm.json"
    path.write_text(json.dumps(stopped))
    host = json.loads(Path("bench/results/host-costs-h100-sxm.json").read_text())
    gpu, model, rounds, _ = measured_rounds(
        str(path), host, load_host_costs("bench/results/host-costs-h100-sxm.json"))
    assert gpu.name == "h100-sxm" and model.name == "qwen3-8b"
    assert rounds and not any(r["extend_rows"] for r in rounds)  # served since the change
    assert f"note: {path} stopped before chunked_2048, chunked_512: its rounds are those of " \
        "the strategies it served" in capsys.readouterr().out
