"""The measured files the cost model reads: calibrations, comparisons, host costs, and the
shipped H200 copies; a bad file is explained in one line."""

import json

import pytest

from pdmux_triton import results
from pdmux_triton.cost import measured_inputs, step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec.models import model_preset

CALIBRATION = "bench/results/calibrate-h200.json"
COMPARISON = "bench/results/compare-h200.json"


def test_the_committed_calibration_reads_back():
    cal = measured_inputs.load_calibration(CALIBRATION, "h200")
    curve = cal.decode_curve("grid_cap")
    assert curve.alone[-1][0] == 132 and curve.corun  # alone up to the whole GPU, corun below
    assert cal.decode_fit("green")["s_sat_fit"] > 0


def test_the_committed_comparison_gives_an_mfu_per_level():
    cmp = measured_inputs.load_compare(COMPARISON, "h200")
    rate = cmp.prefill_rate("grid_cap", 989.0, 132)
    assert [s for s, _ in rate.mfu] == sorted(lv["prefill_sms"] for lv in cmp.levels)
    assert all(0 < m <= 1 for _, m in rate.mfu)
    assert rate.timed_tokens == 8192  # the one prompt the comparison timed


@pytest.mark.parametrize("tokens, message", [(0, "prefill_tokens must be"),
                                             ("8192", "prefill_tokens must be"),
                                             (1.5, "prefill_tokens must be")])
def test_a_comparisons_timed_prompt_is_a_whole_number_of_tokens(tmp_path, tokens, message):
    data = json.loads(open(COMPARISON).read())
    path = tmp_path / "cmp.json"
    path.write_text(json.dumps({**data, "prefill_tokens": tokens}))
    with pytest.raises(PdmuxError, match=message):
        measured_inputs.load_compare(path, "h200")
    del data["prefill_tokens"]  # an older file: not known
    path.write_text(json.dumps(data))
    assert measured_inputs.load_compare(path).prefill_rate("grid_cap", 989.0, 132).timed_tokens \
        is None


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
        measured_inputs.load_calibration(path)


def test_a_directory_or_another_gpus_file_is_refused(tmp_path):
    with pytest.raises(PdmuxError, match="is a directory"):
        measured_inputs.load_calibration(tmp_path)
    with pytest.raises(PdmuxError, match="measured on 'h200', not on 'h100-sxm'"):
        measured_inputs.load_calibration(CALIBRATION, "h100-sxm")
    with pytest.raises(PdmuxError, match="lacks the summary levels of a comparison"):
        measured_inputs.load_compare(CALIBRATION)
    with pytest.raises(PdmuxError, match="no decode_step curve for partition kind 'mig'"):
        measured_inputs.load_calibration(CALIBRATION).decode_curve("mig")


def _calibration_with_batches(tmp_path, settings):
    """Own-batch curve at 2 TB/s; batch 72 at 1 TB/s alone, so its step takes half again
    beyond its bytes at the own rate."""
    rows = [{"workload": "decode_step", "kind": "grid_cap", "ctas_per_sm": 1, "state": "alone",
             "sms": s, "ms": 10.0, "tbps": 2.0} for s in (20, 132)]
    rows += [{"workload": "decode_step", "kind": "grid_cap", "ctas_per_sm": 1, "state": "alone",
              "sms": 20, "ms": 30.0, "tbps": 1.0, "batch": 72}]
    path = tmp_path / "calibrate-h200.json"
    path.write_text(json.dumps({"gpu": "h200", "settings": settings, "rows": rows,
                                "summary": {}}))
    return path


def test_a_calibration_of_other_batches_prices_their_rows_beyond_their_bytes(tmp_path):
    path = _calibration_with_batches(tmp_path, {"batch": 32, "context": 2048})
    curve = measured_inputs.load_calibration(path).decode_curve("grid_cap")
    assert curve.alone == ((20, 2.0), (132, 2.0))  # the own batch only
    # 30 ms at 1 TB/s read 30 GB; at the own 2 TB/s that is 15 ms: 15 ms beyond its bytes
    assert curve.batches.own_batch == 32
    assert curve.batches.alone == ((72, 20, pytest.approx(0.015)),)
    assert curve.batch_extra_s(20, True, 72) == pytest.approx(0.015)  # no corun: alone's
    assert curve.batch_extra_s(20, False, 32) == 0.0


def test_steps_at_other_contexts_price_a_kv_byte_and_leave_the_curve_and_batches(tmp_path):
    """Own curve 2 TB/s; batch 32 at 8192 tokens a request read at 2.5 TB/s: its step took
    0.8 of its bytes' time at the own rate, the rest a saving on its KV bytes."""
    path = _calibration_with_batches(tmp_path, {"batch": 32, "context": 2048,
                                                "model": "qwen3-8b"})
    data = json.loads(path.read_text())
    data["rows"] += [{"workload": "decode_step", "kind": "grid_cap", "ctas_per_sm": 1,
                      "state": "alone", "sms": s, "ms": 20.0, "tbps": 2.5, "context": 8192}
                     for s in (20, 132)]
    path.write_text(json.dumps(data))
    calibration = measured_inputs.load_calibration(path)
    curve = calibration.decode_curve("grid_cap")
    assert curve.alone == ((20, 2.0), (132, 2.0))
    assert curve.batches.alone == ((72, 20, pytest.approx(0.015)),)
    kv = step_cost.kv_bytes(model_preset("qwen3-8b"), 32 * 8192)
    per_byte = 0.020 * (1 - 2.5 / 2.0) / kv
    assert curve.contexts.own_context == 2048
    assert curve.contexts.alone == ((8192, 20, pytest.approx(per_byte)),
                                    (8192, 132, pytest.approx(per_byte)))
    # rows that kept the own context's rate of their session read against it, not the curve's
    for row in data["rows"]:
        if row.get("context"):
            row["own_context_tbps"] = 2.5
    path.write_text(json.dumps(data))
    assert measured_inputs.load_calibration(path).decode_curve("grid_cap").contexts.alone == (
        (8192, 20, 0.0), (8192, 132, 0.0))
    for row in data["rows"]:
        row.pop("own_context_tbps", None)
    # a green curve without its own contexts takes grid capping's
    data["rows"] += [{"workload": "decode_step", "kind": "green", "ctas_per_sm": 1,
                      "state": "alone", "sms": s, "ms": 10.0, "tbps": 2.0} for s in (20, 132)]
    path.write_text(json.dumps(data))
    assert measured_inputs.load_calibration(path).decode_curve("green").contexts == curve.contexts
    del data["settings"]["context"]
    path.write_text(json.dumps(data))
    with pytest.raises(PdmuxError, match="other contexts but names no context of its own"):
        measured_inputs.load_calibration(path).decode_curve("grid_cap")


def test_a_green_curve_without_other_batches_prices_its_rows_as_grid_capping_measured(tmp_path):
    """Green partitions run the same kernels: where the calibration measured other batches
    under grid capping only, a green curve keeps its own bandwidth and takes grid capping's
    rows term."""
    path = _calibration_with_batches(tmp_path, {"batch": 32, "context": 2048})
    data = json.loads(path.read_text())
    data["rows"] += [{"workload": "decode_step", "kind": "green", "ctas_per_sm": 1,
                      "state": "alone", "sms": s, "ms": 12.0, "tbps": 1.8} for s in (20, 132)]
    path.write_text(json.dumps(data))
    cal = measured_inputs.load_calibration(path)
    green, capped = cal.decode_curve("green"), cal.decode_curve("grid_cap")
    assert green.alone == ((20, 1.8), (132, 1.8))
    assert green.batches == capped.batches
    assert green.batch_extra_s(20, False, 72) == pytest.approx(0.015)


def test_other_batches_without_an_own_batch_are_refused(tmp_path):
    path = _calibration_with_batches(tmp_path, {"context": 2048})
    with pytest.raises(PdmuxError, match="names no batch of its own"):
        measured_inputs.load_calibration(path).decode_curve("grid_cap")


def test_the_committed_calibration_prices_batches_past_64_rows_dearer_on_few_sms():
    curve = measured_inputs.load_calibration(CALIBRATION, "h200").decode_curve("grid_cap")
    assert curve.batches is not None
    assert curve.batch_extra_s(20, True, 72) > curve.batch_extra_s(20, True, 64) > 0
    assert curve.batch_extra_s(132, False, 72) < curve.batch_extra_s(20, False, 72)


@pytest.mark.parametrize("gpu", sorted(measured_inputs.SHIPPED))
@pytest.mark.parametrize("kind", ["calibration", "compare", "host_costs"])
def test_the_shipped_inputs_are_the_committed_results(gpu, kind):
    """The package's copies are bench/results' files byte for byte: re-measuring one there
    without shipping it fails here."""
    name = measured_inputs.SHIPPED[gpu][kind]
    shipped = results.resolve(measured_inputs.shipped_inputs(gpu, "qwen3-8b")[kind])
    assert shipped.parent == results.SHIPPED_FOLDER and shipped.read_bytes() == (
        results._REPO / "bench" / "results" / name).read_bytes()


@pytest.mark.parametrize("gpu", sorted(measured_inputs.SHIPPED))
def test_shipped_inputs_load_by_name_on_their_gpu_only(gpu):
    names = measured_inputs.shipped_inputs(gpu, "qwen3-8b")
    assert measured_inputs.load_calibration(names["calibration"], gpu).gpu == gpu
    assert measured_inputs.load_compare(names["compare"], gpu).levels
    assert measured_inputs.load_host_costs(names["host_costs"], gpu).decode_round_s > 0
    assert measured_inputs.shipped_inputs("a100-80gb", "qwen3-8b") == {}
    assert measured_inputs.shipped_inputs("h200", "llama-3.1-8b") == {}  # measured with Qwen3-8B
    with pytest.raises(PdmuxError, match=f"measured on '{gpu}', not on 'b200'"):
        measured_inputs.load_calibration(names["calibration"], "b200")


def test_a_mixed_step_fitted_before_decode_rows_left_the_extend_kernel_is_refused(tmp_path):
    """A host-costs file whose mixed step has no tile times was fitted by the older law, to
    rounds whose decode rows ran in the extend kernel's tiles: refused in one line that says
    to refit; a mixed step missing its fixed cost, with a value out of range or not an object
    is named too."""
    data = json.loads(open("bench/results/host-costs-h200.json").read())
    path = tmp_path / "host.json"
    path.write_text(json.dumps({**data, "mixed_step": {"fixed_s": 0.003, "decode_row_mfu": 0.4}}))
    with pytest.raises(PdmuxError, match="extend kernel's tiles.*fit it again"):
        measured_inputs.load_host_costs(path, "h200")
    tiles = data["mixed_step"]["tiles"]
    path.write_text(json.dumps({**data, "mixed_step": {"tiles": tiles}}))
    with pytest.raises(PdmuxError, match="mixed_step needs fixed_s and tiles"):
        measured_inputs.load_host_costs(path, "h200")
    for mixed, message in (({"fixed_s": -1.0, "tiles": tiles}, "fixed cost must be a finite"),
                           ({"fixed_s": 0.003, "tiles": {**tiles, "attention_prefix_s": -1.0}},
                            "tile time attention_prefix_s"),
                           ([0.003], "its mixed_step is not an object")):
        path.write_text(json.dumps({**data, "mixed_step": mixed}))
        with pytest.raises(PdmuxError, match=message):
            measured_inputs.load_host_costs(path, "h200")
