"""Qwen3.5's linear-attention layer, Gated DeltaNet (Yang et al., 2024, "Gated Delta
Networks: Improving Mamba2 with Delta Rule"; transformers' `Qwen3_5GatedDeltaNet`): a
causal depthwise conv over the q, k, v projections, then the gated delta rule
(`models/delta_rule.py`), a gated RMSNorm and the output projection.

    qkv = silu(causal_conv1d(x W_qkv))        [B, T, 2 Hk Dk + Hv Dv], conv of Kc taps
    q, k, v = split(qkv)                      [B, T, Hk, Dk], [B, T, Hk, Dk], [B, T, Hv, Dv]
    q = l2norm(q) Dk^-0.5,  k = l2norm(k)     (key heads repeated to the Hv value heads)
    beta = sigmoid(x W_b),  log g = -exp(A_log) softplus(x W_a + dt_bias)        [B, T, Hv]
    o = gated_delta_rule(q, k, v, log g, beta)                                   [B, T, Hv, Dv]
    out = (RMSNorm(o) w * silu(x W_z)) W_out                                     [B, T, D]

The layer's decode state is fixed in size (`LinearState`): the conv's last Kc - 1 inputs
[B, Kc - 1, C] and the delta rule's matrix [B, Hv, Dk, Dv] (f32), whatever the length.

Padding: a masked token's input is zeroed (as transformers), its beta and log g set to 0,
so it leaves the delta state exactly as it was, and the conv state carried out of a
forward holds the last Kc - 1 *real* inputs; a left-padded prompt from an empty state
thus gives the unpadded prompt's outputs and state. Packed rows (several sequences per
row) are not supported: the state would have to restart at each segment (`hybrid.py`
refuses `segment_ids`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.models.delta_rule import (
    chunk_gated_delta_rule,
    l2norm,
    recurrent_gated_delta_rule,
)
from jaxrl_frontier.models.kv_cache import init_linear_state, linear_dims
from jaxrl_frontier.models.layers import RMSNorm, make_param, project
from jaxrl_frontier.models.model_config import ModelConfig


def causal_conv(x, w, prev):
    """The causal depthwise conv: x [B, T, C], w [Kc, C], prev [B, Kc - 1, C] the inputs
    before x -> out [B, T, C], out_t = sum_j w_j x_{t - Kc + 1 + j} (prev's inputs first)."""
    kc, t = w.shape[0], x.shape[1]
    full = jnp.concatenate([prev.astype(x.dtype), x], axis=1)  # [B, Kc - 1 + T, C]
    return sum(full[:, j : j + t] * w[j] for j in range(kc))


def last_real_inputs(prev, x, real):
    """The conv state after x: the last Kc - 1 real inputs of [prev, x] (prev [B, Kc - 1, C]
    all counted real, x [B, T, C], real [B, T] bool) -> [B, Kc - 1, C]."""
    keep = prev.shape[1]
    if keep == 0:
        return prev
    full = jnp.concatenate([prev, x.astype(prev.dtype)], axis=1)
    flags = jnp.concatenate([jnp.ones(prev.shape[:2], bool), real], axis=1)
    order = jnp.where(flags, jnp.arange(full.shape[1]), -1)
    idx = jnp.sort(order, axis=1)[:, -keep:]  # the last Kc - 1 real slots, in order
    return jnp.take_along_axis(full, idx[:, :, None], axis=1)


class GatedDeltaNet(nnx.Module):
    """One linear-attention layer's parameters (our layout, [in, out]): in_proj_qkv
    [D, C], in_proj_z [D, Hv Dv], in_proj_b, in_proj_a [D, Hv], conv [Kc, C] (HF
    conv1d.weight [C, 1, Kc]), dt_bias, A_log [Hv], norm [Dv] (plain w, not 1 + w),
    out_proj [Hv Dv, D]."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d = cfg.hidden_size
        hk, dk, hv, dv, ch = linear_dims(cfg)
        pd = jnp.dtype(cfg.param_dtype)
        param = functools.partial(make_param, rngs, dtype=pd)
        self.cfg = cfg
        self.in_proj_qkv = param((d, ch), ("embed", None))
        self.in_proj_z = param((d, hv * dv), ("embed", None))
        self.in_proj_b = param((d, hv), ("embed", None))
        self.in_proj_a = param((d, hv), ("embed", None))
        self.conv = param((cfg.linear_conv_kernel_dim, ch), (None, None))
        self.dt_bias = param((hv,), (None,), init="ones")
        self.A_log = param((hv,), (None,), init="zeros")
        self.norm = RMSNorm(dv, cfg.rms_norm_eps, pd, rngs)
        self.out_proj = param((hv * dv, d), (None, "embed"))

    def __call__(self, x, real, state=None, recurrent: bool = False):
        """x [B, T, D] (normed), real [B, T] bool (None: all real), state None (empty) or
        (conv [B, Kc - 1, C], delta [B, Hv, Dk, Dv]); recurrent: the token-by-token rule
        instead of the chunk-parallel one (the decode's T = 1 step).
        -> (out [B, T, D], the new (conv, delta) state)."""
        cfg, dt = self.cfg, self.cfg.compute_dtype
        hk, dk, hv, dv, ch = linear_dims(cfg)
        b, t, _ = x.shape
        if real is None:
            real = jnp.ones((b, t), bool)
        x = x * real[..., None].astype(x.dtype)
        if state is None:
            state = init_linear_state(cfg, b, dt)
        conv_state, delta_state = state
        qkv = project(self, "in_proj_qkv", x, dt)
        mixed = jax.nn.silu(causal_conv(qkv, self.conv[...].astype(dt), conv_state))
        new_conv = last_real_inputs(conv_state, qkv, real)
        q, k, v = jnp.split(mixed, [hk * dk, 2 * hk * dk], axis=-1)
        q = l2norm(q.reshape(b, t, hk, dk)) * dk**-0.5
        k = l2norm(k.reshape(b, t, hk, dk))
        q, k = (jnp.repeat(a, hv // hk, axis=2) for a in (q, k))  # value head h: key h // G
        v = v.reshape(b, t, hv, dv)
        f32 = jnp.float32
        beta = jax.nn.sigmoid(project(self, "in_proj_b", x, dt).astype(f32))
        a = project(self, "in_proj_a", x, dt).astype(f32) + self.dt_bias[...].astype(f32)
        log_g = -jnp.exp(self.A_log[...].astype(f32)) * jax.nn.softplus(a)
        beta, log_g = (jnp.where(real[..., None], y, 0.0) for y in (beta, log_g))
        if recurrent:
            o, new_delta = recurrent_gated_delta_rule(q, k, v, log_g, beta, delta_state)
        else:
            o, new_delta = chunk_gated_delta_rule(
                q, k, v, log_g, beta, cfg.linear_chunk_size, delta_state
            )
        z = project(self, "in_proj_z", x, dt).reshape(b, t, hv, dv)
        o = self.norm(o.astype(dt)).astype(f32) * jax.nn.silu(z.astype(f32))
        out = project(self, "out_proj", o.astype(dt).reshape(b, t, hv * dv), dt)
        return out, (new_conv.astype(conv_state.dtype), new_delta)
