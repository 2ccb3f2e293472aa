"""Critic: GAE against a NumPy reference (masked observation tokens, bootstrap), the clipped
value loss on hand-computed numbers, value metrics, turn rewards on tokens, both critics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.rl.methods import critic


def gae_reference(rewards, values, mask, gamma, lam, last_value=None):
    """Plain loops: the policy tokens of each row, in order, are the MDP's steps."""
    B, T = rewards.shape
    adv = np.zeros((B, T))
    for b in range(B):
        steps = [t for t in range(T) if mask[b, t]]
        next_v = 0.0 if last_value is None else last_value[b]
        running = 0.0
        for t in reversed(steps):
            delta = rewards[b, t] + gamma * next_v - values[b, t]
            running = delta + gamma * lam * running
            adv[b, t] = running
            next_v = values[b, t]
    return adv, (adv + values) * mask


def test_gae_matches_numpy_reference_with_masked_observations():
    rng = np.random.default_rng(0)
    B, T = 4, 13
    rewards = rng.normal(size=(B, T))
    values = rng.normal(size=(B, T))
    mask = (rng.random((B, T)) < 0.6).astype(np.float32)
    mask[:, 0] = 0  # column 0 is never a sampled token
    mask[3] = 0  # a row with no policy token
    last = rng.normal(size=B)
    for gamma, lam, lv in [
        (1.0, 1.0, None),
        (0.9, 0.95, None),
        (0.99, 0.0, last),
        (0.5, 0.7, last),
    ]:
        adv, ret = jax.jit(critic.gae, static_argnums=(3, 4))(
            jnp.asarray(rewards),
            jnp.asarray(values),
            jnp.asarray(mask),
            gamma,
            lam,
            None if lv is None else jnp.asarray(lv),
        )
        ref_adv, ref_ret = gae_reference(rewards, values, mask, gamma, lam, lv)
        np.testing.assert_allclose(np.asarray(adv), ref_adv * mask, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(ret), ref_ret, rtol=1e-5, atol=1e-5)
        assert np.all(np.asarray(adv)[mask == 0] == 0)


def test_gae_hand_computed_two_turns_skips_observation():
    # tokens: [prompt, a1, a2, obs, obs, a3]; rewards on a2 (turn 0) and a3 (turn 1)
    mask = jnp.asarray([[0, 1, 1, 0, 0, 1]], jnp.float32)
    values = jnp.asarray([[9.0, 0.5, 0.4, 7.0, 7.0, 0.2]])  # observation values are never read
    rewards = jnp.asarray([[5.0, 0.0, 0.1, 3.0, 3.0, 1.0]])  # rewards off the mask are ignored
    adv, ret = critic.gae(rewards, values, mask, gamma=0.5, lam=0.5)
    # a3: delta = 1 - 0.2 = 0.8; a2: delta = 0.1 + 0.5*0.2 - 0.4 = -0.2, A = -0.2 + 0.25*0.8 = 0
    # a1: delta = 0 + 0.5*0.4 - 0.5 = -0.3, A = -0.3 + 0.25*0 = -0.3
    np.testing.assert_allclose(np.asarray(adv), [[0, -0.3, 0.0, 0, 0, 0.8]], atol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), [[0, 0.2, 0.4, 0, 0, 1.0]], atol=1e-6)


def test_turn_rewards_on_last_policy_token_of_each_turn():
    turn = jnp.asarray([[0, 0, 0, 0, 1, 1, 1, 2, 2]])
    mask = jnp.asarray([[0, 1, 1, 0, 1, 1, 0, 1, 0]])  # turn 1 ends with an observation token
    out = critic.turn_rewards_to_tokens(jnp.asarray([[0.5, -1.0, 2.0]]), turn, mask)
    np.testing.assert_allclose(np.asarray(out), [[0, 0, 0.5, 0, 0, -1.0, 0, 2.0, 0]])


def test_value_loss_clipping_hand_computed():
    V = jnp.asarray([[1.5, 0.0, 2.0, 9.0]])
    V_old = jnp.asarray([[1.0, 0.0, 2.0, 0.0]])
    R = jnp.asarray([[1.0, 1.0, 2.5, 0.0]])
    mask = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])
    loss, m = critic.value_loss(V, V_old, R, mask, clip_eps=0.2)
    # token 0: plain (0.5)^2 = 0.25, clipped V = 1.2 -> 0.04; max 0.25 (not clipped)
    # token 1: plain 1, clipped V = 0 -> 1; max 1 (equal: not counted as clipped)
    # token 2: plain 0.25, clipped V = 2.0 -> 0.25
    # token 3: masked. loss = (0.25 + 1 + 0.25) / 2 / 3 = 0.25
    np.testing.assert_allclose(float(loss), 0.25, rtol=1e-6)
    np.testing.assert_allclose(float(m["value/clip_frac"]), 0.0)
    np.testing.assert_allclose(float(m["value/mse"]), 1.5 / 3, rtol=1e-6)
    # the clipped branch wins: V moved away from R beyond eps
    V2 = jnp.asarray([[0.5, 0.0, 2.0, 0.0]])
    loss2, m2 = critic.value_loss(V2, V_old, jnp.asarray([[2.0, 1.0, 2.5, 0.0]]), mask, 0.2)
    # token 0: plain (0.5-2)^2 = 2.25, clipped V = 0.8 -> 1.44; max 2.25
    # token 1: plain 1, clipped 1; token 2: 0.25, 0.25
    np.testing.assert_allclose(float(loss2), (2.25 + 1 + 0.25) / 6, rtol=1e-6)
    V3 = jnp.asarray([[1.5, 0.0, 2.0, 0.0]])
    loss3, m3 = critic.value_loss(V3, V_old, jnp.asarray([[1.4, 1.0, 2.5, 0.0]]), mask, 0.2)
    # token 0: plain (0.1)^2 = 0.01, clipped V = 1.2 -> 0.04: the clipped term is taken
    np.testing.assert_allclose(float(loss3), (0.04 + 1 + 0.25) / 6, rtol=1e-5)
    np.testing.assert_allclose(float(m3["value/clip_frac"]), 1 / 3, rtol=1e-6)
    # and its gradient is zero on that token (clipped: V's change no longer counts)
    g = jax.grad(
        lambda v: critic.value_loss(v, V_old, jnp.asarray([[1.4, 1.0, 2.5, 0.0]]), mask, 0.2)[0]
    )(V3)
    np.testing.assert_allclose(np.asarray(g), [[0.0, -1 / 3, -0.5 / 3, 0.0]], atol=1e-6)
    unclipped, _ = critic.value_loss(V3, V_old, jnp.asarray([[1.4, 1.0, 2.5, 0.0]]), mask, None)
    np.testing.assert_allclose(float(unclipped), (0.01 + 1 + 0.25) / 6, rtol=1e-5)


def test_value_metrics():
    mask = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])
    R = jnp.asarray([[1.0, 2.0, 3.0, 100.0]])
    m = critic.value_metrics(R, R, mask)
    np.testing.assert_allclose(float(m["value/explained_variance"]), 1.0)
    m = critic.value_metrics(jnp.full((1, 4), 2.0), R, mask)  # a constant at the mean
    np.testing.assert_allclose(float(m["value/explained_variance"]), 0.0, atol=1e-6)
    np.testing.assert_allclose(float(m["value/mean"]), 2.0)
    np.testing.assert_allclose(float(m["value/return_mean"]), 2.0)


def tiny_cfg():
    return ModelConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        max_position_embeddings=32,
    )


@pytest.mark.parametrize("kind", ["head", "model"])
def test_critics_shapes_alignment_and_training(kind):
    cfg = tiny_cfg()
    c = critic.make_critic(
        kind, cfg, rngs=nnx.Rngs(0), **({"hidden_size": 8} if kind == "model" else {})
    )
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 32, size=(2, 6)), jnp.int32)
    am = jnp.ones((2, 6), jnp.int32)
    hidden = jnp.asarray(np.random.default_rng(2).normal(size=(2, 6, 16)), jnp.float32)
    graphdef, params = nnx.split(c)
    values_fn = jax.jit(lambda p, t: nnx.merge(graphdef, p).values(t, am, hidden))
    v = values_fn(params, tokens)
    assert v.shape == (2, 6)
    np.testing.assert_allclose(np.asarray(v), 0.0)  # zero-initialised head
    # a few steps of the value loss on fixed targets lower it
    mask = jnp.asarray([[0, 1, 1, 1, 0, 1], [0, 0, 1, 1, 1, 1]], jnp.float32)
    R = jnp.asarray(np.random.default_rng(3).normal(size=(2, 6)), jnp.float32)

    @jax.jit
    def sgd(p):
        def loss_fn(p):
            return critic.value_loss(values_fn(p, tokens), v, R, mask, None)[0]

        loss, g = jax.value_and_grad(loss_fn)(p)
        return loss, jax.tree.map(lambda a, b: a - 0.05 * b, p, g)

    first, params = sgd(params)
    for _ in range(10):
        last, params = sgd(params)
    assert float(last) < float(first)
    # values are aligned: column 0 is 0 and column t reads position t-1 (changing the last
    # token changes no value)
    v1 = values_fn(params, tokens)
    v2 = values_fn(params, tokens.at[:, -1].set(0))
    np.testing.assert_allclose(np.asarray(v1[:, 0]), 0.0)
    np.testing.assert_allclose(np.asarray(v1), np.asarray(v2), atol=1e-6)
    if kind == "head":
        head = nnx.merge(graphdef, params)
        ref = np.asarray(hidden[:, :-1]) @ np.asarray(head.w[...]) + float(head.b[...])
        np.testing.assert_allclose(np.asarray(v1[:, 1:]), ref, rtol=1e-5, atol=1e-6)


def test_head_needs_hidden_and_unknown_kind():
    c = critic.make_critic("head", tiny_cfg(), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="hidden"):
        c.values(jnp.zeros((1, 3), jnp.int32), jnp.ones((1, 3), jnp.int32))
    with pytest.raises(KeyError, match="head, model"):
        critic.make_critic("mlp", tiny_cfg(), rngs=nnx.Rngs(0))
