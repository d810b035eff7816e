"""`run`: every strategy serves the same requests, each row carries the guards that make it
trustworthy, and the summary's ratios and estimate errors are computed from the rows."""

import pytest

from pdmux_triton.experiments import run
from pdmux_triton.experiments.settings import RunSettings
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset


def _settings(**kw):
    return RunSettings(gpu_preset("h200"), model_preset("qwen3-8b"), simulate=True,
                       decode_tokens=24, **kw)


def test_a_simulated_chapter_run_serves_every_strategy_and_all_requests():
    out, results, estimates = run.run_experiment(_settings(), log=lambda line: None)
    names = [r["strategy"] for r in out["rows"]]
    assert names == ["decode_only", "prefill_first", "chunked_2048", "chunked_512",
                     "pdmux_grid_cap", "pdmux_green"]
    assert set(results) == set(names) and estimates and out["mode"] == "simulated"
    assert all(r["requests_lost"] == 0 for r in out["rows"]) and out["warnings"] == []
    served = {n: sum(len(r.token_times) for r in res.requests) for n, res in results.items()}
    assert served["prefill_first"] == served["pdmux_grid_cap"] == 32 * 24 + max(2, 24 // 4)
    assert out["inputs"] == _settings().as_dict()  # replayable from what it saved
    assert set(out["summary"]["estimate_error_pct"]) == {"pdmux_grid_cap", "pdmux_green"}


def test_the_result_so_far_is_handed_over_before_each_strategy():
    partials = []
    out, _, _ = run.run_experiment(_settings(kinds=("grid_cap",), chunks=(512,)),
                                   log=lambda line: None, saved=partials.append)
    names = ["decode_only", "prefill_first", "chunked_512", "pdmux_grid_cap"]
    assert [[r["strategy"] for r in p["rows"]] for p in partials] == [
        [], names[:1], names[:2], names[:3]]
    assert [p["unserved"] for p in partials] == [names, names[1:], names[2:], names[3:]]
    assert partials[-1]["warnings"] == ["not served (the run ended before them): pdmux_grid_cap"]
    assert list(partials[-1]["summary"]["strategies"]) == names[:3]
    assert "unserved" not in out and out["warnings"] == []
    assert [r["strategy"] for r in out["rows"]] == names


def test_without_keep_runs_no_run_is_held():
    _, results, _ = run.run_experiment(_settings(kinds=("grid_cap",), chunks=(512,)),
                                       log=lambda line: None, keep_runs=False)
    assert results == {}


def test_a_row_with_anything_inside_the_measurement_is_warned_about():
    rows = [{"strategy": "pdmux_green", "compiles_during_measurement": 2, "requests_lost": 0},
            {"strategy": "chunked_512", "requests_lost": 1},
            {"strategy": "pdmux_grid_cap", "device_allocations_during_measurement": 5,
             "device_allocations_by_stream": {"prefill, 112 SMs": {"segments": 3, "mib": 60.0},
                                              "decode, 20 SMs": {"segments": 1, "mib": 2.0}}}]
    assert run.warnings(rows) == [
        "pdmux_green: compiles during measurement 2", "chunked_512: requests lost 1",
        "pdmux_grid_cap: device allocations during measurement 5 (held at its end: prefill, "
        "112 SMs 3 segments, 60 MiB; decode, 20 SMs 1 segment, 2 MiB)"]


def test_the_targets_are_ratios_of_the_rows():
    rows = [{"strategy": "decode_only", "itl_p50_ms": 10.0},
            {"strategy": "prefill_first", "prefill_ms": 300.0},
            {"strategy": "chunked_512", "itl_during_prefill_p50_ms": 40.0},
            {"strategy": "pdmux_grid_cap", "itl_during_prefill_p50_ms": 14.0, "prefill_ms": 450.0}]
    t = run.targets(rows, total_sms=132, prefill_sms=80)["pdmux_grid_cap"]
    assert t["itl_during_prefill_vs_decode_only"] == pytest.approx(1.4)
    assert t["itl_during_prefill_vs_chunked_512"] == pytest.approx(0.35)
    assert t["prefill_vs_prefill_first_scaled"] == pytest.approx(450 / (300 * 132 / 80))
    assert run.targets(rows[:1] + rows[3:], 132, 80)["pdmux_grid_cap"][
        "itl_during_prefill_vs_chunked_512"] is None  # no chunked-512 row: no ratio
