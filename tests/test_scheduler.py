"""The scheduler's three strategies on the simulated clock (no GPU): the chapter's story, and
every request served to its last token."""

import re

import pytest

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.multiplex import sglang_rules
from pdmux_triton.serve import metrics, scheduler
from pdmux_triton.serve.simulated import SimExecutor
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import Exponential, Request, prompt_during_decode, stream

QWEN = model_preset("qwen3-8b")
H100 = gpu_preset("h100-sxm")


def sim(s_sat=44.0, gpu=H100):
    return SimExecutor(gpu, QWEN, step_cost.SaturationLaw(gpu.hbm_tbps * 0.85, s_sat),
                       step_cost.PrefillRate.fixed(gpu.bf16_tflops, gpu.sms, 0.5))


def run(strategy, reqs=None, s_sat=44.0, **kw):
    reqs = reqs or prompt_during_decode(QWEN.vocab, decode_tokens=96)
    result = scheduler.run(strategy, sim(s_sat), reqs, **kw)
    return metrics.summarize(result), result


def test_decode_only_itl_matches_the_cost_model():
    s, _ = run("prefill_first", reqs=prompt_during_decode(QWEN.vocab, decode_tokens=9)[:-1])
    assert s["itl_p50_ms"] == pytest.approx(8.7, abs=0.1)
    assert s["prefill_ms"] is None and s["gpu_idle_frac"] == 0.0


def test_prefill_first_stalls_decode_for_the_whole_prefill():
    s, _ = run("prefill_first")
    assert s["tokens_during_prefill"] == 0
    assert s["prefill_ms"] == pytest.approx(270, abs=3)  # 36 layers and the sampled row's LM head
    assert s["itl_p99_ms"] > 270


# the 8192-token prompt beside 32 decode rows, which its chunks count: 2016 and 480 a step
@pytest.mark.parametrize("chunk,steps", [(2048, 5), (512, 18)])
def test_chunked_prefill_spreads_the_prompt(chunk, steps):
    s, _ = run("chunked", chunk=chunk)
    assert s["tokens_during_prefill"] == steps  # every chunk step also decodes a token
    assert s["itl_during_prefill_p50_ms"] > 8.7


def _chunks(result) -> list[tuple[int, int, bool]]:
    """(prompt tokens, decode rows, whether its prompt's last) of every chunked round."""
    labels = [(r.prefill, r.decode_bs) for r in result.rounds if r.prefill.startswith("chunk ")]
    starts = [int(re.fullmatch(r"chunk (\d+)\+\d+", label).group(1)) for label, _ in labels]
    return [(int(label.split("+")[1]), rows, i + 1 == len(labels) or starts[i + 1] == 0)
            for i, (label, rows) in enumerate(labels)]


def _requests_beside_rows(batch: int, decode_tokens: int, prompt: int) -> list[Request]:
    """The chapter's scenario of `batch` rows and then a second prompt behind the first."""
    return (prompt_during_decode(QWEN.vocab, batch=batch, prompt=prompt,
                                 decode_tokens=decode_tokens)
            + [Request(batch + 1, 700, 3, 0.0)])


def test_a_chunk_counts_the_decode_rows_beside_it_as_sglangs_mixed_chunk():
    """A step holds the chunk's tokens, its decode rows among them (SGLang's `PrefillAdder`
    takes the chunk size less the running batch), every step but a prompt's last; every
    request is served. A simulation of a run saved before (`Overheads.served_on`)
    takes the whole chunk beside the rows, as that run did."""
    result = scheduler.run("chunked", sim(), _requests_beside_rows(40, 30, 1500), chunk=48)
    _served_in_full(result)
    chunks = _chunks(result)
    assert {rows for _, rows, _ in chunks} > {0}  # some beside rows, some alone
    assert all(tokens + rows == 48 for tokens, rows, last in chunks if not last)
    assert all(1 <= tokens and tokens + rows <= 48 for tokens, rows, _ in chunks)
    assert sum(tokens for tokens, _, _ in chunks) == 1500 + 700
    older = SimExecutor(H100, QWEN, step_cost.SaturationLaw(H100.hbm_tbps * 0.85, 44.0),
                        step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.5),
                        overheads=step_cost.Overheads().served_on(1))
    assert (older.chunked_steps, sim().chunked_steps) == (1, metrics.CHUNKED_STEPS)
    then = scheduler.run("chunked", older, _requests_beside_rows(40, 30, 1500), chunk=48)
    _served_in_full(then)
    # each run saves the generation it was served with, which a replay of it reads back
    assert [metrics.chunked_steps_of("chunked_48", metrics.details(r)) for r in (result, then)] == [
        metrics.CHUNKED_STEPS, 1]
    assert all(tokens == 48 for tokens, _, last in _chunks(then) if not last)
    assert any(tokens == 48 and rows >= 40 for tokens, rows, _ in _chunks(then))


def test_rows_that_fill_the_chunk_hold_new_prompts_back_until_they_shrink():
    """With as many decode rows as the chunk holds, a waiting prompt starts only once enough of
    them finished (SGLang admits none while its budget is spent); nothing hangs and every
    request is served."""
    result = scheduler.run("chunked", sim(), _requests_beside_rows(24, 12, 300), chunk=16)
    _served_in_full(result)
    chunks = _chunks(result)
    assert chunks and all(rows < 16 and tokens + rows <= 16 for tokens, rows, _ in chunks)
    assert sum(tokens for tokens, _, _ in chunks) == 300 + 700


@pytest.mark.parametrize("s_sat,itl", [(44, 8.8), (66, 11.1), (88, 14.8)])
def test_pdmux_keeps_itl_and_stretches_prefill(s_sat, itl):
    s, _ = run("pdmux", s_sat=s_sat)
    # batch 32 on an H100 picks level 5: 80 prefill SMs, 52 decode SMs
    assert s["itl_during_prefill_p50_ms"] == pytest.approx(itl, rel=0.03)
    # the prefill on 80 of 132 SMs, seen by the host after the decode step it waits on
    prefill_on_80 = 270 * 132 / 80
    assert prefill_on_80 - 3 <= s["prefill_ms"] <= prefill_on_80 + itl + 1
    assert s["tokens_during_prefill"] > 30


def test_pdmux_levels_follow_sglang():
    reqs = prompt_during_decode(QWEN.vocab, decode_tokens=64)
    result = scheduler.run("pdmux", sim(), reqs)
    levels = {r.level for r in result.rounds}
    assert 5 in levels and 7 in levels  # split while prefilling, decode-only otherwise
    split_rounds = [r for r in result.rounds if r.prefill]
    assert [r.prefill for r in split_rounds][:2] == ["layers 0-8", "layers 8-16"]
    assert all(r.level == 5 for r in split_rounds)


def test_manual_divisions_pick_the_level():
    manual = [[112, 20, 1], [104, 28, 100], [96, 36, 100], [88, 44, 100], [80, 52, 100],
              [72, 60, 100]]
    config = sglang_rules.PDMuxConfig(8, manual)
    result = scheduler.run("pdmux", sim(), prompt_during_decode(QWEN.vocab, decode_tokens=64),
                           config=config)
    assert {r.level for r in result.rounds if r.prefill} == {1}


def _served_in_full(result):
    assert all(r.generated == r.output_len for r in result.requests), [
        (r.rid, r.generated, r.output_len) for r in result.requests if not r.done]
    assert all(r.ttft is not None and r.ttft > 0 for r in result.requests if not r.warm)


def test_poisson_stream_serves_every_request():
    def requests():
        return stream(QWEN.vocab, 4.0, 12, Exponential(600, 4000, 20, 60), seed=3)
    reqs = requests()
    for strategy in scheduler.LOOPS:
        result = scheduler.run(strategy, sim(), requests(), chunk=512)
        _served_in_full(result)
        s = metrics.summarize(result)
        assert s["ttft_p50_ms"] > 0 and 0 <= s["gpu_idle_frac"] < 1
    assert [r.arrival for r in reqs] == sorted(r.arrival for r in reqs)


@pytest.mark.parametrize("strategy", scheduler.LOOPS)
@pytest.mark.parametrize("case", ["h20_defaults", "long_prompt", "sparse_poisson"])
def test_a_prefill_that_outlasts_the_decode_batch_is_served(strategy, case):
    """A prompt still prefilling when the last decoding request finishes must not be dropped:
    the chapter's scenario on a slow GPU, a 32K prompt after short decodes, and requests
    arriving far apart, each alone on the GPU."""
    gpu = H100
    if case == "h20_defaults":
        gpu, reqs = gpu_preset("h20"), prompt_during_decode(QWEN.vocab, decode_tokens=96)
    elif case == "long_prompt":
        reqs = prompt_during_decode(QWEN.vocab, prompt=32768, decode_tokens=20)
    else:
        reqs = stream(QWEN.vocab, 0.1, 3, Exponential(4000, 8192, 128, 512), seed=0)
    result = scheduler.run(strategy, sim(gpu=gpu), reqs, chunk=512)
    _served_in_full(result)


def test_a_request_after_every_decode_is_an_error_not_a_hang():
    reqs = [Request(0, [1, 2, 3], 2, None, after_steps=5)]
    with pytest.raises(PdmuxError, match="requests wait on decode steps but nothing is decoding"):
        scheduler.run("prefill_first", sim(), reqs)


def test_unknown_loop():
    with pytest.raises(PdmuxError, match="unknown loop 'fcfs'"):
        scheduler.run("fcfs", sim(), [])


class _SmallCache:
    """The simulated executor with a KV cache of a few thousand tokens."""

    def __init__(self, tokens):
        self.x = sim()
        self.x.kv_capacity_tokens = tokens

    def __getattr__(self, name):
        return getattr(self.x, name)


@pytest.mark.parametrize("strategy", scheduler.LOOPS)
def test_admission_keeps_the_kv_cache_and_the_batch_within_bounds(strategy):
    """Requests wait for room instead of overflowing the cache: every decode step's batch
    holds at most the cache's tokens and `max_running` requests, and all are served."""
    reqs = stream(QWEN.vocab, 50.0, 30, Exponential(900, 2000, 40, 100), seed=1)
    x = _SmallCache(6000)
    seen = []
    original = x.x.launch_decode

    def spy(batch):
        seen.append((len(batch), sum(r.prompt_len + r.output_len for r in batch)))
        return original(batch)
    x.x.launch_decode = spy
    result = scheduler.run(strategy, x, reqs, chunk=512, max_running=4)
    _served_in_full(result)
    assert max(n for n, _ in seen) <= 4 and max(t for _, t in seen) <= 6000
    waited = [r.prefill_start - r.arrival for r in result.requests]
    assert max(waited) > 0.2  # the rate far outran the room: requests queued


def test_a_request_larger_than_the_cache_is_refused_up_front():
    reqs = [Request(0, [1] * 5000, 100, 0.0)]
    x = _SmallCache(4000)
    # 5,100 tokens in whole pages of 16
    with pytest.raises(PdmuxError, match="request 0 needs 5,104 tokens of KV cache; the "
                                         "executor holds 4,000"):
        scheduler.run("pdmux", x, reqs)


def test_arrivals_are_admitted_in_order_and_the_next_is_known_at_once():
    reqs = [Request(3, 10, 2, 0.5), Request(1, 10, 2, 0.2), Request(2, 10, 2, 0.2),
            Request(0, 10, 2, None, after_steps=0), Request(4, 10, 2, 9.0)]
    e = scheduler.Engine(sim(), reqs, max_running=8)
    assert e.next_arrival() == 0.2
    e.x.idle_until(0.5)
    e.admit()  # by arrival (ties by id), then those whose decode steps have passed
    assert [r.rid for r in e.waiting] == [1, 2, 3, 0] and reqs[3].arrival == 0.5
    assert e.next_arrival() == 9.0 and e.busy()


def test_progress_says_how_far_a_run_is(monkeypatch):
    monkeypatch.setattr(scheduler, "PROGRESS_EVERY_S", 0.0)  # a line every round
    lines = []
    reqs = stream(QWEN.vocab, 4.0, 6, Exponential(300, 900, 8, 20), seed=1)
    result = scheduler.run("chunked", sim(), reqs, chunk=512, progress=lines.append)
    assert len(lines) == len(result.rounds)
    assert re.fullmatch(r"chunked: 0/6 requests served, \d+ s wall, clock at [\d.]+ s, "
                        r"0\.0 requests/s", lines[0]), lines[0]
    assert lines[-1].startswith("chunked: 6/6 requests served")
    quiet = scheduler.run("chunked", sim(), stream(QWEN.vocab, 4.0, 6, Exponential(300, 900, 8, 20),
                                                   seed=1), chunk=512)
    assert quiet.rounds.end == result.rounds.end  # told or not, the same run


class TickingClock(SimExecutor):
    """A clock that moves on every reading, as the GPU executor's wall clock does."""

    def now(self) -> float:
        self.t += 1e-6
        return self.t


@pytest.mark.parametrize("strategy", ["prefill_first", "pdmux"])
def test_a_prefill_batch_shares_one_window_on_a_clock_that_moves(strategy):
    """Prompts taken together are one prefill: one start and one end for all of them, so a
    run's prefill windows count a batch once on the GPU as in the simulation."""
    x = TickingClock(H100, QWEN, step_cost.SaturationLaw(3.0, 66.0),
                     step_cost.PrefillRate.fixed(H100.bf16_tflops, H100.sms, 0.5))
    reqs = [Request(i, 300, 4, 0.0) for i in range(5)]  # all arrive together: one batch
    result = scheduler.run(strategy, x, reqs)
    assert len({(r.prefill_start, r.prefill_end) for r in result.requests}) == 1
    assert len(metrics.prefill_windows(result)) == 1


@pytest.mark.parametrize("chunk,most_rows,fewest", [
    (512, 127, 385), (512, 510, 2), (512, 511, 1), (512, 4096, 1), (1, 8, 1), (2048, 1, 2047)])
def test_the_fewest_prompt_tokens_a_chunked_step_carries(chunk, most_rows, fewest):
    """A prompt starts while the rows leave room in the chunk and they only shrink after:
    the bound MAX_CHUNK_STEPS is checked with."""
    assert scheduler.fewest_chunk_tokens(chunk, most_rows) == fewest
