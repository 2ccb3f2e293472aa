"""The HF tensor map (models/tensor_map.py): each tensor's name, our parameter path and the
layout change on hand-made arrays, both ways; the tensors each config adds (Qwen2's biases,
Qwen3's q/k norms, a tied head, experts). Checkpoints against transformers: test_hf.py."""

import numpy as np

from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.tensor_map import tensor_specs

# D = 4, H = 2 heads of Dh = 2, K = 1 kv head, F = 6, V = 5, L = 2
BASE = dict(vocab_size=5, hidden_size=4, intermediate_size=6, num_layers=2, num_heads=2)


def _specs(**kw):
    return {s.hf_name: s for s in tensor_specs(ModelConfig(**{**BASE, "num_kv_heads": 1, **kw}))}


def test_llama_tensors_their_paths_and_layers():
    specs = _specs()
    # embed + final norm + head + per layer: 2 norms, q/k/v/o, gate/up/down
    assert len(specs) == 3 + 2 * 9
    q = specs["model.layers.1.self_attn.q_proj.weight"]
    assert (q.path, q.layer, q.hf_shape, q.shape) == (
        ("layers", "attn", "q_proj"), 1, (4, 4), (4, 2, 2)
    )  # fmt: skip
    assert specs["lm_head.weight"].layer is None and specs["lm_head.weight"].index == ()
    assert specs["model.layers.0.post_attention_layernorm.weight"].path == (
        "layers", "post_attn_norm", "weight"
    )  # fmt: skip


def test_layout_change_by_hand_and_back():
    specs = _specs()
    q = specs["model.layers.0.self_attn.q_proj.weight"]
    w_hf = np.arange(16, dtype=np.float32).reshape(4, 4)  # [H*Dh, D]: row = output h*Dh + j
    ours = q.to_ours(w_hf)  # [D, H, Dh]: ours[d, h, j] = w_hf[h * Dh + j, d]
    assert ours[3, 1, 0] == w_hf[2, 3] and ours[0, 0, 1] == w_hf[1, 0]
    np.testing.assert_array_equal(q.to_hf(ours), w_hf)
    o = specs["model.layers.0.self_attn.o_proj.weight"]  # [D, H*Dh] -> [H, Dh, D]
    w_hf = np.arange(16, dtype=np.float32).reshape(4, 4)
    assert o.to_ours(w_hf)[1, 0, 3] == w_hf[3, 2]
    np.testing.assert_array_equal(o.to_hf(o.to_ours(w_hf)), w_hf)
    norm = specs["model.norm.weight"]  # not a Linear: reshaped only
    np.testing.assert_array_equal(norm.to_ours(np.arange(4.0)), np.arange(4.0))


def test_each_config_adds_its_tensors():
    base = set(_specs())
    qwen2 = set(_specs(qkv_bias=True)) - base
    assert qwen2 == {f"model.layers.{i}.self_attn.{p}_proj.bias" for i in (0, 1) for p in "qkv"}
    qwen3 = set(_specs(qk_norm=True)) - base
    assert qwen3 == {f"model.layers.{i}.self_attn.{p}_norm.weight" for i in (0, 1) for p in "qk"}
    assert base - set(_specs(tie_word_embeddings=True)) == {"lm_head.weight"}


def test_experts_fill_the_expert_axis():
    specs = _specs(num_experts=3, moe_intermediate_size=2, num_experts_per_tok=1)
    up = specs["model.layers.1.mlp.experts.2.up_proj.weight"]
    assert (up.path, up.index, up.hf_shape, up.shape) == (
        ("layers", "mlp", "expert_up"), (1, 2), (2, 4), (4, 2)
    )  # fmt: skip
    assert "model.layers.0.mlp.gate_proj.weight" not in specs  # no dense MLP beside them
    assert specs["model.layers.0.mlp.gate.weight"].shape == (4, 3)  # the router [D, E]
