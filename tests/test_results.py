"""Result files: provenance, atomic writes, and readers that explain a bad file in one line."""

import json

import pytest

from pdmux_triton import results
from pdmux_triton.errors import PdmuxError

CALIBRATION = "bench/results/calibrate-h200.json"
COMPARISON = "bench/results/compare-h200.json"


def test_provenance_names_the_tool_its_commit_and_the_gpu():
    p = results.provenance("h200")
    assert p["tool"] == "pdmux-triton" and p["gpu"] == "h200" and p["version"]
    assert p["commit"] is None or len(p["commit"].split("+")[0]) == 40
    assert {"python", "torch", "triton", "date"} <= set(p)


def test_write_json_leaves_no_partial_file(tmp_path):
    path = results.write_json(tmp_path / "sub" / "r.json", {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


def test_the_committed_calibration_reads_back():
    cal = results.load_calibration(CALIBRATION, "h200")
    curve = cal.decode_curve("grid_cap")
    assert curve.alone[-1][0] == 132 and curve.corun  # alone up to the whole GPU, corun below
    assert cal.decode_fit("green")["s_sat_fit"] > 0


def test_the_committed_comparison_gives_an_mfu_per_level():
    cmp = results.load_compare(COMPARISON, "h200")
    rate = cmp.prefill_rate("grid_cap", 989.0, 132)
    assert [s for s, _ in rate.mfu] == sorted(lv["prefill_sms"] for lv in cmp.levels)
    assert all(0 < m <= 1 for _, m in rate.mfu)


@pytest.mark.parametrize("content,message", [
    (None, "cannot read calibration .*: No such file"),
    ("", "is empty"),
    ("  \n", "is empty"),
    ("sm_group_num: 8\n", "is not JSON"),
    (b"\xff\xfe\x00", "is not JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"gpu": "h200"}', "lacks the rows and summary of a calibration"),
    ('{"rows": [], "summary": {}}', "names no GPU"),
])
def test_bad_calibration_files(tmp_path, content, message):
    path = tmp_path / "cal.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(PdmuxError, match=message):
        results.load_calibration(path)


def test_a_directory_or_another_gpus_file_is_refused(tmp_path):
    with pytest.raises(PdmuxError, match="is a directory"):
        results.load_calibration(tmp_path)
    with pytest.raises(PdmuxError, match="measured on 'h200', not on 'h100-sxm'"):
        results.load_calibration(CALIBRATION, "h100-sxm")
    with pytest.raises(PdmuxError, match="lacks the summary levels of a comparison"):
        results.load_compare(CALIBRATION)
    with pytest.raises(PdmuxError, match="no decode_step curve for partition kind 'mig'"):
        results.load_calibration(CALIBRATION).decode_curve("mig")


def test_settings_must_match_to_resume(tmp_path):
    path = tmp_path / "settings.json"
    results.check_settings(path, {"model": "qwen3-8b", "batch": 32})
    results.check_settings(path, {"model": "qwen3-8b", "batch": 32})
    with pytest.raises(PdmuxError, match=r"differ in batch\): use another --out folder"):
        results.check_settings(path, {"model": "qwen3-8b", "batch": 64})


def test_a_setting_added_later_reads_as_its_default_in_older_folders(tmp_path):
    path = tmp_path / "settings.json"
    results.check_settings(path, {"batch": 32})  # written before `hysteresis` existed
    results.check_settings(path, {"batch": 32, "hysteresis": 0.1}, {"hysteresis": 0.1})
    with pytest.raises(PdmuxError, match=r"differ in hysteresis\)"):
        results.check_settings(path, {"batch": 32, "hysteresis": 0.3}, {"hysteresis": 0.1})
    with pytest.raises(PdmuxError, match=r"differ in hysteresis\)"):  # no default: a change
        results.check_settings(path, {"batch": 32, "hysteresis": 0.1})
