"""Hugging Face checkpoints, checked against transformers itself: tiny random models of every
supported family are made and saved by transformers, read back by this project (config and
safetensors), and run by its kernels (the Triton interpreter on the CPU, fp32) beside
transformers' own forward with the same weights: prefill logits at every position, a prefill
split at layer boundaries, a chunk after a cached prefix, a batch of ragged prompts, and 16
greedy decode steps."""

import json

import pytest
import torch
from conftest import HAS_CUDA
from reference import rel_err

from pdmux_triton.errors import PdmuxError
from pdmux_triton.gpu.checkpoint import load_weights
from pdmux_triton.gpu.decoder import DecodeBatch, ExtendBatch, KVCache, Model
from pdmux_triton.multiplex.partition import Budget
from pdmux_triton.spec.models import resolve_model

transformers = pytest.importorskip("transformers")

DEV = "cuda" if HAS_CUDA else "cpu"
PAGE = 4
TOL = 2e-3 if HAS_CUDA else 1e-5  # fp32 logits: the GPU's tensor cores round to tf32
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=4096)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16, "rope_theta": 10000.0}
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "qwen3-tied": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, tie_word_embeddings=True)),
    # original context 16: positions past it feel the scaling within these short prompts
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=LLAMA3)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def saved(request, tmp_path_factory):
    """A random transformers model of the family, saved with save_pretrained (sharded, so the
    index is read too), and the same in transformers' hands."""
    config_cls, model_cls, extra = FAMILIES[request.param]
    torch.manual_seed(7)
    config = getattr(transformers, config_cls)(**SHAPE, **extra)
    hf = getattr(transformers, model_cls)(config).eval()
    for name, p in hf.named_parameters():  # trained-like norms, a visible bias
        if name.endswith(("norm.weight", "layernorm.weight")):
            torch.nn.init.normal_(p, 1.0, 0.1)
        elif name.endswith("bias"):
            torch.nn.init.normal_(p, 0.0, 0.3)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder, max_shard_size="100KB")
    return request.param, folder, hf


def ours(folder, pages=64):
    spec = resolve_model(str(folder))
    weights = load_weights(spec, folder, DEV, torch.float32)
    return Model(weights, KVCache(spec, pages, PAGE, DEV, torch.float32), max_positions=512)


def hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0]


def extend(tokens, first_page, prefix=0):
    """One sequence's tokens from position `prefix` on, on consecutive pages from first_page."""
    n = prefix + len(tokens)
    pages = list(range(first_page, first_page + -(-n // PAGE)))
    pos = torch.arange(prefix, n)
    table = torch.tensor([pages], dtype=torch.int32)
    slots = table[0].long()[pos // PAGE] * PAGE + pos % PAGE
    return ExtendBatch(torch.tensor(tokens).to(DEV), pos.to(DEV), slots.to(DEV), table.to(DEV),
                       [len(tokens)], [prefix])


def all_logits(model, batch, budget=Budget(3)):
    h, r = model.extend_layers(batch, 0, len(model.w.layers), budget=budget)
    return model.logits(h, r, budget)


def test_prefill_logits_at_every_position(saved):
    family, folder, hf = saved
    spec = resolve_model(str(folder))
    assert spec.tie_embeddings == (family == "qwen3-tied") and spec.qkv_bias == (family == "qwen2")
    assert (spec.rope_scaling is not None) == (family == "llama3")
    assert json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    tokens = torch.randint(0, 256, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    err = rel_err(all_logits(ours(folder), extend(tokens, 3)), hf_logits(hf, tokens))
    print(f"{family}: prefill logits against transformers, relative error {err:.1e}")
    assert err < TOL


def test_split_prefill_and_a_chunk_after_its_prefix(saved):
    _, folder, hf = saved
    tokens = torch.randint(0, 256, (29,), generator=torch.Generator().manual_seed(2)).tolist()
    model = ours(folder)
    whole = extend(tokens, 0)
    h, r = model.extend_layers(whole, 0, 1, budget=Budget(2))
    h, r = model.extend_layers(whole, 1, 2, h, r, budget=Budget(2))
    ref = hf_logits(hf, tokens)
    assert rel_err(model.logits(h, r, Budget(2)), ref) < TOL
    chunked = ours(folder)
    all_logits(chunked, extend(tokens[:12], 0))  # its K/V stay in pages 0-2
    tail = all_logits(chunked, extend(tokens[12:], 0, prefix=12))
    assert rel_err(tail, ref[12:]) < TOL


def test_a_batch_of_ragged_prompts(saved):
    _, folder, hf = saved
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 17, 9)]
    pages, table, slots, pos = 0, [], [], []
    width = -(-max(map(len, prompts)) // PAGE)
    for p in prompts:
        own = list(range(pages, pages + -(-len(p) // PAGE)))
        pages += len(own)
        table.append(own + [own[-1]] * (width - len(own)))
        at = torch.arange(len(p))
        pos.append(at)
        slots.append(torch.tensor(own)[at // PAGE] * PAGE + at % PAGE)
    batch = ExtendBatch(torch.tensor(sum(prompts, [])).to(DEV), torch.cat(pos).to(DEV),
                        torch.cat(slots).to(DEV), torch.tensor(table, dtype=torch.int32).to(DEV),
                        [len(p) for p in prompts], [0] * 3)
    logits = all_logits(ours(folder), batch)
    start = 0
    for p in prompts:
        assert rel_err(logits[start:start + len(p)], hf_logits(hf, p)) < TOL
        start += len(p)


def test_sixteen_greedy_decode_steps(saved):
    """Tokens equal to transformers' greedy ones wherever its top-2 gap is wider than the
    tolerance; each step's logits close."""
    _, folder, hf = saved
    prompt = torch.randint(0, 256, (11,), generator=torch.Generator().manual_seed(4)).tolist()
    model = ours(folder)
    h, r = model.extend_layers(extend(prompt, 0), 0, 2, budget=Budget(2))
    token = int(model.logits(h[-1:], r[-1:], Budget(2)).argmax())
    pages = list(range(0, 16))  # room for 64 positions
    table = torch.tensor([pages], dtype=torch.int32, device=DEV)
    seq = prompt + [token]
    for _ in range(16):
        n = len(seq) - 1  # the new token's position
        step = DecodeBatch(torch.tensor([seq[-1]], device=DEV), torch.tensor([n], device=DEV),
                           torch.tensor([pages[n // PAGE] * PAGE + n % PAGE], device=DEV), table,
                           torch.tensor([n + 1], dtype=torch.int32, device=DEV), max_seq_len=64)
        out = model.decode_step(step, Budget(2))[0]
        ref = hf_logits(hf, seq)[-1]
        assert rel_err(out, ref) < TOL
        top2 = ref.topk(2).values
        chosen = int(out.argmax())
        if top2[0] - top2[1] > 1e-3 * ref.abs().max():
            assert chosen == int(ref.argmax())
        seq.append(int(ref.argmax()))  # follow transformers, so a near tie cannot diverge


def test_a_checkpoint_that_does_not_fit_the_config_is_named(saved, tmp_path):
    family, folder, _ = saved
    if family != "qwen3":
        pytest.skip("one family is enough")
    spec = resolve_model(str(folder))
    with pytest.raises(PdmuxError, match="holds no safetensors"):
        load_weights(spec, tmp_path, DEV, torch.float32)
    wrong = resolve_model(str(folder)).__class__(**{**spec.__dict__, "qkv_bias": True})
    with pytest.raises(PdmuxError, match="lacks 6 tensors the config needs, e.g. "
                                         "model.layers.0.self_attn.k_proj.bias"):
        load_weights(wrong, folder, DEV, torch.float32)
    no_norm = spec.__class__(**{**spec.__dict__, "qk_norm": False})
    with pytest.raises(PdmuxError, match="would not use, e.g. model.layers.0.self_attn.k_norm"):
        load_weights(no_norm, folder, DEV, torch.float32)
    wide = spec.__class__(**{**spec.__dict__, "intermediate": 96})
    with pytest.raises(PdmuxError, match=r"mlp\.\w+_proj\.weight has shape \((64, 128|128, 64)\), "
                                         r"the config says \((64, 96|96, 64)\)"):
        load_weights(wide, folder, DEV, torch.float32)
    two = load_weights(spec, folder, DEV, torch.float32, layers=1)  # a truncated load
    assert len(two.layers) == 1


def _params_to(model, dtype) -> None:
    """The parameters alone in `dtype`. `Module.to` would cast the rotary `inv_freq` buffer
    too: rounded to bf16 (0.4%) it moves a 1000-token prompt's logits by percents, an error
    of the reference rather than of the model under test."""
    for p in model.parameters():
        p.data = p.data.to(dtype)


def _save_real_dims(folder, family: str, layers: int):
    """A transformers model of a real 8B model's dims, `layers` layers, random, saved in bf16."""
    configs = {
        "qwen3": transformers.Qwen3Config(
            hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
            rope_parameters={"rope_theta": 1e6, "rope_type": "default"}),
        "llama3": transformers.LlamaConfig(
            hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
            num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
            rms_norm_eps=1e-5, max_position_embeddings=131072,
            rope_parameters={**LLAMA3, "rope_theta": 5e5,
                             "original_max_position_embeddings": 8192}),
    }
    torch.manual_seed(11)
    model_cls = {"qwen3": "Qwen3ForCausalLM", "llama3": "LlamaForCausalLM"}[family]
    with torch.device("cuda"):  # billions of values: made on the GPU, not the host
        hf = getattr(transformers, model_cls)(configs[family]).eval()
    _params_to(hf, torch.bfloat16)
    hf.save_pretrained(folder)
    return hf


@pytest.mark.gpu
@pytest.mark.parametrize("family,layers", [("qwen3", 4), ("llama3", 2)])
def test_real_dims_in_bf16_within_transformers_own_error(family, layers, tmp_path):
    """bf16 at Qwen3-8B and Llama-3.1-8B dims: this decoder's logits against transformers in
    fp32 (same weights) stay within 1.5x of transformers-bf16's own error against it, and its
    greedy tokens match wherever the fp32 top-2 gap is clear."""
    hf = _save_real_dims(tmp_path, family, layers)
    spec = resolve_model(str(tmp_path))
    model = Model(load_weights(spec, tmp_path, "cuda"), KVCache(spec, 256, 16, "cuda"),
                  max_positions=4096)
    tokens = torch.randint(0, spec.vocab, (1000,), generator=torch.Generator().manual_seed(5))
    pos = torch.arange(1000, device="cuda")
    table = torch.arange(63, dtype=torch.int32, device="cuda")[None]
    batch = ExtendBatch(tokens.cuda(), pos, pos.clone(), table, [1000], [0])
    h, r = model.extend_layers(batch, 0, layers)
    mine = model.logits(h, r, Budget()).float()
    with torch.no_grad():
        _params_to(hf, torch.float32)  # the saved bf16 values, exactly, in fp32
        ref = hf(tokens[None].cuda()).logits[0]
        _params_to(hf, torch.bfloat16)
        own = hf(tokens[None].cuda()).logits[0].float()
    ours_err, hf_err = rel_err(mine, ref), rel_err(own, ref)
    print(family, "ours vs fp32", ours_err, "transformers-bf16 vs fp32", hf_err)
    assert ours_err < 1.5 * hf_err + 1e-3
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 4 * ours_err * ref.abs().amax(-1)
    assert clear.sum() > 100 and torch.equal(mine.argmax(-1)[clear], ref.argmax(-1)[clear])


@pytest.mark.gpu
def test_run_serves_a_users_checkpoint(saved, tmp_path, capsys):
    """`run --model DIR` (random weights of its shape) and `--weights hf` (its safetensors)
    both serve the chapter's scenario on the GPU."""
    from pdmux_triton.cli import main

    family, folder, _ = saved
    if family != "qwen2":  # the family with a bias: the GEMM epilogue on the GPU too
        pytest.skip("one family is enough")
    for weights in ("random", "hf"):
        out = tmp_path / weights
        assert main.main(["run", "--model", str(folder), "--weights", weights, "--batch", "4",
                          "--context", "256", "--prompt", "1024", "--decode-tokens", "16",
                          "--kinds", "grid_cap", "--chunks", "512", "--out", str(out)]) == 0
        data = json.loads(next(out.glob("run-*.json")).read_text())
        assert data["inputs"]["checkpoint"] == (str(folder) if weights == "hf" else None)
        assert all(r["requests_lost"] == 0 for r in data["rows"] if "requests_lost" in r)


def test_a_bf16_checkpoint_read_in_fp32_and_a_long_prompt(tmp_path):
    """A checkpoint saved in bf16 (parameters cast, transformers' rotary buffer left exact),
    read into fp32: the same values, and at 300 positions the rope still agrees."""
    torch.manual_seed(3)
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SHAPE, head_dim=16)).eval()
    _params_to(hf, torch.bfloat16)
    hf.save_pretrained(tmp_path)
    _params_to(hf, torch.float32)
    tokens = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(6)).tolist()
    model = ours(tmp_path, pages=80)
    assert model.w.embed.dtype == torch.float32
    assert rel_err(all_logits(model, extend(tokens, 0)), hf_logits(hf, tokens)) < TOL
