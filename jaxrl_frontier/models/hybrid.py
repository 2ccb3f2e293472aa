"""Hybrid decoders (Qwen3.5 dense and MoE): layers of two kinds by `ModelConfig.layer_types`,
Gated DeltaNet linear attention ("linear_attention": models/linear_attention.py) and gated
full attention ("full_attention": `GatedAttention`), each followed by the MLP or the
mixture of experts with its gated shared expert (models/moe.py).

    x = embed(tokens)
    for each layer:  x = x + Mixer(RMSNorm(x));  x = x + MLP(RMSNorm(x))
    logits = RMSNorm(x) @ W_out

RMSNorms scale by (1 + w) (`norm_plus_one`), the q/k norms of the attention layers too.

`HybridTransformer` is a `Transformer` whose `layers` are L per-layer `HybridBlock`s (an
`nnx.List`, as `model_forms.unstack_layers` makes), run by a Python loop: the two kinds
hold different parameters, so one scan over stacked layers cannot run them. Every forward
(update, log-probs, prefill, decode) takes that loop; the full forwards run the delta rule
chunk-parallel, a one-token decode step token by token.

Its `KVCache` holds each layer kind's own state: an attention layer's keys and values
[B, K, S, Dh]; a linear layer's fixed-size conv and delta-rule state (`KVCache.conv`,
`KVCache.delta`; its k, v hold no slots' data), so that part of the cache does not grow with
the completion.

Supported: the plain forward, log-probs and updates (left or right padding), packed rows
(`segment_ids`: each sequence's conv window and delta state restart at its first token),
Dropout-GRPO MLP masks (dense), routing replay and router stats (MoE), the shared-prompt
forward (run as the plain forward: its prompt is not shared), the plain, continuous and
partial samplers, the speculative sampler (a verify forward keeps each linear layer's
state after every token, `KVCache.keep_steps`, and the round keeps its last accepted
token's), remat (`model.remat`: each layer's forward in a `jax.checkpoint` of its own, the
loop being a Python one). Refused, with the reason: a full forward on a mesh with a
sequence axis (`mesh.sequence` > 1, context parallelism: what a linear layer would need
over the axis is in models/linear_attention.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.models import moe
from jaxrl_frontier.models.attention import attention, mask_to_bias
from jaxrl_frontier.models.kv_cache import write_slots
from jaxrl_frontier.models.layers import (
    MLP,
    Attention,
    apply_rope,
    make_param,
    positions_from_mask,
    project,
    rms_norm,
    rope_inv_freq,
)
from jaxrl_frontier.models.linear_attention import GatedDeltaNet
from jaxrl_frontier.models.model_config import REMAT_POLICIES, ModelConfig
from jaxrl_frontier.models.transformer import Transformer


def partial_rope(x, positions, inv_freq, rope_dim: int):
    """x [..., H, Dh] with its first `rope_dim` dims rotated (rotate-half), the rest as is."""
    if rope_dim == x.shape[-1]:
        return apply_rope(x, positions, inv_freq)
    rotated = apply_rope(x[..., :rope_dim], positions, inv_freq)
    return jnp.concatenate([rotated, x[..., rope_dim:]], axis=-1)


class GatedAttention(Attention):
    """Qwen3.5's full-attention layer: grouped-query attention with q/k RMSNorms (1 + w),
    RoPE on the first `rope_dim` dims of a head, and an output gate: q_proj [D, H, 2 Dh]
    gives per head the query and a gate, and

        out = (softmax(q k^T / sqrt(Dh) + bias) v * sigmoid(gate)) W_o

    (HF `Qwen3_5Attention`; q_proj's HF rows are per head [q (Dh), gate (Dh)])."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        super().__init__(cfg, rngs)
        d, h, hd = cfg.hidden_size, cfg.num_heads, cfg.resolved_head_dim
        pd = jnp.dtype(cfg.param_dtype)
        self.q_proj = make_param(rngs, (d, h, 2 * hd), ("embed", "heads", None), pd)

    def __call__(self, x, positions, inv_freq, attn_bias, kv=None):
        """`Attention.__call__` (x [B, T, D], kv None or (k_cache, v_cache, index)) with the
        output gate. -> (out [B, T, D], (k_cache, v_cache) or None)."""
        cfg, dt = self.cfg, self.cfg.compute_dtype
        hd = cfg.resolved_head_dim
        qg = project(self, "q_proj", x, dt)
        q, gate = qg[..., :hd], qg[..., hd:]
        k, v = project(self, "k_proj", x, dt), project(self, "v_proj", x, dt)
        q = partial_rope(self.q_norm(q), positions, inv_freq, cfg.rope_dim)
        k = partial_rope(self.k_norm(k), positions, inv_freq, cfg.rope_dim)
        new_kv, kv_spec = None, "bskd"
        if kv is not None:
            k_cache, v_cache, index = kv
            k = write_slots(k_cache, jnp.swapaxes(k, 1, 2).astype(k_cache.dtype), index, axis=2)
            v = write_slots(v_cache, jnp.swapaxes(v, 1, 2).astype(v_cache.dtype), index, axis=2)
            new_kv, kv_spec = (k, v), "bksd"
        out = attention(q, k, v, attn_bias, kv_spec, **self.score_options()).astype(x.dtype)
        return self.project_out(out * jax.nn.sigmoid(gate)), new_kv


class HybridBlock(nnx.Module):
    """One layer: `attn` a `GatedDeltaNet` (linear=True) or a `GatedAttention`, then the MLP
    (`MLP`, or `moe.MoE` when the config has experts), each behind an RMSNorm."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, linear: bool):
        d = cfg.hidden_size
        self.linear = linear
        self.input_norm = rms_norm(cfg, d, rngs)
        self.attn = GatedDeltaNet(cfg, rngs) if linear else GatedAttention(cfg, rngs)
        self.post_attn_norm = rms_norm(cfg, d, rngs)
        self.mlp = (moe.MoE if cfg.num_experts else MLP)(cfg, rngs)

    def __call__(self, x, mixer_args, hidden_mask=None, route=None):
        """x [B, T, D]; mixer_args: the mixer's arguments after its input ((real, state,
        recurrent, segment, every_step) or (positions, inv_freq, attn_bias, kv)).
        -> (x, the mixer's new state or kv, router stats or None)."""
        a, new_state = self.attn(self.input_norm(x), *mixer_args)
        x = x + a
        h = self.post_attn_norm(x)
        if route is None:
            return x + self.mlp(h, hidden_mask), new_state, None
        y, stats = self.mlp(h, hidden_mask, route)
        return x + y, new_state, stats


class HybridTransformer(Transformer):
    """A decoder of linear- and full-attention layers (module docstring); a `Transformer`
    in every method but its layers' loop (`hidden_states`)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        if cfg.first_k_dense_replace:
            raise ValueError("a hybrid model has no dense first layers (first_k_dense_replace)")
        pd = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.embed = make_param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
        self.layers = nnx.List([HybridBlock(cfg, rngs, lin) for lin in cfg.linear_layers])
        self.final_norm = rms_norm(cfg, cfg.hidden_size, rngs)
        if cfg.num_labels:
            self.score = make_param(rngs, (cfg.hidden_size, cfg.num_labels), ("embed", None), pd)
        elif not cfg.tie_word_embeddings:
            self.lm_head = make_param(
                rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd
            )

    def hidden_states(
        self,
        tokens,
        attention_mask=None,
        *,
        positions=None,
        cache=None,
        mlp_mask=None,
        segment_ids=None,
        routing=None,
        router_stats: bool = False,
    ):
        """`Transformer.hidden_states` over the hybrid layers: (final-normed hidden [B, T,
        D], the updated cache or None[, router stats [L, ...]]). A cache's linear layers
        read and write their `conv` / `delta` state, a one-token step (T = 1) by the
        recurrence, longer inputs chunk-parallel. segment_ids (packed rows, no cache): the
        attention layers attend within a segment, the linear layers restart their conv
        window and delta state at each (`linear_attention.GatedDeltaNet`)."""
        if segment_ids is not None:
            if cache is not None or positions is None:
                raise ValueError("hidden_states: segment_ids need positions and no cache")
            attention_mask = segment_ids > 0
        if cache is None and shd.sequence_size(self.mesh()) > 1:
            why = GatedDeltaNet.capabilities.why_not("sequence_axis")
            raise ValueError(
                f"context parallelism (config key 'mesh.sequence' = "
                f"{shd.sequence_size(self.mesh())}, with or without model.attention = 'ring') "
                f"does not run a hybrid (linear-attention) model: {why}; set mesh.sequence = 1"
            )
        if attention_mask is None:
            attention_mask = jnp.ones(tokens.shape, jnp.int32)
        if positions is None:
            positions = positions_from_mask(attention_mask)
        real = attention_mask.astype(bool)
        key_valid, _, allowed = self._visible(real, cache, segment_ids)
        mixing = (positions, rope_inv_freq(self.cfg), mask_to_bias(allowed), real, segment_ids)
        route = self._router(attention_mask, routing, router_stats)
        x = self.constrain_rows(self.embed_tokens(tokens))
        x, states, stats = self._layer_loop(x, mixing, cache, mlp_mask, route)
        hidden = self.final_norm(x)
        new_cache = None
        if cache is not None:
            k, v, conv, delta = states
            new_cache = cache.replace(
                k=k, v=v, conv=conv, delta=delta, valid=key_valid,
                index=cache.index + tokens.shape[1],
            )  # fmt: skip
        if not router_stats:
            return hidden, new_cache
        return hidden, new_cache, jax.tree.map(lambda *a: jnp.stack(a), *stats)

    def _layer_loop(self, x, mixing, cache, mlp_mask, route):
        """The layers in order over x [B, T, D]; mixing: (positions, inv_freq, attention
        bias, real, segment ids or None). -> (x, (k, v, conv, delta) per-layer tuples, router
        stats per layer)."""
        positions, inv_freq, bias, real, segment_ids = mixing
        # token by token: a decode step, and a speculative verify that keeps every step
        keep_steps = cache is not None and cache.keep_steps
        recurrent = cache is not None and (x.shape[1] == 1 or keep_steps)
        # a training (or scoring) forward: each layer a jax.checkpoint of its own (the loop
        # is Python's, not a scan's body); never in the decode
        remat = REMAT_POLICIES[self.cfg.remat] if cache is None else None
        states, stats = [], []  # states: per layer (k, v, conv, delta)
        # the config's layers: a shallow draft (sampling/speculative.py) holds the
        # policy's whole list and runs its first cfg.num_layers
        for i in range(self.cfg.num_layers):
            layer = self.layers[i]
            hidden_mask = None if mlp_mask is None else mlp_mask[i]
            forced = None if route.forced is None else route.forced[i]
            if layer.linear:
                state = None if cache is None else (cache.conv[i], cache.delta[i])
                args = (real, state, recurrent, segment_ids, keep_steps)
            else:
                kv = None if cache is None else (cache.k[i], cache.v[i], cache.index)
                args = (positions, inv_freq, bias, kv)
            inputs = (self.constrain_rows(x), args, hidden_mask, route(forced))
            out = layer(*inputs) if remat is None else _checkpointed(layer, remat, *inputs)
            x, new = out[0], out[1]
            stats.append(route.stats(out))
            if cache is None:
                continue
            # a linear layer updates its (conv, delta) state and keeps its empty k, v; an
            # attention layer the reverse
            states.append((cache.k[i], cache.v[i], *new) if layer.linear else (*new, None, None))
        return x, tuple(zip(*states)) if states else ((), (), (), ()), stats

    def hidden_states_shared_prompt(self, tokens, attention_mask, *, prompt_len, group_size,
                                    mlp_mask=None):  # fmt: skip
        """The plain forward (`hidden_states(tokens, attention_mask)[0]`): a hybrid model's
        linear layers carry a recurrent state along each row, which the packed prompt +
        completions rows of `Transformer.hidden_states_shared_prompt` would mix, so the
        prompt is run once per row (the same values, not the saving)."""
        if mlp_mask is not None:
            raise ValueError("hidden_states_shared_prompt: mlp_mask is not supported")
        return self.hidden_states(tokens, attention_mask)[0]


def _checkpointed(layer: HybridBlock, policy, x, *rest):
    """`layer(x, *rest)` as one `jax.checkpoint` (its activations recomputed in the
    backward); `rest` is closed over, so it may hold Python values (the mixer's flags)."""
    graphdef, params = nnx.split(layer)
    run = jax.checkpoint(lambda p, h: nnx.merge(graphdef, p)(h, *rest), policy=policy)
    return run(params, x)


def model_class(cfg: ModelConfig) -> type[Transformer]:
    """The module class a config builds: `HybridTransformer` where it has linear-attention
    layers, else `Transformer`."""
    return HybridTransformer if any(cfg.linear_layers) else Transformer
