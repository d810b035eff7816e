"""The serving commands, `run` and `capacity`: what they print and write, replaying a saved
run, measuring on the local GPU or simulating a preset (their bad input is in test_main.py)."""

import json
from pathlib import Path

import pytest
import torch
from test_main import fails

from pdmux_triton.cli import flags, plots, serve
from pdmux_triton.cli.main import main

CALIBRATION = "bench/results/calibrate-h200.json"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="has a GPU: would measure")


@no_gpu
def test_run_simulates_without_a_gpu(tmp_path, capsys):
    # 64 decode steps of ~12 ms outlast the simulated 480 ms prefill beside them
    assert main(["run", "--gpu", "h200", "--decode-tokens", "64", "--out", str(tmp_path),
                 "--calibration", CALIBRATION, "--json"]) == 0
    printed = capsys.readouterr().out
    out = json.loads((tmp_path / "run-h200.json").read_text())
    assert json.loads(printed) == out  # progress goes to stderr, stdout is pure JSON
    assert out["mode"] == "simulated" and out["inputs"]["decode_tokens"] == 64
    assert out["inputs"]["calibration"] == CALIBRATION and out["version"]
    strategies = out["summary"]["strategies"]
    assert set(strategies) == {"decode_only", "prefill_first", "chunked_2048", "chunked_512",
                               "pdmux_grid_cap", "pdmux_green"}
    assert strategies["prefill_first"]["tokens_during_prefill"] == 0
    assert "pdmux_grid_cap" in out["summary"]["estimate_error_pct"]
    pd = out["details"]["pdmux_grid_cap"]
    assert list(pd["ttft_ms"]) == ["32"] and pd["prefills"][0]["decode_steps"] > 0
    assert any(r["prefill"] == "layers 0-8" and r["level"] == 5 for r in pd["rounds"])
    assert (tmp_path / "run-h200.png").stat().st_size > 1000


@no_gpu
def test_replay_serves_the_same_run(tmp_path, capsys):
    first, again = tmp_path / "first", tmp_path / "again"
    assert main(["run", "--gpu", "h20", "--workload", "stream", "--rate", "3", "--count",
                 "12", "--seed", "7", "--chunks", "1024", "--out", str(first)]) == 0
    assert main(["run", "--replay", str(first / "run-h20.json"), "--out", str(again)]) == 0
    a, b = (json.loads((d / "run-h20.json").read_text()) for d in (first, again))
    assert a["inputs"] == b["inputs"] and a["rows"] == b["rows"] and a["details"] == b["details"]
    capsys.readouterr()
    fails(capsys, ["run", "--replay", str(first / "run-h20.json"), "--rate", "5"],
          "--rate does nothing with --replay")
    fails(capsys, ["run", "--replay", CALIBRATION], "holds no run inputs to replay")
    fails(capsys, ["run", "--replay", "bench/results/capacity-h200.json"],
          "is a capacity result: --replay serves a run result")
    # inputs edited by hand: the model's and the GPU's fields are checked as a preset's are
    for part, key, value, message in (
            ("model", "layers", 0, "model qwen3-8b: layers must be an integer >= 1, got 0"),
            ("model", "kv_heads", 5, "q_heads 32 is not a multiple of kv_heads 5"),
            ("model", "rms_eps", "tiny", "rms_eps must be a finite number > 0, got 'tiny'"),
            ("gpu", "sms", -5, "GPU h20: sms must be an integer in 1..4096, got -5"),
            ("gpu", "hbm_tbps", 0, "hbm_tbps must be a finite number > 0, got 0")):
        edited = json.loads((first / "run-h20.json").read_text())
        edited["inputs"][part][key] = value
        (tmp_path / "edited.json").write_text(json.dumps(edited))
        fails(capsys, ["run", "--replay", str(tmp_path / "edited.json")], message)


@no_gpu
def test_a_run_stopped_midway_keeps_the_strategies_it_served(tmp_path, capsys, monkeypatch):
    from pdmux_triton.experiments import run

    serve_one = run.Servers.serve
    served = []

    def stopped_at_the_third(self, v, requests):
        if len(served) == 2:
            raise KeyboardInterrupt  # as Ctrl-C or a time limit's signal would stop it
        served.append(v.name)
        return serve_one(self, v, requests)
    monkeypatch.setattr(run.Servers, "serve", stopped_at_the_third)
    monkeypatch.setattr(serve, "_saves_as_it_goes", lambda settings: True)  # as measured
    (tmp_path / "run-h100-sxm.png").write_bytes(b"an older run's plot")
    assert main(["run", "--decode-tokens", "16", "--out", str(tmp_path)]) == 130
    data = json.loads((tmp_path / "run-h100-sxm.json").read_text())
    assert [r["strategy"] for r in data["rows"]] == served == ["decode_only", "prefill_first"]
    assert data["unserved"] == ["chunked_2048", "chunked_512", "pdmux_grid_cap", "pdmux_green"]
    assert data["rows"][1]["requests_lost"] == 0
    err = capsys.readouterr().err
    assert f"saved {tmp_path / 'run-h100-sxm.json'} (decode_only, prefill_first so far)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-h100-sxm.json"]


@no_gpu
def test_a_simulated_run_saves_once_and_a_replay_cannot_overwrite_its_file(tmp_path, capsys,
                                                                           monkeypatch):
    saves = []
    save = serve.write_json
    monkeypatch.setattr(serve, "write_json", lambda path, data: saves.append(path) or
                        save(path, data))
    assert main(["run", "--decode-tokens", "16", "--out", str(tmp_path)]) == 0
    assert saves == [tmp_path / "run-h100-sxm.json"]
    assert "unserved" not in json.loads(saves[0].read_text())
    capsys.readouterr()
    fails(capsys, ["run", "--replay", str(saves[0]), "--out", str(tmp_path)],
          f"--out {tmp_path} would overwrite the replayed file {saves[0]} as the run goes")


@no_gpu
def test_run_prints_its_table_when_matplotlib_is_missing(tmp_path, capsys, monkeypatch):
    from pdmux_triton.errors import PdmuxError

    def no_matplotlib(*args):
        raise PdmuxError("plots need matplotlib: pip install 'pdmux-triton[plot]'")
    monkeypatch.setattr(plots, "timeline", no_matplotlib)
    assert main(["run", "--decode-tokens", "16", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "pdmux_grid_cap" in captured.out and "simulated (a prediction)" in captured.out
    # the default GPU, h100-sxm, is priced by its shipped measurements
    assert ("cost model: the h100-sxm's calibration, comparison and host costs shipped"
            in captured.out)
    assert "no plot: plots need matplotlib" in captured.err
    assert (tmp_path / "run-h100-sxm.json").exists()


@no_gpu
def test_capacity_simulated_writes_json_table_and_plot(tmp_path, capsys):
    argv = ["capacity", "--gpu", "h200", "--count", "50", "--strategies",
            "prefill_first,pdmux_grid_cap", "--tol", "0.2", "--out", str(tmp_path)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "goodput capacity req/s" in captured.out and "pdmux_grid_cap" in captured.out
    data = json.loads((tmp_path / "capacity-h200.json").read_text())
    assert data["mode"] == "simulated" and data["inputs"]["count"] == 50
    # the H200 preset without files is priced by the measurements the package ships
    assert data["inputs"]["calibration"] == "shipped:calibrate-h200.json"
    assert "50 requests a point" in captured.out and "shipped with the tool" in captured.out
    # 50 requests end before their queue settles: both capacities are labelled bursts
    assert "burst" in captured.out and "stream too short for its rate" in captured.err
    assert "--count 100 or more" in captured.err
    assert data["summary"]["strategies"]["prefill_first"]["steady"]["goodput"] is False
    assert data["summary"]["highest_goodput_capacity"] in ("prefill_first", "pdmux_grid_cap")
    assert (tmp_path / "capacity-h200.png").stat().st_size > 1000
    assert main([*argv, "--json"]) == 0  # resumed: every point from the store
    assert "[simulated]" not in capsys.readouterr().err
    fails(capsys, [*argv[:-2], "--count", "51", "--out", str(tmp_path)], "differ in count")
    fails(capsys, [*argv[:-2], "--count", "20", "--out", str(tmp_path)],
          "--count 20: a capacity needs at least 50 requests a point")
    fails(capsys, [*argv, "--repeats", "2"], "--repeats 2: a simulation serves the same "
          "requests the same way each time")
    fails(capsys, [*argv, "--repeats", "0"], "--repeats")
    fails(capsys, [*argv, "--warm-requests", "50"], "--warm-requests does nothing when "
          "simulating")
    fails(capsys, [*argv, "--warm-requests", "-1"], "--warm-requests")


@no_gpu
def test_stream_run_prints_the_serving_table(capsys):
    assert main(["run", "--workload", "stream", "--rate", "4", "--count", "20", "--lengths",
                 "conv", "--slo-ttft-ms", "1000", "--slo-tpot-ms", "30"]) == 0
    out = capsys.readouterr().out
    assert "TPOT p50/p99 ms" in out and "goodput req/s" in out and "SLO met" in out


def test_naming_the_local_gpu_measures_and_another_says_how_to_simulate_it(monkeypatch,
                                                                         capsys):
    """On an H200 (faked: the detected GPU), `--gpu h200` is the README's main command and
    measures; another preset is one line that says --simulate runs it."""
    from pdmux_triton.spec.gpus import GPUS

    monkeypatch.setattr(serve, "measuring_gpu", lambda: GPUS["h200"])
    args, given = flags.parse(["run", "--gpu", "h200"])
    assert serve._where(args, given) == (GPUS["h200"], False, None)
    args, given = flags.parse(["run", "--gpu", "local"])
    assert serve._where(args, given) == (GPUS["h200"], False, None)
    fails(capsys, ["run", "--gpu", "h100-sxm"], "--gpu h100-sxm: this machine's GPU is the h200; "
          "to measure, name it (--gpu h200) or leave --gpu out; to simulate the h100-sxm preset "
          "here, add --simulate")
    fails(capsys, ["run", "--gpu", "v100"], "unknown GPU 'v100'")
    fails(capsys, ["run", "--gpu", "h200", "--sms", "100"],
          "--sms does nothing when measuring on the local h200")
    args, given = flags.parse(["run", "--gpu", "h100-sxm", "--simulate"])
    assert serve._where(args, given) == (GPUS["h100-sxm"], True, None)


@no_gpu
def test_a_measured_run_replayed_without_a_gpu_is_simulated_and_says_so(tmp_path, capsys):
    assert main(["run", "--gpu", "h20", "--decode-tokens", "16", "--out", str(tmp_path)]) == 0
    path = tmp_path / "run-h20.json"
    data = json.loads(path.read_text())
    data["inputs"]["simulate"] = False  # as a run measured on an H20 saved it
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["run", "--replay", str(path)]) == 0
    captured = capsys.readouterr()
    assert "no GPU here" in captured.err and "simulating on the h20 preset" in captured.err
    assert "simulated (a prediction)" in captured.out


def test_a_capacity_at_the_search_ceiling_says_it_is_at_least_that(tmp_path, capsys):
    """The tiny model meets the SLOs at any rate: its capacity is the search's ceiling."""
    assert main(["capacity", "--simulate", "--model", "tiny", "--count", "50",
                 "--strategies", "prefill_first", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ">= 1000.00 (search limit)" in out and "50 requests a point" in out
    assert "cost model: first-order and uncalibrated" in out


def test_the_shipped_h200_inputs_price_only_the_model_they_were_measured_with(capsys):
    assert main(["run", "--gpu", "h200", "--model", "tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["calibration"] is None
    assert main(["run", "--gpu", "h200", "--model", "tiny", "--calibration", CALIBRATION,
                 "--decode-tokens", "16"]) == 0
    assert (f"note: {CALIBRATION} was measured with qwen3-8b: its curves price tiny by "
            f"extrapolation") in capsys.readouterr().err


@no_gpu
@pytest.mark.parametrize("name", ["run-h200.json", "run-advised-h200.json"])
def test_the_committed_run_results_replay_simulated_here(name, capsys):
    """A measured file replays on a machine without its GPU: simulated, with a note."""
    assert main(["run", "--replay", f"bench/results/{name}", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["mode"] == "simulated"
    assert "no GPU here" in captured.err and "simulating on the h200 preset" in captured.err


@no_gpu
def test_a_run_saved_before_todays_chunked_steps_replays_as_it_ran(tmp_path, capsys):
    """A measured run whose chunked strategies took the whole chunk beside the decode rows (saved
    before the chunk counted them) is simulated as it ran, with a note; marked as today's, the
    same inputs take the chunk less the rows."""
    saved = Path("bench/results/h100-session-56/run-h100-sxm.json")
    assert main(["run", "--replay", str(saved), "--simulate", "--json"]) == 0
    captured = capsys.readouterr()
    assert "chunked_2048, chunked_512 in" in captured.err and "simulated as they ran" in captured.err
    details = json.loads(captured.out)["details"]["chunked_512"]
    assert {"chunk 0+512"} == {r["prefill"] for r in details["rounds"]
                               if r["prefill"].startswith("chunk 0+")}
    # (saved as it ran: replayed again, it runs that loop again)
    assert details["mixed_decode_rows"] == "decode_attention" and "mixed_chunk_rows" not in details
    today = json.loads(saved.read_text())
    for details in today["details"].values():
        details["mixed_chunk_rows"] = "counted_in_chunk"
    (tmp_path / "today.json").write_text(json.dumps(today))
    assert main(["run", "--replay", str(tmp_path / "today.json"), "--simulate", "--json"]) == 0
    captured = capsys.readouterr()
    assert "simulated as they ran" not in captured.err
    rounds = json.loads(captured.out)["details"]["chunked_512"]["rounds"]
    assert {"chunk 0+480"} == {r["prefill"] for r in rounds if r["prefill"].startswith("chunk 0+")}


def test_every_committed_run_result_holds_its_inputs():
    from pdmux_triton.experiments.settings import RunSettings

    for path in sorted(Path("bench/results").rglob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "rows" in data and "details" in data:  # a run result
            # (its inputs name the GPU it was measured or simulated on)
            assert RunSettings.from_dict(data["inputs"]).gpu.name == data["gpu"], path


@no_gpu
def test_run_serves_a_published_traces_window_faster_and_saves_it(tmp_path, capsys):
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{10 + 2 * i:02d}.5,{100 + i},{4 + i}\n" for i in range(6)))
    argv = ["run", "--gpu", "h200", "--workload", "trace", "--trace", str(trace),
            "--trace-start", "2", "--trace-count", "3", "--speed", "4", "--kinds", "grid_cap",
            "--chunks", "512", "--out", str(tmp_path)]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["inputs"]["trace_start"], out["inputs"]["trace_count"],
            out["inputs"]["speed"]) == (2, 3, 4.0)
    pf = next(d for name, d in out["details"].items() if name == "prefill_first")
    assert len(pf["ttft_ms"]) == 3  # the window's three requests, and only they
    again = tmp_path / "again"
    assert main(["run", "--replay", str(tmp_path / "run-h200.json"), "--out", str(again),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == out["rows"]


@pytest.mark.parametrize("flag", [["--speed", "2"], ["--trace-start", "1"], ["--trace-count", "5"]])
def test_trace_window_flags_do_nothing_without_a_trace(flag, capsys):
    fails(capsys, ["run", "--workload", "stream", *flag], "does nothing with --workload stream")


@no_gpu
def test_capacity_of_a_trace_is_a_rate_and_a_multiple_of_its_own(tmp_path, capsys):
    path = "bench/data/azure-llm-2023/AzureLLMInferenceTrace_code.csv"
    assert main(["capacity", "--simulate", "--gpu", "h200", "--trace", path, "--trace-count",
                 "60", "--strategies", "prefill_first", "--out", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    from pdmux_triton.spec.traces import load_trace

    first = load_trace(path).arrival[:60]
    own = out["trace_rate_rps"]
    assert own == pytest.approx(59 / (first[-1] - first[0]))  # its 60 requests, as recorded
    row = out["summary"]["strategies"]["prefill_first"]
    assert row["x_trace_rate"]["goodput"] == pytest.approx(row["goodput_capacity_rps"] / own)
    assert out["inputs"]["trace_count"] == 60 and out["inputs"]["workload"] == "trace"
    fails(capsys, ["capacity", "--simulate", "--trace", path, "--trace-count", "20"],
          "20 requests of the trace (--trace-count): a capacity needs at least 50")
    fails(capsys, ["capacity", "--simulate", "--trace", path, "--lengths", "arxiv"],
          "--lengths does nothing with --workload trace")


@no_gpu
def test_capacity_of_a_mooncake_window_reads_its_prefix_hit_rate(tmp_path, capsys):
    """The prefix cache's hit rate at each strategy's goodput capacity, in the JSON and the
    table; off, neither (and every point says None)."""
    path = "bench/data/mooncake-fast25/synthetic_trace.jsonl"
    argv = ["capacity", "--simulate", "--gpu", "h200", "--trace", path, "--trace-start", "3000",
            "--trace-count", "60", "--strategies", "pdmux_grid_cap", "--slo-ttft-ms", "10000",
            "--slo-tpot-ms", "50"]
    assert main([*argv, "--out", str(tmp_path / "on")]) == 0
    table = capsys.readouterr().out
    assert "prefix cache on" in table and "prefix hit at goodput capacity" in table
    on = json.loads((tmp_path / "on" / "capacity-h200.json").read_text())
    row = on["summary"]["strategies"]["pdmux_grid_cap"]
    at = max((p for p in on["points"] if p["rate"] <= row["goodput_capacity_rps"]
              and p["slo_attainment"] >= 0.9), key=lambda p: p["rate"])  # the one read
    assert 0 < row["prefix_hit_rate"] == at["prefix_hit_rate"] < 1
    assert main([*argv, "--prefix-cache", "off", "--out", str(tmp_path / "off")]) == 0
    assert "prefix hit" not in capsys.readouterr().out
    off = json.loads((tmp_path / "off" / "capacity-h200.json").read_text())
    assert off["summary"]["strategies"]["pdmux_grid_cap"]["prefix_hit_rate"] is None
    assert all(p["prefix_hit_rate"] is None for p in off["points"])
