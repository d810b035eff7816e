"""The command line: what each subcommand prints, and one clear line for bad input."""

import json
import subprocess
import sys

import pytest
import torch

from pdmux_triton import cli, policy

CALIBRATION = "bench/results/calibrate-h200.json"
COMPARISON = "bench/results/compare-h200.json"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="has a GPU: would measure")


def run(*args):
    return subprocess.run([sys.executable, "-m", "pdmux_triton", *args], capture_output=True,
                          text=True)


def test_levels_table(capsys):
    assert cli.main(["levels"]) == 0
    out = capsys.readouterr().out
    assert "prefill only" in out and "36+           level 6 (72/60)" in out and "    5           80          52" in out


def test_levels_json_for_a_custom_gpu(capsys):
    assert cli.main(["levels", "--sms", "108", "--cc", "8.0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(lv["prefill_sms"], lv["decode_sms"]) for lv in data["levels"]][1] == (84, 24)
    assert data["decode_bs_to_level"][-1] == {"first": 36, "last": None, "level": 6}


def test_levels_written_config_loads_back(tmp_path, capsys):
    path = tmp_path / "h20.yaml"
    assert cli.main(["levels", "--gpu", "h20", "--write-config", str(path)]) == 0
    config = policy.load_config(path, 78, 9)
    assert config.sm_group_num == 5 and [d[:2] for d in config.manual_divisions] == [
        [56, 22], [48, 30], [40, 38]]
    capsys.readouterr()
    assert cli.main(["levels", "--gpu", "h20", "--config", str(path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["levels"]) == 5


@pytest.mark.parametrize("command", [["advise"], ["levels"]])  # levels --calibration: an alias
def test_advise_from_the_h200_calibration(command, tmp_path, capsys):
    out = tmp_path / "advised.yaml"
    assert cli.main([*command, "--gpu", "h200", "--calibration", CALIBRATION, "--itl-ms", "20",
                     "--write-config", str(out)]) == 0
    assert "decode batch" in capsys.readouterr().out
    assert policy.load_config(out, 132, 9).manual_divisions
    assert cli.main([*command, "--gpu", "h200", "--calibration", CALIBRATION]) == 2
    assert "--calibration needs --itl-ms" in capsys.readouterr().err


def test_estimate_json_rows(capsys):
    assert cli.main(["estimate", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        assert {"approach", "itl_ms", "prefill_ms", "tokens_during_prefill", "steps"} <= set(row)
    chunked = next(r for r in rows if r["approach"] == "chunked_512")
    assert chunked["steps"] == 16 and round(chunked["prefill_ms"]) == 286
    assert next(r for r in rows if r["approach"] == "decode_only")["prefill_ms"] is None


@no_gpu
def test_run_simulates_without_a_gpu(tmp_path, capsys):
    # 64 decode steps of ~12 ms outlast the simulated 480 ms prefill beside them
    assert cli.main(["run", "--gpu", "h200", "--decode-tokens", "64", "--out", str(tmp_path),
                     "--calibration", CALIBRATION, "--json"]) == 0
    printed = capsys.readouterr().out
    out = json.loads((tmp_path / "run-h200.json").read_text())
    assert json.loads(printed) == out  # progress goes to stderr, stdout is pure JSON
    assert out["mode"] == "simulated"
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
def test_measuring_commands_need_a_gpu(capsys):
    assert cli.main(["calibrate", "--out", "/tmp/none"]) == 2
    assert "measuring needs a CUDA GPU" in capsys.readouterr().err
    assert cli.main(["compare", "--out", "/tmp/none"]) == 2
    assert "measuring needs a CUDA GPU" in capsys.readouterr().err
    assert cli.main(["calibrate", "--workloads", "prefill_magic"]) == 2
    assert "unknown workload 'prefill_magic'" in capsys.readouterr().err
    assert cli.main(["calibrate", "--ctas", "0,2"]) == 2
    assert "--ctas takes CTAs per SM >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["levels", "--sms", "20"], "no PD-mux split of 20 SMs"),
    (["levels", "--cc", "11.0"], "unsupported compute capability 11.x"),
    (["levels", "--cc", "nine"], "compute capability must look like 9.0"),
    (["levels", "--gpu", "v100"], "unknown GPU 'v100'"),
    (["estimate", "--batch", "-1"], "decode batch must be an integer >= 1, got -1"),
    (["estimate", "--model", "gpt5"], "unknown model 'gpt5'"),
    (["levels", "--config", "/nonexistent/pdmux.yaml"], "cannot read pdmux config"),
    (["run", "--kinds", "mig"], "partition kinds are grid_cap and green, got 'mig'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_malformed_yaml_via_cli(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("sm_group_num: [8\n")
    result = run("levels", "--config", str(path))
    assert result.returncode == 2 and "malformed YAML" in result.stderr
