"""Credit assignment: reward vectors and token statistics in, advantages out.

One pure, jittable function, `compute_advantages`, does the whole step between scoring and the
update, for every entry of the advantage registry:

    r_pg  = sum_k w_k r_k  -  beta * sum_t m_t k(l_rollout - l_ref)_t       sequence reward [P, G]
    A_bt  = group entry:   A(r_pg) [P, G] broadcast over the completion tokens
            (gdpo, gd2po:  A(r_pgk, w) on the reward vector, the KL term one more component)
            token entry:   A(stats, token_reward = -beta * k_t) [B, T]
            opd_hybrid:    A_task = grpo(r_pg) as the verifier part, plus coef * a_t

- w_k: `objective.reward_weights` by component name (unnamed components weigh 0); an empty
  `reward_weights` means the correctness reward alone (w = e_correctness), for every entry.
- beta = `objective.kl_coef` when `objective.kl_in_reward` (else 0), k the configured
  `objective.kl_estimator`, on the rollout policy's log-probs (held constant): the KL to the
  reference folded into the reward, per token for token entries and summed over the completion
  for sequence entries, once in either case. Ziegler et al. 2019 (Fine-Tuning Language Models
  from Human Preferences); Schulman 2020 (Approximating KL Divergence) for k1, k2, k3.

Arrays may be global arrays sharded over several processes: everything here is jnp on the
whole batch (no host code, no value-dependent Python control flow), so batch statistics (the
whitening of reinforce_pp, gdpo and gd2po) span every process under `jax.jit`. The config
values are static Python (choices made at trace time).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_frontier.objectives import advantages as adv_lib
from jaxrl_frontier.objectives import distillation, schema
from jaxrl_frontier.objectives.advantages import zero_variance_groups
from jaxrl_frontier.objectives.stats import TokenStats

Array = jax.Array

__all__ = [
    "compute_advantages",
    "kl_reward_tokens",
    "reward_weight_vector",
    "zero_variance_groups",
]


def reward_weight_vector(reward_weights: Mapping[str, float], reward_names: Sequence[str]) -> Array:
    """w [K] in `reward_names` order: the named weights (0 for the others), or, when
    `reward_weights` is empty, 1 on 'correctness' and 0 elsewhere."""
    names = list(reward_names)
    unknown = sorted(set(reward_weights) - set(names))
    if unknown:
        raise ValueError(
            f"objective.reward_weights names {unknown}; the task's rewards: {', '.join(names)}"
        )
    if not reward_weights:
        if "correctness" not in names:
            raise ValueError(
                "objective.reward_weights is empty (correctness only) but the task has no "
                f"'correctness' reward; its rewards: {', '.join(names)}"
            )
        return jax.nn.one_hot(names.index("correctness"), len(names), dtype=jnp.float32)
    return jnp.asarray([float(reward_weights.get(n, 0.0)) for n in names], jnp.float32)


def kl_reward_tokens(stats: TokenStats, estimator: str) -> Array:
    """-k(l_rollout - l_ref) per completion token, [B, T] (0 off the mask, no gradient):
    the reward a unit KL coefficient adds (`distillation.kl_reward_penalty` with beta = 1)."""
    if stats.ref_logp is None:
        raise ValueError("objective.kl_in_reward needs the reference log-probs (ref_logp)")
    return distillation.kl_reward_penalty(stats, 1.0, estimator)


def compute_advantages(
    objective: schema.ObjectiveSection | Mapping[str, Any],
    rewards_pgk: Array,
    reward_names: Sequence[str],
    stats: TokenStats,
) -> tuple[Array, Array]:
    """-> (advantages [B, T] float32, 0 off stats.mask; sequence reward r_pg [P, G] after
    reward weights and kl_in_reward).

    objective: the objective's record (`schema.objective_of`; it reads advantage,
    advantage_kwargs, reward_weights, kl_in_reward, kl_coef, kl_estimator); rewards_pgk [P, G, K] in `reward_names` order;
    stats: TokenStats [B, T] with B = P * G rows prompt-major, logp / old_logp the behaviour
    log-probs, ref_logp / teacher_logp as the entry needs them (None otherwise).
    """
    objective = schema.objective_of(objective)
    P, G, K = rewards_pgk.shape
    if stats.mask.shape[0] != P * G:
        raise ValueError(
            f"compute_advantages: {stats.mask.shape[0]} token rows for P * G = {P} * {G} rewards"
        )
    mask = stats.mask.astype(jnp.float32)
    r_pgk = rewards_pgk.astype(jnp.float32)
    w_k = reward_weight_vector(objective.reward_weights, reward_names)

    beta = float(objective.kl_coef) if objective.kl_in_reward else 0.0
    neg_kl_bt = kl_reward_tokens(stats, objective.kl_estimator) if beta else None
    neg_kl_pg = None if neg_kl_bt is None else jnp.sum(neg_kl_bt, axis=1).reshape(P, G)

    r_pg = jnp.einsum("pgk,k->pg", r_pgk, w_k)
    if neg_kl_pg is not None:
        r_pg = r_pg + beta * neg_kl_pg

    name = objective.advantage
    fn = adv_lib.ADVANTAGES.get(name)
    kwargs = objective.advantage_kwargs
    inputs = _Inputs(r_pg, r_pgk, w_k, neg_kl_pg, neg_kl_bt, beta, stats, P, G)
    adv_bt = _BY_LEVEL[fn.level](fn, kwargs, inputs)
    return (adv_bt * mask).astype(jnp.float32), r_pg


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """What an advantage entry may be handed."""

    r_pg: Array  # sequence reward [P, G], KL term included
    r_pgk: Array  # reward vector [P, G, K]
    w_k: Array  # reward weights [K]
    neg_kl_pg: Array | None  # -sum_t k_t [P, G] (kl_in_reward) or None
    neg_kl_bt: Array | None  # -k_t [B, T] (kl_in_reward) or None
    beta: float  # the KL coefficient in the reward (0 when off)
    stats: TokenStats
    P: int
    G: int

    def lengths(self) -> Array:
        """Completion tokens per rollout [P, G] (token-weighted batch whitening)."""
        return jnp.sum(self.stats.mask, axis=1).reshape(self.P, self.G)

    def seq_adv(self) -> Array:
        """The verifier part of a hybrid: GRPO on the sequence reward, [P, G]."""
        return adv_lib.ADVANTAGES.get("grpo")(self.r_pg)

    def token_reward(self) -> Array | None:
        return None if self.neg_kl_bt is None else self.beta * self.neg_kl_bt


def _supplied(fn, kwargs: dict, inputs: _Inputs, available: dict) -> dict:
    """kwargs plus each supplied input the entry's signature takes (`group_size` only as a
    default; the data inputs always)."""
    takes = set(schema.entry_defaults(fn)) | _positional_names(fn)
    out = dict(kwargs)
    if "group_size" in takes:
        out.setdefault("group_size", inputs.G)
    for key, make in available.items():
        if key in takes:
            out[key] = make()
    return out


def _positional_names(fn) -> set[str]:
    return {
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.default is inspect.Parameter.empty
    }


def _group_advantage(fn, kwargs: dict, inputs: _Inputs) -> Array:
    """A group entry: [P, G] from the sequence reward (or the reward vector), per token."""
    if fn.components:  # the KL penalty is one more component, weighted by beta
        rewards, w_k = inputs.r_pgk, inputs.w_k
        if inputs.neg_kl_pg is not None:
            rewards = jnp.concatenate([rewards, inputs.neg_kl_pg[..., None]], axis=-1)
            w_k = jnp.concatenate([w_k, jnp.asarray([inputs.beta], jnp.float32)])
        kwargs = {**kwargs, "reward_weights": w_k}
    else:
        rewards = inputs.r_pg
    kwargs = _supplied(fn, kwargs, inputs, {"lengths": inputs.lengths})
    a_pg = fn(rewards, **kwargs)
    return adv_lib.sequence_to_tokens(a_pg, inputs.stats.mask.astype(jnp.float32))


def _token_advantage(fn, kwargs: dict, inputs: _Inputs) -> Array:
    """A token entry: [B, T] from the token statistics (opd_hybrid also from the sequence
    reward, which already holds the KL term: it takes no token_reward)."""
    available = {"seq_adv": inputs.seq_adv}
    if inputs.neg_kl_bt is not None:
        available["token_reward"] = inputs.token_reward
    return fn(inputs.stats, **_supplied(fn, kwargs, inputs, available))


_BY_LEVEL = {"group": _group_advantage, "token": _token_advantage}
