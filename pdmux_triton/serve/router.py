"""Several servers behind a router, each on its own GPUs, on one clock.

- Data parallelism: K independent servers, requests dealt round-robin in arrival order (what a
  simple router in front of K SGLang instances does).
- Prefill/decode disaggregation (DistServe, SGLang's PD disaggregation): P prefill servers
  compute each prompt's KV cache and first token; its KV pages go to one of D decode servers
  over the link, layer by layer as the prefill's layers finish, so the transfer overlaps the
  prefill; the decode server admits the request when its KV has arrived, and that is when its
  first token counts as served (TTFT includes the transfer).

Each server is served by `scheduler.run` on an executor a caller makes (`serve(part)` returns
the part's RunResult); the merged RunResult keeps every request with its own times and the
servers' runs as `parts`, so per-GPU figures are taken per server (`metrics.summarize`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np

from pdmux_triton.cost.parallel import Link
from pdmux_triton.errors import PdmuxError
from pdmux_triton.serve.executor import Activity, Rounds, RunResult
from pdmux_triton.spec.traffic import Request

Serve = Callable[[list[Request]], RunResult]


def round_robin(requests: list[Request], k: int) -> list[list[Request]]:
    """Requests dealt to k servers in arrival order (those decoding from the start too)."""
    if k < 1:
        raise PdmuxError(f"a router needs at least one server, got {k}")
    order = sorted(requests, key=lambda r: (not r.warm, r.arrival or 0.0, r.rid))
    return [order[i::k] for i in range(k)]


def merged(strategy: str, parts: list[RunResult], requests: list[Request]) -> RunResult:
    """The servers' runs as one: `requests` (each once), every round and launch."""
    def gathered(field: str, shape=(-1,)) -> np.ndarray:  # every server's, one after another
        return np.concatenate([np.asarray(getattr(p.activity, field), dtype=float).reshape(shape)
                               for p in parts])
    start = min(p.activity.window[0] for p in parts)
    end = max(p.activity.window[1] for p in parts)
    activity = Activity(gathered("busy", (-1, 2)), (start, end), gathered("decode_step_s"),
                        gathered("drain_s"))
    rounds = Rounds.joined([p.rounds for p in parts])
    return RunResult(strategy, requests, rounds, max(p.wall_s for p in parts), activity, parts,
                     chunked_steps=min(p.chunked_steps for p in parts))


def serve_replicas(strategy: str, serve: Serve, requests: list[Request], k: int) -> RunResult:
    """K independent servers behind a round-robin router."""
    parts = [serve(part) for part in round_robin(requests, k) if part]
    return merged(strategy, parts, [r for p in parts for r in p.requests])


def kv_arrivals(prefilled: list[Request], kv_bytes_per_token: float, layers: int,
                link: Link) -> dict[int, float]:
    """When each prefilled request's KV cache has reached its decode server: a prefill batch's
    layers finish evenly over its window and each layer's pages are sent as it finishes, one
    transfer at a time over the link (so a slow link, not the prefill, can set the time)."""
    batches: dict[tuple[float, float], list[Request]] = {}
    for r in prefilled:
        batches.setdefault((r.prefill_start, r.prefill_end), []).append(r)
    arrivals, link_free = {}, 0.0
    for (start, end), reqs in sorted(batches.items(), key=lambda item: item[0][1]):
        per_layer = sum(r.prompt_len for r in reqs) * kv_bytes_per_token / layers
        send = link.latency_us * 1e-6 + per_layer / (link.busbw_gbps * 1e9)
        for i in range(layers):
            done = start + (end - start) * (i + 1) / layers
            link_free = max(link_free, done) + send
        for r in reqs:
            arrivals[r.rid] = link_free
    return arrivals


def serve_disaggregated(strategy: str, prefill: Serve, decode: Serve, requests: list[Request],
                        prefill_servers: int, decode_servers: int, kv_bytes_per_token: float,
                        layers: int, link: Link) -> RunResult:
    """P prefill servers, D decode servers: `prefill(part)` serves prompts that stop at their
    first token; `decode(part)` serves requests arriving with their KV (its executor prices
    their prefill as free: the pages came over the link)."""
    if any(r.warm for r in requests):
        raise PdmuxError("disaggregated serving takes a stream of arriving requests; the "
                         "chapter's batch decoding from the start has no prefill server")
    firsts = []
    for r in requests:  # the prefill server's copy: its KV and first token
        first = copy.deepcopy(r)
        first.output_len = 1
        firsts.append(first)
    prefill_runs = [prefill(part) for part in round_robin(firsts, prefill_servers) if part]
    done = {r.rid: r for run in prefill_runs for r in run.requests}
    arrive = kv_arrivals(list(done.values()), kv_bytes_per_token, layers, link)
    handed = []
    for r in requests:  # the decode server's copy arrives with its KV
        moved = copy.deepcopy(r)
        moved.arrival = arrive[r.rid]
        handed.append(moved)
    decode_runs = [decode(part) for part in round_robin(handed, decode_servers) if part]
    served = []
    for run in decode_runs:
        for moved in run.requests:
            r = copy.deepcopy(moved)  # as the user sees it: arrival and prefill at the front
            origin = done[r.rid]
            r.arrival, r.prefill_start, r.prefill_end = (origin.arrival, origin.prefill_start,
                                                         origin.prefill_end)
            served.append(r)
    return merged(strategy, prefill_runs + decode_runs, served)
