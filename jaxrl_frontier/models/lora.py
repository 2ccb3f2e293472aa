"""Low-rank adapters (LoRA; Hu et al., 2021) on the transformer's dense projections.

    y = x W  ->  y = x W + (alpha / r) (x A) B        A [*in, r], B [r, *out]

A is drawn as PEFT draws it (uniform in +-1/sqrt(fan_in)), B is zero, so the adapted model
starts equal to its base. Each targeted weight `name` of `Transformer.layers` (stacked
[L, *in, *out]) gets `name_lora_a` [L, *in, r] and `name_lora_b` [L, r, *out], both
`nnx.LoRAParam`s stacked over the layers like the weight (a hybrid model's per-layer
weights [*in, *out]: each layer its own [*in, r] and [r, *out]), with the weight's logical
axes on their in / out dims (so the FSDP and tensor rules shard them as they shard the
weight; the rank axis is replicated), and the module the static scale
`lora_scale = alpha / r`.

The adapters run inside the model's forward (`transformer.project`), unmerged: the update,
the log-prob passes and the sampler's decode all see base + adapters with no merge per
step. Training holds the adapters only (`split`): the optimizer state is the adapters', and
so is a checkpoint; the base weights stay frozen beside them (`combine` rebuilds the full
state for a forward). The reference policy is the base itself: `reference` is the base's
arrays (shared, not copied) with B = 0. `merged` folds the adapters into the weights
(W + (alpha / r) A B) for a Hugging Face export.

qwix (`qwix.apply_lora_to_model`) is not used: it creates adapters by running the model once
and intercepting its matmuls, but this model runs its layers under one `jax.lax.scan` over
stacked weights, re-created per step by `nnx.merge`, so the adapters qwix would create
there are per-layer tracers of a temporary module (qwix 0.1.8 fails in `scan_layers`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# target name -> (the Block's submodule holding it, the weight's number of input dims)
TARGETS: dict[str, tuple[str, int]] = {
    "q_proj": ("attn", 1),
    "k_proj": ("attn", 1),
    "v_proj": ("attn", 1),
    "o_proj": ("attn", 2),
    "gate_proj": ("mlp", 1),
    "up_proj": ("mlp", 1),
    "down_proj": ("mlp", 1),
}
# a hybrid model's linear-attention projections (Qwen3.5's Gated DeltaNet), targets too
LINEAR_ATTENTION_TARGETS: dict[str, tuple[str, int]] = {
    "in_proj_qkv": ("attn", 1),
    "in_proj_z": ("attn", 1),
    "out_proj": ("attn", 1),
}
# DeepSeek-V3's latent attention (`layers.LatentAttention`; q_proj, o_proj above): the q
# latent's down and up projections, the kv latent's (HF kv_a_proj_with_mqa, with the rope
# key) and its up-projection, which the absorbed decode folds into the query and output
LATENT_ATTENTION_TARGETS: dict[str, tuple[str, int]] = {
    "q_a_proj": ("attn", 1),
    "q_b_proj": ("attn", 1),
    "kv_a_proj": ("attn", 1),
    "kv_b_proj": ("attn", 1),
}
_EVERY_TARGET = {**TARGETS, **LINEAR_ATTENTION_TARGETS, **LATENT_ATTENTION_TARGETS}
ADAPTERS = nnx.LoRAParam  # the filter of adapter variables
BASE = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))  # the frozen weights


def check_targets(targets) -> tuple[str, ...]:
    """The target names as a tuple; a ValueError naming `model.lora.targets` otherwise."""
    targets = tuple(targets)
    unknown = [t for t in targets if t not in _EVERY_TARGET]
    if unknown or not targets:
        raise ValueError(
            f"config key 'model.lora.targets' = {targets!r}: unknown {unknown or 'empty'}; "
            f"allowed: a non-empty subset of {tuple(_EVERY_TARGET)}"
        )
    return targets


def target_modules(model, sub: str) -> list[tuple[nnx.Module, int]]:
    """(module, leading dims) of every `sub` ('attn' or 'mlp') of the model's layers: one
    module per stack of layers ([L, ...] weights, 1 leading dim: `layers`, and DeepSeek-V3's
    dense first layers `dense_layers` before it), or, for a per-layer list (a hybrid model's,
    `hybrid.HybridTransformer`, or unstacked layers), each layer's own (0)."""
    if isinstance(model.layers, nnx.List):
        return [(getattr(layer, sub), 0) for layer in model.layers]
    stacks = [model.dense_layers] if model.cfg.first_k_dense_replace else []
    return [(getattr(stack, sub), 1) for stack in stacks + [model.layers]]


def add_adapters(model, *, rank: int, alpha: float, targets, key: jax.Array):
    """Attach rank-`rank` adapters to `targets` of `model.layers` (in place); returns model.
    A hybrid model's layers each get their own where they hold the target (q_proj on the
    full-attention layers, in_proj_qkv on the linear ones, the MLP's on every layer);
    DeepSeek-V3's dense first layers and its MoE layers each stack theirs (the MLP targets
    on the dense layers only: the experts take none).

    A is uniform in +-1/sqrt(fan_in) (PEFT's kaiming_uniform(a=sqrt(5))), B zeros, both in
    the weight's dtype and placed with the weight's sharding's mesh and logical axes (the
    caller re-places them with `sharding.shard_model`)."""
    if rank <= 0:
        raise ValueError(f"config key 'model.lora.rank' = {rank}: must be > 0")
    for i, name in enumerate(check_targets(targets)):
        sub, n_in = _EVERY_TARGET[name]
        found = [(m, lead) for m, lead in target_modules(model, sub) if hasattr(m, name)]
        if not found:  # e.g. k_proj of a latent attention, gate_proj of an MoE's MLP
            kinds = sorted({type(m).__name__ for m, _ in target_modules(model, sub)})
            have = tuple(
                t for t, (s, _) in _EVERY_TARGET.items()
                if any(hasattr(m, t) for m, _ in target_modules(model, s))
            )  # fmt: skip
            raise ValueError(
                f"config key 'model.lora.targets' names {name!r}, which this model's "
                f"{'/'.join(kinds)} does not have; its targets: {have} (the experts of a "
                "mixture take no adapters)"
            )
        k = jax.random.fold_in(key, i)
        for j, (module, lead) in enumerate(found):  # (per layer, its own draw)
            _attach(module, name, n_in, lead, rank, k if lead else jax.random.fold_in(k, j))
            module.lora_scale = float(alpha) / rank
    return model


def _attach(module, name: str, n_in: int, lead: int, rank: int, key: jax.Array) -> None:
    """`name_lora_a` [*lead, *in, r] and `name_lora_b` [*lead, r, *out] on `module`."""
    w = getattr(module, name)
    shape, axes = w.get_value().shape, w.get_metadata().get("logical_axes")
    cut = lead + n_in
    ins, outs, ax_lead = shape[lead:cut], shape[cut:], axes[:lead]
    bound = 1.0 / np.sqrt(np.prod(ins))
    a = jax.random.uniform(key, (*shape[:lead], *ins, rank), w.dtype, -bound, bound)
    b = jnp.zeros((*shape[:lead], rank, *outs), w.dtype)
    setattr(module, f"{name}_lora_a", ADAPTERS(a, logical_axes=(*ax_lead, *axes[lead:cut], None)))
    setattr(module, f"{name}_lora_b", ADAPTERS(b, logical_axes=(*ax_lead, None, *axes[cut:])))


def has_adapters(model_or_state) -> bool:
    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state)
    return bool(jax.tree.leaves(nnx.filter_state(state, ADAPTERS)))


def split(state: nnx.State) -> tuple[nnx.State, nnx.State]:
    """(adapters, base) of a full parameter state."""
    return nnx.split_state(state, ADAPTERS, BASE)


def combine(base: nnx.State, adapters: nnx.State) -> nnx.State:
    """The full state for `nnx.merge(graphdef, ...)` (no copy of either part)."""
    return nnx.merge_state(base, adapters)


def zero_update(adapters: nnx.State) -> nnx.State:
    """A copy of the adapters with every B = 0: their update (alpha / r) x A B is exactly 0.
    (A copy: the training state's adapters are donated to the update.)"""

    def one(path, x):
        return jnp.zeros_like(x) if "_lora_b" in jax.tree_util.keystr(path) else jnp.copy(x)

    return jax.tree_util.tree_map_with_path(one, adapters)


def reference(base: nnx.State, adapters: nnx.State) -> nnx.State:
    """The frozen base as a full state: the base's own arrays (no second copy of the
    weights) and zeroed adapters (adapter-sized), so one graphdef runs policy and reference."""
    return combine(base, zero_update(adapters))


def trained_and_frozen(policy, *, with_reference: bool):
    """(graphdef, trained params, frozen base or None, reference params or None) of a policy.

    Without adapters the whole state is trained and the reference is a copy of it; with
    adapters only they are trained, the base stays frozen, and the reference is the base
    (`reference`: no second copy of the weights)."""
    graphdef, params = nnx.split(policy)
    base = None
    if has_adapters(params):
        params, base = split(params)
    ref = None
    if with_reference:
        ref = jax.tree.map(jnp.copy, params) if base is None else reference(base, params)
    return graphdef, params, base, ref


def delta(a: jax.Array, b: jax.Array, n_in: int, scale: float) -> jax.Array:
    """(alpha / r) A B, f32, in the weight's [*lead, *in, *out] shape; a [*lead, *in, r],
    b [*lead, r, *out] (lead: [L] for stacked layers, none for one layer's)."""
    lead = a.shape[: a.ndim - n_in - 1]
    ins, outs = a.shape[len(lead) : -1], b.shape[len(lead) + 1 :]
    a2 = a.astype(jnp.float32).reshape(*lead, -1, a.shape[-1])
    b2 = b.astype(jnp.float32).reshape(*lead, b.shape[len(lead)], -1)
    return scale * jnp.einsum("...ir,...ro->...io", a2, b2).reshape(*lead, *ins, *outs)


def merged(model):
    """A copy of `model` without adapters whose weights are W + (alpha / r) A B (for a Hugging
    Face export; `model` keeps its adapters). The weights keep their dtype."""
    graphdef, state = nnx.split(model)
    # new variables on the same arrays (a plain merge would share `model`'s variables)
    out = nnx.merge(graphdef, jax.tree.map(lambda x: x, state))
    for name, (sub, n_in) in _EVERY_TARGET.items():
        for module, _ in target_modules(out, sub):
            a = getattr(module, f"{name}_lora_a", None)
            if a is None:
                continue
            b = getattr(module, f"{name}_lora_b")
            w = getattr(module, name)
            d = delta(a.get_value(), b.get_value(), n_in, module.lora_scale)
            w.set_value((w.get_value().astype(jnp.float32) + d).astype(w.dtype))
            delattr(module, f"{name}_lora_a")
            delattr(module, f"{name}_lora_b")
    for sub in {s for s, _ in _EVERY_TARGET.values()}:
        for module, _ in target_modules(out, sub):
            if hasattr(module, "lora_scale"):
                delattr(module, "lora_scale")
    return out


def num_bytes(state: nnx.State) -> int:
    """Bytes of the arrays of `state` (whole arrays, not per device)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
