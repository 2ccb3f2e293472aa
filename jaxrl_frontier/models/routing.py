"""A mixture of experts' router (models/moe.py runs the experts it picks): the gates, routing
replay, and the statistics its losses and metrics read.

    softmax router   p = softmax(x W_r + b_r) [N, E]; (i_1..i_k) = top-k(p), g_j = p_{i_j}
                     (/ sum_j g_j with `norm_topk_prob`)                      `top_k_gates`
    sigmoid router   s = sigmoid(x W_r) [N, E]; experts by s + bias (the balancing bias)
                     within the best `topk_group` of `n_group` groups; g = s at them,
                     normalized, times `routed_scaling_factor` (DeepSeek-V3)  `group_limited_gates`

Routing replay: `Route.experts` [B, T, k] forces each token's experts (recorded in the
rollout, or in the first update epoch); the gates are recomputed from the current router at
those experts, so the router still receives a gradient. `RouterStats` (per layer) feed the
load-balancing loss, the router z-loss and the routing metrics (`router_losses`,
`router_metrics`); `balance_bias_update` moves DeepSeek-V3's auxiliary-loss-free bias (`balance_biases`: every
bias of a params tree, in the learner's update; `is_balance_bias`: the leaves no optimizer
moves). `LayerRouting`: a forward's routing, layer by layer (the model's forwards).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models.model_config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Route:
    """What a forward tells each MoE layer (trace-time, not a pytree).

    mask: [B, T] 1 on the tokens the router statistics count (None: every token).
    experts: int [B, T, k] this layer's forced experts (routing replay), or None: the
      router's own top-k.
    """

    mask: jax.Array | None = None
    experts: jax.Array | None = None


@flax.struct.dataclass
class RouterStats:
    """One MoE layer's routing over the counted tokens (sums, so microbatches and layers
    add up). experts: int32 [B, T, k] the experts each token went to (every token); own:
    the router's own top-k (= experts unless a routing was replayed)."""

    load: jax.Array  # f32 [E]  assignments per expert
    prob: jax.Array  # f32 [E]  summed router probabilities
    z: jax.Array  # f32 []  summed logsumexp(logits)^2
    entropy: jax.Array  # f32 []  summed router entropy (nats)
    tokens: jax.Array  # f32 []  counted tokens
    experts: jax.Array
    own: jax.Array
    # 'all_to_all' dispatch: assignments (of every token, padding included) dropped past
    # the capacity, and all assignments made (f32 []; 0 and N k under 'gather')
    dropped: jax.Array = 0.0
    assigned: jax.Array = 0.0


def top_k_gates(logits: jax.Array, k: int, norm: bool, forced: jax.Array | None = None):
    """Router logits f32 [..., E] -> (experts int32 [..., k], gates f32 [..., k]); the
    router's own top-k is `top_k_gates(logits, k, norm)[0]`.

    forced [..., k]: use these experts (routing replay); the gates are still the current
    router probabilities there (renormalised over the k with `norm`), so they carry a
    gradient. A token whose forced experts are negative (none recorded: padding, a
    rollout's last token) takes its own. Without: the k most probable experts, highest
    first (HF's torch.topk order).
    """
    probs = jax.nn.softmax(logits, axis=-1)
    gates, experts = jax.lax.top_k(probs, k)
    if forced is not None:
        recorded = jnp.all(forced >= 0, axis=-1, keepdims=True)
        experts = jnp.where(recorded, forced.astype(jnp.int32), experts)
        gates = jnp.take_along_axis(probs, experts, axis=-1)
    if norm:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    return experts.astype(jnp.int32), gates


def group_limited_gates(
    logits, bias, k: int, n_group: int, topk_group: int, norm: bool, forced=None
):
    """DeepSeek-V3's router (arXiv 2412.19437 sec. 2.1.2; HF `DeepseekV3TopkRouter`):
    logits f32 [..., E], bias [E] (the auxiliary-loss-free balancing bias, HF
    `e_score_correction_bias`) -> (experts int32 [..., k], gates f32 [..., k]).

        s = sigmoid(logits);  c = s + bias                    (c only chooses)
        group score = sum of the 2 highest c in each of n_group groups of E / n_group
        experts = top-k of c over the topk_group best groups' experts
        gates = s at the experts (/ their sum + 1e-20 with `norm`)

    forced [..., k]: routing replay, as `top_k_gates` (gates the current s there)."""
    scores = jax.nn.sigmoid(logits)
    choice = scores + bias.astype(jnp.float32)
    e = scores.shape[-1]
    grouped = choice.reshape(*choice.shape[:-1], n_group, e // n_group)
    group_score = jax.lax.top_k(grouped, min(2, e // n_group))[0].sum(-1)  # [..., G]
    best = jax.lax.top_k(group_score, topk_group)[1]
    keep = jnp.any(jax.nn.one_hot(best, n_group, dtype=bool), axis=-2)  # [..., G]
    choice = jnp.where(jnp.repeat(keep, e // n_group, axis=-1), choice, -jnp.inf)
    experts = jax.lax.top_k(choice, k)[1]
    if forced is not None:
        recorded = jnp.all(forced >= 0, axis=-1, keepdims=True)
        experts = jnp.where(recorded, forced.astype(jnp.int32), experts)
    gates = jnp.take_along_axis(scores, experts, axis=-1)
    if norm:
        gates = gates / (jnp.sum(gates, axis=-1, keepdims=True) + 1e-20)
    return experts.astype(jnp.int32), gates


def router_stats(logits, experts, mask, num_experts: int, own=None, dropped=0.0) -> RouterStats:
    """The `RouterStats` of logits f32 [B, T, E] and chosen experts [B, T, k] over the
    tokens where mask [B, T] is 1 (None: all); own: the router's own top-k (None: experts);
    dropped: the assignments the dispatch dropped (`expert_parallel`)."""
    w = jnp.ones(logits.shape[:-1], jnp.float32) if mask is None else mask.astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    lse = jax.nn.logsumexp(logits, axis=-1)
    entropy = jnp.sum(jax.scipy.special.entr(probs), axis=-1)  # 0 log 0 = 0
    hits = jax.nn.one_hot(experts, num_experts, dtype=jnp.float32).sum(-2)  # [B, T, E]
    return RouterStats(
        load=jnp.einsum("bte,bt->e", hits, w),
        prob=jnp.einsum("bte,bt->e", probs, w),
        z=jnp.sum(lse**2 * w),
        entropy=jnp.sum(entropy * w),
        tokens=jnp.sum(w),
        experts=experts,
        own=experts if own is None else own,
        dropped=jnp.asarray(dropped, jnp.float32),
        assigned=jnp.asarray(experts.size, jnp.float32),
    )


def no_router_stats(shape, num_experts: int, k: int) -> RouterStats:
    """The `RouterStats` of a layer without a router (a dense layer of an MoE model,
    DeepSeek-V3's first layers) over tokens [B, T] (shape): no load, no tokens counted,
    experts -1 (none: a replay leaves such a layer alone), and 0 assignments, which
    `router_losses`, `router_metrics` and `routing_difference_share` read as "not an MoE
    layer"."""
    zeros = jnp.zeros((num_experts,), jnp.float32)
    none = jnp.full((*shape, k), -1, jnp.int32)
    nothing = jnp.zeros((), jnp.float32)
    return RouterStats(zeros, zeros, nothing, nothing, nothing, none, none, nothing, nothing)


# ----------------------------------------------------------------------------- experts


ROUTING_REPLAY = ("none", "rollout", "first_update")


def check_routing_replay(mode: str, num_experts: int) -> None:
    """`model.moe.routing_replay` = mode is one of `ROUTING_REPLAY`, and a mode other than
    'none' has experts to replay (num_experts > 0); ConfigError otherwise."""
    key = "config key 'model.moe.routing_replay'"
    if mode not in ROUTING_REPLAY:
        raise ConfigError(f"{key} = {mode!r}: allowed values are {ROUTING_REPLAY}")
    if mode != "none" and not num_experts:
        raise ConfigError(
            f"{key} = {mode!r} replays experts: the policy has none (model.moe.num_experts = 0)"
            "; set it to 'none'"
        )


def router_losses(stats: RouterStats) -> dict[str, jax.Array]:
    """Stacked per-layer `RouterStats` ([L, E] / [L]) -> {'load_balance', 'z'} (f32 []).

    load_balance: mean over layers of E * sum_e f_e P_e (Switch Transformer; Fedus et al.,
      2021), f_e the share of the layer's assignments that went to e (load / (tokens k)),
      P_e the mean router probability of e; 1 when balanced, E at worst. Its gradient
      reaches the router through P_e.
    z: mean over layers and tokens of logsumexp(logits)^2 (ST-MoE; Zoph et al., 2022).
    """
    tokens = jnp.maximum(stats.tokens, 1.0)  # [L]
    num_experts = stats.load.shape[-1]
    f = stats.load / jnp.maximum(jnp.sum(stats.load, -1, keepdims=True), 1.0)
    p = stats.prob / tokens[:, None]
    balance = num_experts * jnp.sum(jax.lax.stop_gradient(f) * p, axis=-1)
    moe = _moe_layers(stats)  # the mean over the MoE layers (DeepSeek's dense ones: none)
    return {"load_balance": _mean_over(balance, moe), "z": _mean_over(stats.z / tokens, moe)}


def _moe_layers(stats: RouterStats) -> jax.Array:
    """bool [L]: the layers with a router (`no_router_stats` makes none assignments)."""
    return jnp.broadcast_to(stats.assigned, stats.tokens.shape) > 0


def _mean_over(x, where):
    return jnp.sum(jnp.where(where, x, 0.0)) / jnp.maximum(jnp.sum(where), 1)


def balance_bias_update(bias: jax.Array, load: jax.Array, gamma: float) -> jax.Array:
    """DeepSeek-V3's auxiliary-loss-free balancing (arXiv 2412.19437 sec. 2.1.2; Wang et
    al., 2024): after each step, each expert's selection bias moves by gamma toward balance,

        b_e <- b_e + gamma * sign(mean_e' load_e' - load_e)

    bias [..., E] (`MoE.router_score_bias`, per layer), load [..., E] (the step's
    assignments per expert, `RouterStats.load` summed over its microbatches). The bias only
    chooses experts (`group_limited_gates`): the gates and the gradient do not see it."""
    mean = jnp.mean(load, axis=-1, keepdims=True)
    return bias + gamma * jnp.sign(mean - load).astype(bias.dtype)


# the balancing bias's parameter name (`MoE.router_score_bias`, HF `e_score_correction_bias`)
# and the update's per-layer load [L, E] the loss reports for it (`add_router_terms`)
BIAS_NAME = "router_score_bias"
LOAD_METRIC = "moe/expert_load"


def is_balance_bias(path) -> bool:
    """A params-tree path (`jax.tree_util` keys) that leads to a balancing bias: a leaf no
    optimizer moves (`balance_biases` does)."""
    return any(getattr(k, "key", None) == BIAS_NAME for k in path)


def has_balance_bias(params) -> bool:
    """The params tree holds a balancing bias (a DeepSeek-V3 policy)."""
    return any(is_balance_bias(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0])


def balance_biases(params, load: jax.Array, gamma) -> tuple:
    """(params with every balancing bias moved by `balance_bias_update`, max |b| over them
    after the move: f32 []). load [L, E]: the step's assignments per expert of all L layers
    (`RouterStats.load` stacked, dense layers first, their rows 0); a bias leaf [n, E] holds
    the last n layers' (the MoE stack after DeepSeek-V3's `first_k_dense_replace` dense
    layers), so it moves by load[L - n:]. gamma: u, the bias update speed."""
    moved = []

    def move(path, leaf):
        if not is_balance_bias(path):
            return leaf
        new = balance_bias_update(leaf, load[load.shape[0] - leaf.shape[0] :], gamma)
        moved.append(jnp.max(jnp.abs(new)).astype(jnp.float32))
        return new

    params = jax.tree_util.tree_map_with_path(move, params)
    return params, jnp.max(jnp.stack(moved)) if moved else jnp.zeros((), jnp.float32)


def check_bias_update(rate: float, router_scoring: str, lora: bool = False) -> None:
    """`model.moe.bias_update_rate` = rate > 0 needs a router with a balancing bias
    (`router_scoring` 'sigmoid': DeepSeek-V3; '': no router, a dense MLP) in the trained
    weights (not LoRA's frozen base); ConfigError otherwise."""
    key = f"config key 'model.moe.bias_update_rate' = {rate}"
    if rate and router_scoring != "sigmoid":
        has = f"a {router_scoring!r} router" if router_scoring else "a dense MLP (no router)"
        raise ConfigError(
            f"{key} moves the router's balancing bias (DeepSeek-V3's e_score_correction_bias)"
            f": this policy has {has}, without one; set it to 0 or use model.family = "
            "'deepseek_v3'"
        )
    if rate and lora:
        raise ConfigError(
            f"{key}: with LoRA (model.lora.rank > 0) the bias is in the frozen base, which the "
            "update does not change; set it to 0"
        )


def router_metrics(stats: RouterStats) -> dict[str, jax.Array]:
    """Per-step routing metrics from stacked `RouterStats`: the busiest and idlest expert's
    load over the mean load (max over layers / min over layers), the mean router entropy
    per token (nats; log E is uniform), and the share of assignments the dispatch dropped."""
    mean = jnp.maximum(jnp.mean(stats.load, -1), 1e-9)  # [L]
    tokens = jnp.maximum(stats.tokens, 1.0)
    moe = _moe_layers(stats)  # over the MoE layers only (DeepSeek's dense ones: none)
    return {
        "moe/load_max": jnp.max(jnp.where(moe, jnp.max(stats.load, -1) / mean, 0.0)),
        "moe/load_min": jnp.min(jnp.where(moe, jnp.min(stats.load, -1) / mean, jnp.inf)),
        "moe/router_entropy": _mean_over(stats.entropy / tokens, moe),
        # 'all_to_all' dispatch with a capacity factor: the share of assignments dropped
        "moe/dropped_share": jnp.sum(stats.dropped) / jnp.maximum(jnp.sum(stats.assigned), 1.0),
    }


def routing_difference_share(a, b, mask=None) -> jax.Array:
    """The share of (token, layer) pairs whose top-k expert set differs between two
    routings a, b int [B, T, L, k] (e.g. the rollout's and the update's), over the tokens
    where mask [B, T] is 1 (None: all). The order within the k does not matter."""
    differ = jnp.any(jnp.sort(a, -1) != jnp.sort(b, -1), axis=-1)  # [B, T, L]
    w = jnp.ones(a.shape[:2], jnp.float32) if mask is None else mask.astype(jnp.float32)
    # the layers with a router (a dense layer's experts are -1 everywhere: DeepSeek's first)
    layers = jnp.sum(jnp.any(a >= 0, axis=(0, 1, 3)))
    return jnp.sum(differ * w[..., None]) / jnp.maximum(jnp.sum(w) * layers, 1.0)


class LayerRouting:
    """An MoE forward's routing, for `Transformer.hidden_states`: `routed` (replayed experts
    or router stats asked for), `forced` [L, B, T, k] replayed experts (or None);
    route(forced_l) -> the layer's `Route` (None: a plain MLP call); stats(out) -> the
    layer's router stats from its output (None unless routed)."""

    def __init__(self, routed: bool, attention_mask, forced, cfg: ModelConfig):
        self.routed, self.mask, self.forced, self.cfg = routed, attention_mask, forced, cfg

    def __call__(self, forced_layer):
        return Route(mask=self.mask, experts=forced_layer) if self.routed else None

    def stats(self, out):
        """The layer's stats; a dense layer of an MoE model (DeepSeek-V3's first layers)
        gives none, and stands in the [L, ...] stack as `no_router_stats`."""
        if not self.routed:
            return None
        if out[2] is None:
            return no_router_stats(
                self.mask.shape, self.cfg.num_experts, self.cfg.num_experts_per_tok
            )
        return out[2]
