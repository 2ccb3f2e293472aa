"""The hybrid model's own pieces (models/hybrid.py), by hand: which class a config builds and
the partial RoPE of Qwen3.5's full-attention heads. (The gated attention and the whole model
against transformers, its refusals and its decode: tests/models/test_qwen3_5.py.)

Tolerance: f32, a handful of multiply-adds per element: 1e-6."""

import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.models.hybrid import HybridTransformer, model_class, partial_rope
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.transformer import Transformer

DENSE = ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=16, num_layers=2,
                    num_heads=2, num_kv_heads=1, head_dim=8)  # fmt: skip
HYBRID = DENSE.replace(
    layer_types=("linear_attention", "full_attention"), linear_num_key_heads=1,
    linear_num_value_heads=2, linear_key_head_dim=4, linear_value_head_dim=4,
    linear_conv_kernel_dim=2, attn_output_gate=True, partial_rotary_factor=0.5,
    qk_norm=True, norm_plus_one=True,
)  # fmt: skip


def test_a_config_with_linear_layers_builds_the_hybrid_model():
    assert model_class(DENSE) is Transformer
    assert model_class(HYBRID) is HybridTransformer


def test_partial_rope_rotates_the_first_dims_only():
    """Head width 8, rope_dim 4: dims 0-3 rotated by rotate-half at angle p * f_i (f = two
    frequencies), dims 4-7 as they were."""
    x = jnp.asarray(np.random.RandomState(0).randn(1, 3, 1, 8), jnp.float32)
    pos = jnp.asarray([[0, 1, 5]])
    inv_freq = jnp.asarray([1.0, 0.1])
    out = np.asarray(partial_rope(x, pos, inv_freq, 4))
    xs = np.asarray(x)
    np.testing.assert_array_equal(out[..., 4:], xs[..., 4:])
    for t, p in enumerate([0, 1, 5]):
        for i, f in enumerate([1.0, 0.1]):
            c, s = np.cos(p * f), np.sin(p * f)
            a, b = xs[0, t, 0, i], xs[0, t, 0, i + 2]
            np.testing.assert_allclose(out[0, t, 0, [i, i + 2]], [a * c - b * s, b * c + a * s],
                                       atol=1e-6)  # fmt: skip
