"""Step-level credit for multi-turn episodes: turn-level group baselines, 3SPO state scores,
and the progress advantage as a step score.

A step is one turn: the state before it, the action, the turn's reward. `Steps` holds a
batch of them flat (S steps of E episodes), built from `envs.Episode` records. The
computations over states are host NumPy (states are arbitrary hashables); the ones over
tokens are jittable JAX.

Turn-level group baselines with anchor states. Group-in-Group Policy Optimization for LLM
Agent Training (Feng et al. 2025, GiGPO): the episodes of a group start from the same
state; equal states met along different episodes of the group are anchor states, and the
steps taken from one anchor state form a step group whose returns are compared:

    A_E(e)  = norm over the group's episodes of the episode return R(e)     (episode level)
    R_t     = sum_k gamma^k r_{t+k}                    (discounted return of step t)
    A_S(t)  = norm over the step group of anchor(t) of R_t                    (step level)
    A(t)    = A_E(e(t)) + step_weight * A_S(t)

norm = `scale`: 'mean' (x - mean, GiGPO's default) or 'mean_std' ((x - mean) / (std + 1e-6),
unbiased std, std = 1 for a group of one). A step group of one gives A_S = 0.

3SPO. 3SPO: State-Score-Supervised Policy Optimization for LLM Agents (2026), on GiGPO.
`StateScores` keeps, for every state seen, how many recorded episodes passed through it
(N) and how many of those succeeded; t = 1 + the number of episodes recorded:

    S(s) = exp(-alpha * log(t) * success_rate(s))     (1 for a state never seen)
    S(s) = 0 once N_fail(s) >= xi and success_rate(s) <= zeta   (a dead end)
    n(s) = ceil(G_max * S(s))     rollouts allocated to s (0: stop exploring s; 1: no
                                  comparison, so no step-level update from s)
    R(s_t, s_t+1) = omega * novel + (0.5 - omega) * (S(s_t) - S(s_t+1)) + 0.5 * success
    omega = 0.5 * exp(-k * N(s_t)),  novel = 1 when s_t+1 != s_t

(success the turn's success flag); step advantages normalise R within step groups as above.
Scores favour states the policy has rarely succeeded from: exploring them has the most to
teach, and a state it solves reliably is worth fewer rollouts.

Progress advantage as a step score. Neglected Free Lunch from Post-training: Progress
Advantage for LLM Agents (2026): a_t = beta * (l_policy(y_t) - l_ref(y_t)) per token, summed
over a turn's tokens (`progress_step_scores`), scores each step without a reward model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.objectives import advantages as adv_lib
from jaxrl_frontier.objectives.stats import TokenStats

Array = jax.Array

SCALES = ("mean", "mean_std")


# ----------------------------------------------------------------------------- steps


@dataclasses.dataclass(frozen=True)
class Steps:
    """S steps, flat, episodes contiguous and in turn order.

    group:   int [S]    the episode group (episodes started from the same state)
    episode: int [S]    the episode
    turn:    int [S]    the turn within the episode (0, 1, ...)
    state:   S hashables, the state before the step (the anchor)
    next_state: S hashables, the state after it
    reward:  f32 [S]    the turn's reward
    success: bool [S]   the turn's success flag (the episode's last turn on success)
    """

    group: np.ndarray
    episode: np.ndarray
    turn: np.ndarray
    state: tuple[Hashable, ...]
    next_state: tuple[Hashable, ...]
    reward: np.ndarray
    success: np.ndarray

    def __len__(self) -> int:
        return len(self.reward)

    @classmethod
    def from_episodes(cls, episodes: Sequence[Any]) -> Steps:
        """From `envs.Episode` records (anything with group, states, rewards, infos)."""
        group, episode, turn, state, nxt, reward, success = [], [], [], [], [], [], []
        for e, ep in enumerate(episodes):
            for k, r in enumerate(ep.rewards):
                group.append(ep.group)
                episode.append(e)
                turn.append(k)
                state.append(ep.states[k])
                nxt.append(ep.states[k + 1])
                reward.append(r)
                success.append(bool(ep.infos[k].get("success", False)))
        return cls(
            group=np.asarray(group, np.int64),
            episode=np.asarray(episode, np.int64),
            turn=np.asarray(turn, np.int64),
            state=tuple(state),
            next_state=tuple(nxt),
            reward=np.asarray(reward, np.float32),
            success=np.asarray(success, bool),
        )


def discounted_returns(steps: Steps, gamma: float = 1.0) -> np.ndarray:
    """R_t = sum_k gamma^k r_{t+k} within each episode, f32 [S]."""
    out = np.zeros(len(steps), np.float64)
    running, current = 0.0, None
    for i in range(len(steps) - 1, -1, -1):  # episodes are contiguous: walk back once
        if steps.episode[i] != current:
            running, current = 0.0, steps.episode[i]
        running = float(steps.reward[i]) + gamma * running
        out[i] = running
    return out.astype(np.float32)


def anchor_groups(steps: Steps) -> np.ndarray:
    """int [S]: one id per (episode group, state): the steps taken from the same anchor state."""
    ids: dict[tuple[int, Hashable], int] = {}
    return np.asarray(
        [ids.setdefault((int(g), s), len(ids)) for g, s in zip(steps.group, steps.state)],
        np.int64,
    )


def group_normalise(x: np.ndarray, ids: np.ndarray, scale: str = "mean", eps: float = 1e-6):
    """x normalised within the groups `ids` (module docstring's norm), f32 [len(x)]."""
    if scale not in SCALES:
        raise ValueError(f"step credit: unknown scale {scale!r}; allowed: {', '.join(SCALES)}")
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    for g in np.unique(ids):
        sel = ids == g
        xs = x[sel]
        centred = xs - xs.mean()
        if scale == "mean_std":
            std = xs.std(ddof=1) if len(xs) > 1 else 1.0
            centred = centred / (std + eps)
        out[sel] = centred
    return out.astype(np.float32)


def gigpo_advantages(
    steps: Steps, gamma: float = 0.95, step_weight: float = 1.0, scale: str = "mean"
) -> dict[str, np.ndarray]:
    """GiGPO's episode, step and joint advantages per step (module docstring), each f32 [S];
    also `anchor` (the step-group ids, int [S])."""
    episodes = np.unique(steps.episode)
    ep_return = np.asarray([steps.reward[steps.episode == e].sum() for e in episodes])
    ep_group = np.asarray([steps.group[steps.episode == e][0] for e in episodes])
    a_e = group_normalise(ep_return, ep_group, scale)
    a_e_steps = a_e[np.searchsorted(episodes, steps.episode)]
    anchor = anchor_groups(steps)
    a_s = group_normalise(discounted_returns(steps, gamma), anchor, scale)
    return {
        "episode": a_e_steps,
        "step": a_s,
        "advantage": (a_e_steps + step_weight * a_s).astype(np.float32),
        "anchor": anchor,
    }


# ----------------------------------------------------------------------------- 3SPO


class StateScores:
    """3SPO's per-state history and scores (module docstring).

    Args:
      alpha: how fast a state's score falls with its success rate as history grows.
      xi, zeta: a state with at least xi failures and a success rate <= zeta scores 0.
      g_max: rollouts allocated to a state of score 1.
      omega_k: how fast the novelty weight omega decays with a state's visits.
      eps: in the success rate's denominator.
    """

    def __init__(
        self,
        alpha: float = 1.0,
        xi: float = 10.0,
        zeta: float = 0.1,
        g_max: int = 8,
        omega_k: float = 0.1,
        eps: float = 1e-6,
    ):
        if g_max < 1:
            raise ValueError(f"StateScores: g_max must be >= 1, got {g_max}")
        self.alpha, self.xi, self.zeta = float(alpha), float(xi), float(zeta)
        self.g_max, self.omega_k, self.eps = int(g_max), float(omega_k), float(eps)
        self.counts: dict[Hashable, list[int]] = {}  # state -> [n_total, n_success]
        self.t = 1

    def update(self, states: Sequence[Hashable], success: bool) -> None:
        """Record one finished episode through `states` (each distinct state counted once)."""
        for s in dict.fromkeys(states):
            c = self.counts.setdefault(s, [0, 0])
            c[0] += 1
            c[1] += int(bool(success))
        self.t += 1

    def visits(self, state: Hashable) -> int:
        return self.counts.get(state, (0, 0))[0]

    def success_rate(self, state: Hashable) -> float:
        n, k = self.counts.get(state, (0, 0))
        return k / (n + self.eps) if n else 0.0

    def score(self, state: Hashable) -> float:
        """S(s) in [0, 1]."""
        n, k = self.counts.get(state, (0, 0))
        if n == 0:
            return 1.0  # never seen: everything to learn there
        rate = k / (n + self.eps)
        if n - k >= self.xi and rate <= self.zeta:
            return 0.0
        return math.exp(-self.alpha * math.log(self.t) * rate)

    def rollouts(self, state: Hashable) -> int:
        """n(s) = ceil(G_max * S(s))."""
        return int(math.ceil(self.g_max * self.score(state) - 1e-12))

    def omega(self, state: Hashable) -> float:
        return 0.5 * math.exp(-self.omega_k * self.visits(state))

    def step_reward(self, state: Hashable, next_state: Hashable, success: bool) -> float:
        """R(s_t, s_t+1) (module docstring)."""
        w = self.omega(state)
        novel = float(next_state != state)
        return (
            w * novel
            + (0.5 - w) * (self.score(state) - self.score(next_state))
            + 0.5 * float(success)
        )

    def step_rewards(self, steps: Steps) -> np.ndarray:
        """R for every step of a batch, f32 [S] (scores as they stand: update after)."""
        return np.asarray(
            [
                self.step_reward(s, n, bool(ok))
                for s, n, ok in zip(steps.state, steps.next_state, steps.success)
            ],
            np.float32,
        )

    def advantages(self, steps: Steps, scale: str = "mean") -> np.ndarray:
        """3SPO step advantages: step rewards normalised within anchor groups, f32 [S]."""
        return group_normalise(self.step_rewards(steps), anchor_groups(steps), scale)

    def state_dict(self) -> dict[str, Any]:
        """Plain data to save with a checkpoint (states as they are: pickle, not JSON)."""
        return {"t": self.t, "counts": [(s, n, k) for s, (n, k) in self.counts.items()]}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        self.t = int(d["t"])
        self.counts = {s: [int(n), int(k)] for s, n, k in d["counts"]}


# ----------------------------------------------------------------------------- tokens


def steps_to_tokens(step_values: Array, turn_index: Array, mask: Array) -> Array:
    """A per-step value on every policy token of its turn, [B, T]. Jittable.

    Args:
      step_values: f32 [B, N], the value of turn k of row b (e.g. a step advantage).
      turn_index: int [B, T], each token's turn.
      mask: [B, T], 1 on policy tokens (0 on prompt, observations, padding).
    """
    k = jnp.clip(turn_index, 0, step_values.shape[1] - 1)
    return jnp.take_along_axis(step_values, k, axis=1) * mask


def progress_step_scores(
    old_logp: Array,
    ref_logp: Array,
    mask: Array,
    turn_index: Array,
    num_turns: int,
    beta: float = 1.0,
) -> Array:
    """The progress advantage summed over each turn's policy tokens, f32 [B, num_turns].

    a_t = beta * (l_policy(y_t) - l_ref(y_t)) (`objectives.advantages.progress`, on the
    rollout policy's log-probs); observation tokens (mask 0) count for no turn. Jittable.
    All inputs [B, T] and aligned with the tokens.
    """
    stats = TokenStats(logp=old_logp, old_logp=old_logp, mask=mask, ref_logp=ref_logp)
    a_bt = adv_lib.progress(stats, beta=beta)
    ids = jnp.where(mask > 0, turn_index, -1)
    return adv_lib.step_scores(a_bt, ids, num_turns)
