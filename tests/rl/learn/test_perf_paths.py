"""The fast paths equal the plain ones: the chunked, fused output layer + log-softmax
(`token_stats_from_hidden`) against `token_logprobs` / `token_entropy` of the full logits,
values and gradients; the trainer's fused loss against the logits loss; and block remat."""

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SMALL_MODEL, assert_same_loss_and_grads
from flax import nnx

from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.objectives import logprobs
from jaxrl_frontier.rl.learn.forward import make_logp_fn
from jaxrl_frontier.rl.learn.loss import rl_loss
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run.build import objective_section
from jaxrl_frontier.train.sft import sft_loss

B, T, D, V = 3, 11, 16, 37


def _inputs(seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    h = jax.random.normal(k[0], (B, T, D), jnp.float32)
    w = 0.5 * jax.random.normal(k[1], (D, V), jnp.float32)
    tok = jax.random.randint(k[2], (B, T), 0, V)
    return h, w, tok


@pytest.mark.parametrize("chunk", [1, 4, 7, 256])  # 7 does not divide B * (T - 1) = 30
def test_chunked_logprobs_equal_plain(chunk):
    h, w, tok = _inputs()
    plain = logprobs.token_logprobs(h @ w, tok)
    fused = logprobs.token_logprobs_from_hidden(h, w, tok, chunk)
    np.testing.assert_allclose(fused, plain, atol=1e-5, rtol=0)
    logp, ent = logprobs.token_stats_from_hidden(h, w, tok, chunk, entropy=True)
    np.testing.assert_allclose(logp, plain, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ent, logprobs.token_entropy(h @ w), atol=1e-5, rtol=0)
    assert fused.shape == (B, T) and float(jnp.abs(fused[:, 0]).max()) == 0.0


@pytest.mark.parametrize("chunk", [4, 7])
def test_chunked_logprob_gradients_equal_plain(chunk):
    h, w, tok = _inputs(1)
    c = jax.random.normal(jax.random.key(9), (B, T))  # a generic cotangent

    def plain(h, w):
        return jnp.sum(c * logprobs.token_logprobs(h @ w, tok)) + jnp.sum(
            c**2 * logprobs.token_entropy(h @ w)
        )

    def fused(h, w):
        logp, ent = logprobs.token_stats_from_hidden(h, w, tok, chunk, entropy=True)
        return jnp.sum(c * logp) + jnp.sum(c**2 * ent)

    gp, gf = jax.grad(plain, (0, 1))(h, w), jax.grad(fused, (0, 1))(h, w)
    for a, b in zip(gp, gf):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-5)


def test_entropy_metric_only_has_no_gradient():
    h, w, tok = _inputs(2)

    def f(h):
        return jnp.sum(
            logprobs.token_stats_from_hidden(h, w, tok, 8, entropy=True, entropy_grad=False)[1]
        )

    assert float(jnp.abs(jax.grad(f)(h)).max()) == 0.0


def _tiny_model(remat=False):
    return Transformer(ModelConfig(vocab_size=V, **SMALL_MODEL, remat=remat), rngs=nnx.Rngs(0))


def _rl_batch(seed=0):
    rng = np.random.default_rng(seed)
    mask = np.zeros((4, 9), np.float32)
    mask[:, 3:] = 1.0
    return dict(
        tokens=jnp.asarray(rng.integers(1, V, (4, 9)), jnp.int32),
        attention_mask=jnp.asarray(np.ones((4, 9)), jnp.int32),
        loss_mask=jnp.asarray(mask),
        old_logp=jnp.asarray(-rng.exponential(2.0, (4, 9)) * mask, jnp.float32),
        advantages=jnp.asarray(rng.normal(size=(4, 1)) * mask, jnp.float32),
    )


@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_trainer_fused_rl_loss_equals_logits_loss(entropy_coef):
    graphdef, params = nnx.split(_tiny_model())
    objective = objective_section(config_lib.base_config().objective)
    objective = replace(objective, entropy_coef=entropy_coef)
    batch = _rl_batch()
    outs = []
    for chunk in (None, 5):
        loss_of = rl_loss(graphdef, objective, logprob_chunk=chunk)
        outs.append(jax.value_and_grad(loss_of, has_aux=True)(params, batch))
    assert_same_loss_and_grads(*outs)


def test_trainer_fused_sft_loss_and_logp_fn_equal_plain():
    graphdef, params = nnx.split(_tiny_model())
    batch = {
        k: v for k, v in _rl_batch(1).items() if k in ("tokens", "attention_mask", "loss_mask")
    }
    (l0, _), g0 = jax.value_and_grad(sft_loss(graphdef, None), has_aux=True)(params, batch)
    (l1, _), g1 = jax.value_and_grad(sft_loss(graphdef, 6), has_aux=True)(params, batch)
    np.testing.assert_allclose(l1, l0, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-4)
    args = (params, batch["tokens"], batch["attention_mask"])
    np.testing.assert_allclose(
        make_logp_fn(graphdef, 6)(*args), make_logp_fn(graphdef, None)(*args), atol=1e-5
    )


def test_remat_blocks_give_the_same_loss_and_gradients():
    batch = _rl_batch(2)
    objective = objective_section(config_lib.base_config().objective)
    outs = []
    for remat in (False, True):
        graphdef, params = nnx.split(_tiny_model(remat))
        loss_of = rl_loss(graphdef, objective)
        outs.append(jax.value_and_grad(loss_of, has_aux=True)(params, batch))
    ((l0, _), g0), ((l1, _), g1) = outs
    np.testing.assert_allclose(l1, l0, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(b, a, atol=1e-6, rtol=1e-5)


def _grads_by_model_option(batch, **option):
    graphdef, params = nnx.split(
        Transformer(ModelConfig(vocab_size=V, **SMALL_MODEL, **option), rngs=nnx.Rngs(0))
    )
    objective = objective_section(config_lib.base_config().objective)
    return jax.jit(jax.value_and_grad(rl_loss(graphdef, objective), has_aux=True))(params, batch)


@pytest.mark.parametrize(
    "option", [dict(scan_unroll=0), dict(scan_unroll=2), dict(attention="dot_product")]
)
def test_update_speed_options_keep_the_loss_and_gradient(option):
    """Each speed option of the update (`model.scan_unroll`, `model.attention`) computes the
    same loss and gradient as the scanned, einsum-attention model, to f32 rounding: every
    gradient element within 1e-6 of its leaf's largest (a few ulps of it, the order in which
    XLA sums per-layer and per-head terms being all that changes)."""
    batch = _rl_batch(3)
    ((l0, m0), g0), ((l1, m1), g1) = (
        _grads_by_model_option(batch),
        _grads_by_model_option(batch, **option),
    )
    np.testing.assert_allclose(l1, l0, rtol=1e-6, atol=0)
    assert set(m0) == set(m1)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g0), jax.tree.leaves(g1)):
        scale = float(jnp.abs(a).max())
        assert scale > 0, path
        np.testing.assert_allclose(b, a, atol=1e-6 * scale, rtol=0, err_msg=str(path))


def test_unknown_attention_and_negative_unroll_are_refused():
    with pytest.raises(ValueError, match="attention='flash'.*allowed"):
        ModelConfig(vocab_size=V, **SMALL_MODEL, attention="flash")
    with pytest.raises(ValueError, match="scan_unroll=-1"):
        ModelConfig(vocab_size=V, **SMALL_MODEL, scan_unroll=-1)


def test_dot_product_attention_prefills_and_decodes_like_the_einsums():
    """With a cache ([B, K, S, Dh]: transposed for the call) the prefill of left-padded
    prompts and the next token's logits agree between attention implementations to f32
    rounding of logits of size ~1 (1e-5)."""
    tokens = jnp.asarray(np.random.default_rng(4).integers(1, V, (2, 6)), jnp.int32)
    mask = jnp.asarray([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], jnp.int32)
    outs = []
    for impl in ("xla", "dot_product"):
        model = Transformer(
            ModelConfig(vocab_size=V, **SMALL_MODEL, attention=impl), rngs=nnx.Rngs(0)
        )
        logits, cache = model(tokens, mask, cache=model.init_cache(2, 8))
        pos = jnp.sum(mask, axis=1, keepdims=True)
        step, _ = model(tokens[:, -1:], None, positions=pos, cache=cache)
        outs.append((logits[:, -1], step[:, 0]))
    for a, b in zip(*outs):
        assert float(jnp.abs(a).max()) > 0.1
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
