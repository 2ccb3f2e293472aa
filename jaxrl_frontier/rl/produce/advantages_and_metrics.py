"""The finishing step both producers share: advantages and the rollout's metrics over the
global batch (one jitted program), and the per-prompt results handed to the prompt source.

The correctness reward is looked up by name (`correct_column`): a task's `correctness`, an
environment's `success`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.data.tasks.base import Example
from jaxrl_frontier.objectives.schema import ObjectiveSection
from jaxrl_frontier.objectives.stats import TokenStats
from jaxrl_frontier.rl import credit, diagnostics
from jaxrl_frontier.rl.experience import Experience, PromptResult

Array = jax.Array

# the reward that says a completion is right, by name, first found (else the first reward)
CORRECTNESS_NAMES = ("correctness", "success")


def correct_column(reward_names: Sequence[str]) -> int:
    """The column of the reward vector that says a completion is right."""
    names = tuple(reward_names)
    return next((names.index(n) for n in CORRECTNESS_NAMES if n in names), 0)


@functools.partial(jax.jit, static_argnames=("objective", "reward_names", "group_size"))
def advantages_and_metrics(
    exp: Experience, objective: ObjectiveSection, reward_names: tuple[str, ...], group_size: int
) -> tuple[Array, Array, dict[str, Array]]:
    """Advantages [B, T], per-row sequence rewards [B] and the rollout's scalar metrics,
    over the global batch (`objective`: a static argument, hashable as its record is)."""
    b, k = exp.rewards.shape
    stats = TokenStats(
        logp=exp.old_logp,
        old_logp=exp.old_logp,
        mask=exp.loss_mask,
        ref_logp=exp.ref_logp,
        teacher_logp=exp.teacher_logp,
    )
    adv, r_pg = credit.compute_advantages(
        objective, exp.rewards.reshape(b // group_size, group_size, k), reward_names, stats
    )
    lengths = jnp.sum(exp.loss_mask, axis=1)
    metrics = {f"reward/{n}": jnp.mean(exp.rewards[:, i]) for i, n in enumerate(reward_names)}
    metrics.update(
        {
            "reward/total": jnp.mean(r_pg),
            "rollout/zero_variance_groups": credit.zero_variance_groups(r_pg).astype(jnp.float32),
            "rollout/response_length": jnp.mean(lengths),
            # with the mean: a static decode's busy share of slot-steps, mean / max
            "rollout/response_length_max": jnp.max(lengths),
            "rollout/tokens": jnp.sum(lengths),
        }
    )
    correct = exp.rewards[:, correct_column(reward_names)] > 0
    metrics.update(diagnostics.rollout_diagnostics(exp.old_logp, exp.loss_mask, r_pg, correct))
    weighted = objective.reward_weights
    if sum(1 for v in weighted.values() if v) > 1:  # several rewards: how often they pull apart
        w_k = credit.reward_weight_vector(weighted, reward_names)
        r_pgk = exp.rewards.reshape(b // group_size, group_size, k)
        metrics["diag/conflict_share"] = diagnostics.conflict_share(r_pgk, w_k)
    if exp.teacher_logp is not None:  # sampled-token reverse KL(student || teacher), per token
        gap = (exp.old_logp - exp.teacher_logp) * exp.loss_mask
        metrics["opd/reverse_kl"] = jnp.sum(gap) / jnp.maximum(jnp.sum(exp.loss_mask), 1.0)
    return adv, r_pg.reshape(-1), metrics


def prompt_results(
    examples: Sequence[Example],
    rewards: np.ndarray,
    reward: np.ndarray,
    lengths: np.ndarray,
    texts: Sequence[str],
    reward_names: Sequence[str],
    episode_states: Sequence = (),
) -> tuple[PromptResult, ...]:
    """One `PromptResult` per prompt of this process's rows (prompt-major, G rows a prompt):
    rewards [B_l, K], reward [B_l] sequence rewards, lengths [B_l], texts [B_l]."""
    g = len(rewards) // max(len(examples), 1)
    col = correct_column(reward_names)
    return tuple(
        PromptResult(
            index=int(ex["index"]),
            example=ex,
            rewards=rewards[i * g : (i + 1) * g],
            reward=reward[i * g : (i + 1) * g],
            correct=float(np.mean(rewards[i * g : (i + 1) * g, col] > 0)),
            lengths=lengths[i * g : (i + 1) * g],
            texts=tuple(texts[i * g : (i + 1) * g]),
            episode_states=tuple(episode_states[i * g : (i + 1) * g]),
        )
        for i, ex in enumerate(examples)
    )
