"""models/model_config.py: ModelConfig's checks (each field that names a table is checked
against it), the layer pattern repeated or cut to the layer count, and the parameter count
by hand."""

import pytest

from jaxrl_frontier.models.model_config import (
    ACTIVATIONS,
    LAYER_TYPES,
    MOE_DISPATCH,
    MOE_IMPLS,
    REMAT_POLICIES,
    ModelConfig,
)

BASE = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2
)


def test_each_field_is_checked_against_its_table():
    with pytest.raises(ValueError, match=r"num_heads=4 must be a multiple of num_kv_heads=3"):
        ModelConfig(**{**BASE, "num_kv_heads": 3})
    bad = dict(
        dtype=("float16", "dtype='float16'"),
        attention=("flash9", "attention='flash9'"),
        hidden_act=("relu", "hidden_act='relu'"),
        remat=("some", "remat='some'"),
        moe_impl=("sparse", "moe_impl='sparse'"),
        moe_dispatch=("scatter", "moe_dispatch='scatter'"),
        moe_capacity_factor=(-1.0, "moe_capacity_factor=-1.0"),
        scan_unroll=(-1, "scan_unroll=-1"),
        layer_types=(("chunked_attention",), "layer_types="),
    )
    for key, (value, message) in bad.items():
        with pytest.raises(ValueError, match=message):
            ModelConfig(**BASE, **{key: value})
    with pytest.raises(ValueError, match="sliding layers, which need a window > 0"):
        ModelConfig(**BASE, layer_types=("sliding_attention",))
    with pytest.raises(ValueError, match="num_experts=4 needs 0 < num_experts_per_tok"):
        ModelConfig(**BASE, num_experts=4)
    with pytest.raises(ValueError, match="linear_attention layers need linear_num_key_heads"):
        ModelConfig(**BASE, layer_types=("linear_attention", "full_attention"))
    assert set(LAYER_TYPES) == {"full_attention", "sliding_attention", "linear_attention"}
    assert {"silu", "gelu_pytorch_tanh"} <= set(ACTIVATIONS)
    assert {False, True, "none", "full", "dots_saveable"} == set(REMAT_POLICIES)
    assert (MOE_IMPLS, MOE_DISPATCH) == (("auto", "ragged", "dense"), ("gather", "all_to_all"))


def test_the_layer_pattern_repeats_or_is_cut_to_the_layers():
    cfg = ModelConfig(
        **{**BASE, "num_layers": 5},
        layer_types=("sliding_attention", "full_attention"),
        sliding_window=8,
    )
    assert cfg.sliding_layers == (True, False, True, False, True) and cfg.per_layer_attention
    assert cfg.replace(num_layers=1).layer_types == ("sliding_attention",)
    assert not ModelConfig(**BASE).per_layer_attention
    assert ModelConfig(**BASE).resolved_head_dim == 16
    assert ModelConfig(**BASE, head_dim=32).resolved_head_dim == 32


def test_num_params_by_hand():
    # head 16: q, o 64 x 64 each, k, v 64 x 32 each = 12,288; MLP 3 x 64 x 128 = 24,576;
    # two norms 128: a layer 36,992. Embeddings 128 x 64, untied: x 2. The final norm: 64.
    assert ModelConfig(**BASE).num_params() == 2 * 36_992 + 2 * 8_192 + 64
    assert ModelConfig(**BASE, tie_word_embeddings=True).num_params() == 2 * 36_992 + 8_192 + 64
    # Qwen2's biases: 16 x (4 + 2 + 2) a layer; Qwen3's q and k norms: 2 x 16 a layer
    assert ModelConfig(**BASE, qkv_bias=True).num_params() == 90_432 + 2 * 128
    assert ModelConfig(**BASE, qk_norm=True).num_params() == 90_432 + 2 * 32
    # Gemma's sandwich norms: two more norms a layer
    assert ModelConfig(**BASE, sandwich_norms=True).num_params() == 90_432 + 2 * 128
