"""The train state and the jitted, donated update shared by SFT and RL.

    update(state, batch, frozen=None) -> (state, metrics)

runs `grad_accum` microbatches (lax.scan, one compile), clips and applies the optax update,
and skips it (counting `state.skipped`) when the loss or a gradient is not finite. With a
`denominator_fn`, every microbatch's loss is its share of the minibatch's loss, normalised by
the minibatch's count (its tokens, rows, ...), so the summed gradient is exactly the full
minibatch's gradient, whatever the microbatches' token counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models import routing

# Metrics that are each microbatch's share of a minibatch total (summed, not averaged).
ADDITIVE_METRICS = ("loss", "pg_loss", "kl_loss", "distill_loss", "nll")


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training (a pytree; checkpointed whole)."""

    params: Any  # nnx.State of the policy
    opt_state: Any
    step: jax.Array  # int32 [], completed steps of the outer loop (the policy version)
    rng: jax.Array  # uint32 key data
    skipped: jax.Array  # int32 [], updates skipped for non-finite loss/grads
    # a learned critic's {'params', 'opt_state'} (rl/methods/ppo.py), None without one: trained with
    # the policy and checkpointed with it
    critic: Any = None


HOST_MEMORY = "pinned_host"  # where `train.offload_optimizer` keeps the optimizer state


def optimizer_memory_kind(offload: bool, mesh, *, allow_shared_memory: bool = False):
    """The memory kind of the optimizer state: None (device memory), or 'pinned_host' with
    `train.offload_optimizer` on a backend whose devices address a separate host memory.

    CPU devices list a 'pinned_host' kind too, but it is the same RAM as their 'device'
    memory: offloading there moves nothing, so it is refused with the key to change
    (`allow_shared_memory`: place it anyway, to test the placement on CPU)."""
    if not offload:
        return None
    device = mesh.devices.flat[0]
    kinds = sorted(m.kind for m in device.addressable_memories())
    if device.platform == "cpu" and not allow_shared_memory:
        raise ConfigError(
            "config key 'train.offload_optimizer' = True: the CPU backend has no separate host "
            f"memory (its memory kinds {kinds} are all host RAM), so there is nothing to "
            "offload the optimizer state to; set train.offload_optimizer = False (offload "
            "applies on TPU and GPU)"
        )
    if HOST_MEMORY not in kinds:
        raise ConfigError(
            f"config key 'train.offload_optimizer' = True: {device.platform} devices offer the "
            f"memory kinds {kinds}, without {HOST_MEMORY!r}; set train.offload_optimizer = False"
        )
    return HOST_MEMORY


def _on_memory(shardings, kind: str):
    """Every NamedSharding of the tree moved to memory `kind` (other leaves as they are)."""
    is_named = lambda s: isinstance(s, jax.sharding.NamedSharding)
    return jax.tree.map(lambda s: s.with_memory_kind(kind) if is_named(s) else s, shardings)


def init_opt_state(tx: optax.GradientTransformation, params, mesh, memory_kind=None):
    """`tx.init(params)` with every parameter-shaped leaf (Adam's mu, nu) sharded like its
    parameter (FSDP shards the optimizer state too) and the rest (step counts) replicated.

    A plain `jax.jit(tx.init)` puts its zeros on the default device: replicating them would
    keep a full optimizer state on every device. Every leaf gets a NamedSharding on `mesh`
    (also on one device), so the update's output state has the input's types and the update
    compiles once. memory_kind ('pinned_host', `optimizer_memory_kind`): the parameter-shaped
    leaves live there between updates (the update brings them to the device and back).
    """
    abstract = jax.eval_shape(tx.init, params)
    placed = (lambda s: s) if memory_kind is None else (lambda s: s.with_memory_kind(memory_kind))
    masked = lambda x: isinstance(x, optax.MaskedNode)  # noqa: E731  (a leaf tx leaves alone)
    out_shardings = optax.tree_map_params(
        tx,
        lambda a, s: a if masked(a) else placed(s),
        abstract,
        jax.tree.map(lambda x: x.sharding, params),
        transform_non_params=lambda _: sharding.replicated(mesh),
        is_leaf=masked,
    )
    return jax.jit(tx.init, out_shardings=out_shardings)(params)


def init_train_state(tx, params, mesh, rng_key, memory_kind=None) -> TrainState:
    """A fresh state; memory_kind: where the optimizer state lives (`init_opt_state`)."""
    repl = sharding.replicated(mesh)
    return TrainState(
        params=params,
        opt_state=init_opt_state(tx, params, mesh, memory_kind),
        step=jax.device_put(jnp.zeros((), jnp.int32), repl),
        rng=jax.device_put(jax.random.key_data(rng_key), repl),
        skipped=jax.device_put(jnp.zeros((), jnp.int32), repl),
    )


def _grads(loss_of, params, batch, frozen, denominator):
    kwargs = {} if denominator is None else {"denominator": denominator}
    if frozen is not None:
        kwargs["frozen"] = frozen
    fn = lambda p, b: loss_of(p, b, **kwargs)
    (loss, metrics), grads = jax.value_and_grad(fn, has_aux=True)(params, batch)
    return loss, grads, metrics


def microbatch_grads(loss_of, params, batch, grad_accum: int, frozen=None, denominator=None):
    """Loss, grads and metrics over `grad_accum` microbatches (lax.scan, one compile).

    With a `denominator` (the minibatch's), each microbatch's loss is its share and the
    shares add up to the minibatch loss; without one, per-microbatch losses are averaged.
    """
    if isinstance(batch, dict) and "pack" in batch:
        return packed_microbatch_grads(loss_of, params, batch, frozen, denominator)
    if grad_accum == 1:
        return _grads(loss_of, params, batch, frozen, denominator)
    micro = jax.tree.map(lambda x: x.reshape(grad_accum, -1, *x.shape[1:]), batch)
    share = 1.0 if denominator is not None else 1.0 / grad_accum

    def body(carry, mb):
        loss, grads, metrics = _grads(loss_of, params, mb, frozen, denominator)
        acc_loss, acc_grads, acc_metrics = carry
        scale = lambda k: share if k in ADDITIVE_METRICS else 1.0 / grad_accum
        carry = (
            acc_loss + loss * share,
            jax.tree.map(lambda a, g: a + g * share, acc_grads, grads),
            {k: acc_metrics[k] + metrics[k] * scale(k) for k in metrics},
        )
        return carry, None

    shapes = jax.eval_shape(lambda: _grads(loss_of, params, batch, frozen, denominator))
    zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)
    init = (jnp.zeros((), jnp.float32), zeros(shapes[1]), zeros(shapes[2]))
    (loss, grads, metrics), _ = jax.lax.scan(body, init, micro)
    return loss, grads, metrics


def packed_microbatch_grads(loss_of, params, batch, frozen, denominator):
    """`microbatch_grads` over packed rows: batch['pack'] holds K microbatches' maps
    ([K, ...] leaves, `rl.learn.packing`) and every other entry the whole minibatch [B, T];
    microbatch k's loss is that of the rows it holds, with the minibatch's `denominator`, so
    the K losses and gradients sum to the minibatch's. A microbatch with no rows (the rest
    of a bucket) is skipped (`lax.cond`), not computed."""
    pack = batch["pack"]
    k = pack["src"].shape[0]
    if denominator is None:
        raise ValueError("packed microbatches need the minibatch's denominator")
    rest = {key: v for key, v in batch.items() if key != "pack"}
    one = lambda mb: _grads(loss_of, params, {**rest, "pack": mb}, frozen, denominator)
    first = jax.tree.map(lambda x: x[0], pack)
    shapes = jax.eval_shape(one, first)
    zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)
    if k == 1:
        return one(first)

    def body(carry, mb):
        empty = jnp.all(mb["seg"] == 0)
        loss, grads, metrics = jax.lax.cond(empty, lambda _: zeros(shapes), one, mb)
        acc_loss, acc_grads, acc_metrics, used = carry
        carry = (
            acc_loss + loss,
            jax.tree.map(jnp.add, acc_grads, grads),
            jax.tree.map(jnp.add, acc_metrics, metrics),
            used + (~empty).astype(jnp.float32),
        )
        return carry, None

    init = (jnp.zeros((), jnp.float32), zeros(shapes[1]), zeros(shapes[2]), jnp.zeros(()))
    (loss, grads, metrics, used), _ = jax.lax.scan(body, init, pack)
    # additive metrics are shares of the minibatch's; the others, means over microbatches
    # that held rows
    per = jnp.maximum(used, 1.0)
    metrics = {m: v if m in ADDITIVE_METRICS else v / per for m, v in metrics.items()}
    return loss, grads, metrics


def make_update_fn(
    graphdef,
    tx,
    loss_of: Callable,
    grad_accum: int,
    state_sharding,
    batch_sharding_tree,
    *,
    denominator_fn: Callable | None = None,
    frozen_sharding=None,
    members: dict | None = None,
    bias_update_rate: float = 0.0,
):
    """Jitted `update(state, batch[, frozen]) -> (state, metrics)`; donates the old state.

    loss_of(params, batch[, denominator=][, frozen=]) -> (loss, metrics).
    denominator_fn(batch) -> scalar: the minibatch's normaliser (see the module docstring).
    frozen_sharding: given, the update takes a third argument `frozen`, inputs the loss reads
    but does not train (a teacher's or LoRA's base weights, the scheduled and controlled
    `knobs` of the objective), passed through to `loss_of(..., frozen=)`.
    A non-finite loss or gradient skips the update (params and optimizer state unchanged)
    and counts it in `state.skipped`, so one bad batch does not end a long run.
    members: a population's members updated at once (`run.population.batched_update`): the
    state, the batch and the metrics gain a leading [N] axis, and so do the entries of `frozen` this
    dict maps to 0 (the knobs; None: shared, a teacher's weights); `update` is vmapped over
    it and every sharding gets a leading axis (`stacked`): on the mesh's population axis,
    with `vmap(spmd_axis_name=)` so the constraints inside (rows over data / fsdp, weights
    over fsdp / tensor) hold within each member's block of devices; replicated without one.
    bias_update_rate: u > 0, an MoE router's balancing step after the optimizer's (`balanced`).
    """
    del graphdef  # the loss closes over it
    # an optimizer state offloaded to host memory (`init_opt_state`) comes to the device for
    # the update; the output shardings send the new one back
    offloaded = any(s.memory_kind == HOST_MEMORY for s in jax.tree.leaves(state_sharding.opt_state))
    device_opt = _on_memory(state_sharding.opt_state, "device") if offloaded else None

    def update(state: TrainState, batch, frozen=None):
        den = None if denominator_fn is None else denominator_fn(batch)
        loss, grads, metrics = microbatch_grads(
            loss_of, state.params, batch, grad_accum, frozen, den
        )
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        opt_state = state.opt_state
        if device_opt is not None:
            opt_state = jax.device_put(opt_state, device_opt)
        updates, new_opt = tx.update(grads, opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        new_params, metrics = balanced(new_params, metrics, bias_update_rate)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        state = state.replace(
            params=keep(new_params, state.params),
            opt_state=keep(new_opt, opt_state),
            skipped=state.skipped + (~finite).astype(jnp.int32),
        )
        metrics = dict(metrics, loss=loss, grad_norm=grad_norm, update_skipped=1.0 - finite)
        return state, metrics

    fn = update
    if members is not None:  # one program over the members' stacked states
        frozen_axes = (
            None if frozen_sharding is None else {k: members.get(k) for k in frozen_sharding}
        )
        fn = jax.vmap(
            update,
            in_axes=(0, 0) if frozen_sharding is None else (0, 0, frozen_axes),
            spmd_axis_name=member_axis(state_sharding),
        )
        state_sharding, batch_sharding_tree = stacked(state_sharding), stacked(batch_sharding_tree)
        if frozen_sharding is not None:
            frozen_sharding = {
                k: stacked(v) if members.get(k) == 0 else v for k, v in frozen_sharding.items()
            }
    if frozen_sharding is None:  # nothing frozen: update(state, batch)
        step, in_shardings = (lambda s, b: fn(s, b)), (state_sharding, batch_sharding_tree)
    else:
        step, in_shardings = fn, (state_sharding, batch_sharding_tree, frozen_sharding)
    return jax.jit(
        step, in_shardings=in_shardings, out_shardings=(state_sharding, None), donate_argnums=(0,)
    )


def balanced(params, metrics: dict, rate: float) -> tuple[Any, dict]:
    """(params, metrics) after DeepSeek-V3's auxiliary-loss-free balancing step ("Auxiliary-
    Loss-Free Load Balancing Strategy for Mixture-of-Experts", Wang et al. 2024; arXiv
    2412.19437 sec. 2.1.2): with rate u > 0 every balancing bias b [n, E] of the params moves
    by b_e <- b_e + u sign(mean_e' load_e' - load_e) (`moe.balance_biases`), load [L, E] the
    minibatch's assignments per expert (`moe.LOAD_METRIC`, the loss's router statistics,
    its mean over the microbatches: the sign is the sum's), and `moe/bias_abs_max` max |b|
    is logged. The load leaves the metrics either way (they are scalars)."""
    metrics = dict(metrics)
    load = metrics.pop(routing.LOAD_METRIC, None)
    if load is None or not rate:
        return params, metrics
    params, bias_max = routing.balance_biases(params, load, rate)
    return params, {**metrics, "moe/bias_abs_max": bias_max}


def stacked(shardings):
    """Each NamedSharding of the tree with a leading member axis (a population's:
    `make_update_fn(members=)`), placed on its mesh's population axis (`sharding.
    population_axis`: each block of devices computes its N / P members), or replicated on a
    mesh without one; other leaves as they are."""
    is_named = lambda s: isinstance(s, jax.sharding.NamedSharding)  # noqa: E731

    def lead(s):
        spec = jax.sharding.PartitionSpec(sharding.population_axis(s.mesh), *s.spec)
        return jax.sharding.NamedSharding(s.mesh, spec)

    return jax.tree.map(lambda s: lead(s) if is_named(s) else s, shardings)


def member_axis(shardings) -> str | None:
    """The population axis of the mesh the tree's first NamedSharding is on (None: none)."""
    named = [s for s in jax.tree.leaves(shardings) if isinstance(s, jax.sharding.NamedSharding)]
    return sharding.population_axis(named[0].mesh) if named else None
