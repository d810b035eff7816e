"""Result files: provenance, the source digest, atomic writes, and resuming only on matching
settings."""

import json

import pytest

from pdmux_triton import results
from pdmux_triton.errors import PdmuxError


def test_provenance_names_the_tool_its_commit_and_the_gpu():
    p = results.provenance("h200")
    assert p["tool"] == "pdmux-triton" and p["gpu"] == "h200" and p["version"]
    assert p["commit"] is None or len(p["commit"].split("+")[0]) == 40
    assert {"python", "torch", "triton", "date"} <= set(p)


def test_write_json_leaves_no_partial_file(tmp_path):
    path = results.write_json(tmp_path / "sub" / "r.json", {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


def test_write_json_stopped_midway_keeps_the_previous_file_and_no_temporary(tmp_path,
                                                                              monkeypatch):
    path = results.write_json(tmp_path / "r.json", {"a": 1})

    def interrupted(self, target):
        raise KeyboardInterrupt  # Ctrl-C between the write and the rename
    monkeypatch.setattr(type(path), "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        results.write_json(path, {"a": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    assert json.loads(path.read_text()) == {"a": 1}


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


def test_the_source_digest_names_the_code_and_nothing_else(tmp_path):
    (tmp_path / "pdmux_triton").mkdir()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "pdmux_triton" / "a.py").write_text("x = 1\n")
    (tmp_path / "kernels" / "k.py").write_text("y = 2\n")
    first = results.source_digest(tmp_path)
    (tmp_path / "pdmux_triton" / "notes.txt").write_text("not code")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "b.py").write_text("z = 3\n")
    assert results.source_digest(tmp_path) == first
    (tmp_path / "kernels" / "k.py").write_text("y = 3\n")
    assert results.source_digest(tmp_path) != first
    assert len(first) == 64 and results.provenance("h200")["source_sha256"] == results.source_digest()


def test_a_write_that_fails_names_its_file_and_leaves_nothing(tmp_path):
    (tmp_path / "taken").write_text("a file where a folder should be")
    with pytest.raises(PdmuxError, match=r"cannot write .*taken/out.json: File exists"):
        results.write_json(tmp_path / "taken" / "out.json", {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
