import json
import subprocess
import sys

import pytest

from pdmux_triton import cli, policy


def run(*args):
    return subprocess.run([sys.executable, "-m", "pdmux_triton", *args], capture_output=True,
                          text=True)


def test_levels_table(capsys):
    assert cli.main(["levels"]) == 0
    out = capsys.readouterr().out
    assert "112          20" in out and "36+  level 6 (72/60)" in out


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


def test_estimate_json_rows(capsys):
    assert cli.main(["estimate", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        assert {"approach", "itl_ms", "prefill_ms", "tokens_during_prefill", "steps"} <= set(row)
    chunked = next(r for r in rows if r["approach"] == "chunked_512")
    assert chunked["steps"] == 16 and round(chunked["prefill_ms"]) == 306
    assert next(r for r in rows if r["approach"] == "decode_only")["prefill_ms"] is None


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
