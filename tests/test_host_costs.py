"""`calibrate --host-costs`: the executor's host time per round, measured on the GPU into the
file run and capacity read as --host-costs; its flags and its table."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from pdmux_triton.errors import PdmuxError

from pdmux_triton.cli.main import main
from pdmux_triton.cli.tables import host_costs_table
from pdmux_triton.cost.measured_inputs import load_host_costs


@pytest.mark.parametrize("flag", [["--ctas", "2"], ["--budgets", "16,132"], ["--no-corun"],
                                  ["--batch", "8"], ["--decode-batches", "1,8"],
                                  ["--decode-contexts", "8192"]])
def test_sweep_flags_do_nothing_with_host_costs(flag, capsys):
    assert main(["calibrate", "--host-costs", *flag]) == 2
    err = capsys.readouterr().err
    assert "does nothing with --host-costs" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="has a GPU: would measure")
def test_host_costs_need_a_gpu(capsys):
    assert main(["calibrate", "--host-costs"]) == 2
    assert "measuring needs a CUDA GPU" in capsys.readouterr().err


def test_the_table_shows_each_case_in_ms():
    table = host_costs_table({"eager_layer": [
        {"tokens": 16, "host_s": 0.0012, "later_layer_s": 0.0003, "gpu_s": 0.0004},
        {"tokens": 512, "host_s": 0.0013, "gpu_s": 0.0005}],  # (timed before replays)
        "decode_round": [{"batch": 8, "wall_s": 0.0091, "gpu_s": 0.0083}]})
    assert table.splitlines()[1].split() == ["16", "1.200", "0.300", "0.400"]
    assert table.splitlines()[2].split() == ["512", "1.300", "-", "0.500"]
    assert table.splitlines()[4].split() == ["8", "9.100", "8.300"]


@pytest.mark.gpu
def test_measured_host_costs_are_the_file_run_reads(tmp_path, capsys):
    assert main(["calibrate", "--host-costs", "--model", "tiny", "--out", str(tmp_path)]) == 0
    path = next(tmp_path.glob("host-costs-*.json"))
    costs = load_host_costs(path)
    assert costs.decode_round_s > 0 and costs.layer_launch_s > 0 and costs.later_layer_s > 0
    assert f"wrote {path}" in capsys.readouterr().out


# a shape the loader cannot read names the file and its entry; a value out of range, the
# field it would fill (the cost model's own check)
FILE = "{path}: {key}"


@pytest.mark.parametrize("key, entry, message", [
    ("split_prefill_sustained", [0.95], FILE), ("split_prefill_sustained", {"ratios": []}, FILE),
    ("split_prefill_sustained", {"ratio_by_prefill_sms": [[72]]}, FILE),
    ("split_prefill_sustained", {"ratio_by_prefill_sms": [["x", 0.9]]}, FILE),
    ("split_prefill_sustained", {"ratio_by_prefill_sms": [[72, 3.0]]}, FILE),
    ("split_prefill_sustained", {"ratio_by_prefill_sms": [[72, 0.9]],
                                 "slowdown_by_busy_share": [[0.5]]}, FILE),
    ("split_prefill_sustained", {"ratio_by_prefill_sms": [[72, 0.9]],
                                 "slowdown_by_busy_share": [[1.5, 0.5]]},
     "split_prefill_slowdown needs busy shares"),
    ("decode_beside_prefill", [1.0], FILE), ("decode_beside_prefill", {"ratios": []}, FILE),
    ("decode_beside_prefill", {"ratio_by_busy_share": [[0.5]]}, FILE),
    ("decode_beside_prefill", {"ratio_by_busy_share": [[1.5, 1.0]]}, FILE),
    ("decode_beside_prefill", {"ratio_by_busy_share": [[0.5, 3.0]]}, FILE),
    ("decode_beside_prefill", {"ratio_by_busy_share": [[0.5, 1.0], [0.5, 1.1]]}, FILE),
    ("decode_round_served", [1e-4], FILE), ("decode_round_served", {"fixed_s": 1e-4}, FILE),
    ("decode_round_served", {"fixed_s": 1e-4, "per_request_s": "x", "per_kv_token_s": 0}, FILE),
    ("decode_round_served", {"fixed_s": 1e-4, "per_request_s": -1e-6, "per_kv_token_s": 0},
     FILE),
    ("decode_round_served", {"fixed_s": float("nan"), "per_request_s": 0, "per_kv_token_s": 0},
     FILE),
    *[("decode_round_served", {"fixed_s": 1e-4, "per_request_s": 0, "per_kv_token_s": 0,
                               "split_s": bad}, FILE) for bad in (-1e-6, "x", 2.0)],
    ("prefill_batch", [5e-4], FILE), ("prefill_batch", None, FILE),
    ("prefill_batch", {"seconds": "x"}, FILE), ("prefill_batch", {"seconds": 5.0}, FILE),
    ("prefill_batch", {"seconds": -1e-4}, FILE),
    ("split_prefill_served", [0.99], FILE), ("split_prefill_served", {"batches": 10}, FILE),
    ("split_prefill_served", {"ratio_by_prefill_sms": [[72, "x"]]}, FILE),
    ("split_prefill_served", {"ratio_by_prefill_sms": [[72, 0.0]]}, FILE),
    *[("split_prefill_served", {"ratio_by_prefill_sms": [[72, 0.9]], "layer_s": bad},
       f"{{path}}: split_prefill_served's layer_s needs seconds in [0, 0.01) "
       f"(bench/fit_host_costs.py), got {bad!r}") for bad in (-1e-6, "x", 0.5, True)],
    ("whole_gpu_prefill", {"mfu": 0.5, "ratio_by_busy_share": [[0.5]]},
     "{path}: whole_gpu_prefill's ratio_by_busy_share needs [busy share, ratio] pairs"),
    ("whole_gpu_prefill", {"mfu": 0.5, "ratio_by_busy_share": [[1.5, 1.0]]},
     "{path}: whole_gpu_prefill's ratio_by_busy_share needs distinct busy shares in [0, 1]"),
    ("by_kind", [0.9], FILE), ("by_kind", {"green": [0.9]}, FILE),
    ("by_kind", {"green": {"split_prefill_served": {"ratio_by_prefill_sms": [[72, 3.0]]}}},
     "{path}: by_kind.green.split_prefill_served"),
    ("by_kind", {"green": {"decode_beside_prefill": {"ratio_by_busy_share": [[0.5]]}}},
     "{path}: by_kind.green.decode_beside_prefill"),
    ("by_kind", {"gren": {"decode_beside_prefill": {"ratio_by_busy_share": [[0.5, 1.0]]}}},
     "{path}: by_kind.gren must be one of green, pinned"),
    ("by_kind", {"grid_cap": {"decode_beside_prefill": {"ratio_by_busy_share": [[0.5, 1.0]]}}},
     "{path}: by_kind.grid_cap must be one of"),
    ("by_kind", {"green": {}}, "{path}: by_kind.green must be one of"),
    ("by_kind", {"green": {"split_prefill_sustained": {"ratio_by_prefill_sms": [[72, 0.9]]}}},
     "{path}: by_kind.green must be one of")])
def test_a_malformed_sustained_or_decode_entry_is_refused_by_name(key, entry, message,
                                                                  tmp_path):
    """The committed file's ratios, served decode round and split prefill batch load (a file
    without the served fits prices as before them); a malformed `split_prefill_sustained`,
    `split_prefill_served`, `decode_beside_prefill`, `decode_round_served`, `prefill_batch`,
    the whole-GPU prefill's busy ratios or a kind's own (`by_kind`) is refused in a line that names it, not read as a file without eager layers."""
    path = tmp_path / "host-costs-h200.json"
    shutil.copy("bench/results/host-costs-h200.json", path)
    loaded = load_host_costs(path)
    assert loaded.split_prefill_sustained[0][0] == 72
    assert loaded.split_prefill_slowdown[0][0] == 0.3
    busy = [share for share, _ in loaded.split_decode_by_busy]
    assert busy == sorted(busy) and 0 < busy[0] < busy[-1] < 1
    data = json.loads(path.read_text())
    assert loaded.whole_gpu_prefill_by_busy == tuple(
        map(tuple, data["whole_gpu_prefill"]["ratio_by_busy_share"]))
    assert len(loaded.whole_gpu_prefill_by_busy) >= 2
    served = data["decode_round_served"]  # it prices rounds instead of the captured median
    assert (loaded.decode_round_s, loaded.decode_round_per_request_s,
            loaded.decode_round_per_kv_token_s, loaded.decode_round_split_s) == (
        served["fixed_s"], served["per_request_s"], served["per_kv_token_s"], served["split_s"])
    assert loaded.decode_round_per_request_s > 0 and loaded.decode_round_split_s > 0
    # a file fitted before the split term prices every round as a whole-GPU one
    older = tmp_path / "older" / "host-costs-h200.json"
    older.parent.mkdir()
    older.write_text(json.dumps({**data, "decode_round_served": {
        k: v for k, v in served.items() if k != "split_s"}}))
    assert load_host_costs(older).decode_round_split_s == 0.0
    assert loaded.prefill_batch_s == data["prefill_batch"]["seconds"] < loaded.eager_step_s
    # without the served fits: the captured rounds' median, nothing per request, the eager step
    bare = tmp_path / "bare" / "host-costs-h200.json"
    bare.parent.mkdir()
    bare.write_text(json.dumps({k: v for k, v in data.items()
                                if k not in ("decode_round_served", "prefill_batch")}))
    plain = load_host_costs(bare)
    rounds = sorted(max(0.0, r["wall_s"] - r["gpu_s"]) for r in data["decode_round"])
    assert plain.decode_round_s == rounds[len(rounds) // 2]
    assert plain.decode_round_per_request_s == plain.decode_round_per_kv_token_s == 0.0
    assert plain.prefill_batch_s is None
    assert plain.split_prefill_batch_s() == plain.eager_step_s
    path.write_text(json.dumps({**data, key: entry}))
    with pytest.raises(PdmuxError, match=re.escape(message.format(path=path, key=key))):
        load_host_costs(path)


def test_a_split_prefills_layer_time_is_read_where_fitted_and_none_elsewhere(tmp_path):
    """The H100's file holds a split prefill layer's fixed GPU time (fitted with its served
    ratios) and prices it; a file fitted before it (no `layer_s`) prices none."""
    data = json.loads(Path("bench/results/host-costs-h100-sxm.json").read_text())
    loaded = load_host_costs("bench/results/host-costs-h100-sxm.json")
    assert 0 < loaded.split_prefill_layer_s == data["split_prefill_served"]["layer_s"] < 1e-3
    before = tmp_path / "host-costs-h100-sxm.json"
    before.write_text(json.dumps({**data, "split_prefill_served": {
        k: v for k, v in data["split_prefill_served"].items() if k != "layer_s"}}))
    assert load_host_costs(before).split_prefill_layer_s == 0.0


def test_served_split_prefill_ratios_replace_the_sustained_benchs(tmp_path):
    """A level's prefill on a busy GPU is priced at the ratios fitted from served batches
    (`split_prefill_served`) where the file holds them, else at the sustained bench's; the
    busy curve is the bench's either way, and a file with only the served ratios has none."""
    data = json.loads(open("bench/results/host-costs-h200.json").read())
    served = [tuple(pair) for pair in data["split_prefill_served"]["ratio_by_prefill_sms"]]
    bench = [tuple(pair) for pair in data["split_prefill_sustained"]["ratio_by_prefill_sms"]]
    assert served != bench
    curve = tuple(tuple(pair) for pair in data["split_prefill_sustained"]["slowdown_by_busy_share"])
    for name, drop, ratios, slowdown in (
            ("both", (), served, curve),
            ("bench", ("split_prefill_served",), bench, curve),
            ("served", ("split_prefill_sustained",), served, ())):
        path = tmp_path / name / "host-costs-h200.json"
        path.parent.mkdir()
        path.write_text(json.dumps({k: v for k, v in data.items() if k not in drop}))
        loaded = load_host_costs(path)
        assert list(loaded.split_prefill_sustained) == ratios
        assert loaded.split_prefill_slowdown == slowdown


def test_a_kinds_own_served_ratios_price_its_split_levels_alone(tmp_path):
    """A green context's split prefill and the decode beside it are priced at the ratios fitted
    on its own points (`by_kind`), a capped grid's at the file's top-level ones; a kind with
    only one of the two keeps the default's other, and a kind the file does not name, both."""
    from dataclasses import replace

    from pdmux_triton.cost.measured_inputs import load_calibration, load_compare
    from pdmux_triton.serve.simulated import SimExecutor
    from pdmux_triton.spec.gpus import gpu_preset
    from pdmux_triton.spec.models import model_preset

    data = json.loads(open("bench/results/host-costs-h200.json").read())
    green = data["by_kind"]["green"]
    loaded = load_host_costs("bench/results/host-costs-h200.json")
    mine = loaded.for_kind("green")
    assert mine.split_prefill_sustained == tuple(
        tuple(p) for p in green["split_prefill_served"]["ratio_by_prefill_sms"])
    assert mine.split_decode_by_busy == tuple(
        tuple(p) for p in green["decode_beside_prefill"]["ratio_by_busy_share"])
    assert mine.split_prefill_sustained != loaded.split_prefill_sustained
    assert mine.split_decode_by_busy != loaded.split_decode_by_busy
    assert mine.by_kind == () and mine.eager_step_s == loaded.eager_step_s
    assert loaded.for_kind("grid_cap") is loaded and loaded.for_kind("pinned") is loaded
    half = tmp_path / "host-costs-h200.json"
    half.write_text(json.dumps({**data, "by_kind": {"green": {
        "decode_beside_prefill": green["decode_beside_prefill"]}}}))
    only_decode = load_host_costs(half).for_kind("green")
    assert only_decode.split_prefill_sustained == loaded.split_prefill_sustained
    assert only_decode.split_decode_by_busy == mine.split_decode_by_busy
    half.write_text(json.dumps({**data, "by_kind": {"green": {
        "split_prefill_served": green["split_prefill_served"]}}}))
    only_prefill = load_host_costs(half).for_kind("green")
    assert only_prefill.split_prefill_sustained == mine.split_prefill_sustained
    assert only_prefill.split_decode_by_busy == loaded.split_decode_by_busy
    # the simulator prices a green split level's busy prefill at green's own ratio
    gpu, model = gpu_preset("h200"), model_preset("qwen3-8b")
    cal = load_calibration("bench/results/calibrate-h200.json", "h200")
    cmp = load_compare("bench/results/compare-h200.json", "h200")
    make = lambda kind, overheads: SimExecutor(
        gpu, model, cal.decode_curve(kind), cmp.prefill_rate(kind, gpu.bf16_tflops, gpu.sms),
        kind, overheads)
    for kind, own in (("green", mine), ("grid_cap", replace(loaded, by_kind=()))):
        x, expected = make(kind, loaded), make(kind, own)
        assert (x.sustained_rate, x.decode_by_busy) == (expected.sustained_rate,
                                                        expected.decode_by_busy)
    unfitted = make("green", replace(loaded, by_kind=()))
    assert make("green", loaded).sustained_rate != unfitted.sustained_rate


def test_the_kinds_fitted_apart_are_the_split_kinds_but_the_grid_caps():
    """The cost layer names the kinds a host-costs file may fit apart itself (it imports
    nothing above it): they are the partition module's split kinds, the grid cap's aside."""
    from pdmux_triton.cost.measured_inputs import KINDS_FITTED_APART
    from pdmux_triton.multiplex.partition import SPLIT_KINDS

    assert KINDS_FITTED_APART == tuple(k for k in SPLIT_KINDS if k != "grid_cap")


def test_later_layers_load_where_timed(tmp_path):
    """A file timed with replayed prefill layers gives their median; one timed before them,
    none (every layer priced as the first)."""
    data = json.loads(open("bench/results/host-costs-h200.json").read())
    path = tmp_path / "host-costs-h200.json"
    for row in data["eager_layer"]:
        row.pop("later_layer_s", None)
    path.write_text(json.dumps(data))
    assert load_host_costs(path).later_layer_s is None
    for row, later in zip(data["eager_layer"], (3e-4, 1e-4, 2e-4, 5e-4)):
        row["later_layer_s"] = later
    path.write_text(json.dumps(data))
    loaded = load_host_costs(path)
    assert loaded.later_layer_s == 3e-4  # the median (the upper of the middle two)
    assert loaded.launch_layers_s(3) == pytest.approx(loaded.layer_launch_s + 2 * 3e-4)
