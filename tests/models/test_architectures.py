"""models/architectures.py: HF config.json <-> ModelConfig for every supported architecture
(round trips through transformers' own configs, the transformers-4 spellings, Gemma's layer
types and rope bases), and the settings that are refused."""

import pytest
from conftest import HF_CASES, TINY

from jaxrl_frontier.models.architectures import config_from_hf, config_to_hf
from jaxrl_frontier.models.model_config import ModelConfig

TINY_QWEN3 = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)


def test_config_round_trip():
    import transformers

    for case, (cls_name, extra) in sorted(HF_CASES.items()):
        hf_cfg = getattr(transformers, cls_name)(**TINY, **extra).to_dict()
        hf_cfg["architectures"] = [cls_name.replace("Config", "ForCausalLM")]
        cfg = config_from_hf(hf_cfg)
        assert config_from_hf(config_to_hf(cfg)) == cfg, case

    # transformers < 5 style: top-level rope_theta, rope_scaling with the old `type` key.
    llama3 = config_from_hf({**TINY_QWEN3, **_llama3_overrides()})
    assert llama3.rope_scaling == (
        ("factor", 8.0),
        ("high_freq_factor", 4.0),
        ("low_freq_factor", 1.0),
        ("original_max_position_embeddings", 8192),
        ("rope_type", "llama3"),
    )
    assert llama3.rope_theta == 500000.0
    written = config_to_hf(llama3)
    assert written["architectures"] == ["LlamaForCausalLM"] and written["model_type"] == "llama"
    assert written["rope_scaling"]["rope_type"] == "llama3"

    qwen3 = config_from_hf({**TINY_QWEN3, "architectures": ["Qwen3ForCausalLM"]})
    assert (qwen3.head_dim, qwen3.qk_norm, qwen3.qkv_bias, qwen3.family) == (
        32,
        True,
        False,
        "qwen3",
    )
    qwen2 = config_from_hf({**TINY_QWEN3, "architectures": ["Qwen2ForCausalLM"]})
    assert (qwen2.qkv_bias, qwen2.qk_norm, qwen2.family) == (True, False, "qwen2")
    # No `architectures` key: fall back to model_type.
    assert config_from_hf({**TINY_QWEN3, "model_type": "qwen2"}).family == "qwen2"


def _llama3_overrides():
    """A transformers<5-style config (top-level rope_theta, rope_scaling with `type`)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "rope_parameters": None,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(rope_scaling={"rope_type": "longrope", "factor": 4.0}),
            r"rope_scaling type 'longrope' is not supported",
        ),
        (dict(attention_bias=True), r"attention_bias=True is not supported for LlamaForCausalLM"),
        (dict(hidden_act="gelu"), r"hidden_act='gelu'"),
        (dict(hidden_size=None), r"missing required key 'hidden_size'"),
    ],
)
def test_error_unsupported_config(changes, message):
    config = {**TINY_QWEN3, "architectures": ["LlamaForCausalLM"], **changes}
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        config_from_hf(config)


def test_unknown_family_on_save():
    cfg = ModelConfig(128, 64, 128, 2, 4, 2, family="gpt2")
    with pytest.raises(ValueError, match=r"family='gpt2' has no HF architecture"):
        config_to_hf(cfg)


# Gemma configs as tests/models/test_gemma.py builds them
GEMMA_BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    query_pre_attn_scalar=24,
    sliding_window=4,
)
GEMMA_LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention"]
GEMMA_CASES = {
    "gemma2": (
        "Gemma2Config",
        dict(num_hidden_layers=2, attn_logit_softcapping=1.0, final_logit_softcapping=3.0),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=3,
            layer_types=GEMMA_LAYER_TYPES,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
    ),
}


def test_gemma_config_mapping_and_errors():
    import transformers

    for case, (cls_name, extra) in sorted(GEMMA_CASES.items()):
        hf_cfg = getattr(transformers, cls_name)(**GEMMA_BASE, **extra).to_dict()
        hf_cfg["architectures"] = [{"gemma2": "Gemma2ForCausalLM"}.get(case, "Gemma3ForCausalLM")]
        cfg = config_from_hf(hf_cfg)
        assert config_from_hf(config_to_hf(cfg)) == cfg, case
        assert cfg.tie_word_embeddings and cfg.norm_plus_one and cfg.sandwich_norms
    assert cfg.layer_types == tuple(GEMMA_LAYER_TYPES) and cfg.qk_norm
    assert (cfg.rope_theta, cfg.rope_local_theta) == (1e6, 1e4)
    assert cfg.rope_scaling == (("factor", 2.0), ("rope_type", "linear"))

    # transformers-4 style Gemma 3 (google/gemma-3-1b-it's keys): pattern and local base
    v4 = {
        "architectures": ["Gemma3ForCausalLM"],
        **{k: v for k, v in GEMMA_BASE.items()},
        "num_hidden_layers": 7,
        "rope_theta": 1000000,
        "rope_local_base_freq": 10000,
        "rope_scaling": None,
        "sliding_window_pattern": 6,
        "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    }
    cfg = config_from_hf(v4)
    assert cfg.sliding_layers == (True,) * 5 + (False, True)
    # fewer layers (a speculative shallow draft) keep the first layers' types; more repeat
    assert cfg.replace(num_layers=2).sliding_layers == (True, True)
    assert cfg.replace(num_layers=9).sliding_layers == (True,) * 5 + (False, True, True, True)
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_scaling) == (1e6, 1e4, None)
    # Gemma 2 without layer_types alternates, layer 0 sliding
    g2 = {**v4, "architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 4}
    assert config_from_hf(g2).sliding_layers == (True, False, True, False)

    bad = {
        "hidden_activation": ("gelu_new", "hidden_activation='gelu_new'"),
        "attention_bias": (True, "attention_bias=True"),
        "use_bidirectional_attention": (True, "use_bidirectional_attention"),
        "attn_logit_softcapping": (50.0, "attn_logit_softcapping"),
        "rope_scaling": ({"rope_type": "yarn", "factor": 2.0}, "'yarn'"),
        "layer_types": (["full_attention"] * 6 + ["chunked_attention"], "chunked_attention"),
    }
    for key, (value, message) in bad.items():
        with pytest.raises(ValueError, match=message):
            config_from_hf({**v4, key: value})
