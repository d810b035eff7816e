"""Tensor parallelism on CPUs: ranks in separate processes over gloo, each holding its shard of
the tiny model, serve the same logits and greedy tokens as the whole model on one device."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pdmux_triton.cost.parallel import shard
from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.decoder import DecodeBatch, ExtendBatch, KVCache, Model, Weights
from pdmux_triton.gpu.tensor_parallel import DistCollectives, shard_weights
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.gpus import GPUSpec
from pdmux_triton.spec.models import model_preset
from pdmux_triton.spec.traffic import Request

SPEC = model_preset("tiny")  # 4 query heads, 2 KV heads, MLP 128, vocabulary 256
PAGE, PAGES = 4, [5, 2, 9, 0, 7]
GPU = GPUSpec("test", 48, (9, 0), 1.0, 100.0, 1.0)  # a small GPU whose PD-mux levels exist


def _greedy(model: Model, prompt: list[int], steps: int, budget: Budget = Budget(2)):
    """Prefill `prompt`, then `steps` greedy decode steps: every step's logits and token."""
    n = len(prompt)
    table = torch.tensor([PAGES], dtype=torch.int32)
    pos = torch.arange(n)
    slots = table[0].long()[pos // PAGE] * PAGE + pos % PAGE
    h, r = model.extend_layers(ExtendBatch(torch.tensor(prompt), pos, slots, table, [n], [0]),
                               0, SPEC.layers, budget=budget)
    logits = [model.logits(h[-1:], r[-1:], budget)]
    tokens = [int(logits[-1].argmax(-1))]
    for _ in range(steps):
        at = n + len(tokens) - 1
        step = DecodeBatch(torch.tensor(tokens[-1:]), torch.tensor([at]),
                           torch.tensor([PAGES[at // PAGE] * PAGE + at % PAGE]), table,
                           torch.tensor([at + 1], dtype=torch.int32), max_seq_len=at + 1)
        logits.append(model.decode_step(step, budget))
        tokens.append(int(logits[-1].argmax(-1)))
    return torch.cat(logits), tokens


def _one_rank(rank, tp, rendezvous, out, prompt, steps):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=tp)
    try:
        w = shard_weights(Weights.random(SPEC, "cpu", torch.float32, seed=1), rank, tp)
        model = Model(w, KVCache(w.spec, 16, PAGE, "cpu", torch.float32), max_positions=64)
        logits, tokens = _greedy(model, prompt, steps, Budget(2, comm=DistCollectives()))
        torch.save({"logits": logits, "tokens": tokens}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("tp", [2, 4])  # 4: more ranks than KV heads, each keeps one
def test_tp_ranks_serve_the_whole_models_tokens(tp, tmp_path):
    prompt = torch.randint(0, SPEC.vocab, (11,),
                           generator=torch.Generator().manual_seed(tp)).tolist()
    steps = 4
    whole = Model(Weights.random(SPEC, "cpu", torch.float32, seed=1),
                  KVCache(SPEC, 16, PAGE, "cpu", torch.float32), max_positions=64)
    ref_logits, ref_tokens = _greedy(whole, prompt, steps)
    mp.start_processes(_one_rank, args=(tp, tmp_path / "rendezvous", tmp_path, prompt, steps),
                       nprocs=tp, start_method="spawn")
    for rank in range(tp):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["tokens"] == ref_tokens, rank
        err = (got["logits"] - ref_logits).abs().max() / ref_logits.abs().max()
        assert err < 1e-5, (rank, float(err))


@pytest.mark.parametrize("tp", [2, 4])
def test_the_shards_hold_the_whole_model_between_them(tp):
    w = Weights.random(SPEC, "cpu", torch.float32, seed=2)
    shards = [shard_weights(w, r, tp) for r in range(tp)]
    assert all(s.spec == shard(SPEC, tp) for s in shards)
    qd, inter = SPEC.q_dim // tp, SPEC.intermediate // tp
    assert shards[0].spec.kv_dim == max(1, SPEC.kv_heads // tp) * SPEC.head_dim
    layer = w.layers[0]
    # query rows and o's columns, gate and up, down's columns and the vocabulary: a partition
    assert torch.equal(torch.cat([s.layers[0]["qkv"][:qd] for s in shards]),
                       layer["qkv"][:SPEC.q_dim])
    assert torch.equal(torch.cat([s.layers[0]["o"] for s in shards], 1), layer["o"])
    assert torch.equal(torch.cat([s.layers[0]["gate_up"][:inter] for s in shards]),
                       layer["gate_up"][:SPEC.intermediate])
    assert torch.equal(torch.cat([s.layers[0]["down"] for s in shards], 1), layer["down"])
    assert torch.equal(torch.cat([s.lm_head for s in shards]), w.lm_head)
    # a rank's K rows are those of the KV head its query heads read
    for r, s in enumerate(shards):
        head = (r * (SPEC.q_heads // tp)) // (SPEC.q_heads // SPEC.kv_heads)
        k0 = SPEC.q_dim + head * SPEC.head_dim
        assert torch.equal(s.layers[0]["qkv"][qd:qd + SPEC.head_dim],
                           layer["qkv"][k0:k0 + SPEC.head_dim])
    with pytest.raises(PdmuxError, match="rank 4 is not one of the 4 ranks 0..3"):
        shard_weights(w, 4, 4)


def _rank_loop(rank, tp, rendezvous, out, agree):
    """A pd-mux loop on a simulated rank whose prefills run slower on rank 1 (a GPU that is
    slower or busier): the rounds it serves, with or without agreeing with the other ranks."""
    from pdmux_triton.cost import step_cost
    from pdmux_triton.gpu.tensor_parallel import AgreedExecutor
    from pdmux_triton.serve import scheduler
    from pdmux_triton.serve.simulated import SimExecutor
    from pdmux_triton.spec.gpus import gpu_preset
    from pdmux_triton.spec.traffic import LENGTH_PRESETS, stream

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=tp)
    try:
        gpu, qwen = gpu_preset("h200"), model_preset("qwen3-8b")
        prefill = step_cost.PrefillRate.fixed(gpu.bf16_tflops, gpu.sms, 0.5 if rank == 0 else 0.3)
        x = SimExecutor(gpu, shard(qwen, tp), step_cost.SaturationLaw(4.0, 66), prefill)
        reqs = stream(qwen.vocab, 6.0, 30, LENGTH_PRESETS["sharegpt"], seed=4)
        result = scheduler.run("pdmux", AgreedExecutor(x) if agree else x, reqs)
        rounds = [(rd.level, rd.decode_bs, rd.prefill) for rd in result.rounds]
        torch.save(rounds, f"{out}/rounds{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("agree", [True, False])
def test_ranks_that_agree_take_the_same_rounds(agree, tmp_path):
    """With the vote and the agreed clock every rank takes the same levels, batches and prefill
    layers; without them, the rank whose prefill ends first moves on alone."""
    mp.start_processes(_rank_loop, args=(2, tmp_path / "rendezvous", tmp_path, agree),
                       nprocs=2, start_method="spawn")
    rounds = [torch.load(tmp_path / f"rounds{r}.pt") for r in range(2)]
    assert len(rounds[0]) > 50
    assert (rounds[0] == rounds[1]) == agree


# each side's own page ids: the prompt's three, and on the decode rank one more for its output
PREFILL_PAGES, DECODE_PAGES = [5, 2, 9], [1, 7, 3, 12]


def _disaggregated(rank, rendezvous, out, prompt, steps):
    """Rank 0 prefills `prompt` and sends each layer's KV pages as the layer ends; rank 1
    receives them into its own pages and decodes from them."""
    from pdmux_triton.gpu.kv_transfer import receive_request, send_layer

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    try:
        model = Model(Weights.random(SPEC, "cpu", torch.float32, seed=1),
                      KVCache(SPEC, 16, PAGE, "cpu", torch.float32), max_positions=64)
        n = len(prompt)
        if rank == 0:
            table = torch.tensor([PREFILL_PAGES], dtype=torch.int32)
            pos = torch.arange(n)
            slots = table[0].long()[pos // PAGE] * PAGE + pos % PAGE
            batch = ExtendBatch(torch.tensor(prompt), pos, slots, table, [n], [0])
            h = r = None
            sends = []
            for layer in range(SPEC.layers):  # a layer's pages leave as soon as it has run
                h, r = model.extend_layers(batch, layer, layer + 1, h, r, budget=Budget(2))
                sends += send_layer(model.cache, layer, PREFILL_PAGES, 1)
            first = int(model.logits(h[-1:], r[-1:], Budget(2)).argmax(-1))
            for w in sends:
                w.wait()
            dist.send(torch.tensor([first]), 1)  # the first token, as the router hands it on
            torch.save({"k": [k.clone() for k in model.cache.k]}, f"{out}/prefill.pt")
        else:
            receive_request(model.cache, DECODE_PAGES[:len(PREFILL_PAGES)], 0)
            first = torch.zeros(1, dtype=torch.int64)
            dist.recv(first, 0)
            table = torch.tensor([DECODE_PAGES], dtype=torch.int32)
            tokens, logits = [int(first)], []
            for _ in range(steps):
                at = n + len(tokens) - 1
                step = DecodeBatch(torch.tensor(tokens[-1:]), torch.tensor([at]),
                                   torch.tensor([DECODE_PAGES[at // PAGE] * PAGE + at % PAGE]),
                                   table, torch.tensor([at + 1], dtype=torch.int32),
                                   max_seq_len=at + 1)
                logits.append(model.decode_step(step, Budget(2)))
                tokens.append(int(logits[-1].argmax(-1)))
            torch.save({"tokens": tokens, "logits": torch.cat(logits),
                        "k": [k.clone() for k in model.cache.k]}, f"{out}/decode.pt")
    finally:
        dist.destroy_process_group()


def test_kv_pages_sent_layer_by_layer_land_in_the_decode_ranks_own_pages(tmp_path):
    prompt = torch.randint(0, SPEC.vocab, (10,),
                           generator=torch.Generator().manual_seed(7)).tolist()
    steps = 3
    one = Model(Weights.random(SPEC, "cpu", torch.float32, seed=1),
                KVCache(SPEC, 16, PAGE, "cpu", torch.float32), max_positions=64)
    ref_logits, ref_tokens = _greedy(one, prompt, steps)
    mp.start_processes(_disaggregated, args=(tmp_path / "rendezvous", tmp_path, prompt, steps),
                       nprocs=2, start_method="spawn")
    sent, got = torch.load(tmp_path / "prefill.pt"), torch.load(tmp_path / "decode.pt")
    for layer in range(SPEC.layers):  # the prompt's rows, page for page
        for a, b in zip(PREFILL_PAGES, DECODE_PAGES):
            rows = slice(a * PAGE, (a + 1) * PAGE), slice(b * PAGE, (b + 1) * PAGE)
            used = min(PAGE, len(prompt) - PREFILL_PAGES.index(a) * PAGE)
            assert torch.equal(sent["k"][layer][rows[0]][:used], got["k"][layer][rows[1]][:used])
    assert got["tokens"] == ref_tokens
    err = (got["logits"] - ref_logits[1:]).abs().max() / ref_logits.abs().max()
    assert err < 1e-5, float(err)


def test_pages_outside_the_cache_are_refused_before_anything_is_sent():
    from pdmux_triton.gpu.kv_transfer import send_layer

    cache = KVCache(SPEC, 4, PAGE, "cpu", torch.float32)
    with pytest.raises(PdmuxError, match=r"pages must be ids in 0..3, got \[1, 4\]"):
        send_layer(cache, 0, [1, 4], dst=1)


def _served(x, agree: bool, out: dict | None = None):
    """The pd-mux loop over three requests on executor `x`: each request's greedy tokens (and
    in `out`, its rounds)."""
    from pdmux_triton.gpu.tensor_parallel import AgreedExecutor
    from pdmux_triton.serve import scheduler

    reqs = [Request(0, [5, 17, 99, 3, 42, 7, 250], 6, 0.0, warm=True),
            Request(1, list(range(30, 42)), 7, 0.0, warm=True),
            Request(2, [(i * 37) % 256 for i in range(21)], 5, None, after_steps=2)]
    result = scheduler.run("pdmux", AgreedExecutor(x) if agree else x, reqs)
    if out is not None:
        out["rounds"] = result.rounds
    return {r.rid: r.tokens for r in result.requests}


def _serving_rank(rank, tp, rendezvous, out):
    from pdmux_triton.gpu.model_executor import ModelExecutor

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=tp)
    try:
        x = ModelExecutor.shared(SPEC, GPU, "grid_cap", page_size=4, cache_tokens=512, seed=1,
                                 rank=(rank, tp))
        run = {}
        tokens = _served(x, agree=True, out=run)
        decode_comm, prefill_comm = x.comms
        steps = sum(rd.decode_bs > 0 for rd in run["rounds"])
        torch.save({"tokens": tokens, "decode_calls": decode_comm.calls,
                    "prefill_calls": prefill_comm.calls, "decode_steps": steps,
                    "groups_differ": decode_comm.group is not prefill_comm.group},
                   f"{out}/tokens{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_tp2_serves_the_same_greedy_tokens_as_one_device(tmp_path):
    from pdmux_triton.gpu.model_executor import ModelExecutor

    one = _served(ModelExecutor.shared(SPEC, GPU, "grid_cap", page_size=4, cache_tokens=512,
                                       seed=1), agree=False)
    ModelExecutor.release_shared()
    mp.start_processes(_serving_rank, args=(2, tmp_path / "rendezvous", tmp_path), nprocs=2,
                       start_method="spawn")
    for rank in range(2):
        got = torch.load(tmp_path / f"tokens{rank}.pt")
        assert got["tokens"] == one
        # each side on its own communicator: every decode step's 2 all-reduces a layer and
        # its logits' gather on the decode side's, the prefills on the prefill side's
        assert got["groups_differ"]
        assert got["decode_calls"] == got["decode_steps"] * (2 * SPEC.layers + 1)
        assert got["prefill_calls"] >= 2 * SPEC.layers + 1
    assert len({t for toks in one.values() for t in toks}) > 3  # real, varied tokens
