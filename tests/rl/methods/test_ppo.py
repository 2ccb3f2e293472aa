"""PPO with a learned critic (rl/methods/ppo.py) wired into the Learner: the update trains the critic
and its value loss falls on a fixed batch; the Experience's GAE advantages equal a NumPy
reference (sequence rewards on the last policy token, per-turn rewards from a multi-turn
row, the KL in the reward); gradient accumulation is exact for the value loss; the critic
survives a checkpoint round trip and the run continues as an uninterrupted one; with
critic.kind = 'none' nothing is added."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import SMALL_MODEL, random_model
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.learn.forward import apply_hidden
from jaxrl_frontier.rl.learn.learner import Learner, LearnerOptions
from jaxrl_frontier.rl.learn.loss import rl_loss
from jaxrl_frontier.rl.learn.train_step import init_train_state
from jaxrl_frontier.rl.methods import critic as critic_lib
from jaxrl_frontier.rl.methods import ppo
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run.config import sections
from jaxrl_frontier.train.checkpoint import Checkpointer, abstract_like

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
VOCAB, ROWS, T, TP = 20, 8, 8, 4
MODEL = dict(SMALL_MODEL, num_layers=1)  # compiling the update is most of each test
OBJECTIVE = dict(weight="ppo_clip", aggregation="token_mean", advantage="gae")


def gae_reference(rewards, values, mask, gamma, lam):
    """Plain loops over each row's policy tokens (the MDP's steps), episodes ended."""
    adv = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        next_v, running = 0.0, 0.0
        for t in reversed([t for t in range(rewards.shape[1]) if mask[b, t]]):
            running = rewards[b, t] + gamma * next_v - values[b, t] + gamma * lam * running
            adv[b, t], next_v = running, values[b, t]
    return adv, (adv + values) * mask


def experience(seed=0, gaps=True) -> Experience:
    """ROWS rows of [prompt TP | completion T - TP], groups of 4 sharing a prompt; with gaps
    a masked observation token in the middle of some completions (a multi-turn row)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, T - TP + 1, ROWS)
    mask = ((np.arange(T)[None] >= TP) & (np.arange(T)[None] < TP + lengths[:, None])).astype(
        np.float32
    )
    if gaps:
        mask[::3, TP + 1] = 0.0  # an observation between two turns
    tokens = rng.integers(4, VOCAB, (ROWS, T))
    tokens[:, :TP] = np.repeat(tokens[::4, :TP], 4, 0)
    turn = np.where(np.arange(T)[None] > TP + 1, 1, 0) * (mask[:, [TP + 1]] == 0)
    return Experience(
        tokens=jnp.asarray(tokens, jnp.int32),
        attention_mask=jnp.asarray(np.arange(T)[None] < TP + lengths[:, None], jnp.int32),
        loss_mask=jnp.asarray(mask),
        old_logp=jnp.asarray(-rng.exponential(1.0, (ROWS, T)) * mask, jnp.float32),
        advantages=jnp.zeros((ROWS, T)),
        rewards=jnp.asarray(rng.integers(0, 2, (ROWS, 2)), jnp.float32),
        prompt_index=jnp.zeros(ROWS, jnp.int32),
        group_id=jnp.arange(ROWS) // 4,
        policy_version=jnp.zeros(ROWS, jnp.int32),
        turn_index=jnp.asarray(turn, jnp.int32),
        ref_logp=jnp.asarray(-rng.exponential(1.0, (ROWS, T)) * mask, jnp.float32),
    )


def make_learner(kind="head", *, grad_accum=1, epochs=1, minibatches=1, beta=0.0, whiten=False):
    cfg = ModelConfig(vocab_size=VOCAB, max_position_embeddings=32, **MODEL)
    policy = random_model(cfg)
    graphdef, params = nnx.split(policy)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    kwargs = dict(hidden_size=16, num_layers=1) if kind == "model" else {}
    module = critic_lib.make_critic(kind, cfg, rngs=nnx.Rngs(params=0), **kwargs)
    layout = dict(group_size=1, completion_len=T - TP)
    critic = ppo.Critic(
        module,
        kind=kind,
        tx=optax.adam(3e-2),
        mesh=mesh,
        policy_graphdef=graphdef,
        layout=layout,
        reward_weights=jnp.asarray([1.0, 0.5]),
        options=ppo.GAEOptions(
            gamma=0.9, lam=0.8, value_clip=None, whiten=whiten, kl_coef_in_reward=beta
        ),
    )
    tx = optax.adam(1e-3)
    # placed on the mesh as the trainer places them (else the update's NamedSharding outputs
    # would recompile every program once)
    placed = jax.device_put(params, sharding.state_shardings(params, mesh))
    state = init_train_state(tx, placed, mesh, jax.random.key(0))
    state = state.replace(critic=critic.init_state())
    options = LearnerOptions(
        objective=OBJECTIVE,
        rows=ROWS,
        group_size=4,
        completion_len=T - TP,
        epochs=epochs,
        minibatches=minibatches,
        grad_accum=grad_accum,
    )
    learner = Learner(
        graphdef,
        tx,
        state,
        options,
        mesh=mesh,
        critic=critic,
        log=lambda m: None,
    )
    return learner, critic, policy


def keys(n=100):
    it = iter(jax.random.split(jax.random.key(1), n))
    return lambda: next(it)


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("kind", ["head", "model"])
def test_update_trains_the_critic_and_its_value_loss_falls(kind):
    learner, _, _ = make_learner(kind)
    exp = experience()
    before = leaves(learner.state.critic["params"])
    policy_before = leaves(learner.state.params)
    losses = []
    for _ in range(8):
        m = learner.update(exp, keys())
        losses.append(float(m[0]["value/loss"]))
    after = leaves(learner.state.critic["params"])
    assert max(float(np.abs(a - b).max()) for a, b in zip(after, before)) > 1e-3
    assert (
        max(float(np.abs(a - b).max()) for a, b in zip(leaves(learner.state.params), policy_before))
        > 0
    )
    assert losses[0] > 0.05  # a zero-initialised head: V = 0 against nonzero returns
    assert losses[-1] < 0.5 * losses[0], losses
    assert {"value/explained_variance", "value/mean", "value/clip_frac"} <= set(m[0])
    assert int(learner.state.step) == 8 and int(learner.state.skipped) == 0


def _reference(learner, critic, policy, exp, token_rewards, beta=0.0):
    """(advantages, returns, values) in NumPy from the critic's weights and the policy's
    hidden states: V[:, t] = h[:, t - 1] @ w + b on the policy tokens."""
    head = nnx.merge(critic.graphdef, learner.state.critic["params"])
    hidden = apply_hidden(nnx.graphdef(policy))(nnx.state(policy), exp.tokens, exp.attention_mask)[
        0
    ]
    h = np.asarray(hidden, np.float64)
    v = np.zeros((ROWS, T))
    v[:, 1:] = h[:, :-1] @ np.asarray(head.w[...], np.float64) + float(head.b[...])
    mask = np.asarray(exp.loss_mask, np.float64)
    v *= mask
    r = token_rewards.astype(np.float64)
    if beta:
        r = r - beta * mask * (np.asarray(exp.old_logp) - np.asarray(exp.ref_logp))  # k1
    adv, ret = gae_reference(r, v, mask, 0.9, 0.8)
    return adv, ret, v


def _set_head(learner, seed=3):
    """Random head weights (a fresh head is 0, and GAE on V = 0 would test little)."""
    rng = np.random.default_rng(seed)
    params = learner.state.critic["params"]
    params["w"].set_value(
        jnp.asarray(rng.normal(0, 0.3, params["w"].get_value().shape), jnp.float32)
    )
    params["b"].set_value(jnp.asarray(0.2, jnp.float32))


def test_gae_advantages_in_the_experience_match_numpy():
    learner, critic, policy = make_learner("head")
    _set_head(learner)
    exp = experience()
    got, metrics = critic.prepare(learner.state, exp, learner.policy_params())
    mask = np.asarray(exp.loss_mask)
    # the weighted sequence reward (w = [1, 0.5]) on each row's last policy token
    seq = np.asarray(exp.rewards) @ np.array([1.0, 0.5])
    last = T - 1 - np.argmax(mask[:, ::-1], axis=1)
    r = np.zeros((ROWS, T))
    r[np.arange(ROWS), last] = seq
    adv, ret, v = _reference(learner, critic, policy, exp, r)
    np.testing.assert_allclose(np.asarray(got.extras["old_values"]), v, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got.advantages), adv, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got.extras["returns"]), ret, rtol=1e-4, atol=1e-5)
    ev = 1 - np.var((ret - v)[mask > 0]) / np.var(ret[mask > 0])
    np.testing.assert_allclose(float(metrics["value/explained_variance"]), ev, rtol=1e-4)
    np.testing.assert_allclose(float(metrics["value/mean"]), v[mask > 0].mean(), rtol=1e-4)
    # the update batch carries the critic's fields to the update
    assert {"old_values", "returns"} <= set(got.update_batch())


def test_gae_reads_per_turn_rewards_and_the_kl_in_the_reward():
    """A multi-turn producer's per-turn rewards (extras['turn_rewards'], each turn's on its
    last policy token) replace the sequence reward; kl_in_reward subtracts beta * k1."""
    learner, critic, policy = make_learner("head", beta=0.1, whiten=True)
    _set_head(learner, seed=4)
    exp = experience(seed=2)
    turn_rewards = jnp.asarray(np.random.default_rng(5).normal(size=(ROWS, 2)), jnp.float32)
    tok = critic_lib.turn_rewards_to_tokens(turn_rewards, exp.turn_index, exp.loss_mask)
    exp = exp.replace(extras={"turn_rewards": tok})
    got, _ = critic.prepare(learner.state, exp, learner.policy_params())
    mask = np.asarray(exp.loss_mask)
    # by hand: a row with an observation gap has two turns, each rewarded on its last token
    row = 0
    assert mask[row, TP + 1] == 0 and np.asarray(exp.turn_index)[row, TP + 2] == 1
    np.testing.assert_allclose(np.asarray(tok)[row, TP], float(turn_rewards[row, 0]))
    adv, ret, _ = _reference(learner, critic, policy, exp, np.asarray(tok), beta=0.1)
    a = adv[mask > 0]
    white = np.zeros_like(adv)
    white[mask > 0] = (a - a.mean()) / np.sqrt(a.var() + 1e-8)
    np.testing.assert_allclose(np.asarray(got.advantages), white, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got.extras["returns"]), ret, rtol=1e-4, atol=1e-5)


def test_value_loss_gradient_accumulation_is_exact():
    """2 microbatches of unequal token counts: the same critic and policy as one (the
    head's value loss reaches the policy's trunk too)."""
    exp = experience(gaps=True)
    one, _, _ = make_learner("head", grad_accum=1)
    two, _, _ = make_learner("head", grad_accum=2)
    one.update(exp, keys())
    two.update(exp, keys())
    for a, b in zip(leaves(one.state.critic["params"]), leaves(two.state.critic["params"])):
        np.testing.assert_allclose(a, b, atol=2e-6)
    for a, b in zip(leaves(one.state.params), leaves(two.state.params)):
        np.testing.assert_allclose(a, b, atol=2e-6)


def test_checkpoint_round_trips_the_critic_and_the_run_continues_as_uninterrupted(tmp_path):
    exp = experience()
    learner, _, _ = make_learner("head", epochs=2, minibatches=2)
    learner.update(exp, keys())
    ckpt = Checkpointer(str(tmp_path / "checkpoints"))
    ckpt.save(1, learner.state, {})
    ckpt.wait()
    restored, _ = ckpt.restore(abstract_like(learner.state))
    ckpt.close()
    for a, b in zip(leaves(restored.critic), leaves(learner.state.critic)):  # params and Adam
        np.testing.assert_array_equal(a, b)
    assert len(jax.tree.leaves(restored.critic["opt_state"])) > 2
    fresh, _, _ = make_learner("head", epochs=2, minibatches=2)  # a new process resuming
    fresh.state = restored
    learner.update(exp, keys())  # the same key stream for both (the state's RNG in a run)
    fresh.update(exp, keys())
    for a, b in zip(leaves(fresh.state), leaves(learner.state)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_kind_none_adds_nothing_and_mismatches_are_refused():
    c = config_lib.base_config()
    c.mode = "rl"
    assert c.critic.kind == "none"
    assert (
        ppo.build_critic(
            sections.critic_options(c), None, mesh=None, reward_names=(), objective={}, layout={}
        )
        is None
    )
    c.objective.advantage = "gae"
    with pytest.raises(config_lib.ConfigError, match="critic.kind"):
        config_lib.validate(c)
    c.objective.advantage, c.critic.kind = "grpo", "model"
    with pytest.raises(config_lib.ConfigError, match="objective.advantage = 'gae'"):
        config_lib.validate(c)
    # every experiment file but the PPO one keeps critic.kind = 'none' (no critic state)
    import glob
    import importlib.util

    for path in sorted(glob.glob(os.path.join(REPO, "configs", "*.py"))):
        spec = importlib.util.spec_from_file_location("cfg", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kind = module.get_config("runlocal").critic.kind
        assert (kind != "none") == os.path.basename(path).startswith("ppo_"), path


def test_the_hidden_state_hook_leaves_the_policy_loss_unchanged():
    cfg = ModelConfig(vocab_size=VOCAB, max_position_embeddings=32, **MODEL)
    graphdef, params = nnx.split(random_model(cfg))
    batch = experience().update_batch()
    plain = rl_loss(graphdef, OBJECTIVE)(params, batch)
    hooked = rl_loss(graphdef, OBJECTIVE, capture_hidden=True)(params, batch)
    assert "hidden" not in plain[1] and hooked[1]["hidden"].shape == (ROWS, T, cfg.hidden_size)
    np.testing.assert_allclose(float(hooked[0]), float(plain[0]), rtol=1e-6)
    want = apply_hidden(graphdef)(params, batch["tokens"], batch["attention_mask"])[0]
    np.testing.assert_allclose(np.asarray(hooked[1]["hidden"]), np.asarray(want), atol=1e-5)
