"""Advantage estimators: group baselines (sequence level) and token-level estimators.

One registry, `ADVANTAGES`, with two kinds of entries told apart by `fn.level`:

* `level == "group"`: `ADVANTAGES.get(name)(rewards, **hparams) -> adv [P, G]`.
  `rewards` is [P, G] (P prompts, G completions each) or [P, G, K] for K named reward
  components; entries other than gdpo/gd2po first combine components as
  `R = sum_k reward_weights[k] * r_k` (weights default to 1). Group statistics are computed
  by a per-group function vmapped over prompts. Broadcast to tokens with
  `sequence_to_tokens(adv_pg, mask_bt)` (rows prompt-major: row g*G + i is completion i of
  prompt g).
* `level == "token"`: `ADVANTAGES.get(name)(stats, **hparams) -> adv [B, T]`, from a
  `TokenStats` (e.g. `ADVANTAGES.get("opd")(stats, estimator="gae", gamma=1.0, lam=0.95)`);
  the result is already per token and masked.

`advantage_level(name)` returns the kind. Group statistics use the unbiased std (ddof=1),
so G >= 2 is required (checked at trace time, shapes are static).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.objectives.stats import TokenStats

Array = jax.Array

ADVANTAGES = Registry("advantage estimator", key="objective.advantage")

# Keyword arguments the caller supplies from the batch (`rl.credit`), not config keys:
# the reward weights (from objective.reward_weights), completion lengths, the verifier's
# sequence advantage of a hybrid, a per-token reward (the KL of kl_in_reward).
SUPPLIED_KWARGS = ("reward_weights", "lengths", "seq_adv", "token_reward")


def register_advantage(
    name: str,
    level: str,
    requires: tuple[str, ...] = (),
    components: bool = False,
    *,
    critic: bool = False,
    test_time_only: str = "",
) -> Callable:
    """Register an advantage estimator under `name` (config key `objective.advantage`).

    level: 'group', `fn(rewards [P, G], **hparams) -> adv [P, G]`, or 'token',
    `fn(stats: TokenStats, **hparams) -> adv [B, T]` (masked). Keyword arguments with
    defaults are the entry's config keys (`objective.advantage_kwargs`); an argument named as
    one of `SUPPLIED_KWARGS` (or `group_size`) is given from the batch. `requires`: the
    optional `TokenStats` fields it reads (e.g. 'teacher_logp'), checked at validation.
    `components=True`: a group entry that reads the reward vector [P, G, K] with
    `reward_weights` (the others read the combined sequence reward [P, G]). `critic=True`:
    the learner replaces it with estimates from a learned critic's values (a run needs
    `critic.kind` 'head' or 'model' with it, and no critic without). `test_time_only`: why
    the entry cannot train a policy (a config choosing it for mode='rl' is refused with it).
    """
    if level not in ("group", "token"):
        raise ValueError(f"advantage {name!r}: level={level!r}; allowed: 'group', 'token'")

    def decorator(fn):
        fn.level = level
        fn.requires = tuple(requires)
        fn.components = components
        fn.critic, fn.test_time_only = critic, test_time_only
        return ADVANTAGES.register(name)(fn)

    return decorator


def advantage_level(name: str) -> str:
    """'group' (rewards [P, G(, K)] -> [P, G]) or 'token' (TokenStats -> [B, T])."""
    return ADVANTAGES.get(name).level


def group_advantage_names() -> list[str]:
    return [n for n in ADVANTAGES.names() if advantage_level(n) == "group"]


def token_advantage_names() -> list[str]:
    return [n for n in ADVANTAGES.names() if advantage_level(n) == "token"]


# ----------------------------------------------------------------------------- helpers


def _check_group(rewards: Array) -> None:
    if rewards.ndim not in (2, 3):
        raise ValueError(f"rewards must be [P, G] or [P, G, K], got shape {rewards.shape}")
    if rewards.shape[1] < 2:
        raise ValueError(
            f"group baselines need G >= 2 completions per prompt, got G={rewards.shape[1]}"
        )


def combine_rewards(rewards: Array, reward_weights: Sequence[float] | None = None) -> Array:
    """[P, G] unchanged; [P, G, K] -> sum_k reward_weights[k] * r_k  (weights default to 1)."""
    _check_group(rewards)
    if rewards.ndim == 2:
        return rewards.astype(jnp.float32)
    w_k = _component_weights(rewards, reward_weights)
    return jnp.einsum("pgk,k->pg", rewards.astype(jnp.float32), w_k)


def _component_weights(rewards: Array, reward_weights: Sequence[float] | None) -> Array:
    K = rewards.shape[-1]
    if reward_weights is None:
        return jnp.ones((K,), jnp.float32)
    if len(reward_weights) != K:
        raise ValueError(f"reward_weights has {len(reward_weights)} entries, rewards have K={K}")
    return jnp.asarray(reward_weights, jnp.float32)


def centre(r_g: Array, axis: int = 0) -> Array:
    """r - mean(r) along `axis`, exactly 0 on a constant group.

    Computed about the first element (the shifted-data form): with d = r - r_0,
    r - mean(r) = d - mean(d). On a constant group every d is exactly 0, so the result is
    exactly 0 even when the shared value is not representable (0.9 in float32, whose
    plain mean rounds and leaves ~1e-7 residues that an std normalisation would blow up).
    """
    d = r_g - jnp.take(r_g, jnp.asarray([0]), axis=axis)
    return d - jnp.mean(d, axis=axis, keepdims=True)


def centred_std(c_g: Array, axis: int = 0, keepdims: bool = False) -> Array:
    """Unbiased std from already-centred values: sqrt(sum c^2 / (G - 1)); 0 on a constant group."""
    G = c_g.shape[axis]
    return jnp.sqrt(jnp.sum(c_g**2, axis=axis, keepdims=keepdims) / (G - 1))


def _weighted_whiten(x: Array, weight: Array, eps: float, sqrt_var: bool) -> Array:
    """(x - mean) / (std + eps) or / sqrt(var + eps), weighted mean and unbiased weighted var.

    `weight` counts how many (token) samples each entry stands for; zero-weight entries do not
    enter the statistics. N = sum weight, var = sum w (x - mean)^2 / (N - 1).
    """
    n = jnp.sum(weight)
    mean = jnp.sum(weight * x) / jnp.maximum(n, 1.0)
    var = jnp.sum(weight * (x - mean) ** 2) / jnp.maximum(n - 1.0, 1.0)
    scale = jnp.sqrt(var + eps) if sqrt_var else jnp.sqrt(var) + eps
    return (x - mean) / scale


def zero_variance_mask(rewards: Array) -> Array:
    """[P] bool: groups whose rewards are all equal (every component, for [P, G, K]).

    Such groups carry no within-group signal; DAPO's dynamic sampling drops and resamples them.
    """
    r = rewards if rewards.ndim == 3 else rewards[..., None]
    const_pk = jnp.all(r == r[:, :1], axis=1)
    return jnp.all(const_pk, axis=-1)


def zero_variance_groups(rewards: Array) -> Array:
    """Number of groups (int32 scalar) with all-equal rewards, for dynamic sampling metrics."""
    return jnp.sum(zero_variance_mask(rewards)).astype(jnp.int32)


def _zero_constant_groups(adv_pg: Array, rewards: Array) -> Array:
    """0 on groups whose rewards are all equal: after a batch whitening they would get
    -mean/std (exactly 0 only up to rounding, or not at all with token weighting)."""
    return jnp.where(zero_variance_mask(rewards)[:, None], 0.0, adv_pg)


def sequence_to_tokens(adv: Array, mask_bt: Array) -> Array:
    """Broadcast a sequence advantage [P, G] (or [B]) over tokens: [B, T] = adv[b] * mask."""
    return adv.reshape(-1, 1).astype(jnp.float32) * mask_bt


# ----------------------------------------------------------------------------- group baselines


@register_advantage("grpo", "group")
def grpo(
    rewards: Array,
    scale: str = "group",
    eps: float = 1e-6,
    reward_weights: Sequence[float] | None = None,
) -> Array:
    """GRPO group-normalised advantage.

    A = (R - mean_g) / (std_g + eps); scale='batch' divides by the std of all rewards of the
    batch instead (TRL's scale_rewards='batch'); scale='none' skips the division
    (= dr_grpo). std unbiased.
    Config keys: scale='group' ('group' | 'batch' | 'none'), eps=1e-6, reward_weights=None.
    Shao et al. 2024 (DeepSeekMath, GRPO).
    """
    R = combine_rewards(rewards, reward_weights)
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"grpo: unknown scale {scale!r}; allowed: 'group', 'batch', 'none'")

    def per_group(r_g):  # [G]
        c_g = centre(r_g)
        return c_g / (centred_std(c_g) + eps) if scale == "group" else c_g

    A = jax.vmap(per_group)(R)
    if scale == "batch":
        A = A / (centred_std(centre(R.reshape(-1))) + eps)
    return A


@register_advantage("dr_grpo", "group")
def dr_grpo(rewards: Array, reward_weights: Sequence[float] | None = None) -> Array:
    """Dr. GRPO: the group-mean baseline without the std division.

    A = R - mean_g.   Config keys: reward_weights=None.
    Liu et al. 2025 (Understanding R1-Zero-Like Training: A Critical Perspective).
    """
    R = combine_rewards(rewards, reward_weights)
    return jax.vmap(centre)(R)


@register_advantage("rloo", "group")
def rloo(rewards: Array, reward_weights: Sequence[float] | None = None) -> Array:
    """RLOO: leave-one-out baseline.

    A_i = R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean_g).   Config keys: reward_weights=None.
    Kool et al. 2019 (Buy 4 REINFORCE Samples, Get a Baseline for Free!); Ahmadian et al. 2024.
    """
    R = combine_rewards(rewards, reward_weights)

    def per_group(r_g):
        # the centred form: exactly 0 on equal rewards (sum - r_i over G - 1 can round off)
        G = r_g.shape[0]
        return G / (G - 1) * centre(r_g)

    return jax.vmap(per_group)(R)


@register_advantage("reinforce", "group")
def reinforce(rewards: Array, reward_weights: Sequence[float] | None = None) -> Array:
    """REINFORCE with a batch-mean baseline.

    A = R - mean over the batch.   Config keys: reward_weights=None.
    Williams 1992.
    """
    R = combine_rewards(rewards, reward_weights)
    return R - jnp.mean(R)


@register_advantage("gae", "group", critic=True)
def gae(rewards: Array, reward_weights: Sequence[float] | None = None) -> Array:
    """GAE from a learned critic (PPO): needs `critic.kind` 'head' or 'model' (rl/methods/ppo.py).

    At rollout time A = R, the sequence reward with no baseline (GAE with V = 0 and
    gamma = 1); before the update the learner replaces it with GAE on the critic's values,
    per policy token (`rl.critic.gae`, `critic.gamma`, `critic.lam`).
    Config keys: reward_weights=None.
    Schulman et al. 2016 (GAE); Schulman et al. 2017 (PPO).
    """
    return combine_rewards(rewards, reward_weights)


@register_advantage("reinforce_pp", "group")
def reinforce_pp(
    rewards: Array,
    reward_weights: Sequence[float] | None = None,
    lengths: Array | None = None,
) -> Array:
    """REINFORCE++ (baseline variant): group-mean baseline, then global batch whitening.

    A = whiten_batch(R - mean_g),  whiten(x) = (x - mean) / sqrt(var + 1e-8), mean and
    (unbiased) var over all valid tokens of the batch: pass `lengths` [P, G] (completion
    token counts) to weight each completion by its tokens; None counts each once.
    Groups with all-equal rewards get exactly 0.
    Config keys: reward_weights=None, lengths=None.
    Hu 2025 (REINFORCE++: A Simple and Efficient Approach for Aligning LLMs).
    """
    R = combine_rewards(rewards, reward_weights)
    centred = jax.vmap(centre)(R)
    n = jnp.ones_like(R) if lengths is None else jnp.asarray(lengths, jnp.float32)
    return _zero_constant_groups(_weighted_whiten(centred, n, eps=1e-8, sqrt_var=True), rewards)


def _decoupled_components(rewards: Array) -> Array:
    """GDPO's per-component group normalisation: A_k = (r_k - mean_g) / (std_g + 1e-4), [P, G, K]."""
    r = rewards if rewards.ndim == 3 else rewards[..., None]
    r = r.astype(jnp.float32)

    def per_group(r_gk):  # [G, K]
        c_gk = centre(r_gk, axis=0)
        return c_gk / (centred_std(c_gk, axis=0) + 1e-4)

    return jax.vmap(per_group)(r)


@register_advantage("gdpo", "group", components=True)
def gdpo(rewards: Array, reward_weights: Sequence[float] | None = None) -> Array:
    """GDPO: decouple the reward components' group normalisation, then whiten the batch.

    A_k = (r_k - mean_g(r_k)) / (std_g(r_k) + 1e-4),  A = whiten_batch(sum_k w_k A_k),
    whiten(x) = (x - mean) / (std + 1e-4) over all rows of the batch (std unbiased);
    groups with all-equal rewards (every component) get exactly 0.
    Config keys: reward_weights=None (w_k, default 1).
    GDPO (Group reward-Decoupled Policy Optimization), as described in the GD^2PO abstract.
    """
    _check_group(rewards)
    A_pgk = _decoupled_components(rewards)
    x = jnp.einsum("pgk,k->pg", A_pgk, _component_weights(A_pgk, reward_weights))
    return _zero_constant_groups(
        _weighted_whiten(x, jnp.ones_like(x), eps=1e-4, sqrt_var=False), rewards
    )


@register_advantage("gd2po", "group", components=True)
def gd2po(
    rewards: Array,
    reward_weights: Sequence[float] | None = None,
    mode: str = "hard",
    tau: float = 0.2,
    lengths: Array | None = None,
) -> Array:
    """GD^2PO: GDPO plus conflict-aware filtering and query-level reweighting.

    A_k as in gdpo; a rollout is in conflict when two components' advantages have opposite
    signs (both |.| > 1e-8). mode='hard': keep = not conflict. mode='soft': with
    s = sum_k w_k A_k / (sum_k |w_k A_k| + 1e-6), drop only conflicts with |s| < tau.
    rho_g = kept fraction of the group (query-level reweighting);
    A = whiten(sum_k w_k A_k * rho_g * keep) over kept rows (token-weighted by `lengths`
    [P, G] when given; whiten as in gdpo), and 0 on dropped rows. Groups whose rewards are
    all equal also stay 0: they carry no signal, and whitening over kept rows (whose mean is
    not 0 after filtering) would otherwise give them one.
    Config keys: reward_weights=None, mode='hard' ('hard' | 'soft'), tau=0.2, lengths=None.
    Liu et al. 2026 (GD^2PO: Mitigating Multi-Reward Conflicts via Group-Dynamic
    reward-Decoupled Policy Optimization).
    """
    _check_group(rewards)
    if mode not in ("hard", "soft"):
        raise ValueError(f"gd2po: unknown mode {mode!r}; allowed: 'hard', 'soft'")
    A_pgk = _decoupled_components(rewards)
    wA_pgk = A_pgk * _component_weights(A_pgk, reward_weights)
    pos = jnp.any(wA_pgk > 1e-8, axis=-1)
    neg = jnp.any(wA_pgk < -1e-8, axis=-1)
    conflict = pos & neg
    if mode == "soft":
        s = jnp.sum(wA_pgk, -1) / (jnp.sum(jnp.abs(wA_pgk), -1) + 1e-6)
        conflict = conflict & (jnp.abs(s) < tau)
    keep = (~conflict).astype(jnp.float32)  # [P, G]
    rho_p1 = jnp.mean(keep, axis=1, keepdims=True)
    x = jnp.sum(wA_pgk, -1) * rho_p1 * keep
    n = keep if lengths is None else keep * jnp.asarray(lengths, jnp.float32)
    return _zero_constant_groups(_weighted_whiten(x, n, eps=1e-4, sqrt_var=False) * keep, rewards)


# ----------------------------------------------------------------------------- token level


def _masked_reverse_scan(x_bt: Array, mask_bt: Array, decay: float) -> Array:
    """y_t = m_t x_t + decay^{m_t} y_{t+1}: a discounted sum over later *completion* tokens.

    Masked positions pass the running sum through undiscounted, so decay counts completion
    steps, not columns. Output is masked.
    """
    m = mask_bt.astype(jnp.float32)

    def step(carry_b, xm):
        x_b, m_b = xm
        y_b = m_b * x_b + jnp.where(m_b > 0, decay, 1.0) * carry_b
        return y_b, y_b

    _, ys = jax.lax.scan(step, jnp.zeros(x_bt.shape[0], jnp.float32), (x_bt.T, m.T), reverse=True)
    return ys.T * m


def _shift_left(x_bt: Array) -> Array:
    """x[:, t + 1], with 0 after the last column."""
    return jnp.concatenate([x_bt[:, 1:], jnp.zeros_like(x_bt[:, :1])], axis=1)


def _column_group_mean(x_bt: Array, mask_bt: Array, group_size: int | None) -> Array:
    """Mean of x over the rows of a group still generating at column t (0 if none), [B, T].

    Prompts are left-padded to a common width, so column t is the same completion step in
    every row; this is what makes a per-column mean a per-step baseline.
    """
    B, T = x_bt.shape
    G = B if group_size is None else group_size
    if B % G:
        raise ValueError(f"opd: batch of {B} rows is not divisible by group_size={G}")
    x = (x_bt * mask_bt).reshape(B // G, G, T)
    m = mask_bt.reshape(B // G, G, T)
    mean_pt = jnp.sum(x, 1) / jnp.maximum(jnp.sum(m, 1), 1.0)
    return jnp.repeat(mean_pt, G, axis=0) * mask_bt


def opd_reward(stats: TokenStats) -> Array:
    """a_t = l_teacher(y_t) - l_rollout(y_t) on the sampled token, masked, [B, T].

    Its expectation under the student is -KL(student || teacher) at that state.
    """
    return stats.mask * (stats.teacher_logp - stats.old_logp)


def _returns(a_bt, mask_bt, estimator, gamma, lam, group_size):
    if estimator == "immediate":
        return a_bt * mask_bt
    if estimator == "return_to_go":
        return _masked_reverse_scan(a_bt, mask_bt, 1.0)
    if estimator == "discounted":
        return _masked_reverse_scan(a_bt, mask_bt, gamma)
    if estimator == "gae":
        ret = _masked_reverse_scan(a_bt, mask_bt, gamma)
        V = _column_group_mean(ret, mask_bt, group_size)
        V_next = _shift_left(V) * _shift_left(mask_bt)  # terminal value 0
        delta = mask_bt * (a_bt + gamma * V_next - V)
        return _masked_reverse_scan(delta, mask_bt, gamma * lam)
    raise ValueError(
        f"opd: unknown estimator {estimator!r}; allowed: 'immediate', 'return_to_go', "
        "'discounted', 'gae'"
    )


@register_advantage("opd", "token", requires=("teacher_logp",))
def opd(
    stats: TokenStats,
    estimator: str = "immediate",
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int | None = None,
    token_reward: Array | None = None,
) -> Array:
    """On-policy distillation: per-token reverse KL as reward, [B, T].

    a_t = l_teacher(y_t) - l_rollout(y_t)   (rollout = old_logp), plus `token_reward` [B, T]
    when given (e.g. the KL-to-reference penalty -beta k_t of kl_in_reward), then a return
    estimator:
      immediate:    A_t = a_t
      return_to_go: A_t = sum_{s>=t} a_s
      discounted:   A_t = sum_{s>=t} gamma^{s-t} a_s
      gae:          GAE-OPD. Value-free baseline V_t = mean of the discounted return at the
                    same completion step over the rows of the group (group_size rows sharing
                    a prompt; None = the whole batch) still generating there, V = 0 after the
                    end; delta_t = a_t + gamma V_{t+1} - V_t, A_t = sum_k (gamma lam)^k delta_{t+k}.
                    lam = 1 gives return_to_go(gamma) - V_t; lam = 0 the one-step TD error.
    Steps count completion tokens. Config keys: estimator='immediate', gamma=1.0, lam=1.0,
    group_size=None (the trainer passes G).  Needs: teacher_logp.
    Agarwal et al. 2024 (GKD); Lu & Thinking Machines 2025 (On-Policy Distillation); GAE-OPD
    from Zhang 2026 (A Formula-Driven Survey and Research Agenda for On-Policy Distillation).
    """
    a_bt = opd_reward(stats) if token_reward is None else opd_reward(stats) + token_reward
    return _returns(a_bt, stats.mask, estimator, gamma, lam, group_size)


@register_advantage("opd_hybrid", "token", requires=("teacher_logp",))
def opd_hybrid(
    stats: TokenStats,
    seq_adv: Array,
    coef: float = 1.0,
    estimator: str = "immediate",
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int | None = None,
) -> Array:
    """Verifier + OPD hybrid: A_t = A_task + coef * a_t, [B, T].

    `seq_adv` is the verifier's sequence advantage ([P, G], [B] or already [B, T], e.g. from
    grpo); a_t is the `opd` advantage with the given estimator.
    Config keys: coef=1.0, estimator='immediate', gamma=1.0, lam=1.0, group_size=None.
    Needs: teacher_logp.  OPD survey (Zhang 2026), verifier-guided hybrids.
    """
    B, T = stats.mask.shape
    task = seq_adv if seq_adv.shape == (B, T) else seq_adv.reshape(B, 1)
    a = opd(stats, estimator=estimator, gamma=gamma, lam=lam, group_size=group_size)
    return stats.mask * (task + coef * a)


@register_advantage(
    "progress",
    "token",
    requires=("ref_logp",),
    test_time_only="its a_t = beta * (l_policy - l_ref) is 0 at step 0, where the reference is "
    "the initial policy, so the gradient is 0 and the policy never moves from it. Progress is "
    "a test-time score (advantages.step_scores); choose another advantage for mode='rl'",
)
def progress(stats: TokenStats, beta: float = 1.0, token_reward: Array | None = None) -> Array:
    """Progress advantage: a_t = beta * (l_policy(y_t) - l_ref(y_t)), [B, T], masked.

    l_policy is the rollout policy (old_logp); `token_reward` [B, T] is added when given. A
    step score sums a_t over the step's tokens: `step_scores(a_bt, step_ids_bt, num_steps)`.
    A test-time score: as a training advantage against a reference equal to the initial
    policy it is 0 at step 0 and nothing is learnt (the config refuses mode='rl' with it).
    Config keys: beta=1.0.  Needs: ref_logp.
    Neglected Free Lunch from Post-training: Progress Advantage for LLM Agents (2026).
    """
    a_bt = beta * (stats.old_logp - stats.ref_logp)
    return stats.mask * (a_bt if token_reward is None else a_bt + token_reward)


def step_scores(a_bt: Array, step_ids_bt: Array, num_steps: int) -> Array:
    """Sum a per-token score over steps: [B, num_steps], out[b, s] = sum_{t: id=s} a[b, t].

    `step_ids_bt` int [B, T]; ids outside [0, num_steps) (e.g. -1 on prompt) are ignored.
    """
    onehot_bts = jax.nn.one_hot(step_ids_bt, num_steps, dtype=a_bt.dtype)
    return jnp.einsum("bt,bts->bs", a_bt, onehot_bts)
