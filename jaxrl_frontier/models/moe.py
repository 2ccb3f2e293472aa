"""The mixture-of-experts MLP (Qwen3-MoE, GPT-OSS): a softmax top-k router and E SwiGLU
experts.

    p = softmax(x W_r + b_r)                  [N, E]   router probabilities (f32)
    (i_1..i_k) = top-k(p),  g_j = p_{i_j}     gates; / sum_j g_j with `norm_topk_prob`
    y = sum_j g_j * Expert_{i_j}(x)           [N, D]
    Expert_e(x) = glu(x W_g,e + b_g,e, x W_u,e + b_u,e) W_d,e + b_d,e

glu is `swiglu` (silu(g) u) and there are no biases b, except for GPT-OSS: the biases
with `ModelConfig.expert_bias`, the clamped SwiGLU `clamped_swiglu` with `swiglu_limit`.
Its router takes the softmax over the top-k logits, which is the renormalised top-k of the
full softmax (`norm_topk_prob`): exp(l_i) / sum_j exp(l_j) over the k either way.
DeepSeek-V3 (`ModelConfig.router_scoring = 'sigmoid'`) routes by sigmoid scores instead,
its experts chosen by score plus a balancing bias within the best groups of experts and
its gates times `routed_scaling_factor` (`group_limited_gates`; the bias moved by
`balance_bias_update`), with ungated shared experts.

The experts' weights are stacked over a leading expert axis (`ExpertWeights`: gate, up
[E, D, F], down [E, F, D], logical axes `expert`, `embed`, `mlp`; their biases), and each
expert runs on the tokens routed to it: the N k assignments are sorted by expert and the
three matmuls are grouped matmuls (`jax.lax.ragged_dot`) over the sorted rows
(`EXPERT_IMPLS['ragged']`); `EXPERT_IMPLS['dense']` runs every expert on every token and
weighs the outputs by a one-hot combine matrix (E / k times the FLOPs; the reference form).

Expert parallelism: where the expert axis of the weights is split over a mesh axis
(`sharding.DEFAULT_RULES`: `expert` -> fsdp), `expert_parallel` runs the experts under
`jax.shard_map`: each device gathers the tokens of its expert group (an all-gather over the
expert axis), runs its E / n local experts on the assignments routed to them, and the
partial outputs are summed and split back to the devices' own rows (a reduce-scatter). The
expert weights never move; the tokens do (N D per layer, against E 3 D F for gathering the
experts as FSDP gathers a dense MLP).

The router (its gates, routing replay, `RouterStats` and the losses and metrics they
feed) is models/routing.py; its names are read as `moe.<name>` as well.
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.models.layers import dense, make_param
from jaxrl_frontier.models.model_config import ModelConfig

# the router's parts, read as `moe.<name>` as well (models/routing.py)
from jaxrl_frontier.models.routing import (  # noqa: F401
    LOAD_METRIC,
    ROUTING_REPLAY,
    Route,
    RouterStats,
    balance_bias_update,
    balance_biases,
    check_bias_update,
    check_routing_replay,
    group_limited_gates,
    has_balance_bias,
    is_balance_bias,
    no_router_stats,
    router_losses,
    router_metrics,
    router_stats,
    routing_difference_share,
    top_k_gates,
)


@flax.struct.dataclass
class ExpertWeights:
    """One layer's experts, stacked over a leading expert axis of E_l (all E, or a device's
    shard): gate, up [E_l, D, F], down [E_l, F, D]; GPT-OSS's biases gate_bias, up_bias
    [E_l, F], down_bias [E_l, D] (None without `ModelConfig.expert_bias`)."""

    gate: jax.Array
    up: jax.Array
    down: jax.Array
    gate_bias: jax.Array | None = None
    up_bias: jax.Array | None = None
    down_bias: jax.Array | None = None

    def axes(self) -> ExpertWeights:
        """The logical axes of each field present (None where a bias is absent)."""
        have = lambda a, axes: None if a is None else axes  # noqa: E731
        return ExpertWeights(
            EXPERT_AXES, EXPERT_AXES, EXPERT_DOWN_AXES,
            have(self.gate_bias, ("expert", "mlp")), have(self.up_bias, ("expert", "mlp")),
            have(self.down_bias, ("expert", "embed")),
        )  # fmt: skip


def swiglu(gate, up):
    """silu(gate) * up (Qwen-MoE's experts)."""
    return jax.nn.silu(gate) * up


def clamped_swiglu(gate, up, *, limit: float, alpha: float):
    """GPT-OSS's experts (HF `GptOssExperts._apply_gate`): the gate clamped above at c, up
    clamped to [-c, c], and a sigmoid of gain alpha (1.702: silu's approximation of GELU),

        g' = min(gate, c),  u' = clip(up, -c, c),  out = (u' + 1) * g' * sigmoid(alpha g')"""
    gate = jnp.minimum(gate, limit)
    up = jnp.clip(up, -limit, limit)
    return (up + 1) * gate * jax.nn.sigmoid(alpha * gate)


def _bias(b, ids, dt):
    """b [E_l, ...] at each row's expert ids [M] (ids past the shard clipped: such rows'
    outputs are weighted 0), in dtype dt; 0 without a bias."""
    if b is None:
        return jnp.zeros((), dt)
    return b.astype(dt)[jnp.minimum(ids, b.shape[0] - 1)]


def _expert_ragged(xs, sizes, ids, w: ExpertWeights, glu):
    """Rows xs [M, D] grouped by expert (group sizes [E_l], each row's expert ids [M]) ->
    [M, D]; rows past the groups come out 0 (their biases aside: such rows are weighted 0)."""
    dt = xs.dtype
    gate = jax.lax.ragged_dot(xs, w.gate.astype(dt), sizes) + _bias(w.gate_bias, ids, dt)
    up = jax.lax.ragged_dot(xs, w.up.astype(dt), sizes) + _bias(w.up_bias, ids, dt)
    out = jax.lax.ragged_dot(glu(gate, up), w.down.astype(dt), sizes)
    return out + _bias(w.down_bias, ids, dt)


def experts_ragged(x, experts, gates, w: ExpertWeights, first: int | jax.Array = 0, glu=swiglu):
    """sum_j gates_j * Expert_{experts_j}(x) over the experts held, by grouped matmuls.

    x [N, D]; experts int [N, k] (distinct per token); gates [N, k]; w: the experts first ..
    first + E_l - 1 (all of them on one device; a shard's under expert parallelism, whose
    other assignments contribute 0); glu(gate, up) -> h (`swiglu`, `clamped_swiglu`). The N k
    assignments are sorted by expert (stable), the held ones first and contiguous per
    expert; a token has at most min(k, E_l) of its k experts here, so the grouped matmuls
    run over the first N min(k, E_l) sorted rows only (exact, dropless: at 128 experts over
    64 devices, 2 held, a quarter of the N k rows), and each output row is added to its
    token with its gate (f32). Returns [N, D] in x's dtype.
    """
    n, k = experts.shape
    num_local = w.gate.shape[0]
    local = experts.reshape(-1) - first
    held = (local >= 0) & (local < num_local)
    ids = jnp.where(held, local, num_local)  # assignments to other shards sort last
    order = jnp.argsort(ids, stable=True)[: n * min(k, num_local)]
    sizes = jnp.bincount(ids, length=num_local + 1)[:num_local].astype(jnp.int32)
    tokens = order // k
    out = _expert_ragged(x[tokens], sizes, ids[order], w, glu)  # rows past the groups: 0
    g = jnp.where(held, gates.reshape(-1), 0)[order].astype(jnp.float32)
    y = jnp.zeros(x.shape, jnp.float32).at[tokens].add(out.astype(jnp.float32) * g[:, None])
    return y.astype(x.dtype)


def experts_dense(x, experts, gates, w: ExpertWeights, first: int | jax.Array = 0, glu=swiglu):
    """`experts_ragged` by running every held expert on every token (one-hot combine
    weights [N, E_l]): E_l / k times the FLOPs, no sort or gather."""
    dt = x.dtype
    num_local = w.gate.shape[0]
    onehot = jax.nn.one_hot(experts - first, num_local, dtype=jnp.float32)  # [N, k, E_l]
    combine = jnp.einsum("nke,nk->ne", onehot, gates.astype(jnp.float32)).astype(dt)
    every = jnp.arange(num_local)  # each row meets every held expert
    gate = jnp.einsum("nd,edf->nef", x, w.gate.astype(dt)) + _bias(w.gate_bias, every, dt)
    up = jnp.einsum("nd,edf->nef", x, w.up.astype(dt)) + _bias(w.up_bias, every, dt)
    out = jnp.einsum("nef,efd->ned", glu(gate, up), w.down.astype(dt))
    return jnp.einsum("ned,ne->nd", out + _bias(w.down_bias, every, dt), combine)


# ModelConfig.moe_impl -> the experts' computation (same signature and values); `auto` picks
# by the backend (`expert_impl`)
EXPERT_IMPLS = {"ragged": experts_ragged, "dense": experts_dense}


def expert_impl(name: str):
    """The `EXPERT_IMPLS` entry for `ModelConfig.moe_impl`; 'auto' is 'ragged' on TPU (its
    grouped-matmul kernel) and 'dense' elsewhere. XLA:CPU lowers `ragged_dot` to a masked dot
    per group (every row against every expert), so there the one-hot form, with no sort or
    gather, ran forward + gradient 1.6x as fast at N=256, D=64, E=8, k=2, F=32 (2.2 vs 3.6 ms)
    and 2.4x at N=2048, D=256, E=32, k=4, F=128 (0.55 vs 1.29 s); on an H200 (jax 0.11.2) the
    dense form, though it costs E / k times the FLOPs, ran a Qwen3-30B-A3B layer over 1,024
    tokens (E=128, k=8) in 15.4 ms against ragged_dot's 103.3 ms, and 0.44 vs 1.34 ms at
    N=2048, D=256, E=32, k=4, F=128 (benchmarks/moe_experts.py)."""
    if name == "auto":
        name = "ragged" if jax.default_backend() == "tpu" else "dense"
    return EXPERT_IMPLS[name]


# `model.moe.routing_replay`: none; rollout (R3: the sampler's recorded experts, replayed by
# the update and the policy's log-prob passes); first_update (R2: the experts of the step's
# first training forward, at the step's starting weights, replayed by its later minibatches
# and epochs)
EXPERT_AXES = ("expert", "embed", "mlp")  # logical axes of expert_gate / expert_up
EXPERT_DOWN_AXES = ("expert", "mlp", "embed")


def expert_parallel(
    fn, x, experts, gates, w: ExpertWeights, dispatch="gather", capacity_factor=0.0
):
    """(`fn(x [B, T, D], ...)`, the count of assignments dropped: f32 []) with the experts
    `w` split over the mesh axis their weights are split on (under `jax.shard_map`); `fn`
    directly where they are not split.

    Per device, `dispatch` (`ModelConfig.moe_dispatch`, `model_config.MOE_DISPATCH`):
    - 'gather': x's rows (split over the batch axes as `Transformer.constrain_rows` split
      them) are all-gathered over the expert axis, the device's E / n experts run on the
      assignments routed to them, and the partial outputs are reduce-scattered back to the
      rows (psum where the rows are not split over that axis). Dropless; the buffers grow
      with the expert group's tokens.
    - 'all_to_all': each device sends each assignment of its own rows to the device holding
      its expert, at most C a destination (`all_to_all_capacity`), runs the assignments it
      receives and sends the outputs back (two all-to-alls; GShard, Lepikhin et al. 2020):
      buffers of n C rows, bounded by the device's own tokens. Assignments past C are
      dropped (the token keeps its other experts' outputs); capacity_factor 0 sizes C so
      none can be. Rows not split over the expert axis take 'gather'.
    The F dim split over `tensor` (the `mlp` rule) adds a psum over `tensor` (the down
    projection's bias is added by the first `tensor` shard only, so the sum has it once).
    """
    none = jnp.zeros((), jnp.float32)  # assignments dropped: none but by 'all_to_all'
    mesh = getattr(jax.typeof(w.gate).sharding, "mesh", None)
    if mesh is None or not mesh.shape or math.prod(mesh.shape.values()) == 1:
        return _flat(fn, x, experts, gates, w, 0), none
    if jax.sharding.AxisType.Manual in getattr(mesh, "axis_types", ()):
        return _flat(fn, x, experts, gates, w, 0), none
    w_spec = shd.logical_to_spec(EXPERT_AXES, w.gate.shape, mesh)
    axis = w_spec[0]
    if axis is None:  # the experts are whole on each device: XLA places the rest
        return _flat(fn, x, experts, gates, w, 0), none
    # each weight's spec from its logical axes (the axes tree holds a tuple where w has a leaf)
    w_specs = jax.tree.map(lambda a, axes: shd.logical_to_spec(axes, a.shape, mesh), w, w.axes())
    row_spec = shd.logical_to_spec(("batch", None, None), x.shape, mesh)
    rows = row_spec[0]
    rows = () if rows is None else ((rows,) if isinstance(rows, str) else tuple(rows))
    split_rows = axis in rows
    f_axis = w_spec[2]
    lead = lambda nd: jax.sharding.PartitionSpec(row_spec[0], *([None] * (nd - 1)))

    def local(x, experts, gates, w):
        if f_axis is not None and w.down_bias is not None:  # summed over f_axis: added once
            w = w.replace(down_bias=w.down_bias * (jax.lax.axis_index(f_axis) == 0))
        if split_rows and dispatch == "all_to_all":
            y, dropped = _all_to_all_experts(fn, x, experts, gates, w, axis, capacity_factor)
            y = y if f_axis is None else jax.lax.psum(y, f_axis)
            return y, jax.lax.psum(dropped, rows)  # every device's own rows' drops
        return gather(x, experts, gates, w), jnp.zeros((), jnp.float32)

    def gather(x, experts, gates, w):
        if split_rows:  # every token of the expert group, in the group's row order
            x, experts, gates = (
                jax.lax.all_gather(a, axis, axis=0, tiled=True) for a in (x, experts, gates)
            )
        first = jax.lax.axis_index(axis) * w.gate.shape[0]
        y = _flat(fn, x, experts, gates, w, first)
        if f_axis is not None:
            y = jax.lax.psum(y, f_axis)
        if split_rows:
            return jax.lax.psum_scatter(y, axis, scatter_dimension=0, tiled=True)
        return jax.lax.psum(y, axis)

    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(lead(3), lead(3), lead(3), w_specs),
        out_specs=(lead(3), jax.sharding.PartitionSpec()),
        check_vma=False,
    )(x, experts, gates, w)


def all_to_all_capacity(tokens: int, k: int, devices: int, local_experts: int, factor: float):
    """C, the assignments one device sends another under 'all_to_all' dispatch: a token
    sends at most min(k, E_l) of its k to one device, so C = tokens min(k, E_l) drops none
    (factor 0); factor f > 0: ceil(f tokens k / devices), f = 1 the balanced share, capped
    there."""
    dropless = tokens * min(k, local_experts)
    if factor <= 0:
        return dropless
    return max(1, min(dropless, math.ceil(factor * tokens * k / devices)))


def _all_to_all_experts(fn, x, experts, gates, w: ExpertWeights, axis, capacity_factor):
    """One device's share of 'all_to_all' dispatch (inside `expert_parallel`'s shard_map):
    x [b, T, D] its rows, experts / gates [b, T, k] (global expert ids). Returns [b, T, D].

    Assignment a (token t, expert e) goes to device d = e // E_l, in slot p = its rank among
    this device's assignments to d (token order); slots p >= C are dropped. send [n, C, D]
    -> all_to_all -> [n, C, D] received from each device -> the local experts (`fn`, one
    expert a row, gate 1) -> all_to_all back -> each kept assignment's output added to its
    token with its gate (f32). Also returns the count of this device's dropped assignments."""
    n = jax.lax.axis_size(axis)
    lead, d = x.shape[:-1], x.shape[-1]
    k, num_local = experts.shape[-1], w.gate.shape[0]
    xf = x.reshape(-1, d)
    tokens = xf.shape[0]
    c = all_to_all_capacity(tokens, k, n, num_local, capacity_factor)
    dest = experts.reshape(-1) // num_local  # [tokens k] the device holding each expert
    onehot = jax.nn.one_hot(dest, n, dtype=jnp.int32)
    slot = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)  # rank within dest
    kept = slot < c
    index = jnp.where(kept, dest * c + slot, n * c)  # dropped: past the buffer
    owner = jnp.arange(tokens * k) // k  # the token of each assignment
    send = jnp.zeros((n * c, d), x.dtype).at[index].set(xf[owner], mode="drop")
    local_id = jnp.full((n * c,), num_local, jnp.int32)  # empty slots: no held expert
    local_id = local_id.at[index].set(experts.reshape(-1) % num_local, mode="drop")

    def exchange(a):  # [n C, ...] -> the same rows of every device, by source
        a = a.reshape(n, c, *a.shape[1:])
        return jax.lax.all_to_all(a, axis, 0, 0, tiled=True).reshape(n * c, *a.shape[2:])

    received, received_id = exchange(send), exchange(local_id)
    ones = jnp.ones((n * c, 1), x.dtype)
    out = exchange(fn(received, received_id[:, None], ones, w, 0))
    g = jnp.where(kept, gates.reshape(-1), 0).astype(jnp.float32)
    back = out.at[jnp.minimum(index, n * c - 1)].get().astype(jnp.float32) * g[:, None]
    y = jnp.zeros((tokens, d), jnp.float32).at[owner].add(back)
    return y.astype(x.dtype).reshape(*lead, d), jnp.sum(~kept).astype(jnp.float32)


def _flat(fn, x, experts, gates, w: ExpertWeights, first):
    """fn over the flattened tokens of x [..., D] -> [..., D]."""
    lead, k = x.shape[:-1], experts.shape[-1]
    y = fn(x.reshape(-1, x.shape[-1]), experts.reshape(-1, k), gates.reshape(-1, k), w, first)
    return y.reshape(*lead, -1)


class MoE(nnx.Module):
    """Qwen3-MoE's sparse MLP: `router` [D, E], experts `expert_gate`, `expert_up`
    [E, D, F] and `expert_down` [E, F, D] (F = `moe_intermediate_size`); with
    `shared_expert_intermediate_size` Fs > 0 (Qwen2-MoE) also a shared expert every token
    goes through, `shared_gate`, `shared_up` [D, Fs], `shared_down` [Fs, D], scaled by
    sigmoid(x `shared_expert_gate` [D, 1]); with `expert_bias` (GPT-OSS) the biases
    `router_bias` [E], `expert_gate_bias`, `expert_up_bias` [E, F], `expert_down_bias`
    [E, D], and with `swiglu_limit` the experts' `clamped_swiglu`."""

    capabilities = Capabilities.all_but(
        sequence_axis="the expert-parallel dispatch takes whole rows"
    )

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack=()):
        d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        param = functools.partial(make_param, rngs, dtype=jnp.dtype(cfg.param_dtype), stack=stack)
        self.cfg = cfg
        self.router = param((d, e), ("embed", None))
        self.expert_gate = param((e, d, f), EXPERT_AXES)
        self.expert_up = param((e, d, f), EXPERT_AXES)
        self.expert_down = param((e, f, d), EXPERT_DOWN_AXES)
        if cfg.expert_bias:
            self.router_bias = param((e,), (None,), init="zeros")
            self.expert_gate_bias = param((e, f), ("expert", "mlp"), init="zeros")
            self.expert_up_bias = param((e, f), ("expert", "mlp"), init="zeros")
            self.expert_down_bias = param((e, d), ("expert", "embed"), init="zeros")
        fs = cfg.shared_expert_intermediate_size
        if fs:
            self.shared_gate = param((d, fs), ("embed", "mlp"))
            self.shared_up = param((d, fs), ("embed", "mlp"))
            self.shared_down = param((fs, d), ("mlp", "embed"))
            if cfg.shared_expert_gated:
                self.shared_expert_gate = param((d, 1), ("embed", None))
        if cfg.router_scoring == "sigmoid":  # DeepSeek-V3's balancing bias (HF buffer)
            self.router_score_bias = param((e,), (None,), init="zeros")

    def shared_expert(self, x):
        """The shared expert SwiGLU_shared(x), x [..., D]; Qwen2-MoE's times its gate
        sigmoid(x w_g) (`shared_expert_gated`), DeepSeek-V3's ungated."""
        dt = x.dtype
        h = jax.nn.silu(dense(x, self.shared_gate[...].astype(dt)))
        h = h * dense(x, self.shared_up[...].astype(dt))
        y = dense(h, self.shared_down[...].astype(dt))
        if not self.cfg.shared_expert_gated:
            return y
        return jax.nn.sigmoid(dense(x, self.shared_expert_gate[...].astype(dt))) * y

    def route(self, x, forced=None):
        """x [B, T, D] -> (router logits f32 [B, T, E], experts [B, T, k], gates f32)."""
        cfg = self.cfg
        if cfg.router_scoring == "sigmoid":  # DeepSeek-V3: the logits in f32, as HF's
            logits = dense(x.astype(jnp.float32), self.router[...].astype(jnp.float32))
            experts, gates = group_limited_gates(
                logits, self.router_score_bias[...], cfg.num_experts_per_tok, cfg.n_group,
                cfg.topk_group, cfg.norm_topk_prob, forced,
            )  # fmt: skip
            return logits, experts, gates * cfg.routed_scaling_factor
        # the logits in the compute dtype, the softmax in f32: as transformers computes them
        logits = dense(x, self.router[...].astype(x.dtype))
        if cfg.expert_bias:
            logits = logits + self.router_bias[...].astype(x.dtype)
        logits = logits.astype(jnp.float32)
        experts, gates = top_k_gates(logits, cfg.num_experts_per_tok, cfg.norm_topk_prob, forced)
        return logits, experts, gates

    def weights(self) -> ExpertWeights:
        """The layer's experts (and their biases where it has them)."""
        bias = lambda name: getattr(self, name)[...] if self.cfg.expert_bias else None  # noqa: E731
        return ExpertWeights(
            self.expert_gate[...], self.expert_up[...], self.expert_down[...],
            bias("expert_gate_bias"), bias("expert_up_bias"), bias("expert_down_bias"),
        )  # fmt: skip

    def glu(self):
        """The experts' gate: GPT-OSS's `clamped_swiglu` with `swiglu_limit`, else `swiglu`."""
        cfg = self.cfg
        if cfg.swiglu_limit is None:
            return swiglu
        return functools.partial(clamped_swiglu, limit=cfg.swiglu_limit, alpha=cfg.swiglu_alpha)

    def __call__(self, x, hidden_mask=None, route: Route | None = None):
        """x [B, T, D] -> y [B, T, D]; with a `route`, (y, `RouterStats`)."""
        if hidden_mask is not None:
            raise ValueError(
                "MLP dropout masks (Dropout-GRPO, rollout.dropout_rate > 0) apply to a dense "
                "MLP's hidden units; this model's MLP is a mixture of experts"
            )
        logits, experts, gates = self.route(x, None if route is None else route.experts)
        fn = functools.partial(expert_impl(self.cfg.moe_impl), glu=self.glu())
        y, dropped = expert_parallel(
            fn, x, experts, gates.astype(x.dtype), self.weights(),
            self.cfg.moe_dispatch, self.cfg.moe_capacity_factor,
        )  # fmt: skip
        if self.cfg.shared_expert_intermediate_size:
            y = y + self.shared_expert(x)
        if route is None:
            return y
        own = experts
        if route.experts is not None:  # replayed: the router's own choice too, for the metrics
            own = self.route(x)[1]
        stats = router_stats(logits, experts, route.mask, self.cfg.num_experts, own, dropped)
        return y, stats


# ----------------------------------------------------------------------------- losses


def config_from_hf(hf: dict) -> dict:
    """The MoE fields of a `ModelConfig` from a Qwen3-MoE / Qwen2-MoE config.json dict;
    options the stacked layers cannot express raise, naming the key."""
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    for key, value in (
        ("num_experts", experts),
        ("num_experts_per_tok", hf.get("num_experts_per_tok")),
        ("moe_intermediate_size", hf.get("moe_intermediate_size")),
    ):
        if not value:
            raise ValueError(f"config.json: missing required key {key!r} (a positive int)")
    if int(hf.get("decoder_sparse_step") or 1) != 1 or hf.get("mlp_only_layers"):
        raise ValueError(
            f"config.json: decoder_sparse_step={hf.get('decoder_sparse_step')!r} / "
            f"mlp_only_layers={hf.get('mlp_only_layers')!r} are not supported: every layer "
            "must be a mixture of experts (decoder_sparse_step 1, mlp_only_layers []), since "
            "the layers' parameters are stacked into one scanned block"
        )
    return dict(
        num_experts=int(experts),
        num_experts_per_tok=int(hf["num_experts_per_tok"]),
        moe_intermediate_size=int(hf["moe_intermediate_size"]),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        shared_expert_intermediate_size=int(hf.get("shared_expert_intermediate_size") or 0),
    )


def config_to_hf(cfg: ModelConfig) -> dict:
    """The MoE keys of a Qwen3-MoE / Qwen2-MoE config.json (the Hub's spelling,
    `num_experts`)."""
    return {
        "num_experts": cfg.num_experts,
        "num_experts_per_tok": cfg.num_experts_per_tok,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "norm_topk_prob": cfg.norm_topk_prob,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "output_router_logits": False,
        **(
            {"shared_expert_intermediate_size": cfg.shared_expert_intermediate_size}
            if cfg.shared_expert_intermediate_size
            else {}
        ),
    }
