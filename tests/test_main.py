"""The command line's entry: what levels, advise and estimate print, and for every bad input of
any command one clear line on stderr with exit code 2 (no traceback, no silent nonsense, no
unbounded work); last, random argument vectors drawn from its real flags and adversarial
values. The serving commands' output is in test_serve.py."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pdmux_triton.cli import flags
from pdmux_triton.cli.main import main
from pdmux_triton.multiplex import sglang_rules

CALIBRATION = "bench/results/calibrate-h200.json"
COMPARISON = "bench/results/compare-h200.json"
AZURE_CONV = "bench/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="has a GPU: would measure")


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "pdmux_triton", *args], capture_output=True,
                          text=True, **kw)


def fails(capsys, argv, message):
    """The CLI exits 2 with exactly one line on stderr that says `message`."""
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


# --- what the subcommands print ------------------------------------------------------------

def test_levels_table(capsys):
    assert main(["levels"]) == 0
    out = capsys.readouterr().out
    assert "prefill only" in out and "36+           level 6 (72/60)" in out
    assert "    5           80          52" in out


def test_levels_json_for_a_custom_gpu(capsys):
    assert main(["levels", "--sms", "108", "--cc", "8.0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(lv["prefill_sms"], lv["decode_sms"]) for lv in data["levels"]][1] == (84, 24)
    assert data["decode_bs_to_level"][-1] == {"first": 36, "last": None, "level": 6}


def test_levels_written_config_loads_back(tmp_path, capsys):
    path = tmp_path / "sub" / "dir" / "h20.yaml"  # folders are made
    assert main(["levels", "--gpu", "h20", "--write-config", str(path)]) == 0
    config = sglang_rules.load_config(path, 78, 9)
    assert config.sm_group_num == 5 and [d[:2] for d in config.manual_divisions] == [
        [56, 22], [48, 30], [40, 38]]
    assert "allow 3 splits, so 5 levels, not the 8 asked for" in capsys.readouterr().err
    assert main(["levels", "--gpu", "h20", "--config", str(path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["levels"]) == 5


@pytest.mark.parametrize("command", [["advise"], ["levels"]])  # levels --calibration: an alias
def test_advise_from_the_h200_calibration(command, tmp_path, capsys):
    out = tmp_path / "advised.yaml"
    assert main([*command, "--gpu", "h200", "--calibration", CALIBRATION, "--itl-ms", "20",
                 "--write-config", str(out)]) == 0
    assert "predicted step ms" in capsys.readouterr().out
    assert sglang_rules.load_config(out, 132, 9).manual_divisions
    fails(capsys, [*command, "--gpu", "h200", "--calibration", CALIBRATION],
          "--calibration needs --itl-ms")


def test_advise_for_a_traffic_writes_divisions_that_follow_the_slo_policy(tmp_path, capsys):
    """No --gpu: the calibration names the H200. --context-dist draws the contexts a traffic
    decodes at and writes SGLang thresholds that rise with the batch size."""
    out = tmp_path / "slo.yaml"
    argv = ["advise", "--calibration", CALIBRATION, "--itl-ms", "25", "--context-dist", "sharegpt",
            "--max-batch", "96"]
    assert main([*argv, "--write-config", str(out)]) == 0
    assert "qwen3-8b on h200, sharegpt contexts" in capsys.readouterr().out
    thresholds = [t for _, _, t in sglang_rules.load_config(out, 132, 9).manual_divisions]
    assert thresholds == sorted(thresholds) and thresholds[0] == 1
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert 0 <= data["disagreement"] < 1 and data["decode_bs_to_level"][0]["first"] == 1
    fails(capsys, [*argv, "--context", "4096"], "--context does nothing with --context-dist")
    fails(capsys, ["advise", "--calibration", CALIBRATION, "--itl-ms", "25", "--max-batch", "9"],
          "--max-batch does nothing without --context-dist")


def test_a_users_model_directory_is_a_model(tmp_path, capsys):
    """--model takes a Hugging Face directory: estimated by its shapes, named by its folder."""
    model = tmp_path / "Qwen2.5-7B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "vocab_size": 152064, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
        "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 131072}))
    assert main(["estimate", "--gpu", "h200", "--model", str(model), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["inputs"]["model"]["name"] == "Qwen2.5-7B" and data["inputs"]["model"]["qkv_bias"]
    assert main(["run", "--gpu", "h200", "--model", str(model), "--decode-tokens", "16"]) == 0
    assert "Qwen2.5-7B on h200" in capsys.readouterr().out


def test_estimate_json_carries_its_inputs(capsys):
    assert main(["estimate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["inputs"]["decode_batch"] == 32 and data["inputs"]["gpu"]["name"] == "h100-sxm"
    assert {"version", "commit", "date"} <= set(data)
    for row in data["rows"]:
        assert {"approach", "itl_ms", "prefill_ms", "tokens_during_prefill", "steps"} <= set(row)
    chunked = next(r for r in data["rows"] if r["approach"] == "chunked_512")
    assert chunked["steps"] == 18 and round(chunked["prefill_ms"]) == 294  # 480 beside 32 rows


def test_an_sm_override_names_the_gpu_once_and_says_what_stays(capsys):
    assert main(["estimate", "--sms", "78", "--cc", "9.0"]) == 0
    captured = capsys.readouterr()
    assert "h100-sxm-78sm (78 SMs, 3.35 TB/s, 989 bf16 TFLOP/s)" in captured.out
    assert "the h100-sxm preset with 78 SMs instead of 132" in captured.err


def test_help_shows_defaults_and_allowed_values(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "(default: 32)" in out and "grid_cap, green" in out and "(default: 2048,512)" in out


# --- bad input: one line, exit 2 -----------------------------------------------------------

@pytest.fixture
def files(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "latin1.yaml").write_bytes(b"sm_group_num: 8 \xff\xfe\n")
    (tmp_path / "twice.yaml").write_text("sm_group_num: 5\nsm_group_num: 6\n")
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir").mkdir()
    os.mkfifo(tmp_path / "a_pipe")  # a reader of it would block: refused before it opens
    (tmp_path / "null.json").write_text("null")
    (tmp_path / "no_gpu.json").write_text('{"x": 1}')
    return tmp_path


BAD = [
    # unknown names and shapes
    (["levels", "--sms", "20"], "no PD-mux split of 20 SMs"),
    (["levels", "--cc", "11.0"], "unsupported compute capability 11.x"),
    (["levels", "--cc", "nine"], "levels --cc: compute capability must look like 9.0"),
    (["levels", "--gpu", "v100"], "unknown GPU 'v100'"),
    (["levels", "--sms", "99999999999999999999999"], "levels --sms: expected an integer <= 4096"),
    (["estimate", "--model", "gpt5"], "unknown model 'gpt5'"),
    (["run", "--simulate", "--weights", "hf"], "--weights hf does nothing when simulating"),
    (["estimate", "--weights", "hf"], "unrecognized arguments: --weights hf"),
    (["estimate", "--model", "nope/config.json"], "cannot read model config nope/config.json"),
    (["levels", "--calibration", CALIBRATION, "--itl-ms", "20", "--model", "README.md"],
     "cannot read model config README.md"),
    (["run", "--kinds", "mig"], "run --kinds: expected one of grid_cap, green, pinned, got 'mig'"),
    (["compare", "--kinds", "grid_cap,pinned"], "compares an emulation (grid_cap, pinned) with "
                                                "green contexts"),
    (["levels", "--frob"], "unrecognized arguments: --frob"),
    # files
    (["levels", "--config", "/nonexistent/pdmux.yaml"], "cannot read pdmux config"),
    (["levels", "--config", "{d}/latin1.yaml"], "is not text (UTF-8 YAML expected)"),
    (["levels", "--config", "{d}/empty.yaml"], "is empty; it needs at least sm_group_num"),
    (["levels", "--config", "{d}/a_dir"], "pdmux config {d}/a_dir is a directory, not a file"),
    (["levels", "--config", "{d}/a_pipe"], "pdmux config {d}/a_pipe is not a regular file"),
    (["run", "--simulate", "--calibration", "{d}/a_pipe"], "calibration {d}/a_pipe is not a "
     "regular file (a pipe or a device): give a file"),
    (["run", "--simulate", "--workload", "trace", "--trace", "{d}/a_pipe"],
     "trace {d}/a_pipe is not a regular file"),
    (["run", "--simulate", "--replay", "/dev/zero"], "/dev/zero is not a regular file"),
    (["run", "--simulate", "--calibration", "{d}/null.json"], "holds a JSON null, not an object"),
    (["levels", "--write-config", "{d}/a_dir"], "cannot write the pdmux config to"),
    (["run", "--calibration", "{d}/missing.json"], "cannot read calibration"),
    (["run", "--calibration", "{d}/empty.yaml"], "calibration {d}/empty.yaml is empty"),
    (["run", "--calibration", CALIBRATION, "--gpu", "h200", "--compare", "{d}/missing.json"],
     "cannot read comparison"),
    (["advise", "--gpu", "h200", "--calibration", "{d}/missing.json", "--itl-ms", "12"],
     "cannot read calibration"),
    (["advise", "--gpu", "h200", "--calibration", "{d}/empty.json", "--itl-ms", "12"],
     "is empty"),
    (["run", "--out", "{d}/a_file"], "--out {d}/a_file is a file; it must be a folder"),
    (["run", "--gpu", "h100-sxm", "--calibration", CALIBRATION],
     "was measured on 'h200', not on 'h100-sxm'"),
    # numbers
    (["estimate", "--batch", "-1"], "estimate --batch: expected an integer >= 1, got -1"),
    (["estimate", "--s-sat", "inf"], "estimate --s-sat: expected a finite number, got 'inf'"),
    (["estimate", "--s-sat", "nan"], "estimate --s-sat: expected a finite number, got 'nan'"),
    (["run", "--s-sat", "inf"], "run --s-sat: expected a finite number"),
    (["estimate", "--bandwidth-tbps", "0"],
     "estimate --bandwidth-tbps: expected a number >= 0.01"),
    (["estimate", "--bandwidth-tbps", "-3"], "expected a number >= 0.01, got -3"),
    (["estimate", "--tflops", "0"], "estimate --tflops: expected a number >= 1, got 0"),
    (["estimate", "--tflops", "-989"], "expected a number >= 1, got -989"),
    # tiny positive values: a peak or share no GPU has, whose prices pass the float64 clock
    (["estimate", "--tflops", "1e-300"], "estimate --tflops: expected a number >= 1, got 1e-300"),
    (["estimate", "--mfu", "1e-300"], "estimate --mfu: expected a number >= 0.001, got 1e-300"),
    (["run", "--simulate", "--bw-eff", "1e-300"], "run --bw-eff: expected a number >= 0.001"),
    (["estimate", "--s-sat", "1e-300"], "estimate --s-sat: expected a number >= 1, got 1e-300"),
    (["run", "--simulate", "--tp", "2", "--link-gbps", "1e-300"],
     "run --link-gbps: expected a number >= 0.01, got 1e-300"),
    (["capacity", "--simulate", "--start-rate", "5000"],
     "capacity --start-rate: expected a number <= 1000, got 5000"),
    (["capacity", "--simulate", "--start-rate", "1e-9"],
     "capacity --start-rate: expected a number >= 0.01, got 1e-9"),
    # a flag given as 0 was given: where it does nothing, it says so
    (["run", "--simulate", "--workload", "stream", "--trace-start", "0"],
     "--trace-start does nothing with --workload stream"),
    (["run", "--simulate", "--hysteresis", "0"], "--hysteresis does nothing without the slo"),
    (["run", "--simulate", "--warm-requests", "0"], "--warm-requests does nothing when simulating"),
    (["estimate", "--context", "0"], "estimate --context: expected an integer >= 1, got 0"),
    (["run", "--simulate", "--host-costs", "{d}/no_gpu.json"],
     "host-costs file {d}/no_gpu.json names no GPU: is it a host-costs file?"),
    # an empty value is no path
    (["run", "--simulate", "--out", ""], "run --out: expected a value, got ''"),
    (["run", "--simulate", "--calibration", ""], "run --calibration: expected a value, got ''"),
    (["levels", "--write-config", ""], "levels --write-config: expected a value, got ''"),
    (["capacity", "--simulate", "--out", " "], "capacity --out: expected a value, got ' '"),
    # a trace slowed past the float64 clock
    (["run", "--simulate", "--workload", "trace", "--trace", AZURE_CONV, "--speed", "1e-12",
      "--trace-count", "500"], "(--speed 1.29e-06 or more)"),
    (["estimate", "--tflops", "nan"], "expected a finite number, got 'nan'"),
    (["estimate", "--mfu", "1.5"], "estimate --mfu: expected a number <= 1"),
    (["run", "--kinds", "", "--calibration", CALIBRATION], "run --kinds: expected at least one"),
    (["run", "--chunks", "2048,2048"], "run --chunks: 2048 listed more than once"),
    (["run", "--kinds", "green,green"], "run --kinds: green listed more than once"),
    (["estimate", "--chunks", "512,512"], "estimate --chunks: 512 listed more than once"),
    (["calibrate", "--ctas", "0,2"], "calibrate --ctas: expected an integer >= 1, got 0"),
    (["calibrate", "--workloads", "prefill_magic"], "expected one of stream_read"),
    (["calibrate", "--decode-batches", "0"], "calibrate --decode-batches: expected an integer >= 1"),
    (["calibrate", "--decode-batches", "72", "--workloads", "decode_linear"],
     "--decode-batches measures decode_step at one CTA per SM"),
    (["calibrate", "--decode-batches", "72", "--ctas", "2"],
     "--decode-batches measures decode_step at one CTA per SM"),
    (["calibrate", "--decode-contexts", "0"], "calibrate --decode-contexts: expected an integer >= 1"),
    (["calibrate", "--decode-contexts", "2048,8192"],
     "--decode-contexts 2048: at or below --context 2048 a step is priced by the curve itself"),
    (["calibrate", "--decode-contexts", "8192", "--workloads", "decode_attention"],
     "--decode-contexts measures decode_step at one CTA per SM"),
    (["run", "--seed", "-1"], "run --seed: expected an integer >= 0"),
    (["run", "--simulate", "--tp", "0"], "run --tp: expected an integer >= 1, got 0"),
    (["capacity", "--simulate", "--tp", "3"], "--tp 3: qwen3-8b's query heads (32) does not split"),
    (["run", "--simulate", "--tp", "2", "--link-gbps", "nan"],
     "run --link-gbps: expected a finite number, got 'nan'"),
    (["run", "--simulate", "--tp", "2", "--link-latency-us", "0"],
     "run --link-latency-us: expected a number >= 0.001, got 0"),
    (["run", "--simulate", "--tp", "2", "--link", "ib"], "run --link: expected one of"),
    (["capacity", "--simulate", "--replicas", "0"], "capacity --replicas: expected an integer >= 1"),
    (["capacity", "--simulate", "--strategies", "disagg_0p1d"], "unknown strategy 'disagg_0p1d'"),
    # flags that conflict or would do nothing
    (["levels", "--itl-ms", "12"], "--itl-ms does nothing without --calibration"),
    (["levels", "--kind", "grid_cap", "--context", "4096"],
     "--context, --kind do nothing without --calibration"),
    (["run", "--compare", COMPARISON, "--gpu", "h200"], "--compare calibrates the prefill rate"),
    (["run", "--rate", "4"], "--rate does nothing with --workload chapter"),
    (["run", "--simulate", "--link", "pcie5", "--link-gbps", "50"],
     "--link, --link-gbps do nothing without --tp 2 or more or a disagg"),
    (["capacity", "--strategies", "fcfs"], "unknown strategy 'fcfs'"),
    (["capacity", "--simulate", "--rates", "1,2"], "--rates does nothing when simulating"),
    (["capacity", "--offline", "--out", "{d}", "--rates", "1,2"],
     "--rates does nothing with --offline (it reads every point measured in --out)"),
    (["run", "--workload", "stream", "--batch", "8"], "--batch does nothing with --workload stream"),
    (["levels", "--config", "{d}/pd.yaml", "--sm-group-num", "6"],
     "--sm-group-num conflicts with --config"),
    (["advise", "--gpu", "h200", "--itl-ms", "12"], "advise needs --calibration"),
    (["run", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "25"],
     "--slo-ttft-ms, --slo-tpot-ms do nothing with --workload chapter"),
    (["run", "--max-prefill-tokens", "4096"], "--max-prefill-tokens does nothing with --workload "
                                              "chapter"),
    (["run", "--workload", "stream", "--itl-slo-ms", "20"],
     "--itl-slo-ms does nothing without the slo level policy"),
    (["run", "--relevel-at-layers"], "--relevel-at-layers does nothing without the slo level"),
    (["capacity", "--simulate", "--hysteresis", "0.2"],
     "--hysteresis does nothing without the slo level policy"),
    (["estimate", "--s-sat", "44,,88"], "estimate --s-sat: expected S_SATs separated by single "
                                        "commas"),
    (["levels", "--config", "{d}/twice.yaml"], "sm_group_num given twice"),
    (["estimate", "--s-sat", "500"], "--s-sat 500: S_SAT is a number of SMs, at most the "
                                     "h100-sxm's 132"),
    (["estimate", "--gpu", "h20", "--s-sat", "44,88"], "--s-sat 88: S_SAT is a number of SMs"),
    (["run", "--s-sat", "133"], "--s-sat 133: S_SAT is a number of SMs"),
    (["advise", "--calibration", CALIBRATION, "--itl-ms", "12", "--context", "1000000"],
     "one request at 1000000 tokens does not fit on the h200"),
    # work that cannot fit or would not end
    (["estimate", "--context", "131072"], "does not fit on the h100-sxm"),
    (["estimate", "--batch", "99999999999999999999999"], "does not fit on the h100-sxm"),
    (["estimate", "--chunks", "1", "--prompt", "1000000000"], "does not fit on the h100-sxm"),
    (["run", "--context", "1000000"], "does not fit on the h100-sxm"),
    (["run", "--batch", "4096"], "does not fit on the h100-sxm"),
    # (a chunk counts its decode rows: 2 tokens beside the chapter's one leave a prompt one)
    (["run", "--chunks", "2", "--prompt", "70000", "--gpu", "h200", "--batch", "1", "--model",
      "llama-3.1-8b"],
     "--chunks 2 beside up to 1 decode rows cuts a 70000-token prompt into up to 70,000 "
     "steps; at most 65,536"),
    # a prompt past the model's context is named as that, not as too many chunks
    (["run", "--chunks", "129", "--prompt", "70000", "--gpu", "h200", "--batch", "32"],
     "more than qwen3-8b's context length"),
    # refused on two GPUs as on one (the estimate refuses it only on one)
    (["run", "--simulate", "--tp", "2", "--chunks", "32,512", "--batch", "32", "--gpu", "h200"],
     "chunk sizes 32 hold no prompt tokens beside 32 decode rows"),
    (["run", "--decode-tokens", "8"], "--decode-tokens 8: the decoding requests would finish"),
    (["run", "--workload", "stream", "--lengths", "exponential", "--prompt-mean", "9000"],
     "lengths need 1 <= mean <= max"),
    (["run", "--workload", "stream", "--prompt-mean", "900"],
     "--prompt-mean does nothing with --lengths sharegpt"),
    (["run", "--workload", "trace"], "--workload trace needs --trace FILE"),
    (["run", "--workload", "trace", "--trace", "{d}/empty.json"], "has no requests"),
    (["run", "--workload", "stream", "--slo-ttft-ms", "100"], "needs both --slo-ttft-ms and"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(argv, message, files, capsys):
    (files / "pd.yaml").write_text("sm_group_num: 8\n")
    argv = [a.replace("{d}", str(files)) for a in argv]
    fails(capsys, argv, message.replace("{d}", str(files)))


@no_gpu
def test_offline_capacity_on_another_gpus_points_names_the_gpu(tmp_path, capsys):
    """Read offline on a machine without that GPU and without --gpu, a folder of H200 points
    is not looked up as the default preset's: one line says which --gpu reads them."""
    import shutil

    shutil.copy("bench/results/capacity-burst-100/capacity-settings-h200.json", tmp_path)
    fails(capsys, ["capacity", "--offline", "--out", str(tmp_path)],
          "holds capacity points of the h200, not the h100-sxm: add --gpu h200")


def test_advise_with_an_sm_override_keeps_the_calibrations_gpu(capsys):
    assert main(["advise", "--calibration", CALIBRATION, "--itl-ms", "12", "--sms",
                 "100"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("qwen3-8b on h200-100sm") and "h100" not in out


def test_advise_for_a_traffic_offers_every_split_and_writes_no_placeholder(tmp_path, capsys):
    path = tmp_path / "slo.yaml"
    assert main(["advise", "--calibration", CALIBRATION, "--itl-ms", "12", "--context-dist",
                 "sharegpt", "--write-config", str(path)]) == 0
    assert "every green-context split" in capsys.readouterr().out
    config = sglang_rules.load_config(path, 132, 9)
    thresholds = [t for _, _, t in config.manual_divisions]
    assert thresholds == sorted(thresholds) and max(thresholds) <= 128
    # splits off SGLang's default levels are offered, as advise for one context offers them
    assert {(p, d) for p, d, _ in config.manual_divisions} - set(sglang_rules.stream_groups(132, 9))


@no_gpu
def test_measuring_commands_need_a_gpu(capsys):
    fails(capsys, ["calibrate", "--out", "/tmp/none"], "measuring needs a CUDA GPU")
    fails(capsys, ["compare", "--out", "/tmp/none"], "measuring needs a CUDA GPU")


def test_calibrate_without_torch_installed():
    """The README's main install has no torch: a measuring command says so in one line."""
    code = ("import sys; sys.modules['torch'] = None; from pdmux_triton.cli.main import main; "
            "sys.exit(main(['calibrate']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2 and "torch is not installed" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_malformed_yaml_via_cli(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("sm_group_num: [8\n")
    result = run("levels", "--config", str(path))
    assert result.returncode == 2 and "malformed YAML" in result.stderr


# --- pipes and Ctrl-C ----------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["estimate", "--json"], ["levels"],
                                  ["run", "--json", "--decode-tokens", "16"]])
def test_a_reader_that_stops_early_gets_no_traceback(argv):
    proc = subprocess.Popen([sys.executable, "-m", "pdmux_triton", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and "Traceback" not in err and "Error" not in err, err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_full_standard_output_is_one_line_and_exit_2():
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "pdmux_triton", "estimate", "--json"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "pdmux-triton: error: cannot write to its standard output: No space left on device"]


def test_a_closed_standard_output_runs_without_a_traceback():
    proc = subprocess.run([sys.executable, "-m", "pdmux_triton", "estimate"], stdout=None,
                          stderr=subprocess.PIPE, text=True, timeout=60,
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == 0 and not proc.stderr, proc.stderr


@no_gpu
def test_ctrl_c_is_one_line_and_exit_130():
    # as from a terminal: SIGINT at its default disposition in the child (tests run as a
    # background job inherit it ignored, and Python then never raises KeyboardInterrupt)
    proc = subprocess.Popen([sys.executable, "-m", "pdmux_triton", "run", "--workload",
                             "stream", "--count", "100000", "--rate", "1000", "--gpu", "b200"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Ctrl-C once the run serves, whatever the machine's speed
    seen = [proc.stderr.readline() for _ in range(2)]
    assert seen[-1].startswith("running "), seen
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "pdmux-triton: interrupted" and "Traceback" not in err


def test_ctrl_c_while_the_cli_loads_is_one_line_and_exit_130():
    """Ctrl-C in the first moments, while the CLI's modules (numpy, yaml, ...) import: a
    KeyboardInterrupt raised by that import, as the signal would raise it."""
    code = ("import builtins, sys\n"
            "real = builtins.__import__\n"
            "def interrupted(name, *args, **kw):\n"
            "    if name == 'pdmux_triton.cli.main':\n"
            "        raise KeyboardInterrupt\n"
            "    return real(name, *args, **kw)\n"
            "builtins.__import__ = interrupted\n"
            "from pdmux_triton.__main__ import entry\n"
            "sys.exit(entry())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 130, out.stderr
    assert out.stderr == "pdmux-triton: interrupted\n"


# --- random argument vectors ---------------------------------------------------------

# values a flag could take, then values no flag should: each flag draws from both
PLAUSIBLE = {
    "--gpu": ["h200", "h20", "b200", "h100-sxm", "a100-80gb", "local"],
    "--sms": ["78", "108", "132"], "--cc": ["9.0", "8.0"], "--model": ["qwen3-8b", "tiny"],
    "--batch": ["1", "8", "32"], "--context": ["16", "512", "2048"],
    "--prompt": ["1", "512", "8192"], "--decode-tokens": ["2", "16", "48"],
    "--rate": ["0.5", "4", "50"], "--count": ["1", "8", "40"],
    "--prompt-mean": ["16", "256", "1024"], "--prompt-max": ["256", "1024", "8192"],
    "--output-mean": ["2", "16", "64"], "--output-max": ["16", "64", "256"],
    "--seed": ["0", "3"], "--chunks": ["512", "2048,512", "256"],
    "--kinds": ["grid_cap", "green", "green,grid_cap"], "--s-sat": ["44", "66", "110"],
    "--bw-eff": ["0.5", "0.85", "1"], "--mfu": ["0.3", "0.5", "1"],
    "--calibration": [CALIBRATION], "--compare": [COMPARISON], "--itl-ms": ["8", "12", "20"],
    "--kind": ["grid_cap", "green"], "--sm-group-num": ["3", "5", "8", "12"],
    "--bandwidth-tbps": ["3.35", "8"], "--tflops": ["989", "100"],
    "--lengths": ["sharegpt", "code", "exponential"],
    "--burstiness": ["0.5", "1"], "--slo-ttft-ms": ["2000"], "--slo-tpot-ms": ["25"],
    "--strategies": ["prefill_first", "pdmux_grid_cap"], "--rates": ["2,4"],
    "--max-running": ["8", "64"], "--max-prefill-tokens": ["4096"], "--workloads": ["stream_read"], "--ctas": ["1"],
    "--budgets": ["16,132"], "--prefill-tokens": ["2048"],
    "--workload": ["chapter", "stream", "trace", "trace"],
}
ADVERSARIAL = ["0", "-1", "1e-9", "nan", "inf", "-inf", "1e30", "99999999999999999999999", "",
               "abc", "2048,2048", "12.0", "h20,h20"]


def _flags() -> dict[str, list[tuple[str, bool]]]:
    """Each subcommand's options and whether they take a value."""
    parser = flags.build_parser()
    subs = parser._subparsers._group_actions[0].choices
    return {name: [(a.option_strings[-1], a.nargs != 0) for a in sub._actions
                   if a.option_strings and a.dest != "help"] for name, sub in subs.items()}


FLAGS = _flags()


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    (d / "empty.json").write_text("")
    (d / "dir").mkdir()
    (d / "pd.yaml").write_text("sm_group_num: 5\n")
    assert main(["run", "--gpu", "h20", "--decode-tokens", "16", "--out", str(d / "run")]) == 0
    traces = {name: d / f"{name}.csv" for name in TRACES}
    for name, text in TRACES.items():
        traces[name].write_bytes(text.encode("utf-8"))
    configs = {name: d / f"{name}.yaml" for name in CONFIGS}
    for name, text in CONFIGS.items():
        configs[name].write_text(text)
    return {"good": {"--out": [str(d / "out")], "--write-config": [str(d / "new" / "x.yaml")],
                     "--config": [str(d / "pd.yaml"), *map(str, configs.values())],
                     "--replay": [str(d / "run" / "run-h20.json")],
                     "--trace": list(map(str, traces.values()))},
            "bad": [str(d / "empty.json"), str(d / "dir"), str(d / "missing.yaml")],
            "cwd": d}


# generated inputs a user could hand over: traces and pdmux YAMLs, good and bad
TRACES = {
    "plain": "arrival_s,prompt_tokens,output_tokens\n0,64,8\n0.5,128,4\n",
    "bom_spaces": "\ufeff arrival_s , prompt_tokens , output_tokens\n0, 64, 8\n1, 32, 2\n",
    "semicolons": "arrival_s;prompt_tokens;output_tokens\n0;64;8\n",
    "unordered": "arrival_s,prompt_tokens,output_tokens\n2,64,8\n1,64,8\n",
    "huge_prompt": "arrival_s,prompt_tokens,output_tokens\n0,100000000000000000000,8\n",
    "far_arrival": "arrival_s,prompt_tokens,output_tokens\n1e300,64,8\n",
    "nan_arrival": "arrival_s,prompt_tokens,output_tokens\nnan,64,8\n",
    "wrong_columns": "time,in,out\n0,64,8\n",
    "header_only": "arrival_s,prompt_tokens,output_tokens\n",
    "binary": "\x00\x01\x02",
}
CONFIGS = {
    "duplicate_key": "sm_group_num: 5\nsm_group_num: 6\n",
    "unordered_thresholds": ("sm_group_num: 4\nmanual_divisions:\n- [96, 36, 20]\n"
                             "- [64, 68, 10]\n"),
    "too_many_groups": "sm_group_num: 1000\n",
    "not_a_mapping": "- 1\n- 2\n",
}


@st.composite
def argvs(draw, paths):
    # weighted towards the commands with the most flags and work behind them
    command = draw(st.sampled_from(["run"] * 4 + ["estimate", "levels"] * 2
                                   + ["advise", "calibrate", "compare"]))
    chosen = draw(st.lists(st.sampled_from(FLAGS[command]), max_size=4, unique=True))
    argv = [command]
    for flag, takes_value in chosen:
        argv.append(flag)
        if takes_value:
            plausible = PLAUSIBLE.get(flag, []) + paths["good"].get(flag, [])
            bad = ADVERSARIAL + paths["bad"]
            pool = plausible if plausible and draw(st.integers(0, 3)) else bad
            argv.append(draw(st.sampled_from(pool)))
    return argv


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_argument_vector_gets_an_answer(data, paths):
    argv = data.draw(argvs(paths))
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    # adversarial values land in path flags too ("--out inf"): keep what they write in a temp dir
    with contextlib.chdir(paths["cwd"]), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as done:  # --help and --version exit through argparse
            code = done.code
    elapsed = time.perf_counter() - started
    assert code in (0, 2), (argv, err.getvalue())
    assert "Traceback" not in err.getvalue(), (argv, err.getvalue())
    assert elapsed < 20, (argv, elapsed)
    event(f"{argv[0]} exit {code}")
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) == 1, (argv, err.getvalue())
    if code == 0 and "--json" in argv:
        json.loads(out.getvalue())


# --- generated input files ---------------------------------------------------------

TRACE_COLUMNS = ["arrival_s", "prompt_tokens", "output_tokens"]
GOOD_VALUES = {"arrival_s": ["0", "0.25", "3"], "prompt_tokens": ["1", "64", "4096"],
               "output_tokens": ["1", "2", "64"]}
BAD_VALUES = ["0", "-1", "nan", "inf", "1e300", "1e20", "abc", "", "99999999999999999999"]


@st.composite
def trace_files(draw) -> bytes:
    """A trace as a user might hand it over: our columns (some renamed or missing, in any
    order, padded, after a BOM), any of three delimiters, rows good or not."""
    columns = draw(st.permutations(TRACE_COLUMNS))
    if draw(st.integers(0, 4)) == 0:
        columns = columns[:draw(st.integers(0, 2))] + draw(st.lists(
            st.sampled_from(["time", "Request tokens", "in"]), max_size=2))
    sep = draw(st.sampled_from([",", ",", ";", "\t"]))
    pad = draw(st.sampled_from(["", " "]))
    lines = [sep.join(pad + c + pad for c in columns)]
    for _ in range(draw(st.integers(0, 5))):
        lines.append(sep.join(draw(st.sampled_from(GOOD_VALUES.get(c, ["1"])))
                              if draw(st.integers(0, 5)) else draw(st.sampled_from(BAD_VALUES))
                              for c in columns))
    text = "\n".join(lines) + "\n"
    return (("\ufeff" if draw(st.booleans()) else "") + text).encode()


@st.composite
def config_files(draw) -> str:
    """A pdmux YAML: SGLang's keys with good and bad values, repeated keys, divisions whose
    thresholds need not rise."""
    lines = []
    for _ in range(draw(st.integers(0, 2)) + 1):
        lines.append(f"sm_group_num: {draw(st.sampled_from(['4', '5', '8', '1000', '-1', 'x']))}")
    if draw(st.booleans()):
        lines.append("manual_divisions:")
        for _ in range(draw(st.integers(0, 3))):
            p = draw(st.sampled_from([8, 64, 96, 124, 200]))
            lines.append(f"- [{p}, {132 - p}, {draw(st.sampled_from([0, 1, 10, 40, -3]))}]")
    if draw(st.booleans()):
        lines.append(f"decode_bs_divisor: {draw(st.sampled_from(['36', '0', '1.5']))}")
    return "\n".join(lines) + "\n"


def _answers(argv, cwd) -> tuple[int, str]:
    """Exit code and stderr of one CLI call, asserting the contract: 0 or 2, no traceback,
    one line on an error, within a bounded time."""
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code in (0, 2) and "Traceback" not in err.getvalue(), (argv, err.getvalue())
    assert time.perf_counter() - started < 20, argv
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) == 1, (argv, err.getvalue())
    return code, err.getvalue()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=trace_files(), chunks=st.sampled_from([[], ["--chunks", "512"]]))
def test_any_trace_file_gets_an_answer(content, chunks, tmp_path_factory):
    d = tmp_path_factory.mktemp("trace")
    (d / "t.csv").write_bytes(content)
    code, err = _answers(["run", "--simulate", "--gpu", "h20", "--workload", "trace", "--trace",
                          str(d / "t.csv"), "--kinds", "grid_cap", *chunks], d)
    event(f"trace exit {code}")
    if code == 2:
        assert "t.csv" in err  # the line names the file


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=config_files(), command=st.sampled_from([["levels"], ["levels", "--json"],
                                                      ["run", "--decode-tokens", "16"]]))
def test_any_pdmux_yaml_gets_an_answer(text, command, tmp_path_factory):
    d = tmp_path_factory.mktemp("yaml")
    (d / "pd.yaml").write_text(text)
    code, err = _answers([*command, "--gpu", "h200", "--config", str(d / "pd.yaml")], d)
    event(f"{command[0]} yaml exit {code}")
    if code == 0 and text.count("sm_group_num") > 1:
        raise AssertionError(f"a repeated key was accepted:\n{text}")
