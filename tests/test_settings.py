"""A run's settings: what the GPU, the model and the clock can hold is refused before serving,
and a trace is read once."""

import tracemalloc

import pytest

from pdmux_triton.errors import PdmuxError


def _settings(**kw):
    from pdmux_triton.experiments.settings import RunSettings
    from pdmux_triton.spec.gpus import gpu_preset
    from pdmux_triton.spec.models import model_preset

    return RunSettings(gpu_preset(kw.pop("gpu", "h200")), model_preset(kw.pop("model", "qwen3-8b")),
                       simulate=kw.pop("simulate", True), **kw)


def _trace(tmp_path, rows: str, name: str = "t.csv"):
    path = tmp_path / name
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    return str(path)


@pytest.mark.parametrize("prompt", ["40951", "1000000000"])
def test_requests_beyond_the_models_context_are_left_out_and_counted(tmp_path, prompt):
    path = _trace(tmp_path, f"0,100,10\n0.5,40000,960\n1,{prompt},10\n")
    tracemalloc.start()
    s = _settings(workload="trace", trace=path)
    assert s.loaded_trace.prompt.tolist() == [100, 40000]  # 40,960 tokens: the context fits
    assert s.notes == (f"trace {path}: 1 row(s) of more than 40,960 prompt and output tokens "
                       f"(qwen3-8b's context length, max_position_embeddings) left out",)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2**25  # read as counts: nothing of the prompt's size (GBs) drawn or allocated
    with pytest.raises(PdmuxError, match=r"t2.csv has no requests a server can hold: its 1 "
                                         r"row\(s\) of more than 40,960 .* \(qwen3-8b's context"):
        _settings(workload="trace", trace=_trace(tmp_path, f"1,{prompt},10\n", "t2.csv"))


def test_a_trace_beyond_the_kv_cache_names_the_cache(tmp_path):
    path = _trace(tmp_path, "0,35000,10\n")  # within qwen3-32b's context of 40,960
    with pytest.raises(PdmuxError, match=r"t.csv has no requests a server can hold: .* more than "
                                         r"[\d,]+ .* \(the KV cache the a100-80gb keeps for "
                                         r"qwen3-32b: 60% of what its weights"):
        _settings(gpu="a100-80gb", model="qwen3-32b", workload="trace", trace=path)


@pytest.mark.parametrize("kw,message", [
    ({"prompt": 40_950}, "the 40950-token prompt and its output: 40,974 tokens, more than "
                         "qwen3-8b's context length of 40,960"),
    ({"context": 40_900, "batch": 1}, "a request decoding 96 tokens after 40900: 40,996 tokens"),
    ({"workload": "stream", "lengths": "exponential", "prompt_max": 40_000, "output_max": 1000},
     "a request of 40000 prompt and 1000 output tokens: 41,000 tokens, more than"),
    ({"workload": "stream", "rate": 1e-300},
     r"64 requests at 1e-300/s arrive over ~6.4e\+301 s; arrivals must come within 1e\+08 s"),
    ({"workload": "stream", "count": 10**9}, "--count 1000000000: a stream holds 1 to 10,000,000"),
])
def test_settings_refuse_what_the_model_or_the_clock_cannot_hold(kw, message):
    with pytest.raises(PdmuxError, match=message):
        _settings(**kw)


def test_settings_read_a_trace_once_and_pass_its_notes_on(tmp_path):
    from pdmux_triton.experiments.settings import make_requests

    s = _settings(workload="trace", trace=_trace(tmp_path, "0.5,10,2\n0.1,10,2\n"))
    assert s.notes == (f"trace {s.trace}: 1 row(s) arrive before a row above them (the first "
                       f"at line 3); served in arrival order",)
    assert [r.arrival for r in make_requests(s)] == [0.1, 0.5]
    assert _settings().notes == ()


def test_a_measured_stream_must_arrive_within_the_run_time_bound():
    from pdmux_triton.experiments.settings import MAX_GPU_RUN_S, check_measured_span

    check_measured_span(1000, 1000 / MAX_GPU_RUN_S, "never")  # exactly at the bound
    with pytest.raises(PdmuxError, match=r"^1000 requests at 0.25/s arrive over ~4,000 s, longer "
                                         r"than a measured run may take \(3600 s\): lower it$"):
        check_measured_span(1000, 0.25, "lower it")
    with pytest.raises(PdmuxError, match=r"raise --rate or lower --count"):
        _settings(workload="stream", simulate=False, count=1000, rate=0.25)


@pytest.mark.parametrize("kw,message", [
    ({"trace_start": -1}, r"--trace-start -1: a row number >= 0"),
    ({"trace_count": 0}, r"--trace-count 0: a number of requests >= 1"),
    ({"speed": 0.0}, r"--speed 0.0: a finite factor > 0"),
    ({"speed": float("inf")}, r"--speed inf: a finite factor > 0"),
])
def test_a_trace_window_and_speed_are_checked(tmp_path, kw, message):
    trace = _trace(tmp_path, "0.5,10,2\n")
    with pytest.raises(PdmuxError, match=message):
        _settings(workload="trace", trace=trace, **kw)


def test_settings_serve_the_trace_window_at_its_speed(tmp_path):
    from pdmux_triton.experiments.settings import make_requests

    s = _settings(workload="trace", trace=_trace(tmp_path, "0,10,2\n1,11,2\n3,12,2\n"),
                  trace_start=1, speed=2.0)
    assert [(r.arrival, r.prompt_len) for r in make_requests(s)] == [(0.0, 11), (1.0, 12)]
    assert s.notes[-1].endswith("rows 1 to 2 of 3 served, arriving 2x as fast as recorded")
