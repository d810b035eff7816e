"""Model shapes from Hugging Face configs: presets as data, a user's directory or config.json,
and a clear error for what the decoder does not run."""

import dataclasses
import json

import pytest

from pdmux_triton.cost import step_cost
from pdmux_triton.errors import PdmuxError
from pdmux_triton.spec.models import (MODELS, ModelSpec, RopeScaling, model_preset, resolve_model,
                                      spec_from_config)

LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def test_qwen3_8b_sizes():
    m = model_preset("Qwen3-8B")
    # 36 x (QKV 4096x6144 + O 4096x4096 + gate/up/down 3 x 4096x12288) + LM head 151936x4096
    assert m.linear_params == 36 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 12288) + 151936 * 4096
    assert m.kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2


def config(**over):
    """A small Llama config as transformers 5 saves it."""
    base = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "tie_word_embeddings": False}
    return {**base, **over}


def test_presets_are_the_published_shapes():
    assert set(MODELS) >= {"qwen3-8b", "qwen3-4b", "qwen3-14b", "qwen3-32b", "llama-3.1-8b",
                           "llama-3.2-3b", "mistral-7b", "tiny"}
    assert model_preset("qwen3-8b") == ModelSpec("qwen3-8b", 36, 4096, 32, 8, 128, 12288,
                                                 151936, True, 1e6, max_context=40960)
    llama = model_preset("Llama-3.1-8B")
    assert llama.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192) and not llama.qk_norm
    assert llama.head_dim == 128 and llama.rms_eps == 1e-5  # head_dim derived: 4096 / 32
    small = model_preset("qwen3-4b")
    assert small.tie_embeddings and small.q_dim == 4096 != small.hidden  # head_dim given
    # a tied LM head is the embedding table: one table less to hold
    untied = dataclasses.replace(small, tie_embeddings=False)
    assert (step_cost.footprint_bytes(untied, 0) - step_cost.footprint_bytes(small, 0)
            == 2 * small.vocab * small.hidden)
    with pytest.raises(PdmuxError, match="unknown model 'gpt5'.*qwen3-8b.*config.json"):
        model_preset("gpt5")


def test_each_preset_holds_its_published_context_length():
    published = {"qwen3-8b": 40960, "qwen3-4b": 40960, "qwen3-14b": 40960, "qwen3-32b": 40960,
                 "llama-3.1-8b": 131072, "llama-3.2-3b": 131072, "mistral-7b": 32768}
    assert {name: MODELS[name].max_context for name in published} == published
    assert 8192 + 96 < MODELS["tiny"].max_context  # the chapter's scenario fits


def test_the_context_length_is_read_and_may_be_absent():
    assert spec_from_config(config(max_position_embeddings=4096), "m", "c.json").max_context == 4096
    assert spec_from_config(config(), "m", "c.json").max_context is None  # nothing to check
    with pytest.raises(PdmuxError, match="max_position_embeddings must be an integer >= 1"):
        spec_from_config(config(max_position_embeddings=0), "m", "c.json")
    # a result file written before the field existed reads back
    saved = dataclasses.asdict(model_preset("qwen3-8b"))
    del saved["max_context"]
    assert ModelSpec(**saved) == dataclasses.replace(model_preset("qwen3-8b"), max_context=None)


def test_both_generations_of_rope_fields_read_the_same():
    v5 = spec_from_config(config(rope_parameters={"rope_theta": 5e5, "rope_type": "llama3",
                                                  **LLAMA3_SCALING}), "m", "c.json")
    v4 = spec_from_config({**config(rope_theta=5e5, rope_scaling={"type": "llama3",
                                                                  **LLAMA3_SCALING}),
                           "rope_parameters": None}, "m", "c.json")
    assert v5 == v4 and v5.rope_theta == 5e5 and v5.rope_scaling.factor == 8.0


@pytest.mark.parametrize("family,qk_norm,bias", [("qwen3", True, False), ("qwen2", False, True),
                                                 ("llama", False, False),
                                                 ("mistral", False, False)])
def test_each_family_gets_its_layout(family, qk_norm, bias):
    spec = spec_from_config(config(model_type=family, head_dim=32, sliding_window=None),
                            "m", "c.json")
    assert (spec.qk_norm, spec.qkv_bias, spec.head_dim, spec.q_dim) == (qk_norm, bias, 32, 128)


@pytest.mark.parametrize("over,message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported .qwen3, llama, qwen2, mistral"),
    ({"num_local_experts": 8}, "num_local_experts 8: mixture-of-experts models are not supported"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 4096},
     "sliding_window 4096: sliding-window attention is not supported"),
    ({"model_type": "mistral", "sliding_window": 4096}, "sliding_window 4096"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "only full_attention"),
    ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}},
     "rope type 'yarn' is not supported .default or llama3"),
    ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "llama3"}},
     "llama3 rope scaling needs factor"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"attention_bias": True}, "attention_bias true is not supported for llama"),
    ({"vocab_size": None}, "c.json lacks vocab_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be an integer >= 1, got 0"),
    ({"hidden_size": 64.5}, "hidden_size must be an integer"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"head_dim": 15}, "head_dim 15 must be even"),
    ({"hidden_size": 66}, "hidden_size 66 is not a multiple of num_attention_heads 4"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({"rms_norm_eps": 0}, "c.json: rms_norm_eps must be a number > 0, got 0"),
    ({"rms_norm_eps": float("inf")}, "rms_norm_eps must be a number > 0, got inf"),
])
def test_what_the_decoder_does_not_run_is_named(over, message):
    with pytest.raises(PdmuxError, match=message):
        spec_from_config(config(**over), "m", "c.json")


def test_a_directory_or_a_config_file_or_a_preset(tmp_path):
    model_dir = tmp_path / "my-llama"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config()))
    by_dir, by_file = resolve_model(str(model_dir)), resolve_model(str(model_dir / "config.json"))
    assert by_dir == by_file and by_dir.name == "my-llama" and by_dir.layers == 2
    assert resolve_model("qwen3-8b") == model_preset("qwen3-8b")
    (tmp_path / "empty").mkdir()
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text("{")
    for path, message in (("empty", "holds no config.json"), ("missing.json", "no such file"),
                          ("list.json", "holds a JSON list"), ("broken.json", "cannot read")):
        with pytest.raises(PdmuxError, match=message):
            resolve_model(str(tmp_path / path))
    # there, but neither a file nor a directory
    with pytest.raises(PdmuxError, match="--model /dev/null is neither a config.json nor a "
                                         "Hugging Face model directory"):
        resolve_model("/dev/null")


@pytest.mark.parametrize("field, value, message", [
    ("layers", 0, "model qwen3-8b: layers must be an integer >= 1, got 0"),
    ("vocab", 1.5, "vocab must be an integer >= 1, got 1.5"),
    ("head_dim", True, "head_dim must be an integer >= 1, got True"),
    ("rms_eps", 0.0, "rms_eps must be a finite number > 0, got 0.0"),
    ("rope_theta", float("nan"), "rope_theta must be a finite number > 0, got nan"),
    ("kv_heads", 5, "q_heads 32 is not a multiple of kv_heads 5"),
])
def test_a_model_spec_checks_its_fields_as_a_result_file_brings_them(field, value, message):
    with pytest.raises(PdmuxError, match=message):
        dataclasses.replace(model_preset("qwen3-8b"), **{field: value})
