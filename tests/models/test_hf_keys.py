"""The config.json keys every family shares (models/hf_keys.py): a missing key is named, the
shape is read as `ModelConfig`'s fields, and the shared keys are written from a config."""

import pytest

from jaxrl_frontier.models.hf_keys import require, shape_from_hf, shared_to_hf
from jaxrl_frontier.models.model_config import ModelConfig


def test_a_missing_key_is_named():
    with pytest.raises(ValueError, match="missing required key 'vocab_size'"):
        require({}, "vocab_size")


def test_shape_from_hf_reads_the_shape_and_defaults_kv_heads_to_heads():
    hf = {"vocab_size": "64", "hidden_size": 32, "intermediate_size": 48}
    assert shape_from_hf(hf, heads=4, head_dim=8) == dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=4,
        head_dim=8,
    )  # fmt: skip
    assert shape_from_hf({**hf, "num_key_value_heads": 2}, 4, 8)["num_kv_heads"] == 2
    with pytest.raises(ValueError, match="'intermediate_size'"):
        shape_from_hf({"vocab_size": 64, "hidden_size": 32}, 4, 8)


def test_shared_to_hf_writes_the_config_and_both_dtype_spellings():
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3,
                      num_heads=4, num_kv_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=True)  # fmt: skip
    out = shared_to_hf("LlamaForCausalLM", "llama", cfg, "bfloat16")
    assert out == {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
        "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "max_position_embeddings": cfg.max_position_embeddings, "tie_word_embeddings": True,
        "attention_dropout": 0.0, "torch_dtype": "bfloat16", "dtype": "bfloat16",
    }  # fmt: skip
