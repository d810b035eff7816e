"""Servers behind a router on one clock: round-robin replicas and prefill/decode disaggregation,
served on the simulated executor."""

import copy

import pytest

from pdmux_triton.cost import step_cost
from pdmux_triton.cost.parallel import Link
from pdmux_triton.errors import PdmuxError
from pdmux_triton.serve import metrics, scheduler
from pdmux_triton.serve.router import kv_arrivals, round_robin, serve_disaggregated, serve_replicas
from pdmux_triton.serve.simulated import SimExecutor
from pdmux_triton.spec.gpus import gpu_preset
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import LENGTH_PRESETS, Request, stream

GPU, MODEL = gpu_preset("h200"), model_preset("qwen3-8b")
LAW = step_cost.SaturationLaw(4.0, 66)
PREFILL = step_cost.PrefillRate.fixed(GPU.bf16_tflops, GPU.sms, 0.5)


def _server(strategy: str, kv_arrives: bool = False):
    def serve(part):
        x = SimExecutor(GPU, MODEL, LAW, PREFILL, kv_arrives=kv_arrives)
        return scheduler.run(strategy, x, copy.deepcopy(part))
    return serve


def _requests(n=40, rate=6.0):
    return stream(MODEL.vocab, rate, n, LENGTH_PRESETS["sharegpt"], seed=3)


def test_round_robin_deals_in_arrival_order():
    reqs = _requests(7)
    parts = round_robin(list(reversed(reqs)), 3)
    order = sorted(reqs, key=lambda r: r.arrival)
    assert [[r.rid for r in p] for p in parts] == [[r.rid for r in order[i::3]] for i in range(3)]
    with pytest.raises(PdmuxError, match="at least one server, got 0"):
        round_robin(reqs, 0)


def test_one_replica_is_the_server_itself():
    reqs = _requests()
    alone = metrics.summarize(_server("pdmux")(reqs))
    behind = metrics.summarize(serve_replicas("pdmux", _server("pdmux"), reqs, 1))
    for key in ("ttft_p50_ms", "tpot_p99_ms", "itl_p50_ms", "gpu_idle_frac", "level_changes"):
        assert behind[key] == pytest.approx(alone[key]), key


def test_replicas_serve_each_request_once_and_keep_each_gpus_figures():
    reqs = _requests()
    result = serve_replicas("chunked", _server("chunked"), reqs, 2)
    assert sorted(r.rid for r in result.requests) == sorted(r.rid for r in reqs)
    assert all(r.generated == r.output_len for r in result.requests)
    assert len(result.parts) == 2
    summary = metrics.summarize(result)
    parts = [metrics.summarize(p) for p in result.parts]
    assert summary["gpu_idle_frac"] == pytest.approx(sum(p["gpu_idle_frac"] for p in parts) / 2)
    assert summary["level_changes"] == sum(p["level_changes"] for p in parts)
    # one timeline: every server's rounds by start, each server's own order kept
    assert list(result.rounds) == sorted((rd for p in result.parts for rd in p.rounds),
                                         key=lambda rd: rd.start)
    assert {rd.prefill for rd in result.rounds} >= {"", "chunk 0+2048"}
    # each server's requests as it served them
    for part in result.parts:
        alone = _server("chunked")(round_robin(reqs, 2)[result.parts.index(part)])
        assert [r.token_times for r in part.requests] == [r.token_times for r in alone.requests]


def _prefilled(start, end, prompts):
    out = []
    for i, n in enumerate(prompts):
        r = Request(rid=i, prompt=[0] * n, output_len=4, arrival=0.0)
        r.prefill_start, r.prefill_end = start, end
        out.append(r)
    return out


def test_kv_pages_overlap_the_prefill_unless_the_link_is_slower():
    layers, per_token = 4, 1000.0  # bytes of KV per token
    reqs = _prefilled(1.0, 2.0, [500, 500])  # one batch: 1e6 bytes, 2.5e5 a layer
    fast = Link("fast", busbw_gbps=1.0, latency_us=1.0)  # 0.25 ms a layer, layers 0.25 s apart
    send = 1e-6 + 2.5e5 / 1e9
    assert kv_arrivals(reqs, per_token, layers, fast) == {0: pytest.approx(2.0 + send),
                                                          1: pytest.approx(2.0 + send)}
    slow = Link("slow", busbw_gbps=1e-3, latency_us=1.0)  # 250 s a layer: the link sets it
    send = 1e-6 + 2.5e5 / 1e6
    assert kv_arrivals(reqs, per_token, layers, slow)[0] == pytest.approx(1.25 + 4 * send)
    # a later batch waits for the link the earlier one holds
    both = reqs + [Request(rid=9, prompt=[0] * 100, output_len=2, arrival=0.0,
                           prefill_start=2.0, prefill_end=2.1)]
    arrive = kv_arrivals(both, per_token, layers, slow)
    assert arrive[9] == pytest.approx(arrive[0] + 4 * (1e-6 + 2.5e4 / 1e6))


def test_disaggregated_requests_get_their_first_token_after_their_kv_arrives():
    reqs = _requests()
    link = Link("nvlink", 450.0, 10.0)
    per_token = MODEL.kv_bytes_per_token(step_cost.DTYPE_BYTES)
    result = serve_disaggregated("disagg_1p1d", _server("prefill_first"),
                                 _server("prefill_first", kv_arrives=True), reqs, 1, 1,
                                 per_token, MODEL.layers, link)
    assert len(result.parts) == 2 and len(result.requests) == len(reqs)
    by_rid = {r.rid: r for r in reqs}
    prefilled = result.parts[0].requests
    arrive = kv_arrivals(prefilled, per_token, MODEL.layers, link)
    for r in result.requests:
        assert r.generated == r.output_len  # served to its last token
        assert r.arrival == by_rid[r.rid].arrival  # as the user sent it
        assert r.prefill_end <= arrive[r.rid] <= r.token_times[0]
    # the decode server computes no prefill: its launches are decode steps
    decode = result.parts[1]
    assert sum(b - a for a, b in decode.activity.busy) == pytest.approx(
        sum(decode.activity.decode_step_s))
    summary = metrics.summarize(result)
    assert summary["requests_lost"] == 0 and summary["ttft_p50_ms"] > 0


def test_disaggregation_takes_arriving_requests_only():
    warm = Request(rid=0, prompt=[0] * 10, output_len=3, arrival=None, warm=True)
    with pytest.raises(PdmuxError, match="takes a stream of arriving requests"):
        serve_disaggregated("d", _server("prefill_first"), _server("prefill_first", True),
                            [warm], 1, 1, 1.0, 2, Link("l", 1.0, 1.0))
