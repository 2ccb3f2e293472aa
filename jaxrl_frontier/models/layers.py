"""The decoder's parts (transformer.py assembles them, `ModelConfig` sets them): RoPE
(with HF's linear, llama3 and YaRN scaling), the projections (`dense`, `project`: LoRA
adapters run inside them), RMSNorm, the grouped-query attention layer (its projections,
biases and GPT-OSS's sinks; the attention itself, with its one selection point, is
`models/attention.py`), the gated MLP (SwiGLU, or GeGLU by `ModelConfig.hidden_act`) and
the pre-norm `Block` (with Gemma's extra norms around attention and MLP when
`ModelConfig.sandwich_norms`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.models import lora
from jaxrl_frontier.models.attention import attention
from jaxrl_frontier.models.kv_cache import write_slots
from jaxrl_frontier.models.model_config import ACTIVATIONS, ModelConfig


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """[B, T] positions of real tokens (0, 1, ...), padding slots get 0."""
    return jnp.maximum(jnp.cumsum(attention_mask, axis=-1) - 1, 0).astype(jnp.int32)


# ----------------------------------------------------------------------------- RoPE


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
    """[Dr/2] inverse frequencies (Dr = `cfg.rope_dim`), with HF's `linear`, `llama3` and
    `yarn` scaling."""
    hd = cfg.rope_dim
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
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, scaling, cfg)
    raise ValueError(
        f"rope_scaling type {kind!r} is not supported; supported: default, linear, llama3, yarn"
    )


def _yarn_factor(scaling: dict, cfg: ModelConfig) -> float:
    """YaRN's context factor s (HF: `factor`, else max positions / original max positions)."""
    factor = scaling.get("factor")
    if factor is None:
        return cfg.max_position_embeddings / scaling["original_max_position_embeddings"]
    return float(factor)


def _yarn_inv_freq(inv_freq: jax.Array, scaling: dict, cfg: ModelConfig) -> jax.Array:
    """YaRN (Peng et al., 2023), as HF's `_compute_yarn_parameters`: each frequency blends
    the interpolated theta_i / s and the original theta_i by a ramp over the dims,

        theta_i' = theta_i / s * r_i + theta_i * (1 - r_i),   r_i = clip((i - lo) / (hi - lo), 0, 1)

    lo, hi the dims that turn beta_fast and beta_slow times over the original context
    (floored / ceiled unless `truncate` is false): the fast dims keep their frequency, the
    slow ones are interpolated."""
    if scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("rope_scaling 'yarn' with partial_rotary_factor != 1 is not supported")
    dim, base = cfg.rope_dim, cfg.rope_theta
    old_len = scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dim_of(rotations):  # the dim whose wavelength fits `rotations` times in old_len
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high  # HF: no division by 0
    ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
    return inv_freq / _yarn_factor(scaling, cfg) * ramp + inv_freq * (1 - ramp)


def rope_attention_scale(cfg: ModelConfig) -> float:
    """The factor HF multiplies RoPE's cos and sin by (its `attention_factor`): 1, or with
    YaRN `attention_factor` where set, else 0.1 ln(s) + 1 (the ratio of two such terms with
    `mscale` and `mscale_all_dim`). Scaling both q and k, it sharpens the scores by its
    square."""
    scaling = dict(cfg.rope_scaling or ())
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])

    def mscale(s, m=1.0):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    s = _yarn_factor(scaling, cfg)
    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    return mscale(s, m) / mscale(s, m_all) if m and m_all else mscale(s)


def layer_attention_inputs(cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """Each layer's (RoPE inverse frequencies [L, Dh/2] f32, window [L] int32): a sliding
    layer's window and, where `rope_local_theta` is set (Gemma 3), that base unscaled (as
    HF's local rotary embedding), else the full layers' RoPE (Gemma 2, GPT-OSS: one rotary
    embedding); a full layer's `rope_inv_freq(cfg)` and a window of 2**30 (no limit).
    Scanned over the layers beside their weights, so layers of both kinds run in one
    program."""
    full = rope_inv_freq(cfg)
    local = full
    if cfg.rope_local_theta is not None:
        local = rope_inv_freq(cfg.replace(rope_theta=cfg.rope_local_theta, rope_scaling=None))
    sliding = jnp.asarray(cfg.sliding_layers)
    inv_freq = jnp.where(sliding[:, None], local[None], full[None])
    window = jnp.where(sliding, cfg.sliding_window or 0, NO_WINDOW).astype(jnp.int32)
    return inv_freq, window


NO_WINDOW = 2**30  # a full-attention layer's window in `layer_attention_inputs`


def apply_rope(
    x: jax.Array, positions: jax.Array, inv_freq: jax.Array, scale: float = 1.0
) -> jax.Array:
    """x [..., H, Dh], positions [...] (e.g. [B, T]) -> x rotated (rotate-half convention),
    times `scale` (YaRN's `rope_attention_scale`, folded into cos and sin as HF does)."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [..., Dh/2]
    cos = scale * jnp.cos(jnp.concatenate([angles, angles], -1))[..., None, :]
    sin = scale * jnp.sin(jnp.concatenate([angles, angles], -1))[..., None, :]
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


def folded_weight(module: nnx.Module, name: str, dt) -> jax.Array:
    """The module's weight `name` [*in, *out] with its adapter folded in, W + (alpha / r) A B
    (`lora.delta`; one input dim), where it holds one: for a product that needs the matrix
    itself rather than x W (the latent attention's absorbed decode)."""
    w = getattr(module, name)[...]
    a = getattr(module, f"{name}_lora_a", None)
    if a is not None:
        b = getattr(module, f"{name}_lora_b")[...]
        w = w.astype(jnp.float32) + lora.delta(a[...], b, 1, module.lora_scale)
    return w.astype(dt)


def make_param(rngs: nnx.Rngs, shape, axes, dtype, init="normal", stack=()) -> nnx.Param:
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
    """x / rms(x) * w in f32, cast back to x's dtype; plus_one (Gemma): * (1 + w), the
    weight stored around 0 (initialised to 0)."""

    def __init__(self, dim: int, eps: float, param_dtype, rngs: nnx.Rngs, stack=(), plus_one=False):
        init = "zeros" if plus_one else "ones"
        self.weight = make_param(rngs, (dim,), (None,), param_dtype, init=init, stack=stack)
        self.eps = eps
        self.plus_one = plus_one

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...].astype(jnp.float32)
        return ((1.0 + w if self.plus_one else w) * x32).astype(x.dtype)


def rms_norm(cfg: ModelConfig, dim: int, rngs: nnx.Rngs, stack=()) -> RMSNorm:
    """An `RMSNorm` of `dim` with the config's eps, parameter dtype and (1 + w) choice."""
    pd = jnp.dtype(cfg.param_dtype)
    return RMSNorm(dim, cfg.rms_norm_eps, pd, rngs, stack, plus_one=cfg.norm_plus_one)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack=()):
        d, h, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim
        pd = jnp.dtype(cfg.param_dtype)
        param = functools.partial(make_param, rngs, dtype=pd, stack=stack)
        self.cfg = cfg
        self.q_proj = param((d, h, hd), ("embed", "heads", None))
        self.k_proj = param((d, k, hd), ("embed", "kv_heads", None))
        self.v_proj = param((d, k, hd), ("embed", "kv_heads", None))
        self.o_proj = param((h, hd, d), ("heads", None, "embed"))
        if cfg.qkv_bias:
            self.q_bias = param((h, hd), ("heads", None), init="zeros")
            self.k_bias = param((k, hd), ("kv_heads", None), init="zeros")
            self.v_bias = param((k, hd), ("kv_heads", None), init="zeros")
        if cfg.o_bias:
            self.o_bias = param((d,), ("embed",), init="zeros")
        if cfg.attention_sinks:  # one logit per query head, read in f32 (`attention.py`)
            self.sinks = param((h,), ("heads",), init="zeros")
        if cfg.qk_norm:
            self.q_norm = rms_norm(cfg, hd, rngs, stack)
            self.k_norm = rms_norm(cfg, hd, rngs, stack)

    def project_qkv(self, x, positions, inv_freq):
        """x [..., D], positions [...] -> q [..., H, Dh], k and v [..., K, Dh], with the
        biases, the q/k norms and RoPE (times YaRN's scale) applied (compute dtype)."""
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
        scale = rope_attention_scale(cfg)
        return (
            apply_rope(q, positions, inv_freq, scale),
            apply_rope(k, positions, inv_freq, scale),
            v,
        )

    def project_out(self, out):
        """Attention output [..., H, Dh] -> [..., D] (plus the output bias where it has one)."""
        dt = self.cfg.compute_dtype
        y = project(self, "o_proj", out, dt, contract=2)
        return y + self.o_bias[...].astype(dt) if self.cfg.o_bias else y

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
            k_new = jnp.swapaxes(k, 1, 2).astype(k_cache.dtype)
            v_new = jnp.swapaxes(v, 1, 2).astype(v_cache.dtype)
            k = write_slots(k_cache, k_new, index, axis=2)
            v = write_slots(v_cache, v_new, index, axis=2)
            new_kv, kv_spec = (k, v), "bksd"
        out = attention(q, k, v, attn_bias, kv_spec, **self.score_options())
        return self.project_out(out.astype(x.dtype)), new_kv

    def score_options(self) -> dict:
        """`attention`'s keywords from the config: impl, Gemma's scale and soft-cap, GPT-OSS's
        sinks [H] (each absent where the config has none, so the other families' scores are
        computed as before)."""
        cfg, options = self.cfg, dict(impl=self.cfg.attention)
        if cfg.query_pre_attn_scalar is not None:
            options["scale"] = cfg.query_pre_attn_scalar**-0.5
        if cfg.attn_logit_softcap is not None:
            options["softcap"] = cfg.attn_logit_softcap
        if cfg.attention_sinks:
            options["sinks"] = self.sinks[...].astype(jnp.float32)
        return options


def yarn_softmax_scale(cfg: ModelConfig) -> float:
    """The factor latent attention multiplies its softmax scale by (HF `yarn_apply_mscale`):
    with YaRN and `mscale_all_dim` m, (0.1 m ln(s) + 1) ** 2, else 1. DeepSeek scales every
    dim of the score this way, the rotated ones also by `rope_attention_scale`."""
    scaling = dict(cfg.rope_scaling or ())
    m = scaling.get("mscale_all_dim")
    if scaling.get("rope_type", "default") == "default" or not m:
        return 1.0
    s = float(scaling["factor"])
    mscale = 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
    return mscale * mscale


class LatentAttention(Attention):
    """Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434; HF
    `DeepseekV3Attention`), R = kv_lora_rank, Rq = q_lora_rank, Dn / Dr / Dv the nope, rope
    and value head widths:

        q = RMSNorm(x W_qa) W_qb                 [.., H, Dn + Dr]   (x W_q when Rq = 0)
        c, k_r = split(x W_kva, [R, Dr])         latent [.., R], one rope key [.., Dr]
        k_n, v = split(RMSNorm(c) W_kvb)         [.., H, Dn], [.., H, Dv]
        k = [k_n, RoPE(k_r) for every head],  q = [q_n, RoPE(q_r)]
        out = softmax(q k^T * (Dn + Dr) ** -0.5 * yarn mscale^2) v  W_o

    A forward over whole rows (update, scoring) runs as `Attention` with K = H heads of
    width Dh = Dn + Dr: `project_qkv` gives full per-head keys and values padded with zeros
    from Dv to Dh (the padded columns of the output are dropped by `project_out`), so the
    attention implementations and the shared-prompt forward are the other families'. A
    forward over a cache (prefill, decode) caches only each token's latent and rope key
    (R + Dr numbers per layer, against a full cache's 2 H Dh) and absorbs the
    up-projection into the query and the output (`__call__`).
    `rope_interleave`: RoPE rotates the pairs (x0, x1), (x2, x3), ...; de-interleaving q_r
    and k_r alike ([x0, x2, .., x1, x3, ..]) makes that the rotate-half RoPE and leaves
    q_r . k_r unchanged.
    """

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack=()):
        d, h, hd = cfg.hidden_size, cfg.num_heads, cfg.resolved_head_dim
        r, rq = cfg.kv_lora_rank, cfg.q_lora_rank
        pd = jnp.dtype(cfg.param_dtype)
        param = functools.partial(make_param, rngs, dtype=pd, stack=stack)
        self.cfg = cfg
        if rq:
            self.q_a_proj = param((d, rq), ("embed", None))
            # HF builds both latent norms with its default eps, 1e-6, not rms_norm_eps
            self.q_a_norm = RMSNorm(rq, 1e-6, pd, rngs, stack)
            self.q_b_proj = param((rq, h, hd), (None, "heads", None))
        else:
            self.q_proj = param((d, h, hd), ("embed", "heads", None))
        self.kv_a_proj = param((d, r + cfg.qk_rope_head_dim), ("embed", None))
        self.kv_a_norm = RMSNorm(r, 1e-6, pd, rngs, stack)
        self.kv_b_proj = param((r, h, cfg.qk_nope_head_dim + cfg.v_head_dim), (None, "heads", None))
        self.o_proj = param((h, cfg.v_head_dim, d), ("heads", None, "embed"))

    def project_latent(self, x, positions, inv_freq):
        """x [..., D], positions [...] -> (q_nope [..., H, Dn], q_rot [..., H, Dr] rotated,
        the normed latent [..., R], the rotated rope key [..., 1, Dr])."""
        cfg, dt = self.cfg, self.cfg.compute_dtype
        if cfg.q_lora_rank:
            q = project(self, "q_b_proj", self.q_a_norm(project(self, "q_a_proj", x, dt)), dt)
        else:
            q = project(self, "q_proj", x, dt)
        latent, k_rot = jnp.split(project(self, "kv_a_proj", x, dt), [cfg.kv_lora_rank], -1)
        q_nope, q_rot = q[..., : cfg.qk_nope_head_dim], q[..., cfg.qk_nope_head_dim :]
        k_rot = k_rot[..., None, :]  # [..., 1, Dr]: one rope key for every head
        if cfg.rope_interleave:
            q_rot, k_rot = _deinterleave(q_rot), _deinterleave(k_rot)
        scale = rope_attention_scale(cfg)
        q_rot = apply_rope(q_rot, positions, inv_freq, scale)
        k_rot = apply_rope(k_rot, positions, inv_freq, scale)
        return q_nope, q_rot, self.kv_a_norm(latent), k_rot

    def project_qkv(self, x, positions, inv_freq):
        """x [..., D], positions [...] -> q, k, v [..., H, Dh] (v zero-padded from Dv)."""
        cfg, dt = self.cfg, self.cfg.compute_dtype
        dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        q_nope, q_rot, latent, k_rot = self.project_latent(x, positions, inv_freq)
        kv = project(self, "kv_b_proj", latent, dt)  # [..., H, Dn + Dv]
        k_nope, v = kv[..., :dn], kv[..., dn:]
        q = jnp.concatenate([q_nope, q_rot], -1)
        k = jnp.concatenate([k_nope, jnp.broadcast_to(k_rot, (*k_nope.shape[:-1], dr))], -1)
        v = jnp.pad(v, [(0, 0)] * (v.ndim - 1) + [(0, dn + dr - dv)])
        return q, k, v

    def __call__(self, x, positions, inv_freq, attn_bias, kv=None):
        """`Attention.__call__`; with a cache, kv = (latent cache [B, 1, S, R], rope-key
        cache [B, 1, S, Dr], index): the T new tokens' latents and rope keys are written at
        slots [index, index + T) and attended to with the up-projection absorbed
        (DeepSeek-V2 sec. 2.1.2): W_kvb = [W_k [R, H, Dn], W_v [R, H, Dv]],

            score_hts = (q_nope_h W_k,h^T) . c_s + q_rot_h . k_rot_s     ([R] and [Dr] dots)
            out_h = (sum_s p_hts c_s) W_v,h                              [Dv]

        so no per-head key or value is formed or cached: R + Dr numbers per token and
        layer. Scores and softmax in f32, as `attention.attend`; the values are those of
        the expanded form up to f32 rounding (summed in another order)."""
        if kv is None:
            return super().__call__(x, positions, inv_freq, attn_bias)
        cfg, dt = self.cfg, self.cfg.compute_dtype
        f32, dn = jnp.float32, cfg.qk_nope_head_dim
        latent_cache, rope_cache, index = kv
        q_nope, q_rot, latent, k_rot = self.project_latent(x, positions, inv_freq)
        c = write_slots(latent_cache, latent[:, None].astype(latent_cache.dtype), index, axis=2)
        k_rot = write_slots(rope_cache, jnp.swapaxes(k_rot, 1, 2).astype(rope_cache.dtype),
                            index, axis=2)  # fmt: skip
        w = folded_weight(self, "kv_b_proj", dt)  # [R, H, Dn + Dv], with its adapter
        q_abs = jnp.einsum("bthn,rhn->bthr", q_nope, w[..., :dn], preferred_element_type=f32)
        scores = jnp.einsum("bthr,bsr->bhts", q_abs, c[:, 0].astype(f32))
        scores += jnp.einsum(
            "bthd,bsd->bhts", q_rot, k_rot[:, 0].astype(dt), preferred_element_type=f32
        )
        scores = scores * self.score_options()["scale"] + attn_bias[:, 0]  # [B, H, T, S]
        probs = jax.nn.softmax(scores, axis=-1)
        out_c = jnp.einsum("bhts,bsr->bthr", probs, c[:, 0].astype(f32))
        out = jnp.einsum("bthr,rhv->bthv", out_c.astype(dt), w[..., dn:])
        return project(self, "o_proj", out, dt, contract=2), (c, k_rot)

    def project_out(self, out):
        """Attention output [..., H, Dh] -> [..., D] through its first Dv columns."""
        dt = self.cfg.compute_dtype
        return project(self, "o_proj", out[..., : self.cfg.v_head_dim], dt, contract=2)

    def score_options(self) -> dict:
        """impl and the softmax scale Dh ** -0.5 times YaRN's mscale^2 (`yarn_softmax_scale`)."""
        cfg = self.cfg
        scale = cfg.resolved_head_dim**-0.5 * yarn_softmax_scale(cfg)
        return dict(impl=cfg.attention, scale=scale)


def _deinterleave(x):
    """[..., (x0, x1, x2, x3, ..)] -> [..., (x0, x2, .., x1, x3, ..)]."""
    return jnp.concatenate([x[..., 0::2], x[..., 1::2]], -1)


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack=()):
        d, f, pd = cfg.hidden_size, cfg.intermediate_size, jnp.dtype(cfg.param_dtype)
        param = functools.partial(make_param, rngs, dtype=pd, stack=stack)
        self.cfg = cfg
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.gate_proj = param((d, f), ("embed", "mlp"))
        self.up_proj = param((d, f), ("embed", "mlp"))
        self.down_proj = param((f, d), ("mlp", "embed"))

    def __call__(self, x, hidden_mask=None, route=None):
        """x [B, T, D] -> [B, T, D]; with a route (a dense layer of a mixture-of-experts
        model, DeepSeek-V3's first layers, in a routed forward): (that, None), no router."""
        dt = self.cfg.compute_dtype
        gate = project(self, "gate_proj", x, dt)
        h = self.act(gate) * project(self, "up_proj", x, dt)
        if hidden_mask is not None:  # [B, F] fixed dropout mask (Dropout-GRPO rollouts)
            h = h * hidden_mask[:, None, :].astype(dt)
        y = project(self, "down_proj", h, dt)
        return y if route is None else (y, None)


class Block(nnx.Module):
    """One decoder layer. Built with `stack=(L,)` (as `Transformer.layers`), it holds L
    layers' parameters stacked along a leading `layers` axis; `Transformer.scan_layers`
    runs it one layer at a time, each call seeing one layer's slice."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack=(), mlp=None):
        """mlp: the MLP's class (`MLP` when None; `moe.MoE` for a mixture of experts)."""
        d = cfg.hidden_size
        self.input_norm = rms_norm(cfg, d, rngs, stack)
        self.attn = (LatentAttention if cfg.kv_lora_rank else Attention)(cfg, rngs, stack)
        self.post_attn_norm = rms_norm(cfg, d, rngs, stack)  # the MLP's input norm
        self.mlp = (mlp or MLP)(cfg, rngs, stack)
        if cfg.sandwich_norms:  # Gemma: norms on the attention's and the MLP's outputs
            self.attn_out_norm = rms_norm(cfg, d, rngs, stack)
            self.mlp_out_norm = rms_norm(cfg, d, rngs, stack)

    def __call__(self, x, positions, inv_freq, attn_bias, kv=None, hidden_mask=None, route=None):
        """-> (x, new_kv); with a `route` (an MoE's `moe.Route`), (x, new_kv, router stats)."""
        a, new_kv = self.attn(self.input_norm(x), positions, inv_freq, attn_bias, kv)
        x = x + self.out_norm("attn_out_norm", a)
        if route is None:
            return self.feed_forward(x, hidden_mask), new_kv
        out, stats = self.feed_forward(x, hidden_mask, route)
        return out, new_kv, stats

    def out_norm(self, name: str, x):
        """x through the block's output norm `name` where it has one (Gemma), else x."""
        norm = getattr(self, name, None)
        return x if norm is None else norm(x)

    def feed_forward(self, x, hidden_mask=None, route=None):
        """The block's second residual half: x + MLP(RMSNorm(x)); x [..., D]. With a
        `route` (MoE only): (that, the layer's router stats)."""
        if route is None:
            return x + self.out_norm("mlp_out_norm", self.mlp(self.post_attn_norm(x), hidden_mask))
        y, stats = self.mlp(self.post_attn_norm(x), hidden_mask, route)
        return x + self.out_norm("mlp_out_norm", y), stats


def shared_prompt_block(layer: Block, x, positions, inv_freq, bias_p, bias_c, *, n, tp):
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
    options = layer.attn.score_options()
    out_p = attention(q_p, k_p, v_p, bias_p, **options)
    keys = jnp.concatenate([jnp.repeat(k_p, n, axis=0), k_c], axis=1)  # [B, T, K, Dh]
    values = jnp.concatenate([jnp.repeat(v_p, n, axis=0), v_c], axis=1)
    out_c = attention(q_c, keys, values, bias_c, **options)
    out = jnp.concatenate([out_p, out_c.reshape(groups, n * tn, *out_c.shape[2:])], axis=1)
    return layer.feed_forward(x + layer.out_norm("attn_out_norm", layer.attn.project_out(out)))
