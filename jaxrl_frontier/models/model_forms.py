"""A model's parameters in the module form a program runs: the same arrays in a tree built
for other run choices (`reconfigured`) or another compute dtype (`with_compute_dtype`: a
sampler in bf16 beside an f32 learner), the matrices cast to the compute dtype once
(`with_compute_weights`) and the stacked layers split into per-layer blocks
(`unstack_layers`), both for the sampler's decode loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.transformer import Transformer


def reconfigured(model: Transformer, cfg: ModelConfig) -> Transformer:
    """`model`'s parameters in a module built for `cfg`, which must describe the same
    parameters: a choice of how it runs (remat, the attention or MoE implementation), not a
    shape. Every layer holds its own copy of the config, so assigning `model.cfg` alone
    would reach the top module and none of its layers."""
    abstract = nnx.eval_shape(lambda: type(model)(cfg, rngs=nnx.Rngs(0)))
    return nnx.merge(nnx.graphdef(abstract), nnx.state(model))


def with_compute_weights(model: Transformer) -> Transformer:
    """The same model with every matrix parameter (ndim >= 2: projections, per-head biases,
    embeddings) already in `cfg.compute_dtype`; norm scales (1-D, read in f32) untouched.

    Every use site casts these weights with `.astype(compute_dtype)`, which then does
    nothing, so the forward's outputs are bitwise the same. For a loop that runs the model
    many times on fixed weights (the sampler's decode) this moves the cast out of the loop:
    XLA does not hoist it out of a while loop, so in bf16 each step would otherwise read the
    f32 weights (and, where the cast is not fused into the matmul, write and re-read a bf16
    copy): 2x to 4x the bytes of reading bf16 weights. The copy costs half the f32 weights'
    memory while the calling program runs. A no-op model
    comes back when nothing needs a cast (f32 compute, or bf16 parameters).
    """
    dt, un = model.cfg.compute_dtype, isinstance(model.layers, nnx.List)  # un: per layer
    graphdef, state = nnx.split(model)

    def needs_cast(path, w):
        # a leading [L] axis
        stacked = jax.tree_util.keystr(path[:1]) in ("['layers']", "['dense_layers']") and not un
        matrix = w.ndim - stacked >= 2
        return matrix and jnp.issubdtype(w.dtype, jnp.floating) and w.dtype != dt

    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    if not any(needs_cast(path, w) for path, w in flat):
        return model
    cast = jax.tree_util.tree_map_with_path(
        lambda path, w: w.astype(dt) if needs_cast(path, w) else w, state
    )
    return nnx.merge(graphdef, cast)


def with_compute_dtype(model: Transformer, dtype: str) -> Transformer:
    """The same parameters (the arrays shared, LoRA adapters included) in a module tree that
    computes in `dtype` ('float32' or 'bfloat16'): every module's config copy says so. For a
    sampler that runs in another dtype than the learner (`rollout.dtype`); with
    `with_compute_weights` its decode then reads the weights in that dtype. Unlike
    `reconfigured`, no fresh module is built, so adapters attached after construction stay."""
    dtype = str(jnp.dtype(dtype))
    if model.cfg.dtype == dtype:
        return model
    out = nnx.merge(*nnx.split(model))  # a shallow structural copy sharing the arrays
    for _, module in out.iter_modules():
        cfg = getattr(module, "cfg", None)
        if isinstance(cfg, ModelConfig):  # each layer holds its own copy of the config
            module.cfg = cfg.replace(dtype=dtype)
    return out


def unstack_layers(model: Transformer) -> Transformer:
    """The same model with its stacked [L, ...] layer parameters split into L per-layer
    `Block`s (`layers` an `nnx.List`), run by a Python loop instead of a scan: for a loop
    that runs the model many times on fixed weights (the samplers' decode). Inside a jitted
    program the split is one copy of the layers' weights, made once, outside the loop; the
    layer slices of a scan inside the loop would be copied at every step. (With FSDP
    sharding XLA then gathers every layer's weights before the loop; remat does not apply.)
    For forward passes only; a model already unstacked comes back as is."""
    if isinstance(model.layers, nnx.List):
        return model
    dense = model.cfg.first_k_dense_replace  # DeepSeek-V3's dense layers come first
    stacks = ([model.dense_layers] if dense else []) + [model.layers]
    blocks = []
    for stack in stacks:
        graphdef, params = nnx.split(stack)
        num = jax.tree.leaves(params)[0].shape[0]
        blocks += [
            nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], params)) for i in range(num)
        ]
    out = nnx.merge(*nnx.split(model))  # a shallow structural copy sharing the arrays
    out.layers = nnx.List(blocks[: model.cfg.num_layers])
    if dense:
        del out.dense_layers
    return out
