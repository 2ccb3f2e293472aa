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
so it leaves the delta state exactly as it was, and the conv runs over each row's real
inputs only (`causal_conv`: a masked token is skipped, not read as a zero), its state the
last Kc - 1 real inputs: a row with padding anywhere (left, right, a hole, a padded chunk
appended to a cache) gives the real tokens alone's outputs and state. Packed rows (several
sequences per row, `segment`): each sequence's conv reads only its own inputs and its delta
state starts from zero (`delta_rule.py`), so each gives its outputs alone.

A sequence axis (context parallelism, `mesh.sequence`) is not supported either
(`GatedDeltaNet.capabilities`). Attention splits a row's positions over s devices by
passing K/V blocks around the axis (ring attention): every block's scores are independent
and merge by a running logsumexp, in any order. This layer's output at t depends on the
whole prefix through the recurrent state, so over the axis it would need, device j of s:

    S_in(j) = S_out(j - 1)      the delta state [B, Hv, Dk, Dv] (f32) after shard j - 1's
                                T / s positions: the chunk scan's carry passed shard to
                                shard, a sequential dependency across the axis (s steps,
                                or a two-pass scan: each shard's transition (its decay and
                                rank-T/s update, an affine map of S) composed in a prefix
                                scan over the devices, then each shard's outputs from its S_in)
    conv_in(j) = the last Kc - 1 real inputs before shard j   [B, Kc - 1, C] (a shard of
                                only padding passes its predecessor's window on)

plus the padding's skips (`causal_conv` counts real inputs across the shard boundary).
Neither is implemented: the rows run whole per device.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.models.delta_rule import (
    chunk_gated_delta_rule,
    l2norm,
    recurrent_gated_delta_rule,
    segment_runs,
)
from jaxrl_frontier.models.kv_cache import init_linear_state, linear_dims
from jaxrl_frontier.models.layers import RMSNorm, make_param, project
from jaxrl_frontier.models.model_config import ModelConfig


def causal_conv(x, w, prev, real, segment=None, every_step: bool = False):
    """The causal depthwise conv over each row's real inputs: x [B, T, C], w [Kc, C], prev
    [B, Kc - 1, C] the (real) inputs before x, real [B, T] bool. A real token's output is
    sum_j w_j u_{r - Kc + 1 + j}, u the row's real inputs in order (prev's first) and r its
    own rank among them: masked tokens are skipped, not read as zeros (the outputs at masked
    tokens are unused). Packed rows (`segment` [B, T] int): a tap reads an input of the
    token's own segment only (prev belongs to the first token's), as if each sequence ran
    alone. -> (out [B, T, C], the conv state after x: the last Kc - 1 real inputs
    [B, Kc - 1, C]; every_step: the state after each token [B, T, Kc - 1, C])."""
    kc, (b, t, _) = w.shape[0], x.shape
    keep = kc - 1
    full = jnp.concatenate([prev.astype(x.dtype), x], axis=1)  # [B, L, C], L = Kc - 1 + T
    flags = jnp.concatenate([jnp.ones((b, keep), bool), real], axis=1)
    slots = jnp.arange(keep + t)
    order = jnp.argsort(jnp.where(flags, slots, keep + t + slots), axis=1)  # reals first
    compact = jnp.take_along_axis(full, order[:, :, None], axis=1)
    taps = [compact[:, j : j + t] for j in range(kc)]  # at ranks Kc - 1 + [0, T)
    if segment is not None:  # a tap from another sequence reads nothing
        runs = segment_runs(segment)
        runs = jnp.concatenate([jnp.repeat(runs[:, :1], keep, axis=1), runs], axis=1)
        runs = jnp.take_along_axis(runs, order, axis=1)  # each compact input's sequence
        own = runs[:, keep:]  # the token at rank Kc - 1 + i: its sequence
        taps = [x * (runs[:, j : j + t] == own)[..., None] for j, x in enumerate(taps)]
    conv = sum(x * w[j] for j, x in enumerate(taps))
    rank = jnp.cumsum(flags, axis=1)[:, keep:] - 1  # [B, T], >= Kc - 1
    out = jnp.take_along_axis(conv, (rank - keep)[:, :, None], axis=1)
    # the window once n real inputs of x are in: compact ranks n .. n + Kc - 2
    seen = jnp.cumsum(real, axis=1) if every_step else jnp.sum(real, axis=1, keepdims=True)
    ranks = (seen[..., None] + jnp.arange(keep)).reshape(b, -1)  # [B, (T or 1) (Kc - 1)]
    window = jnp.take_along_axis(compact, ranks[..., None], axis=1)
    window = window.reshape(b, -1, keep, window.shape[-1])  # [B, T or 1, Kc - 1, C]
    return out, window if every_step else window[:, 0]


class GatedDeltaNet(nnx.Module):
    """One linear-attention layer's parameters (our layout, [in, out]): in_proj_qkv
    [D, C], in_proj_z [D, Hv Dv], in_proj_b, in_proj_a [D, Hv], conv [Kc, C] (HF
    conv1d.weight [C, 1, Kc]), dt_bias, A_log [Hv], norm [Dv] (plain w, not 1 + w),
    out_proj [Hv Dv, D]. Tensor parallelism: the value-head axes (Hv, Hv Dv) carry the
    logical name `heads` (over the mesh's `tensor` axis, as the attention layers' heads);
    in_proj_qkv and conv (C mixes q, k and v) are split over `embed` / replicated."""

    capabilities = Capabilities.all_but(
        sequence_axis="its recurrent delta state and conv window run along the whole row: "
        "over the axis each shard would need the state and last Kc - 1 inputs of the shard "
        "before it (models/linear_attention.py), which is not implemented"
    )

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d = cfg.hidden_size
        hk, dk, hv, dv, ch = linear_dims(cfg)
        pd = jnp.dtype(cfg.param_dtype)
        param = functools.partial(make_param, rngs, dtype=pd)
        self.cfg = cfg
        # the value heads' axis is `heads` (over `tensor`: Hv Dv splits at head boundaries
        # where tensor divides Hv); q, k, v's C mixes three kinds, so its axis is unnamed
        self.in_proj_qkv = param((d, ch), ("embed", None))
        self.in_proj_z = param((d, hv * dv), ("embed", "heads"))
        self.in_proj_b = param((d, hv), ("embed", "heads"))
        self.in_proj_a = param((d, hv), ("embed", "heads"))
        self.conv = param((cfg.linear_conv_kernel_dim, ch), (None, None))
        self.dt_bias = param((hv,), ("heads",), init="ones")
        self.A_log = param((hv,), ("heads",), init="zeros")
        self.norm = RMSNorm(dv, cfg.rms_norm_eps, pd, rngs)
        self.out_proj = param((hv * dv, d), ("heads", "embed"))

    def __call__(
        self, x, real, state=None, recurrent: bool = False, segment=None, every_step=False
    ):
        """x [B, T, D] (normed), real [B, T] bool (None: all real), state None (empty) or
        (conv [B, Kc - 1, C], delta [B, Hv, Dk, Dv]); recurrent: the token-by-token rule
        instead of the chunk-parallel one (the decode's T = 1 step); segment [B, T] int:
        packed rows, each sequence's conv window and delta state its own; every_step (with
        recurrent): the state after each token, ([B, T, Kc - 1, C], [B, T, Hv, Dk, Dv]),
        for a speculative round to keep its last accepted token's.
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
        conv_w = self.conv[...].astype(dt)
        mixed, new_conv = causal_conv(qkv, conv_w, conv_state, real, segment, every_step)
        mixed = jax.nn.silu(mixed)
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
            o, new_delta = recurrent_gated_delta_rule(
                q, k, v, log_g, beta, delta_state, segment, every_step
            )
        else:
            o, new_delta = chunk_gated_delta_rule(
                q, k, v, log_g, beta, cfg.linear_chunk_size, delta_state, segment
            )
        z = project(self, "in_proj_z", x, dt).reshape(b, t, hv, dv)
        o = self.norm(o.astype(dt)).astype(f32) * jax.nn.silu(z.astype(f32))
        out = project(self, "out_proj", o.astype(dt).reshape(b, t, hv * dv), dt)
        return out, (new_conv.astype(conv_state.dtype), new_delta)
