"""Run diagnostics: is there learning signal in the batch, and has the eval curve collapsed?

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

Per eval (`after_eval`): the rise-and-collapse detector of "Self-Improvement Can
Self-Regress: The Rise-and-Collapse Failure Mode of LLM Self-Training" and its early-stop
rule (ES): stop at a collapse, roll forward the peak checkpoint, next budget = peak step + 3;
`train.export = 'best'` exports the peak policy rather than the last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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


# ----------------------------------------------------------------------------- collapse


@dataclasses.dataclass(frozen=True)
class CollapseDetector:
    """Rise-then-collapse on an eval curve [(step, value), ...].

    Fires at the latest point when the curve rose (peak - first >= rise) and its last
    `patience` values all lie at least `drop` below the peak (after it). A monotone curve
    never falls below its peak; a flat curve whose noise stays under `rise` never rises.
    """

    rise: float = 0.05
    drop: float = 0.05
    patience: int = 2

    def check(self, curve: Sequence[tuple[int, float]]) -> dict[str, Any] | None:
        """None, or {collapse_at, peak_step, peak, next_budget = peak_step + 3}."""
        if len(curve) < 2:
            return None
        steps = [int(s) for s, _ in curve]
        values = np.asarray([float(v) for _, v in curve])
        i = int(np.argmax(values))  # the first peak
        tail = values[i + 1 :][-self.patience :]
        rose = values[i] - values[0] >= self.rise
        fell = len(tail) >= self.patience and bool(np.all(tail <= values[i] - self.drop))
        if not (rose and fell):
            return None
        return dict(
            collapse_at=steps[-1],
            peak_step=steps[i],
            peak=float(values[i]),
            next_budget=steps[i] + 3,
        )


@dataclasses.dataclass(frozen=True)
class PeakOptions:
    """What the loop does after an eval (`train.export`, `train.collapse.*`): export the best
    policy ('best') or the last ('last'), and stop on a rise and collapse of `metric`."""

    export: str = "last"
    stop: bool = False
    metric: str = "eval/pass@1_greedy"
    rise: float = 0.05
    drop: float = 0.05
    patience: int = 2


def after_eval(
    history: dict[str, Any], ev: dict[str, float], step: int, options: PeakOptions, export, say
):
    """The loop's decisions after an eval at `step` (history['eval'] already holds it).

    Tracks history['best'] = {step, value} of `train.collapse.metric`; under
    `train.export = 'best'` calls export() at each new best, so the export is the peak
    policy. Under `train.collapse.stop`, runs the `CollapseDetector` on the eval curve and on
    a collapse records history['collapse'] = {collapse_at, peak_step, peak, next_budget}:
    the run stops (`collapse_outcome`), its export is the peak (rolled forward to the next
    campaign), whose budget is peak_step + 3.
    """
    t = options
    key = t.metric
    if key not in ev:
        if t.export == "best" or t.stop:
            raise KeyError(
                f"config key 'train.collapse.metric' = {key!r} is not an eval metric; the "
                f"eval's: {', '.join(sorted(ev))}"
            )
        return
    value = float(ev[key])
    best = history.get("best")
    if best is None or value > best["value"]:
        history["best"] = dict(step=int(step), value=value)
        if t.export == "best":
            export()
    if t.stop and "collapse" not in history:
        det = CollapseDetector(t.rise, t.drop, t.patience)
        found = det.check([(e["step"], e[key]) for e in history["eval"] if key in e])
        if found is not None:
            history["collapse"] = found
            say(
                f"collapse: {key} peaked at {found['peak']:.4f} (step {found['peak_step']}) and "
                f"fell; stopping, the export is the peak, next budget {found['next_budget']}"
            )


def collapse_outcome(history: dict[str, Any], step: int) -> str | None:
    """ "target" (stop, as at a reached target) when the collapse was found at `step`."""
    return "target" if history.get("collapse", {}).get("collapse_at") == step else None


def finished(history: dict[str, Any]) -> bool:
    """A run whose history says it is done (target reached, or collapsed) trains no further."""
    return "target_reached_at" in history or "collapse" in history
