"""Actor-critic pieces: a learned value function, GAE advantages, the clipped value loss.

Alignment. As every per-token array here (`objectives.stats`), `values[b, t]` is about token
`tokens[b, t]`: the value of the state the token is sampled in, V(tokens[b, :t]), read from
the hidden state at position t - 1 (column 0 holds 0). `mask` [B, T] is 1 on the tokens the
policy sampled (the loss mask): prompt, padding and environment observations are 0, so they
are not steps of the MDP, get no advantage and no value loss.

GAE (Schulman et al. 2016, High-Dimensional Continuous Control Using Generalized Advantage
Estimation), over the policy tokens p_1 < ... < p_n of a row only:

    delta_i = r_i + gamma * V_{i+1} - V_i          (V_{n+1} = last_value: 0 at a real end,
    A_i     = sum_l (gamma * lam)^l delta_{i+l}      the critic's value of the cut state when
    R_i     = A_i + V_i   (the value targets)       an episode was cut by a budget)

Masked positions are skipped, not treated as zero-reward steps: an observation between two
turns does not discount and its value is never read. Rewards sit on policy tokens (a turn's
reward on its last sampled token: `turn_rewards_to_tokens`).

Clipped value loss (PPO as in OpenAI baselines / Andrychowicz et al. 2021, What Matters In
On-Policy Reinforcement Learning?):

    L_V = token_mean( max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2) / 2 )

Two critics, a `CRITICS` registry entry each (selected by name):
  head   a linear value head on the policy's final hidden states (shared trunk; the value
         loss trains the trunk too unless `stop_gradient`), `ValueHead`;
  model  a small separate transformer with its own value head, `ValueModel`.
Both expose `values(tokens, attention_mask, hidden=None) -> [B, T]`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.models.hybrid import model_class
from jaxrl_frontier.models.model_config import ModelConfig

Array = jax.Array

CRITICS = Registry("critic", key="critic.kind")


# ----------------------------------------------------------------------------- GAE


def gae(
    rewards: Array,
    values: Array,
    mask: Array,
    gamma: float = 1.0,
    lam: float = 0.95,
    last_value: Array | None = None,
) -> tuple[Array, Array]:
    """GAE over the masked (policy) tokens of each row (module docstring). Jittable.

    Args:
      rewards: f32 [B, T], the reward of each policy token (read only where mask is 1).
      values: f32 [B, T], V of the state each token is sampled in (held constant).
      mask: [B, T], 1 on policy tokens.
      gamma, lam: discount and GAE lambda (per policy token).
      last_value: f32 [B], the value after the last policy token (default 0: episodes ended).

    Returns:
      (advantages [B, T], returns [B, T]), 0 off the mask.
    """
    m = mask.astype(jnp.float32)
    r = rewards.astype(jnp.float32)
    v = jax.lax.stop_gradient(values.astype(jnp.float32))
    B = r.shape[0]
    v_last = jnp.zeros(B, jnp.float32) if last_value is None else last_value.astype(jnp.float32)

    def step(carry, x):
        next_v, next_a = carry
        r_t, v_t, m_t = x
        delta = r_t + gamma * next_v - v_t
        a_t = delta + gamma * lam * next_a
        on = m_t > 0
        carry = (jnp.where(on, v_t, next_v), jnp.where(on, a_t, next_a))
        return carry, jnp.where(on, a_t, 0.0)

    init = (jax.lax.stop_gradient(v_last), jnp.zeros(B, jnp.float32))
    _, adv_tb = jax.lax.scan(step, init, (r.T, v.T, m.T), reverse=True)
    adv = adv_tb.T
    return adv, (adv + v) * m


def turn_rewards_to_tokens(turn_rewards: Array, turn_index: Array, mask: Array) -> Array:
    """Each turn's reward on the last policy token of that turn, [B, T]. Jittable.

    Args:
      turn_rewards: f32 [B, N], reward of turn k (N turns at most).
      turn_index: int [B, T], the turn each token belongs to (any value off the mask).
      mask: [B, T], 1 on policy tokens.
    """
    m = mask.astype(bool)
    # a policy token is its turn's last when the next policy token belongs to a later turn (or
    # there is none); find the next policy token's turn with a reverse cumulative scan
    big = jnp.iinfo(jnp.int32).max

    def step(next_turn, x):
        k_t, m_t = x
        return jnp.where(m_t, k_t, next_turn), next_turn

    _, next_turn_tb = jax.lax.scan(
        step,
        jnp.full(mask.shape[0], big, jnp.int32),
        (turn_index.astype(jnp.int32).T, m.T),
        reverse=True,
    )
    last = m & (next_turn_tb.T != turn_index)
    k = jnp.clip(turn_index, 0, turn_rewards.shape[1] - 1)
    return jnp.where(last, jnp.take_along_axis(turn_rewards, k, axis=1), 0.0)


# ----------------------------------------------------------------------------- loss


def value_loss(
    values: Array, old_values: Array, returns: Array, mask: Array, clip_eps: float | None = 0.2
) -> tuple[Array, dict[str, Array]]:
    """Clipped value loss (module docstring), token mean over the mask. Jittable.

    Args:
      values: f32 [B, T], the critic's current values (differentiable).
      old_values: f32 [B, T], the values at rollout time (constant).
      returns: f32 [B, T], the GAE value targets (constant).
      mask: [B, T], 1 on policy tokens.
      clip_eps: eps_v; None = the unclipped loss (V - R)^2 / 2.

    Returns:
      (loss [], metrics {value/clip_frac, value/mse}).
    """
    m = mask.astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    old_values = jax.lax.stop_gradient(old_values)
    returns = jax.lax.stop_gradient(returns)
    plain = jnp.square(values - returns)
    if clip_eps is None:
        per_token, clipped_share = plain, jnp.zeros((), jnp.float32)
    else:
        v_clip = old_values + jnp.clip(values - old_values, -clip_eps, clip_eps)
        clipped = jnp.square(v_clip - returns)
        per_token = jnp.maximum(plain, clipped)
        clipped_share = jnp.sum(m * (clipped > plain)) / n
    loss = 0.5 * jnp.sum(m * per_token) / n
    metrics = {
        "value/clip_frac": jax.lax.stop_gradient(clipped_share),
        "value/mse": jax.lax.stop_gradient(jnp.sum(m * plain) / n),
    }
    return loss, metrics


def value_metrics(values: Array, returns: Array, mask: Array) -> dict[str, Array]:
    """Diagnostics of a critic on a batch, all scalars over the masked tokens:

    value/mean, value/return_mean, value/explained_variance = 1 - Var(R - V) / Var(R)
    (1 a perfect critic, 0 no better than a constant, < 0 worse; 0 when Var(R) = 0).
    """
    m = mask.astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    v = jax.lax.stop_gradient(values)
    r = jax.lax.stop_gradient(returns)

    def var(x):
        mu = jnp.sum(m * x) / n
        return jnp.sum(m * jnp.square(x - mu)) / n

    var_r = var(r)
    ev = jnp.where(var_r > 0, 1.0 - var(r - v) / jnp.where(var_r > 0, var_r, 1.0), 0.0)
    return {
        "value/mean": jnp.sum(m * v) / n,
        "value/return_mean": jnp.sum(m * r) / n,
        "value/explained_variance": ev,
    }


# ----------------------------------------------------------------------------- critics


def align_values(v_hidden: Array) -> Array:
    """[B, T] values read at each position -> aligned with the tokens: out[:, t] = v[:, t-1]
    (the state before token t), out[:, 0] = 0."""
    return jnp.concatenate([jnp.zeros_like(v_hidden[:, :1]), v_hidden[:, :-1]], axis=1)


class ValueHead(nnx.Module):
    """V = h @ w + b on the policy's final (normed) hidden states h [B, T, D].

    Zero-initialised: the first values are 0, so the first advantages are the rewards' GAE
    and a fresh head does not add noise to them.
    """

    capabilities = Capabilities.all_but(
        packed_rows="a value head on the padded rows' hidden states"
    )

    def __init__(self, hidden_size: int, *, rngs: nnx.Rngs, stop_gradient: bool = False):
        del rngs  # zero init needs no randomness; kept for a uniform constructor
        self.w = nnx.Param(jnp.zeros((hidden_size,), jnp.float32))
        self.b = nnx.Param(jnp.zeros((), jnp.float32))
        self.stop_gradient = stop_gradient

    def __call__(self, hidden: Array) -> Array:
        """hidden [B, T, D] -> values per position [B, T] (not yet aligned)."""
        h = hidden.astype(jnp.float32)
        if self.stop_gradient:  # train the head only, not the policy's trunk
            h = jax.lax.stop_gradient(h)
        return h @ self.w[...] + self.b[...]

    def values(self, tokens: Array, attention_mask: Array, hidden: Array | None = None) -> Array:
        """Aligned values [B, T] from the policy's hidden states `hidden` [B, T, D]."""
        if hidden is None:
            raise ValueError("critic 'head' reads the policy's hidden states: pass hidden")
        return align_values(self(hidden))


class ValueModel(nnx.Module):
    """A separate small transformer with a value head (its own trunk, its own optimizer)."""

    capabilities = Capabilities.all_but(packed_rows="its values on the padded rows")

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.trunk = model_class(cfg)(cfg, rngs=rngs)  # (a hybrid policy's: Qwen3.5)
        self.head = ValueHead(cfg.hidden_size, rngs=rngs)

    def values(self, tokens: Array, attention_mask: Array, hidden: Array | None = None) -> Array:
        """Aligned values [B, T] for tokens int32 [B, T] (`hidden`, the policy's, is unused)."""
        del hidden
        h, _ = self.trunk.hidden_states(tokens, attention_mask)
        return align_values(self.head(h))


@CRITICS.register("head", part=ValueHead)
def make_value_head(policy_cfg: ModelConfig, *, rngs: nnx.Rngs, stop_gradient: bool = False):
    """A value head on the policy (`ValueHead` of the policy's hidden size)."""
    return ValueHead(policy_cfg.hidden_size, rngs=rngs, stop_gradient=stop_gradient)


@CRITICS.register("model", part=ValueModel)
def make_value_model(
    policy_cfg: ModelConfig,
    *,
    rngs: nnx.Rngs,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
):
    """A separate critic: a transformer of the policy's vocabulary and positions, with its
    own (small) width and depth, and a value head."""
    import dataclasses

    cfg = dataclasses.replace(
        policy_cfg,
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=None,
    )
    return ValueModel(cfg, rngs=rngs)


def make_critic(kind: str, policy_cfg: ModelConfig, *, rngs: nnx.Rngs, **kwargs):
    """The critic `kind` ('head' | 'model'); kwargs go to its builder."""
    return CRITICS.get(kind)(policy_cfg, rngs=rngs, **kwargs)
