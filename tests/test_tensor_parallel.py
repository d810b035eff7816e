"""Tensor parallelism on CPUs: ranks in separate processes over gloo, each holding its shard of
the tiny model, serve the same logits and greedy tokens as the whole model on one device."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pdmux_triton.errors import PdmuxError
from pdmux_triton.model import DecodeBatch, ExtendBatch, KVCache, Model, Weights
from pdmux_triton.models import model_preset
from pdmux_triton.parallel import shard
from pdmux_triton.partition import Budget
from pdmux_triton.tensor_parallel import DistCollectives, shard_weights

SPEC = model_preset("tiny")  # 4 query heads, 2 KV heads, MLP 128, vocabulary 256
PAGE, PAGES = 4, [5, 2, 9, 0, 7]


def _greedy(model: Model, prompt: list[int], steps: int):
    """Prefill `prompt`, then `steps` greedy decode steps: every step's logits and token."""
    n = len(prompt)
    table = torch.tensor([PAGES], dtype=torch.int32)
    pos = torch.arange(n)
    slots = table[0].long()[pos // PAGE] * PAGE + pos % PAGE
    h, r = model.extend_layers(ExtendBatch(torch.tensor(prompt), pos, slots, table, [n], [0]),
                               0, SPEC.layers, budget=Budget(2))
    logits = [model.logits(h[-1:], r[-1:], Budget(2))]
    tokens = [int(logits[-1].argmax(-1))]
    for _ in range(steps):
        at = n + len(tokens) - 1
        step = DecodeBatch(torch.tensor(tokens[-1:]), torch.tensor([at]),
                           torch.tensor([PAGES[at // PAGE] * PAGE + at % PAGE]), table,
                           torch.tensor([at + 1], dtype=torch.int32), max_seq_len=at + 1)
        logits.append(model.decode_step(step, Budget(2)))
        tokens.append(int(logits[-1].argmax(-1)))
    return torch.cat(logits), tokens


def _one_rank(rank, tp, rendezvous, out, prompt, steps):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=tp)
    try:
        w = shard_weights(Weights.random(SPEC, "cpu", torch.float32, seed=1), rank, tp)
        model = Model(w, KVCache(w.spec, 16, PAGE, "cpu", torch.float32), max_positions=64,
                      collectives=DistCollectives())
        logits, tokens = _greedy(model, prompt, steps)
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
