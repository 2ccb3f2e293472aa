"""Run diagnostics: is there learning signal in the batch, and do the trainer and the sampler
agree on its log-probs? (The eval curve's collapse: train/collapse.py.)

Per step (jitted over the global rollout, logged with the rollout's metrics):

    diag/entropy             -sum_bt m logp_old / sum_bt m: the sampled-token estimate of the
                             policy's per-token entropy (exact in expectation when sampling at
                             temperature 1 without truncation)
    diag/pass_rate           p: the batch's share of correct completions
    diag/expected_adv_var    p (1 - p) (G - 1) / G: the expected within-group variance of the
                             group-centred advantage for binary rewards ("SFT Overtraining
                             Predicts Rank Inversion via Entropy Collapse Under RLVR")
    diag/adv_var             the measured mean over groups of (1/G) sum_i (r_i - mean r)^2
    diag/zero_signal_share   share of groups whose rewards are all equal (no group signal)
    diag/p_star              p*(G): below it more than half the groups are all-equal
    diag/p_star_alarm        1 when p < p*(G) (early in a run: GRPO has little to work with)
    diag/conflict_share      with several weighted reward components: the share of rollouts
                             whose components' group advantages disagree in sign

When the trainer has its own log-probs of the sampled tokens (`train.recompute_old_logp`, or
`train.measure_mismatch`), the train/rollout mismatch (`logp_mismatch`) on the loss tokens,
d = log pi_learner(y) - log pi_sampler(y), the same weights on both sides:

    rollout/logp_mismatch_max   max |d|
    rollout/logp_mismatch_mean  mean |d|
    rollout/logp_mismatch_k3    mean (e^d - 1 - d): the K3 estimate of KL(sampler || learner)

"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def p_star(group_size: int) -> float:
    """p*(G): the pass rate p < 1/2 where p^G + (1 - p)^G = 1/2, i.e. below which more than
    half of the groups of G binary rewards are all equal (p*(8) = 0.0830 ~ 1 - 2^(-1/8))."""
    lo, hi = 0.0, 0.5
    for _ in range(60):  # p^G + (1-p)^G decreases on [0, 1/2]
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid**group_size + (1 - mid) ** group_size > 0.5 else (lo, mid)
    return (lo + hi) / 2


def expected_advantage_variance(p, group_size: int):
    """E[(1/G) sum_i (r_i - mean r)^2] for G Bernoulli(p) rewards = p (1 - p) (G - 1) / G."""
    return p * (1 - p) * (group_size - 1) / group_size


def rollout_diagnostics(
    old_logp: Array, mask: Array, r_pg: Array, correct_b: Array
) -> dict[str, Array]:
    """The per-step diagnostics (module docstring). old_logp, mask [B, T]; r_pg [P, G] the
    sequence rewards the advantages use; correct_b [B] 1 on correct completions."""
    g = r_pg.shape[1]
    entropy = -jnp.sum(old_logp * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    p = jnp.mean(correct_b.astype(jnp.float32))
    centred = r_pg - jnp.mean(r_pg, axis=1, keepdims=True)
    zero = jnp.all(r_pg == r_pg[:, :1], axis=1)
    ps = p_star(g)
    return {
        "diag/entropy": entropy,
        "diag/pass_rate": p,
        "diag/expected_adv_var": expected_advantage_variance(p, g),
        "diag/adv_var": jnp.mean(jnp.mean(centred**2, axis=1)),
        "diag/zero_signal_share": jnp.mean(zero.astype(jnp.float32)),
        "diag/p_star": jnp.float32(ps),
        "diag/p_star_alarm": (p < ps).astype(jnp.float32),
    }


def logp_mismatch(sampler_logp: Array, learner_logp: Array, mask: Array) -> dict[str, Array]:
    """The train/rollout mismatch metrics (module docstring) over the tokens where mask
    [B, T] is 1; sampler_logp, learner_logp [B, T]."""
    d = jnp.where(mask > 0, learner_logp - sampler_logp, 0.0)
    n = jnp.maximum(jnp.sum(mask > 0), 1)
    return {
        "rollout/logp_mismatch_max": jnp.max(jnp.abs(d)),
        "rollout/logp_mismatch_mean": jnp.sum(jnp.abs(d)) / n,
        "rollout/logp_mismatch_k3": jnp.sum(jnp.expm1(d) - d) / n,
    }


def conflict_share(rewards_pgk: Array, weights_k: Array) -> Array:
    """Share of rollouts whose weighted, group-centred reward components disagree in sign
    (some w_k (r_k - mean_g r_k) > 0 and another < 0, beyond 1e-8): the rows GD^2PO's hard
    conflict masking drops ("GD^2PO: Mitigating Multi-Reward Conflicts via Group-Dynamic
    reward-Decoupled Policy Optimization"). rewards [P, G, K], weights [K]."""
    wa = (rewards_pgk - jnp.mean(rewards_pgk, axis=1, keepdims=True)) * weights_k
    conflict = jnp.any(wa > 1e-8, axis=-1) & jnp.any(wa < -1e-8, axis=-1)
    return jnp.mean(conflict.astype(jnp.float32))
