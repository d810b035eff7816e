"""Requests to serve: length presets against the published statistics they were fitted to,
gamma arrivals, users' traces, prompt ids drawn only when asked for."""

import tracemalloc

import numpy as np
import pytest

from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec import traffic
from pdmux_triton.spec.traffic import LENGTH_PRESETS, decoding_contexts

# the largest relative error of each fit against its published figures (the README's table)
FIT_ERROR_BOUND = {"sharegpt": 0.02, "arxiv": 0.025, "conv": 0.06, "code": 0.015}


@pytest.mark.parametrize("name", sorted(traffic.LENGTH_PRESETS))
def test_presets_hold_the_published_statistics(name):
    preset = traffic.LENGTH_PRESETS[name]
    for dist in (preset.prompt, preset.output):
        errors = dist.fit_error()
        assert set(errors) == set(dist.published) and {"median", "mean", "p90"} <= set(errors)
        assert max(map(abs, errors.values())) <= FIT_ERROR_BOUND[name], errors


@pytest.mark.parametrize("name", sorted(traffic.LENGTH_PRESETS))
def test_samples_follow_the_fitted_distribution(name):
    preset = traffic.LENGTH_PRESETS[name]
    for dist in (preset.prompt, preset.output):
        x = dist.sample(np.random.default_rng(0), 100_000)
        assert x.min() >= dist.floor and x.max() <= dist.cap
        mine = dist.stats()
        assert np.median(x) == pytest.approx(mine["median"], rel=0.03, abs=1)
        assert x.mean() == pytest.approx(mine["mean"], rel=0.02)
        assert np.percentile(x, 90) == pytest.approx(mine["p90"], rel=0.03, abs=1)


def test_a_stream_is_reproducible_and_its_lengths_do_not_depend_on_the_rate():
    preset = traffic.LENGTH_PRESETS["sharegpt"]
    slow = traffic.stream(100, 1.0, 50, preset, seed=4)
    fast = traffic.stream(100, 4.0, 50, preset, seed=4)
    assert [len(r.prompt) for r in slow] == [len(r.prompt) for r in fast]
    assert [r.output_len for r in slow] == [r.output_len for r in fast]
    assert [r.arrival / 4 for r in slow] == pytest.approx([r.arrival for r in fast])
    again = traffic.stream(100, 1.0, 50, preset, seed=4)
    assert all((a.prompt == b.prompt).all() for a, b in zip(slow, again))


def test_prompt_ids_are_drawn_when_first_read_the_same_for_a_seed():
    reqs = traffic.stream(1000, 2.0, 20, traffic.LENGTH_PRESETS["conv"], seed=7)
    assert all(r._ids is None for r in reqs)  # lengths only, until an executor asks
    again = traffic.stream(1000, 2.0, 20, traffic.LENGTH_PRESETS["conv"], seed=7)
    # each request's ids are its own: reading them in another order gives the same ids
    for a in reqs:  # drawn first to last here, last to first in `again` (below)
        a.prompt
    for a, b in zip(reversed(reqs), reversed(again)):
        assert len(a.prompt) == a.prompt_len and (a.prompt == b.prompt).all()
        assert a.prompt.min() >= 0 and a.prompt.max() < 1000
    other = traffic.stream(1000, 2.0, 20, traffic.LENGTH_PRESETS["conv"], seed=8)
    assert not (other[0].prompt[:8] == reqs[0].prompt[:8]).all()
    with pytest.raises(PdmuxError, match="request 3 holds a prompt length and no token ids"):
        traffic.Request(3, 10, 2, 0.0).prompt


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_keep_the_rate_and_change_the_spread(burstiness):
    preset = traffic.Exponential(10, 20, 5, 10)
    reqs = traffic.stream(10, 8.0, 20_000, preset, burstiness=burstiness, seed=0)
    gaps = np.diff([0.0] + [r.arrival for r in reqs])
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.03)
    # a gamma gap of shape k has a coefficient of variation 1/sqrt(k): Poisson's is 1
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness ** -0.5, rel=0.05)


def test_a_trace_is_read_sorted_with_its_lengths_and_says_so(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.5,100,20\n0.1,7,3\n\n0.2,9,2\n"
                    "0.7,8,2\n")
    trace = traffic.load_trace(path)
    reqs = trace.requests(vocab=50)
    assert [(r.rid, r.arrival, r.prompt_len, r.output_len) for r in reqs] == [
        (1, 0.1, 7, 3), (2, 0.2, 9, 2), (0, 0.5, 100, 20), (3, 0.7, 8, 2)]
    assert trace.notes == (f"trace {path}: 2 row(s) arrive before a row above them (the first "
                           f"at line 3); served in arrival order",)
    assert traffic.load_trace(tmp_path / "trace.csv").longest == 120
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.1,7,3\n0.1,5,2\n")
    in_order = traffic.load_trace(path)
    assert in_order.notes == () and in_order.rid.tolist() == [0, 1]  # ties keep the file's order


@pytest.mark.parametrize("header,sep", [
    ("\ufeffarrival_s,prompt_tokens,output_tokens", ","),  # a byte-order mark
    (" arrival_s , prompt_tokens ,output_tokens ", ","),
    ("arrival_s;prompt_tokens;output_tokens", ";"),
    ("arrival_s\tprompt_tokens\toutput_tokens", "\t"),
    ("model,output_tokens,arrival_s,prompt_tokens", ","),  # other columns, any order
])
def test_trace_headers_as_spreadsheets_write_them(tmp_path, header, sep):
    names = [n.strip().lstrip("\ufeff") for n in header.split(sep)]
    row = {"arrival_s": "0.25", "prompt_tokens": " 12", "output_tokens": "3 ", "model": "x"}
    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + sep.join(row[n] for n in names) + "\n", encoding="utf-8")
    (r,) = traffic.load_trace(path).requests(vocab=50)
    assert (r.arrival, r.prompt_len, r.output_len) == (0.25, 12, 3)


@pytest.mark.parametrize("text,message", [
    ("", "has no requests"),
    ("\n0,5,5\n", "has no requests .a header row arrival_s,prompt_tokens,output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n\n", "has no requests"),
    ("arrival_s,prompt_tokens\n0,5\n",
     r"lacks the column\(s\) output_tokens; it needs arrival_s, prompt_tokens, output_tokens "
     r"\(found: arrival_s, prompt_tokens\)"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,5\n",
     r"lacks the column\(s\) arrival_s, prompt_tokens, output_tokens; .* \(found: TIMESTAMP, "
     r"ContextTokens, GeneratedTokens\)"),
    ("arrival_s,prompt_tokens,output_tokens\nsoon,5,5\n",
     ":2: arrival_s must be a number of seconds, got 'soon'"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,5,5\n", ":2: arrival_s must be a finite number >="),
    ("arrival_s,prompt_tokens,output_tokens\nnan,5,5\n", ":2: arrival_s must be a finite number"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,5\ninf,5,5\n", ":3: arrival_s must be a finite"),
    ("arrival_s,prompt_tokens,output_tokens\n0,0,5\n", ":2: token counts must be >= 1, got 0"),
    ("arrival_s,prompt_tokens,output_tokens\n0,-3,5\n", ":2: token counts must be >= 1"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5.5,5\n",
     ":2: prompt_tokens must be a whole number of tokens >= 1, got '5.5'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,nan\n", ":2: output_tokens must be a whole"),
    ("arrival_s,prompt_tokens,output_tokens\n0,inf,5\n", ":2: prompt_tokens must be a whole"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5\n",
     ":2: 2 field.s.; the header puts the columns read in the first 3"),
    ("arrival_s,prompt_tokens,output_tokens\n1e300,5,5\n",
     ":2: arrival_s 1e\\+300: arrivals must come within 1e\\+08 s .~3 years. of the start"),
])
def test_bad_traces(tmp_path, text, message):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(PdmuxError, match=message):
        traffic.load_trace(path)
    with pytest.raises(PdmuxError, match="cannot read trace"):
        traffic.load_trace(tmp_path / "missing.csv")


@pytest.mark.parametrize("prompt", ["1000000000", "10000000000", "1e10", "1e20",
                                    "100000000000000000000"])
def test_huge_prompts_are_refused_at_their_row_at_once(tmp_path, prompt):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.5," + prompt + ",10\n")
    tracemalloc.start()
    with pytest.raises(PdmuxError, match=f":3: {int(float(prompt)):,} prompt \\+ 10 output "
                                         f"tokens; a request holds at most 40,960 .ctx."):
        traffic.load_trace(path, 40960, "ctx")
    if int(float(prompt)) > traffic.MAX_TRACE_TOKENS:  # no model bounds it: what a count holds
        with pytest.raises(PdmuxError, match=":3: .* at most 2,147,483,647 .the most this tool"):
            traffic.load_trace(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2**20  # refused as read: no prompt's ids drawn, nothing of its size allocated


def test_bad_streams():
    preset = traffic.LENGTH_PRESETS["code"]
    with pytest.raises(PdmuxError, match="finite rate > 0"):
        traffic.stream(10, float("inf"), 5, preset)
    with pytest.raises(PdmuxError, match="burstiness must be a finite number > 0"):
        traffic.stream(10, 1.0, 5, preset, burstiness=0.0)
    with pytest.raises(PdmuxError, match="count <= 10,000,000, got 1.0 and 99999999999"):
        traffic.stream(10, 1.0, 99_999_999_999, preset)
    # the clock would lose a decode step's time in the arrivals' (float64)
    with pytest.raises(PdmuxError, match=r"5 requests at 1e-300/s arrive over .*e\+300 s; "
                                         r"arrivals must come within 1e\+08 s"):
        traffic.stream(10, 1e-300, 5, preset)


@pytest.mark.parametrize("name", ["sharegpt", "arxiv"])
def test_decoding_contexts_weight_requests_by_how_long_they_decode(name):
    """A batch seen at a random step: the mean context is the prompt's mean plus E[o^2]/2E[o]
    of the outputs (length-biased), not E[o]/2, which an unweighted draw would give."""
    preset = LENGTH_PRESETS[name]
    rng = np.random.default_rng(5)
    prompts = preset.prompt.sample(rng, 200_000).astype(float)
    outputs = preset.output.sample(rng, 200_000).astype(float)
    biased = prompts.mean() + (outputs ** 2).mean() / (2 * outputs.mean())
    draw = decoding_contexts(preset, seed=3)
    drawn = np.concatenate([draw(64) for _ in range(300)])
    assert drawn.mean() == pytest.approx(biased, rel=0.02)
    assert abs(drawn.mean() - biased) < abs(prompts.mean() + outputs.mean() / 2 - biased) / 2


# --- through a run's settings: what the GPU and the model allow, checked before serving ---

def _settings(**kw):
    from pdmux_triton.experiments.settings import RunSettings
    from pdmux_triton.spec.gpus import gpu_preset
    from pdmux_triton.spec.models import model_preset

    return RunSettings(gpu_preset(kw.pop("gpu", "h200")), model_preset(kw.pop("model", "qwen3-8b")),
                       simulate=True, **kw)


def _trace(tmp_path, rows: str, name: str = "t.csv"):
    path = tmp_path / name
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    return str(path)


@pytest.mark.parametrize("prompt", ["1000000000", "10000000000", "1e20"])
def test_a_trace_beyond_the_models_context_is_refused_at_its_line(tmp_path, prompt):
    path = _trace(tmp_path, f"0,100,10\n0.5,40000,960\n1,{prompt},10\n")
    _settings(workload="trace", trace=_trace(tmp_path, "0.5,40000,960\n", "fits.csv"))  # 40,960
    tracemalloc.start()
    with pytest.raises(PdmuxError, match=rf"t.csv:4: {int(float(prompt)):,} prompt \+ 10 output "
                                         r"tokens; a request holds at most 40,960 \(qwen3-8b's "
                                         r"context length, max_position_embeddings\)"):
        _settings(workload="trace", trace=path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2**20  # refused as read: nothing drawn or allocated


def test_a_trace_beyond_the_kv_cache_names_the_cache(tmp_path):
    path = _trace(tmp_path, "0,35000,10\n")  # within qwen3-32b's context of 40,960
    with pytest.raises(PdmuxError, match=r"t.csv:2: .* at most [\d,]+ \(the KV cache the "
                                         r"a100-80gb keeps for qwen3-32b: 60% of what its weights"):
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
