"""The learner (rl/learn/learner.py): epochs x minibatches x microbatches of unequal token
counts give the parameters of plain optax steps on each whole minibatch with the full-logits
objective. (Its wiring in the trainer, every objective name: tests/run/test_rl_step.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import SMALL_MODEL, random_experience, random_model
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.objectives import TokenStats, logprobs, losses
from jaxrl_frontier.rl.learn.learner import Learner, LearnerOptions, minibatch_order
from jaxrl_frontier.rl.learn.train_step import init_train_state


def _plain_loss(graphdef, objective):
    """The objective on full logits: no chunking, no shared prompt, no microbatches."""

    def loss(params, batch):
        logits = nnx.merge(graphdef, params)(batch["tokens"], batch["attention_mask"])
        stats = TokenStats(
            logp=logprobs.token_logprobs(logits, batch["tokens"]),
            old_logp=batch["old_logp"],
            mask=batch["loss_mask"],
            ref_logp=batch.get("ref_logp"),
            teacher_logp=batch.get("teacher_logp"),
            sc_logp=batch.get("sc_logp"),
            sc_kl=batch.get("sc_kl"),
        )
        extra = {}
        if batch.get("teacher_logits") is not None:
            extra = dict(teacher_logits=batch["teacher_logits"], tokens=batch["tokens"])
        return losses.objective_loss(stats, batch["advantages"], objective, logits=logits, **extra)[
            0
        ]

    return loss


_experience = random_experience  # conftest.py


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_learner_epochs_minibatches_microbatches_equal_plain_full_batch_steps(aggregation):
    """2 epochs x 2 minibatches x 2 microbatches of unequal token counts: the same params
    as plain optax steps on each whole minibatch with the full-logits objective."""
    model = random_model(ModelConfig(vocab_size=20, **SMALL_MODEL))
    graphdef, params = nnx.split(model)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    objective = dict(weight="ppo_clip", aggregation=aggregation, advantage="grpo")
    tx = optax.adam(1e-2)
    state = init_train_state(tx, jax.tree.map(jnp.copy, params), mesh, jax.random.key(0))
    options = LearnerOptions(
        objective=objective,
        rows=16,
        group_size=4,
        completion_len=3,
        epochs=2,
        minibatches=2,
        grad_accum=2,
    )
    learner = Learner(graphdef, tx, state, options, mesh=mesh, log=lambda m: None)
    exp = _experience()
    keys = iter(jax.random.split(jax.random.key(1), 2))
    learner.update(exp, lambda: next(keys))

    plain = _plain_loss(graphdef, objective)
    batch = {k: np.asarray(v) for k, v in exp.update_batch().items()}
    p, opt = params, tx.init(params)
    for key in jax.random.split(jax.random.key(1), 2):
        order = minibatch_order(key, 16, learner.update_groups)
        for j in range(2):
            mb = {k: v[order[j * 8 : (j + 1) * 8]] for k, v in batch.items()}
            g = jax.grad(plain)(p, mb)
            u, opt = tx.update(g, opt, p)
            p = optax.apply_updates(p, u)
    moved = max(
        float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(params))
    )
    assert moved > 1e-3
    for a, b in zip(jax.tree.leaves(learner.state.params), jax.tree.leaves(p)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
    assert int(learner.state.step) == 1 and learner.update_groups == 4  # shared prompts
