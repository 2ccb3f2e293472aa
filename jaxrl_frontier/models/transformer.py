"""A decoder-only transformer covering the Llama, Qwen2 and Qwen3 shapes, in Flax NNX.

    x = embed(tokens)
    for each layer:  x = x + Attn(RMSNorm(x));  x = x + SwiGLU(RMSNorm(x))
    logits = RMSNorm(x) @ W_out          (W_out = embed^T when embeddings are tied)

- Attention: grouped-query (num_kv_heads divides num_heads), RoPE in the rotate-half
  convention of the Hugging Face implementations, optional qkv bias (Qwen2), optional
  per-head RMSNorm of q and k before RoPE (Qwen3).
- Padding: prompts are left-padded; `attention_mask` is 1 on real tokens. Positions count
  real tokens only (`cumsum(mask) - 1`), so a left-padded prompt sees the same positions as
  the unpadded one and gets the same logits.
- Layers are scanned: `Transformer.layers` is one `Block` whose parameters are stacked
  along a leading `layers` axis ([L, ...]), and every forward runs the blocks under one
  `jax.lax.scan` (as MaxText's `scan_layers`). With FSDP-sharded weights XLA then gathers
  one layer's shards at a time inside the loop instead of every layer's at once, so no
  device holds a full copy of the weights; the program is compiled once per layer shape,
  not once per layer. `ModelConfig.remat` wraps the scanned body in `jax.checkpoint`.
- Rollouts run the layers unstacked (`unstack_layers`: L per-layer `Block`s, a Python
  loop): inside a decode loop, a scan's per-layer slices of the stacked weights are
  copies (XLA:CPU copied every layer's weights before its matmuls at every step: a 25M
  decode step took 2.3x as long), while per-layer arrays are read in place.
- KV cache (`KVCache`): slots along the sequence axis, written for all rows at the same
  slot index. With left-padded prompts every row's next token lands in the same slot, so
  causality in slot space is causality in time; `valid` masks padding slots. Each layer has
  its own [B, K, S, Dh] array (kv heads before slots): attention's batch dims (B, K) are
  major and each head's [S, Dh] block is contiguous, and an unstacked model's decode step
  writes and reads it in place. (A stacked [L, B, K, S, Dh] cache cost XLA a copy of the
  cache per layer and step.) A scanned forward stacks the layers' caches for its scan.
- Parameters are kept in `param_dtype` (f32) and cast to `dtype` (bf16 or f32) for compute;
  softmax, norms and logits are computed in f32.
- Every parameter carries `logical_axes` metadata (`layers`, `vocab`, `embed`, `heads`,
  `kv_heads`, `mlp`, or None); `jaxrl_frontier.core.sharding` maps these names to mesh axes
  (`layers` to none: every device holds its shard of every layer).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from jaxrl_frontier.core import sharding as shd

_NEG_INF = -1e30  # finite, so a fully masked (padding) query row gives a uniform softmax, not NaN


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture hyperparameters (names follow Hugging Face's config.json)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None  # None -> hidden_size // num_heads
    rope_theta: float = 10000.0
    # None, or a sorted tuple of (key, value) items of HF's rope_scaling dict (hashable).
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3
    max_position_embeddings: int = 4096
    dtype: str = "float32"  # compute dtype: float32 | bfloat16
    param_dtype: str = "float32"
    family: str = "llama"  # llama | qwen2 | qwen3 (the HF architecture written back on save)
    # recompute each block in the backward pass (jax.checkpoint of the scanned body): False /
    # 'none', True / 'full' (keep only each block's input), 'dots_saveable' (keep the matmul
    # outputs too)
    remat: bool | str = False
    attention: str = "xla"  # the attention implementation (`ATTENTION_IMPLS`)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype={self.dtype!r}; allowed: 'float32', 'bfloat16'")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention={self.attention!r}; allowed: {ATTENTION_IMPLS}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat={self.remat!r}; allowed: {tuple(REMAT_POLICIES)}")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    def replace(self, **kwargs) -> ModelConfig:
        return dataclasses.replace(self, **kwargs)

    def num_params(self) -> int:
        d, f, v, hd = (
            self.hidden_size,
            self.intermediate_size,
            self.vocab_size,
            self.resolved_head_dim,
        )
        attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        if self.qkv_bias:
            attn += hd * (self.num_heads + 2 * self.num_kv_heads)
        if self.qk_norm:
            attn += 2 * hd
        layer = attn + 3 * d * f + 2 * d
        emb = v * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + d


@flax.struct.dataclass
class KVCache:
    """Every layer's keys and values for incremental decoding.

    k, v:  tuples of L arrays [B, K, S, Dh] (K kv heads, S cache slots; see the module
           docstring)
    valid: [B, S] bool       slot holds a real (non-padding) token
    index: int32 []          next slot to write (the same for every row)
    """

    k: jax.Array
    v: jax.Array
    valid: jax.Array
    index: jax.Array

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache of `max_len` slots (prompt + generated tokens)."""
    dtype = dtype or cfg.compute_dtype
    shape = (batch_size, cfg.num_kv_heads, max_len, cfg.resolved_head_dim)
    return KVCache(
        k=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
        v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
        valid=jnp.zeros((batch_size, max_len), bool),
        index=jnp.zeros((), jnp.int32),
    )


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """[B, T] positions of real tokens (0, 1, ...), padding slots get 0."""
    return jnp.maximum(jnp.cumsum(attention_mask, axis=-1) - 1, 0).astype(jnp.int32)


# ----------------------------------------------------------------------------- RoPE


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
    """[Dh/2] inverse frequencies, with HF's `linear` and `llama3` scaling."""
    hd = cfg.resolved_head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    scaling = dict(cfg.rope_scaling or ())
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return jnp.where(medium, smoothed, scaled)
    raise ValueError(
        f"rope_scaling type {kind!r} is not supported; supported: default, linear, llama3"
    )


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """x [..., H, Dh], positions [...] (e.g. [B, T]) -> x rotated (rotate-half convention)."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [..., Dh/2]
    cos = jnp.cos(jnp.concatenate([angles, angles], -1))[..., None, :]
    sin = jnp.sin(jnp.concatenate([angles, angles], -1))[..., None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x * cos + rotated * sin).astype(x.dtype)


# ----------------------------------------------------------------------------- layers


def dense(x: jax.Array, w: jax.Array, contract: int = 1) -> jax.Array:
    """x [..., *w.shape[:contract]] @ w -> [..., *w.shape[contract:]], as one 2-D matmul.

    The leading dims of x are flattened into the matmul's rows, so autodiff's weight
    gradient is a plain [in, rows] x [rows, out] dot. Left as a 3-D dot_general
    (`einsum("btd,df->btf")`), XLA:CPU (jaxlib 0.10) transposes the [B, T, F] cotangent
    into a copy before each weight-gradient dot: measured on a 4-block SwiGLU stack at
    [16, 48] tokens, the backward pass ran 1.26x to 1.28x faster flattened (same values,
    no copies left). The reshapes are row-major bitcasts (no data moves), and a batch
    dim sharded over the mesh stays the major dim of the rows.
    """
    lead, inner = x.shape[: x.ndim - contract], w.shape[:contract]
    if x.shape[x.ndim - contract :] != inner:
        raise ValueError(f"dense: x {x.shape} does not end in w's input dims {inner}")
    out = w.shape[contract:]
    y = x.reshape(-1, math.prod(inner)) @ w.reshape(math.prod(inner), math.prod(out))
    return y.reshape(*lead, *out)


def project(module: nnx.Module, name: str, x: jax.Array, dt, contract: int = 1) -> jax.Array:
    """`dense(x, W)` for the module's weight `name`, plus its low-rank adapter's update
    (alpha / r) (x A) B where the module holds one (`jaxrl_frontier.models.lora`; Hu et al., 2021):
    A `name_lora_a` [*in, r], B `name_lora_b` [r, *out], the scale `lora_scale`. The adapter
    runs beside the frozen weight, unmerged, in every forward (update, scoring, decode)."""
    y = dense(x, getattr(module, name)[...].astype(dt), contract)
    a = getattr(module, f"{name}_lora_a", None)
    if a is None:
        return y
    h = dense(x, a[...].astype(dt), contract)  # [..., r]
    b = getattr(module, f"{name}_lora_b")[...].astype(dt)
    return y + dense(h, b * jnp.asarray(module.lora_scale, dt))


def _param(rngs: nnx.Rngs, shape, axes, dtype, init="normal", stack=()) -> nnx.Param:
    """A parameter of `shape` with logical `axes`; `stack` (L,) prepends the layers axis."""
    shape, axes = (*stack, *shape), ("layers",) * len(stack) + tuple(axes)
    if init == "normal":
        value = 0.02 * jax.random.normal(rngs.params(), shape, dtype)
    elif init == "ones":
        value = jnp.ones(shape, dtype)
    else:
        value = jnp.zeros(shape, dtype)
    return nnx.Param(value, logical_axes=axes)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, param_dtype, rngs: nnx.Rngs, stack=()):
        self.weight = _param(rngs, (dim,), (None,), param_dtype, init="ones", stack=stack)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (self.weight[...].astype(jnp.float32) * x32).astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack=()):
        d, h, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim
        pd = jnp.dtype(cfg.param_dtype)
        param = functools.partial(_param, rngs, dtype=pd, stack=stack)
        self.cfg = cfg
        self.q_proj = param((d, h, hd), ("embed", "heads", None))
        self.k_proj = param((d, k, hd), ("embed", "kv_heads", None))
        self.v_proj = param((d, k, hd), ("embed", "kv_heads", None))
        self.o_proj = param((h, hd, d), ("heads", None, "embed"))
        if cfg.qkv_bias:
            self.q_bias = param((h, hd), ("heads", None), init="zeros")
            self.k_bias = param((k, hd), ("kv_heads", None), init="zeros")
            self.v_bias = param((k, hd), ("kv_heads", None), init="zeros")
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, pd, rngs, stack)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, pd, rngs, stack)

    def project_qkv(self, x, positions, inv_freq):
        """x [..., D], positions [...] -> q [..., H, Dh], k and v [..., K, Dh], with the
        biases, the q/k norms and RoPE applied (compute dtype)."""
        cfg, dt = self.cfg, self.cfg.compute_dtype
        q = project(self, "q_proj", x, dt)
        k = project(self, "k_proj", x, dt)
        v = project(self, "v_proj", x, dt)
        if cfg.qkv_bias:
            q = q + self.q_bias[...].astype(dt)
            k = k + self.k_bias[...].astype(dt)
            v = v + self.v_bias[...].astype(dt)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v

    def project_out(self, out):
        """Attention output [..., H, Dh] -> [..., D]."""
        return project(self, "o_proj", out, self.cfg.compute_dtype, contract=2)

    def __call__(self, x, positions, inv_freq, attn_bias, kv=None):
        """x [B, T, D]; attn_bias [B, 1, 1, T, S] additive.

        kv: None, or (k_cache, v_cache, index) with this layer's cache [B, K, S, Dh]; the new
        keys/values are written in place at slots [index, index + T).
        Returns (out [B, T, D], (k_cache, v_cache) or None).
        """
        q, k, v = self.project_qkv(x, positions, inv_freq)
        new_kv, kv_spec = None, "bskd"  # without a cache: the fresh [B, T, K, Dh] keys
        if kv is not None:
            k_cache, v_cache, index = kv
            # Only the T new tokens are transposed to the cache's [B, K, T, Dh] layout.
            start = (0, 0, index, 0)
            k_new = jnp.swapaxes(k, 1, 2).astype(k_cache.dtype)
            v_new = jnp.swapaxes(v, 1, 2).astype(v_cache.dtype)
            k = jax.lax.dynamic_update_slice(k_cache, k_new, start)
            v = jax.lax.dynamic_update_slice(v_cache, v_new, start)
            new_kv, kv_spec = (k, v), "bksd"
        out = attention(q, k, v, attn_bias, kv_spec, impl=self.cfg.attention)
        return self.project_out(out.astype(x.dtype)), new_kv


ATTENTION_IMPLS = ("xla",)  # ModelConfig.attention


def attention(q, k, v, attn_bias, kv_spec: str = "bskd", *, impl: str = "xla"):
    """The model's one attention-selection point (`ModelConfig.attention`, static).

    q [B, T, H, Dh]; k, v [B, S, K, Dh] (kv_spec 'bskd') or [B, K, S, Dh] ('bksd', the
    cache's layout); attn_bias [B, 1, 1, T, S] additive. Returns [B, T, H, Dh].

    'xla': plain XLA. A one-query step over the cache (decode) runs as broadcast-multiply
    and reductions (`_attend_one_query`), every other call as `attend`'s einsums.
    """
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention impl {impl!r}; allowed: {ATTENTION_IMPLS}")
    if q.shape[1] == 1 and kv_spec == "bksd":
        b, _, h, hd = q.shape
        kvh = k.shape[1]
        out = _attend_one_query(q.reshape(b, kvh, h // kvh, hd), k, v, attn_bias[:, 0, 0, 0])
        return out.astype(q.dtype).reshape(b, 1, h, hd)
    return attend(q, k, v, attn_bias, kv_spec)


def attend(q, k, v, attn_bias, kv_spec: str = "bskd"):
    """softmax(q k^T / sqrt(Dh) + bias) v with grouped-query heads; scores and softmax in f32.

    q [B, T, H, Dh]; k, v [B, S, K, Dh] (kv_spec 'bskd') or [B, K, S, Dh] ('bksd', the
    cache's layout); attn_bias [B, 1, 1, T, S] additive. Returns [B, T, H, Dh], q's dtype.
    """
    b, t, h, hd = q.shape
    dt = q.dtype
    kvh = k.shape[kv_spec.index("k")]
    q = q.reshape(b, t, kvh, h // kvh, hd)  # group query heads by their kv head
    scores = jnp.einsum(
        f"btkgd,{kv_spec}->bkgts", q, k.astype(dt), preferred_element_type=jnp.float32
    )
    scores = scores / math.sqrt(hd) + attn_bias
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    out = jnp.einsum(f"bkgts,{kv_spec}->btkgd", probs, v.astype(dt))
    return out.reshape(b, t, h, hd)


def _attend_one_query(q, k, v, bias):
    """One decode step's attention as broadcast-multiply + reduce, in f32.

    q [B, K, G, Dh] (query heads grouped by kv head); k, v: one layer's cache [B, K, S, Dh];
    bias [B, S] additive. Returns f32 [B, K, G, Dh]. With one query per row, XLA:CPU runs
    the einsum form as B*K tiny batched dots (measured ~150 us per layer at B=16, S=144,
    ~1% of peak); as reductions they fuse into loops that read the cache in place.
    """
    f32 = jnp.float32
    qf = q.astype(f32)
    scores = jnp.sum(qf[:, :, :, None, :] * k[:, :, None].astype(f32), axis=-1)  # [B,K,G,S]
    scores = scores / math.sqrt(q.shape[-1]) + bias[:, None, None, :]
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.sum(probs[..., None] * v[:, :, None].astype(f32), axis=3)  # [B, K, G, Dh]


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack=()):
        d, f, pd = cfg.hidden_size, cfg.intermediate_size, jnp.dtype(cfg.param_dtype)
        param = functools.partial(_param, rngs, dtype=pd, stack=stack)
        self.dtype = cfg.compute_dtype
        self.gate_proj = param((d, f), ("embed", "mlp"))
        self.up_proj = param((d, f), ("embed", "mlp"))
        self.down_proj = param((f, d), ("mlp", "embed"))

    def __call__(self, x, hidden_mask=None):
        dt = self.dtype
        gate = project(self, "gate_proj", x, dt)
        h = jax.nn.silu(gate) * project(self, "up_proj", x, dt)
        if hidden_mask is not None:  # [B, F] fixed dropout mask (Dropout-GRPO rollouts)
            h = h * hidden_mask[:, None, :].astype(dt)
        return project(self, "down_proj", h, dt)


class Block(nnx.Module):
    """One decoder layer. Built with `stack=(L,)` (as `Transformer.layers`), it holds L
    layers' parameters stacked along a leading `layers` axis; `Transformer.scan_layers`
    runs it one layer at a time, each call seeing one layer's slice."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack=()):
        pd = jnp.dtype(cfg.param_dtype)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs, stack)
        self.attn = Attention(cfg, rngs, stack)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs, stack)
        self.mlp = MLP(cfg, rngs, stack)

    def __call__(self, x, positions, inv_freq, attn_bias, kv=None, hidden_mask=None):
        a, new_kv = self.attn(self.input_norm(x), positions, inv_freq, attn_bias, kv)
        return self.feed_forward(x + a, hidden_mask), new_kv

    def feed_forward(self, x, hidden_mask=None):
        """The block's second residual half: x + MLP(RMSNorm(x)); x [..., D]."""
        return x + self.mlp(self.post_attn_norm(x), hidden_mask)


def _attn_bias(allowed: jax.Array) -> jax.Array:
    """allowed [B, T, S] bool -> additive attention bias [B, 1, 1, T, S] (f32)."""
    return jnp.where(allowed, 0.0, _NEG_INF).astype(jnp.float32)[:, None, None]


# ModelConfig.remat -> the jax.checkpoint policy of the scanned body (None: no remat)
REMAT_POLICIES = {
    False: None,
    "none": None,
    True: jax.checkpoint_policies.nothing_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
}


def _shared_prompt_block(layer: Block, x, positions, inv_freq, bias_p, bias_c, *, n, tp):
    """One `Block` over packed rows x [G, Tp + n * Tn, D]: group g's prompt rows, then its
    n completions' rows. Row-wise work (norms, projections, MLP) runs once over all rows,
    with each weight used once; prompts attend to their prompt (bias_p [G, 1, 1, Tp, Tp]),
    completions to their group's prompt keys and their own (bias_c [B, 1, 1, Tn, T]).
    Groups stay the major axis throughout, so a batch sharded by group moves no data."""
    groups = x.shape[0]
    tn = (x.shape[1] - tp) // n

    def split(a):  # [G, Tp + n Tn, ...] -> prompts [G, Tp, ...], completions [B, Tn, ...]
        return a[:, :tp], a[:, tp:].reshape(groups * n, tn, *a.shape[2:])

    (q_p, q_c), (k_p, k_c), (v_p, v_c) = map(
        split, layer.attn.project_qkv(layer.input_norm(x), positions, inv_freq)
    )
    impl = layer.attn.cfg.attention
    out_p = attention(q_p, k_p, v_p, bias_p, impl=impl)
    keys = jnp.concatenate([jnp.repeat(k_p, n, axis=0), k_c], axis=1)  # [B, T, K, Dh]
    values = jnp.concatenate([jnp.repeat(v_p, n, axis=0), v_c], axis=1)
    out_c = attention(q_c, keys, values, bias_c, impl=impl)
    out = jnp.concatenate([out_p, out_c.reshape(groups, n * tn, *out_c.shape[2:])], axis=1)
    return layer.feed_forward(x + layer.attn.project_out(out))


# ----------------------------------------------------------------------------- model


class Transformer(nnx.Module):
    """Decoder LM. `model(tokens, attention_mask)` -> logits [B, T, V] (f32).

    `self.layers` is one `Block` holding every layer's parameters stacked [L, ...]
    (state paths `layers.attn.q_proj`, ...); forwards scan over it (`scan_layers`).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
        self.layers = Block(cfg, rngs, stack=(cfg.num_layers,))
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)

    def constrain_rows(self, x: jax.Array) -> jax.Array:
        """x [B, ...] with its rows split over the mesh's batch axes, on the mesh the
        parameters are placed on (read from the embedding's sharding; nothing without one).

        A scan's carry keeps one sharding for every layer, and XLA took it from the
        embedding lookup: the hidden size split over fsdp, like the embedding's columns. The
        activations inside the layers then came out replicated on every device (a 100M
        update on 8 fsdp devices: 5 stacked [L, B, T, F] residuals at the full batch,
        240 MB per device); with the rows split, each device keeps its rows' activations.
        """
        mesh = getattr(jax.typeof(self.embed[...]).sharding, "mesh", None)
        if mesh is None or not set(shd.BATCH_AXES) <= set(mesh.shape) or mesh.size == 1:
            return x
        spec = shd.logical_to_spec(("batch",) + (None,) * (x.ndim - 1), x.shape, mesh)
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    def scan_layers(self, body, carry, xs=None, *, remat: bool | str = False):
        """Run `body(layer, carry, x_i) -> (carry, y_i)` over the first `cfg.num_layers`
        layers under one `jax.lax.scan`, `layer` a `Block` on layer i's parameters and x_i
        layer i's slice of `xs` (a pytree with a leading [L] axis, or None). The blocks'
        parameters are scanned over, so XLA reads (and with FSDP gathers) one layer's
        weights per iteration. `remat` (a `ModelConfig.remat` value) wraps the body in
        `jax.checkpoint` with that policy. Returns (carry, ys stacked [L, ...])."""
        num = self.cfg.num_layers
        if isinstance(self.layers, nnx.List):  # unstacked (`unstack_layers`): a Python loop
            ys = []
            for i in range(num):
                carry, y = body(self.layers[i], carry, jax.tree.map(lambda a: a[i], xs))
                ys.append(y)
            return carry, jax.tree.map(lambda *a: jnp.stack(a), *ys)
        graphdef, params = nnx.split(self.layers)
        if jax.tree.leaves(params)[0].shape[0] != num:  # a shallow draft: the first layers
            params = jax.tree.map(lambda a: a[:num], params)

        def step(carry, inputs):
            layer_params, x = inputs
            return body(nnx.merge(graphdef, layer_params), carry, x)

        policy = REMAT_POLICIES[remat]
        if policy is not None:
            step = jax.checkpoint(step, policy=policy)
        return jax.lax.scan(step, carry, (params, xs))

    def __call__(
        self,
        tokens: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        positions: jax.Array | None = None,
        cache: KVCache | None = None,
        mlp_mask: jax.Array | None = None,
    ):
        """Logits for `tokens`.

        Args:
          tokens: int32 [B, T].
          attention_mask: [B, T], 1 on real tokens (prompts left-padded); None = all real.
          positions: int32 [B, T]; default `positions_from_mask(attention_mask)`. With a
            cache, pass the true positions of the new tokens.
          cache: a `KVCache`; the T new tokens are written at slots [index, index + T).
          mlp_mask: optional [L, B, F] multiplicative mask on the MLP hidden units, held
            fixed over a rollout (Dropout-GRPO).

        Returns:
          logits f32 [B, T, V]; with a cache, (logits, updated cache).
        """
        hidden, new_cache = self.hidden_states(
            tokens, attention_mask, positions=positions, cache=cache, mlp_mask=mlp_mask
        )
        logits = self.logits(hidden)
        return logits if cache is None else (logits, new_cache)

    def hidden_states(
        self, tokens, attention_mask=None, *, positions=None, cache=None, mlp_mask=None
    ):
        """Final-normed hidden states [B, T, D] (and the updated cache, or None)."""
        cfg = self.cfg
        b, t = tokens.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), jnp.int32)
        if positions is None:
            positions = positions_from_mask(attention_mask)
        real = attention_mask.astype(bool)
        if cache is None:
            key_valid, offset = real, 0
        else:
            key_valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, real, cache.index, 1)
            offset = cache.index
        s = key_valid.shape[1]
        # query i sits in slot offset + i; it sees valid slots up to its own
        causal = (offset + jnp.arange(t))[:, None] >= jnp.arange(s)[None, :]  # [T, S]
        attn_bias = _attn_bias(causal[None] & key_valid[:, None, :])

        inv_freq = rope_inv_freq(cfg)
        x = self.constrain_rows(self.embed[...].astype(cfg.compute_dtype)[tokens])
        if cache is None:  # a training (or scoring) forward: remat applies

            def block(layer, x, hidden_mask):
                x = self.constrain_rows(x)
                return layer(x, positions, inv_freq, attn_bias, None, hidden_mask)[0], None

            x, _ = self.scan_layers(block, x, mlp_mask, remat=cfg.remat)
            return self.final_norm(x), None

        def cached_block(layer, x, inputs):
            k, v, hidden_mask = inputs
            kv = (k, v, cache.index)
            return layer(self.constrain_rows(x), positions, inv_freq, attn_bias, kv, hidden_mask)

        if isinstance(self.layers, nnx.List):  # unstacked: each layer's cache in place
            new_k, new_v = [], []
            for i, layer in enumerate(self.layers):
                hidden_mask = None if mlp_mask is None else mlp_mask[i]
                x, (k, v) = cached_block(layer, x, (cache.k[i], cache.v[i], hidden_mask))
                new_k.append(k)
                new_v.append(v)
        else:  # the scan takes (and returns) the layers' caches stacked [L, ...]
            xs = (jnp.stack(cache.k), jnp.stack(cache.v), mlp_mask)
            x, (k, v) = self.scan_layers(cached_block, x, xs)
            new_k, new_v = list(k), list(v)
        new_cache = KVCache(k=tuple(new_k), v=tuple(new_v), valid=key_valid, index=cache.index + t)
        return self.final_norm(x), new_cache

    def hidden_states_shared_prompt(
        self,
        tokens: jax.Array,
        attention_mask: jax.Array,
        *,
        prompt_len: int,
        group_size: int,
        mlp_mask: jax.Array | None = None,
    ) -> jax.Array:
        """`hidden_states(tokens, attention_mask)[0]` for rows that come in groups sharing a
        prompt, with each group's prompt run through the model once instead of once per row.

        tokens, attention_mask: [B, T], B = G * group_size rows, prompt-major: rows
        g * n .. g * n + n - 1 hold the same first `prompt_len` tokens and mask (an RL batch
        of n completions per prompt). Each layer runs on the packed rows of the G prompts
        [G, Tp] and the B completions [B, T - Tp]; the completions attend to their group's
        prompt keys and values, repeated to the group's rows. The prompt part's cost falls
        by the group size (a third of the update's FLOPs at 16 prompt and 32 completion
        tokens, n = 8), and each weight is used once per layer (one FSDP all-gather). The
        gradient through the shared prompt is the sum over the group's rows, as in the
        per-row forward. Returns [B, T, D]. Rows of a group with different prompts get the
        first row's prompt (not checked).

        mlp_mask must be None: a per-row MLP mask (Dropout-GRPO) makes the rows of a group
        differ on their prompt tokens too, so their prompt cannot be run once; use
        `hidden_states` for those batches.
        """
        if mlp_mask is not None:
            raise ValueError(
                "hidden_states_shared_prompt: mlp_mask is not supported (per-row MLP masks "
                "change each row's prompt hidden states, so the prompt cannot be shared); "
                "use hidden_states(tokens, mask, mlp_mask=...) for Dropout-GRPO batches"
            )
        cfg = self.cfg
        b, t = tokens.shape
        n, tp = group_size, prompt_len
        if b % n or not 0 < tp < t:
            raise ValueError(
                f"shared-prompt forward: {b} rows are not whole groups of {n}, or the prompt "
                f"length {tp} is not within the {t} positions"
            )
        groups, tn = b // n, t - tp
        positions = positions_from_mask(attention_mask)
        real = attention_mask.astype(bool)

        def first_of_group(x):  # [B, Tp] -> [G, Tp]
            return x[:, :tp].reshape(groups, n, tp)[:, 0]

        def pack(x):  # [B, T] -> [G, Tp + n * Tn]: a group's prompt, then its completions
            completions = x[:, tp:].reshape(groups, n * tn)
            return jnp.concatenate([first_of_group(x), completions], axis=1)

        prompt_causal = jnp.arange(tp)[:, None] >= jnp.arange(tp)[None, :]
        bias_p = _attn_bias(prompt_causal[None] & first_of_group(real)[:, None, :])
        completion_causal = (tp + jnp.arange(tn))[:, None] >= jnp.arange(t)[None, :]
        bias_c = _attn_bias(completion_causal[None] & real[:, None, :])  # [B, 1, 1, Tn, T]

        inv_freq = rope_inv_freq(cfg)
        rows_positions = pack(positions)

        def block(layer, x, _):
            out = _shared_prompt_block(
                layer, self.constrain_rows(x), rows_positions, inv_freq, bias_p, bias_c, n=n, tp=tp
            )
            return out, None

        x = self.constrain_rows(self.embed[...].astype(cfg.compute_dtype)[pack(tokens)])
        x, _ = self.scan_layers(block, x, remat=cfg.remat)
        hidden = self.final_norm(x)
        h_p, h_c = hidden[:, :tp], hidden[:, tp:].reshape(b, tn, -1)
        return jnp.concatenate([jnp.repeat(h_p, n, axis=0), h_c], axis=1)

    def output_embedding(self) -> jax.Array:
        """[D, V] output projection (the transposed input embedding when tied)."""
        return self.embed[...].T if self.cfg.tie_word_embeddings else self.lm_head[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., D] -> f32 logits [..., V]."""
        w = self.output_embedding().astype(self.cfg.compute_dtype)
        return jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)

    def init_cache(self, batch_size: int, max_len: int, dtype=None) -> KVCache:
        return init_cache(self.cfg, batch_size, max_len, dtype)


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
    dt = model.cfg.compute_dtype
    graphdef, state = nnx.split(model)

    def needs_cast(path, w):
        stacked = jax.tree_util.keystr(path[:1]) == "['layers']"  # a leading [L] axis
        matrix = w.ndim - stacked >= 2
        return matrix and jnp.issubdtype(w.dtype, jnp.floating) and w.dtype != dt

    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    if not any(needs_cast(path, w) for path, w in flat):
        return model
    cast = jax.tree_util.tree_map_with_path(
        lambda path, w: w.astype(dt) if needs_cast(path, w) else w, state
    )
    return nnx.merge(graphdef, cast)


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
    graphdef, params = nnx.split(model.layers)
    blocks = [
        nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], params))
        for i in range(model.cfg.num_layers)
    ]
    out = nnx.merge(*nnx.split(model))  # a shallow structural copy sharing the arrays
    out.layers = nnx.List(blocks)
    return out
