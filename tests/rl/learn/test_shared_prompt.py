"""The shared-prompt forward (`Transformer.hidden_states_shared_prompt`, the trainer's
`train.share_prompt_forward`) gives the per-row forward's values and gradients: each group's
prompt runs once and its KV cache is repeated to the group's rows."""

import collections
import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SMALL_MODEL, assert_same_loss_and_grads, random_model, small_rl_config
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.objectives import logprobs
from jaxrl_frontier.rl.learn.forward import make_logp_fn
from jaxrl_frontier.rl.learn.learner import minibatch_order, update_layout
from jaxrl_frontier.rl.learn.loss import rl_loss
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import trainer as tr
from jaxrl_frontier.run.build import objective_section

V, TP, TN, N, G = 41, 6, 5, 4, 3  # vocab, prompt / completion positions, group size, groups


def _model(remat=False):
    """Every parameter random, the qkv biases too (a bias the shared path skipped would show)."""
    return random_model(ModelConfig(vocab_size=V, **SMALL_MODEL, qkv_bias=True, remat=remat))


def _rl_batch(seed=0):
    """G prompt-major groups of N rows: left-padded prompts (a different pad per group) shared
    within the group, completions of different lengths padded on the right."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, V, (G, TP))
    prompt_mask = (np.arange(TP)[None] >= np.array([0, 2, 4])[:, None]).astype(np.int32)
    prompt, prompt_mask = np.repeat(prompt, N, 0), np.repeat(prompt_mask, N, 0)
    lengths = rng.integers(1, TN + 1, (G * N, 1))
    completion_mask = (np.arange(TN)[None] < lengths).astype(np.int32)
    completion = np.where(completion_mask, rng.integers(1, V, (G * N, TN)), 0)
    loss_mask = np.concatenate([np.zeros_like(prompt_mask), completion_mask], 1)
    loss_mask = loss_mask.astype(np.float32)
    return dict(
        tokens=jnp.asarray(np.concatenate([prompt, completion], 1), jnp.int32),
        attention_mask=jnp.asarray(np.concatenate([prompt_mask, completion_mask], 1)),
        loss_mask=jnp.asarray(loss_mask),
        old_logp=jnp.asarray(-rng.exponential(2.0, loss_mask.shape) * loss_mask, jnp.float32),
        advantages=jnp.asarray(rng.normal(size=(G * N, 1)) * loss_mask, jnp.float32),
    )


@pytest.mark.parametrize("remat", [False, True])
def test_shared_prompt_hidden_states_and_gradients_equal_per_row(remat):
    graphdef, params = nnx.split(_model(remat))
    batch = _rl_batch()
    tokens, mask = batch["tokens"], batch["attention_mask"]
    # a generic cotangent on real positions (padding positions' hidden states are unused)
    cot = jax.random.normal(jax.random.key(1), (*tokens.shape, 32)) * mask[..., None]

    def per_row(p):
        return nnx.merge(graphdef, p).hidden_states(tokens, mask)[0]

    def shared(p):
        model = nnx.merge(graphdef, p)
        return model.hidden_states_shared_prompt(tokens, mask, prompt_len=TP, group_size=N)

    h0, h1 = per_row(params), shared(params)
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(h1)[real], np.asarray(h0)[real], atol=1e-5)
    g0 = jax.grad(lambda p: jnp.sum(per_row(p) * cot))(params)
    g1 = jax.grad(lambda p: jnp.sum(shared(p) * cot))(params)
    for (path, a), b in zip(jax.tree.leaves_with_path(g0), jax.tree.leaves(g1)):
        if "lm_head" not in str(path):  # every other parameter shapes the hidden states
            assert float(jnp.abs(a).max()) > 0, path
        scale = float(jnp.abs(a).max())  # up to ~50 here: f32 sums of 64 summands
        np.testing.assert_allclose(b, a, atol=1e-5 * max(scale, 1.0), err_msg=str(path))


def test_shared_prompt_rejects_rows_that_are_not_whole_groups():
    model = _model()
    batch = _rl_batch()
    with pytest.raises(ValueError, match="not whole groups of 5"):
        model.hidden_states_shared_prompt(
            batch["tokens"], batch["attention_mask"], prompt_len=TP, group_size=5
        )
    with pytest.raises(ValueError, match="prompt length 11 is not within the 11 positions"):
        model.hidden_states_shared_prompt(
            batch["tokens"], batch["attention_mask"], prompt_len=TP + TN, group_size=N
        )


@pytest.mark.parametrize("chunk", [None, 7])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_rl_loss_with_shared_prompt_equals_per_row(chunk, entropy_coef):
    """Loss, metrics and gradients: the per-row loss over all positions against the
    shared-prompt loss that scores only the completion's positions."""
    graphdef, params = nnx.split(_model())
    objective = objective_section(config_lib.base_config().objective)
    objective = replace(objective, entropy_coef=entropy_coef)
    batch = _rl_batch(1)
    outs = []
    for layout in ({}, dict(group_size=N, completion_len=TN)):
        loss_of = rl_loss(graphdef, objective, chunk, **layout)
        outs.append(jax.value_and_grad(loss_of, has_aux=True)(params, batch))
    assert_same_loss_and_grads(*outs)


@pytest.mark.parametrize("chunk", [None, 7])
def test_logp_fn_scores_only_the_completion(chunk):
    graphdef, params = nnx.split(_model())
    batch = _rl_batch(2)
    args = (params, batch["tokens"], batch["attention_mask"])
    plain = np.asarray(make_logp_fn(graphdef, None)(*args))
    shared = np.asarray(make_logp_fn(graphdef, chunk, group_size=N, completion_len=TN)(*args))
    m = np.asarray(batch["loss_mask"])
    np.testing.assert_allclose(shared * m, plain * m, atol=1e-5)
    assert np.abs(shared[:, :TP]).max() == 0.0  # the prompt's columns are not computed
    assert np.abs(shared[:, TP:]).min() > 0  # every completion column is


def test_chunked_logprobs_from_a_start_position():
    h = jax.random.normal(jax.random.key(0), (3, 9, 8))
    w = jax.random.normal(jax.random.key(1), (8, V))
    tok = jax.random.randint(jax.random.key(2), (3, 9), 0, V)
    plain = np.asarray(logprobs.token_logprobs(h @ w, tok))
    for start in (1, 4, 8):
        got = np.asarray(logprobs.token_logprobs_from_hidden(h, w, tok, 5, start=start))
        np.testing.assert_allclose(got[:, start:], plain[:, start:], atol=1e-5)
        assert np.abs(got[:, :start]).max() == 0.0
    with pytest.raises(ValueError, match="start = 9 must be in"):
        logprobs.token_logprobs_from_hidden(h, w, tok, 5, start=9)


def _trainer(tmp_path, **overrides):
    c = small_rl_config()
    c.rollout.max_new_tokens = 6
    c.objective.kl_coef = 0.05  # reference log-probs through the shared path too
    c.optimizer.lr = 1e-2  # a step that moves the parameters visibly
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return tr.Trainer(c, str(tmp_path))


def test_minibatches_hold_whole_groups_when_the_prompt_is_shared(tmp_path):
    trainer = _trainer(tmp_path, **{"train.minibatches": 2})
    order = minibatch_order(jax.random.key(0), 16, 4)
    assert sorted(order.tolist()) == list(range(16))
    groups = order.reshape(4, 4)
    np.testing.assert_array_equal(groups - groups[:, :1], np.tile(np.arange(4), (4, 1)))
    assert trainer.step.learner.update_groups == 4  # 2 minibatches of 8 rows: whole groups
    layout = lambda rows: update_layout(
        rows=rows, group_size=4, completion_len=6, mesh=trainer.roles.mesh, share_prompt=True
    )
    assert layout(8) == dict(group_size=4, completion_len=6)
    assert layout(6) == dict(group_size=1, completion_len=6)


def test_trainer_update_with_and_without_shared_prompt(tmp_path, capsys):
    """One real RL step (rollout, reference log-probs, update) both ways, from the same
    state: same reference log-probs, loss, gradient norm and new parameters."""
    keys = ["tokens", "attention_mask", "loss_mask", "old_logp", "advantages", "ref_logp"]
    results = []
    for share in (False, True):
        trainer = _trainer(tmp_path / str(share), **{"train.share_prompt_forward": share})
        examples = [trainer.task.example("train", i) for i in range(4)]
        exp, _ = trainer.step.rollout(examples, jax.random.key(3))
        host = {k: np.asarray(v) for k, v in exp.update_batch().items()}
        assert sorted(host) == sorted(keys)
        # an untrained policy's rewards are all 0 (zero advantages): use random ones
        adv = np.random.default_rng(0).normal(size=(16, 1)).astype(np.float32)
        host["advantages"] = adv * host["loss_mask"]
        update = trainer.step.learner.programs(keys)[1]
        state, metrics = update(trainer.state, sharding.shard_batch(host, trainer.roles.mesh))
        results.append((host, jax.device_get(state.params), jax.device_get(metrics)))
    (b0, p0, m0), (b1, p1, m1) = results
    np.testing.assert_array_equal(b1["tokens"], b0["tokens"])  # the same rollout
    np.testing.assert_allclose(b1["ref_logp"], b0["ref_logp"], atol=1e-5)
    np.testing.assert_allclose(m1["loss"], m0["loss"], atol=1e-6)
    np.testing.assert_allclose(m1["grad_norm"], m0["grad_norm"], rtol=1e-4)
    assert float(m0["grad_norm"]) > 0
    # Adam's first step is lr * g / (|g| + eps) per element: the same to 0.1% of lr = 1e-2
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)):
        np.testing.assert_allclose(b, a, atol=1e-5)

    _trainer(tmp_path / "odd", **{"train.minibatches": 8})
    assert "share_prompt_forward is off for the update: a microbatch of 2 rows" in (
        capsys.readouterr().out
    )


def _collectives(compiled_text: str) -> collections.Counter:
    ops = "all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter"
    return collections.Counter(re.findall(rf"= \S+ ({ops})\(", compiled_text))


def test_sharded_update_moves_no_more_data_with_a_shared_prompt(tmp_path):
    """On fsdp=8 with one group per device, the shared-prompt update compiles to the same
    collectives as the per-row one: each weight is all-gathered once per use, and the
    packed [G, Tp + n Tn] rows keep groups on their devices (nothing is resharded)."""
    keys = ["tokens", "attention_mask", "loss_mask", "old_logp", "advantages", "ref_logp"]
    counts = {}
    for share in (False, True):
        trainer = _trainer(
            tmp_path / str(share),
            **{
                "mesh.num_devices": 0,
                "mesh.fsdp": 8,
                "data.prompt_batch": 8,
                "train.share_prompt_forward": share,
            },
        )
        assert trainer.step.learner.update_groups == (4 if share else 1)
        rows, t = 32, 5 + 6
        batch = {k: np.zeros((rows, t), np.float32) for k in keys}
        batch["tokens"] = np.ones((rows, t), np.int32)
        batch["attention_mask"] = np.ones((rows, t), np.int32)
        update = trainer.step.learner.programs(keys)[1]
        lowered = update.lower(trainer.state, sharding.shard_batch(batch, trainer.roles.mesh))
        counts[share] = _collectives(lowered.compile().as_text())
    assert counts[False]["all-gather"] > 0  # the weights are gathered: the check can fail
    assert counts[True] == counts[False]
    # 2 groups cannot split over 8 devices: the trainer runs every row's prompt instead
    few = _trainer(tmp_path / "few", **{"mesh.num_devices": 0, "mesh.fsdp": 8})
    assert few.config.data.prompt_batch == 4 and few.step.learner.update_groups == 1
