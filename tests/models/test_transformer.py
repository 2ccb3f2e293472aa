"""Transformer: KV-cache decoding equals the full forward, left padding, parameter count.

(Parity with transformers is in test_hf.py; sharded forwards in test_sharding.py.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import left_padded_batch, random_model
from flax import nnx

from jaxrl_frontier.models.kv_cache import init_cache
from jaxrl_frontier.models.layers import positions_from_mask
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.transformer import Transformer

BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
)
CONFIGS = {
    "llama": ModelConfig(**BASE),
    "llama3_rope_tied": ModelConfig(
        **BASE,
        tie_word_embeddings=True,
        rope_scaling=(
            ("factor", 4.0),
            ("high_freq_factor", 4.0),
            ("low_freq_factor", 1.0),
            ("original_max_position_embeddings", 8),
            ("rope_type", "llama3"),
        ),
    ),
    "qwen2": ModelConfig(**BASE, qkv_bias=True, family="qwen2"),
    "qwen3": ModelConfig(**BASE, head_dim=32, qk_norm=True, family="qwen3"),
}


# Eager forwards compile every op separately (slow on shared CPUs); jit compiles once.
forward = nnx.jit(lambda model, tokens, mask: model(tokens, mask))


# plain Llama is qwen2 without biases: three configs cover every code path at a third less
# compile time
@pytest.mark.parametrize("name", ["llama3_rope_tied", "qwen2", "qwen3"])
def test_kv_cache_decoding_matches_full_forward(name):
    cfg = CONFIGS[name]
    model = random_model(cfg)
    prompt_len, total = 6, 11
    tokens, prompt_mask = left_padded_batch(batch=3, length=prompt_len, seed=1)
    rng = np.random.RandomState(2)
    # completions are real tokens in every row, appended after the left-padded prompt
    tokens = np.concatenate([tokens, rng.randint(0, 128, (3, total - prompt_len))], 1)
    mask = np.concatenate([prompt_mask, np.ones((3, total - prompt_len), np.int32)], 1)
    tokens, mask = jnp.asarray(tokens, jnp.int32), jnp.asarray(mask)
    full = np.asarray(forward(model, tokens, mask))  # [B, T, V]
    positions = positions_from_mask(mask)

    step = nnx.jit(lambda m, t, a, p, c: m(t, a, positions=p, cache=c))
    cache = init_cache(cfg, batch_size=3, max_len=total)
    logits, cache = step(
        model, tokens[:, :prompt_len], mask[:, :prompt_len], positions[:, :prompt_len], cache
    )
    pieces = [np.asarray(logits)]
    for t in range(prompt_len, total):
        s = slice(t, t + 1)
        logits, cache = step(model, tokens[:, s], mask[:, s], positions[:, s], cache)
        pieces.append(np.asarray(logits))
    assert int(cache.index) == total
    decoded = np.concatenate(pieces, 1)

    real = np.asarray(mask, bool)
    diff = np.abs(decoded - full)[real].max()
    assert diff < 1e-5, f"{name}: cached decoding differs from full forward by {diff}"
    assert np.abs(full[real]).max() > 0.3  # the comparison is not between near-zero logits


def test_left_padding_does_not_change_logits():
    model = random_model(CONFIGS["qwen3"])
    seq = jax.random.randint(jax.random.key(0), (10,), 0, 128)
    # One call, two rows: row 0 holds the 7 tokens unpadded (then 3 more, which causal
    # attention hides from the first 7), row 1 the same 7 tokens after 3 padding slots.
    tokens = jnp.stack([seq, jnp.concatenate([jnp.zeros(3, seq.dtype), seq[:7]])])
    mask = jnp.array([[1] * 10, [0] * 3 + [1] * 7], jnp.int32)
    logits = np.asarray(forward(model, tokens, mask))
    np.testing.assert_allclose(logits[1, 3:], logits[0, :7], atol=1e-5)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_num_params_matches_state(name):
    cfg = CONFIGS[name]
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
    assert sum(int(np.prod(x.shape)) for x in leaves) == cfg.num_params()


def test_bfloat16_compute_close_to_f32():
    cfg = CONFIGS["qwen3"]
    f32 = random_model(cfg)
    bf16 = random_model(cfg.replace(dtype="bfloat16"))
    tokens, mask = left_padded_batch(batch=2, length=8)
    a = np.asarray(forward(f32, jnp.asarray(tokens), jnp.asarray(mask)))
    b = np.asarray(forward(bf16, jnp.asarray(tokens), jnp.asarray(mask)))
    assert b.dtype == np.float32  # logits come out in f32 whatever the compute dtype
    real = mask.astype(bool)
    assert np.abs(a - b)[real].max() < 0.05 * np.abs(a[real]).max()
