"""A decoder-only transformer covering the Llama, Qwen2, Qwen3, Gemma 2, Gemma 3, GPT-OSS and
DeepSeek-V3 shapes (and their mixtures of experts, models/moe.py), in Flax NNX.

    x = embed(tokens)                    (Gemma: * sqrt(D))
    for each layer:  x = x + Attn(RMSNorm(x));  x = x + SwiGLU(RMSNorm(x))
    logits = RMSNorm(x) @ W_out          (W_out = embed^T when embeddings are tied)

- Gemma 2 / 3 (`ModelConfig` fields after `scan_unroll`): RMSNorm by (1 + w), GeGLU, the
  query pre-attention scale, norms on the attention and MLP outputs, soft-capped scores
  and logits (Gemma 2), sliding-window layers with their own RoPE base. Layers that differ
  in window and RoPE base still run under one scan: each layer's inverse frequencies and
  window are scanned beside its weights (`layers.layer_attention_inputs`), and its
  attention bias is built from the window inside the scanned body.

- Attention: grouped-query (num_kv_heads divides num_heads), RoPE in the rotate-half
  convention of the Hugging Face implementations, optional qkv bias (Qwen2), optional
  per-head RMSNorm of q and k before RoPE (Qwen3); GPT-OSS's output bias and attention
  sinks (a learned logit per head in every softmax's denominator, models/attention.py).
- Padding: prompts are left-padded; `attention_mask` is 1 on real tokens. Positions count
  real tokens only (`cumsum(mask) - 1`), so a left-padded prompt sees the same positions as
  the unpadded one and gets the same logits.
- Layers are scanned: `Transformer.layers` is one `Block` whose parameters are stacked
  along a leading `layers` axis ([L, ...]), and every forward runs the blocks under one
  `jax.lax.scan` (as MaxText's `scan_layers`). With FSDP-sharded weights XLA then gathers
  one layer's shards at a time inside the loop instead of every layer's at once, so no
  device holds a full copy of the weights; the program is compiled once per layer shape,
  not once per layer. `ModelConfig.remat` wraps the scanned body in `jax.checkpoint`.
  DeepSeek-V3's first `first_k_dense_replace` layers have a dense MLP where the others
  have experts: two parameter shapes, so two stacks (`dense_layers`, then `layers`), each
  scanned, the per-layer inputs split between them (`scan_layers`).
- Rollouts run the layers unstacked (`model_forms.unstack_layers`: L per-layer `Block`s, a
  Python loop): inside a decode loop, a scan's per-layer slices of the stacked weights are
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

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.models import moe
from jaxrl_frontier.models.attention import RowMask, mask_to_bias, same_segment
from jaxrl_frontier.models.kv_cache import KVCache, init_cache, write_slots
from jaxrl_frontier.models.layers import (
    Block,
    layer_attention_inputs,
    make_param,
    positions_from_mask,
    rms_norm,
    rope_inv_freq,
    shared_prompt_block,
)
from jaxrl_frontier.models.model_config import REMAT_POLICIES, ModelConfig
from jaxrl_frontier.models.routing import LayerRouting

# ----------------------------------------------------------------------------- model


class Transformer(nnx.Module):
    """Decoder LM. `model(tokens, attention_mask)` -> logits [B, T, V] (f32).

    `self.layers` is one `Block` holding every layer's parameters stacked [L, ...]
    (state paths `layers.attn.q_proj`, ...); forwards scan over it (`scan_layers`).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.embed = make_param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
        mlp = moe.MoE if cfg.num_experts else None  # the dense MLP unless experts
        k = cfg.first_k_dense_replace
        if k:  # DeepSeek-V3: the first k layers' MLPs dense, in a stack of their own
            self.dense_layers = Block(cfg, rngs, stack=(k,))
        self.layers = Block(cfg, rngs, stack=(cfg.num_layers - k,), mlp=mlp)
        self.final_norm = rms_norm(cfg, cfg.hidden_size, rngs)
        if cfg.num_labels:  # a sequence classifier: its score head, no LM head
            self.score = make_param(rngs, (cfg.hidden_size, cfg.num_labels), ("embed", None), pd)
        elif not cfg.tie_word_embeddings:
            self.lm_head = make_param(
                rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd
            )

    def mesh(self):
        """The mesh the parameters are placed on (read from the embedding's sharding), or
        None (no mesh, one device, or inside a shard_map: a device's own rows)."""
        return shd.mesh_of(self.embed[...])

    def constrain_rows(self, x: jax.Array, positions: bool = False) -> jax.Array:
        """x [B, ...] with its rows split over the mesh's batch axes, on the mesh the
        parameters are placed on (nothing without one). positions=True (a forward over whole
        rows, no cache): x [B, T, ...] also has its positions split over the mesh's
        `sequence` axis (context parallelism; `sharding.activation_sharding`).

        A scan's carry keeps one sharding for every layer, and XLA took it from the
        embedding lookup: the hidden size split over fsdp, like the embedding's columns. The
        activations inside the layers then came out replicated on every device (a 100M
        update on 8 fsdp devices: 5 stacked [L, B, T, F] residuals at the full batch,
        240 MB per device); with the rows split, each device keeps its rows' activations.
        """
        mesh = self.mesh()
        if mesh is None:
            return x
        return jax.lax.with_sharding_constraint(x, shd.activation_sharding(mesh, x, positions))

    def scan_layers(self, body, carry, xs=None, *, remat: bool | str = False):
        """Run `body(layer, carry, x_i) -> (carry, y_i)` over the first `cfg.num_layers`
        layers under one `jax.lax.scan`, `layer` a `Block` on layer i's parameters and x_i
        layer i's slice of `xs` (a pytree with a leading [L] axis, or None). The blocks'
        parameters are scanned over, so XLA reads (and with FSDP gathers) one layer's
        weights per iteration. `remat` (a `ModelConfig.remat` value) wraps the body in
        `jax.checkpoint` with that policy; `cfg.scan_unroll` layers run per iteration (0: all,
        no loop). Returns (carry, ys stacked [L, ...])."""
        num = self.cfg.num_layers
        if isinstance(self.layers, nnx.List):  # unstacked (`unstack_layers`): a Python loop
            ys = []
            for i in range(num):
                carry, y = body(self.layers[i], carry, jax.tree.map(lambda a: a[i], xs))
                ys.append(y)
            return carry, jax.tree.map(lambda *a: jnp.stack(a), *ys)
        k = self.cfg.first_k_dense_replace
        if not k:
            return self._scan(self.layers, body, carry, xs, num, remat)
        # DeepSeek-V3: the k dense layers' scan, then the MoE layers' (two layer shapes,
        # two stacks: one scan cannot slice layers of different parameters)
        if num <= k:
            raise ValueError(f"a shallow model of {num} layers within the {k} dense ones")
        part = lambda lo, hi: jax.tree.map(lambda a: a[lo:hi], xs)  # noqa: E731
        carry, ys_dense = self._scan(self.dense_layers, body, carry, part(0, k), k, remat)
        carry, ys = self._scan(self.layers, body, carry, part(k, num), num - k, remat)
        return carry, jax.tree.map(lambda a, b: jnp.concatenate([a, b]), ys_dense, ys)

    def _scan(self, layers, body, carry, xs, num, remat):
        """`scan_layers` over one stack of layers (its first `num`)."""
        graphdef, params = nnx.split(layers)
        if jax.tree.leaves(params)[0].shape[0] != num:  # a shallow draft: the first layers
            params = jax.tree.map(lambda a: a[:num], params)

        def step(carry, inputs):
            layer_params, x = inputs
            return body(nnx.merge(graphdef, layer_params), carry, x)

        policy = REMAT_POLICIES[remat]
        if policy is not None:
            step = jax.checkpoint(step, policy=policy)
        return jax.lax.scan(step, carry, (params, xs), unroll=self.cfg.scan_unroll or num)

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
        embeds=None,
    ):
        """Final-normed hidden states [B, T, D] (and the updated cache, or None).

        segment_ids [B, T] int (no cache): packed rows, several sequences per row (0 on empty
        slots); a token attends only to earlier tokens of its own segment
        (`attention.same_segment`), and `positions` (then required) restart in each segment.
        MoE models only: routing int [B, T, L, k] sends each token of layer l to the experts
        routing[:, :, l] (routing replay; gates from the current router); router_stats=True
        also returns the layers' `moe.RouterStats` stacked [L, ...] (their `experts`
        [L, B, T, k]) over the real tokens: (hidden, cache, stats). A dense layer of an MoE
        model (DeepSeek-V3's first) ignores its routing and has `moe.no_router_stats`.
        embeds [B, T, D]: the first layer's input in place of the tokens' embeddings (a
        multi-token-prediction module's, models/multi_token.py; `tokens` then give the
        shape only).
        """
        cfg = self.cfg
        if segment_ids is not None:
            if cache is not None or positions is None:
                raise ValueError("hidden_states: segment_ids need positions and no cache")
            attention_mask = segment_ids > 0
        if attention_mask is None:
            attention_mask = jnp.ones(tokens.shape, jnp.int32)
        if positions is None:
            positions = positions_from_mask(attention_mask)
        real = attention_mask.astype(bool)
        key_valid, mask = self._row_mask(real, cache, segment_ids)
        per_layer, layer_info = self.attention_inputs([mask])
        t = tokens.shape[1]
        route = self._router(attention_mask, routing, router_stats)
        with_stats = lambda x, cache, stats: (  # noqa: E731
            (self.final_norm(x), cache) + ((stats,) if router_stats else ())
        )

        if cache is None:  # a training (or scoring) forward: remat applies
            x = self.embed_tokens(tokens) if embeds is None else embeds
            x = self.constrain_rows(x, positions=True)

            def block(layer, x, inputs):
                hidden_mask, info, forced = inputs
                inv_freq, (attn_bias,) = per_layer(info)
                x = self.constrain_rows(x, positions=True)
                out = layer(x, positions, inv_freq, attn_bias, None, hidden_mask, route(forced))
                return out[0], route.stats(out)

            xs = (mlp_mask, layer_info, route.forced)
            x, stats = self.scan_layers(block, x, xs, remat=cfg.remat)
            return with_stats(x, None, stats)

        x = self.constrain_rows(self.embed_tokens(tokens) if embeds is None else embeds)
        if isinstance(self.layers, nnx.List):  # unstacked: each layer's cache in place
            x, new_cache, stats = self._cached_layers(
                x, positions, real, (per_layer, layer_info), cache, mlp_mask, route
            )
            return with_stats(x, new_cache.replace(valid=key_valid, index=cache.index + t), stats)
        x, new_cache, stats = self._scanned_cache_layers(
            x, positions, (per_layer, layer_info), cache, mlp_mask, route
        )
        return with_stats(x, new_cache.replace(valid=key_valid, index=cache.index + t), stats)

    def _row_mask(self, real, cache, segment_ids):
        """(key_valid [B, S], the mask as `attention_inputs` takes it: (distance, allowed))
        of `hidden_states`. A forward over whole rows with `model.attention = 'ring'` gets
        the mask by its parts (`attention.RowMask`, allowed; distance None): the ring
        builds each block's mask itself, and no [B, T, S] mask is made."""
        if cache is None and self.cfg.attention == "ring":
            return real, (None, self._split_positions(RowMask(real, segment_ids)))
        key_valid, distance, allowed = self._visible(real, cache, segment_ids)
        allowed = allowed if cache is not None else self._split_positions(allowed)
        return key_valid, (distance, allowed)

    def _split_positions(self, allowed):
        """A forward over whole rows on a mesh with a sequence axis of s devices (context
        parallelism): each device takes T / s positions, so s must divide T, and builds its
        own queries' rows of the mask allowed [B, T, S] (or of a `RowMask`'s [B, T] parts)."""
        s, t = shd.sequence_size(self.mesh()), jax.tree.leaves(allowed)[0].shape[1]
        if s == 1:
            return allowed
        if t % s:
            raise ValueError(
                f"context parallelism: the mesh's sequence axis ({s} devices, config key "
                f"'mesh.sequence') must divide the rows' {t} positions"
            )
        return jax.tree.map(lambda a: self.constrain_rows(a, positions=True), allowed)

    @staticmethod
    def _visible(real, cache, segment_ids):
        """(key_valid [B, S], distance [T, S] or [B, T, S], allowed [B, T, S]): which cache
        slots hold real tokens, each query's slot distance to each key, and the keys it may
        attend to (causal, valid, in its own segment). Query i sits in slot offset + i
        (offset [B]: a cache whose rows write at their own slots)."""
        b, t = real.shape
        key_valid = real if cache is None else write_slots(cache.valid, real, cache.index, axis=1)
        offset = 0 if cache is None else cache.index
        s = key_valid.shape[1]
        query_slot = jnp.asarray(offset)[..., None, None] + jnp.arange(t)[:, None]
        distance = query_slot - jnp.arange(s)[None, :]
        allowed = jnp.broadcast_to(distance >= 0, (b, t, s)) & key_valid[:, None, :]
        if segment_ids is not None:  # packed rows: nothing attends across segments
            allowed = allowed & same_segment(segment_ids)
        return key_valid, distance, allowed

    def _router(self, attention_mask, routing, router_stats: bool) -> LayerRouting:
        """The layers' MoE routing for `hidden_states` (replayed experts, stats wanted)."""
        routed = routing is not None or router_stats
        if routed and not self.cfg.num_experts:
            raise ValueError("routing / router_stats: this model has no experts (num_experts=0)")
        forced = None if routing is None else jnp.moveaxis(routing, 2, 0)  # [L, B, T, k]
        return LayerRouting(routed, attention_mask, forced, self.cfg)

    def _scanned_cache_layers(self, x, positions, attention, cache, mlp_mask, route):
        """The stacked layers over a cache, under one scan that takes (and returns) the
        layers' caches stacked [L, ...]: at slots [index, index + T). attention: as
        `_cached_layers`. -> (x, the cache with new k, v, router stats [L, ...] or None)."""
        if cache.ring_layers:
            raise ValueError(
                "a cache with sliding-window rings runs on the unstacked model "
                "(model_forms.unstack_layers), not the scanned one"
            )
        per_layer, layer_info = attention

        def cached_block(layer, x, inputs):
            k, v, hidden_mask, info, forced = inputs
            inv_freq, (attn_bias,) = per_layer(info)
            kv, x = (k, v, cache.index), self.constrain_rows(x)
            out = layer(x, positions, inv_freq, attn_bias, kv, hidden_mask, route(forced))
            return out[0], (out[1], route.stats(out))

        xs = (jnp.stack(cache.k), jnp.stack(cache.v), mlp_mask, layer_info, route.forced)
        x, ((k, v), stats) = self.scan_layers(cached_block, x, xs)
        return x, cache.replace(k=tuple(k), v=tuple(v)), stats

    def _cached_layers(self, x, positions, real, attention, cache, mlp_mask, route):
        """The unstacked layers over a cache, each layer's cache updated in place: at slots
        [index, index + T), or for a sliding layer's ring (`sliding_cache`) one token at
        slot index % W, its bias the ring's validity. attention: (per_layer, layer_info) of
        `attention_inputs`. -> (x, the cache with new k, v, router stats [L, ...] or None)."""
        per_layer, layer_info = attention
        rings = cache.ring_layers or (False,) * len(self.layers)
        if any(rings):
            if x.shape[1] != 1 or jnp.ndim(cache.index) != 0:
                raise ValueError(
                    "a cache with sliding-window rings takes one token per step at one index "
                    "for every row; run longer inputs on the full cache, then "
                    "sliding_cache.to_ring"
                )
            ring_slot = cache.index % cache.ring_valid.shape[1]
            ring_valid = write_slots(cache.ring_valid, real, ring_slot, axis=1)
            ring_bias = mask_to_bias(ring_valid[:, None, :])  # [B, 1, 1, 1, W]
            cache = cache.replace(ring_valid=ring_valid)
        new_k, new_v, stats = [], [], []
        for i, layer in enumerate(self.layers):
            hidden_mask = None if mlp_mask is None else mlp_mask[i]
            info = jax.tree.map(lambda a, i=i: a[i], layer_info)
            if rings[i]:
                inv_freq, attn_bias, index = info[0], ring_bias, ring_slot
            else:
                (inv_freq, (attn_bias,)), index = per_layer(info), cache.index
            kv = (cache.k[i], cache.v[i], index)
            forced = None if route.forced is None else route.forced[i]
            out = layer(
                self.constrain_rows(x),
                positions,
                inv_freq,
                attn_bias,
                kv,
                hidden_mask,
                route(forced),
            )
            x, (k, v) = out[0], out[1]
            new_k.append(k)
            new_v.append(v)
            stats.append(route.stats(out))
        stacked = jax.tree.map(lambda *a: jnp.stack(a), *stats) if route.routed else None
        return x, cache.replace(k=tuple(new_k), v=tuple(new_v)), stacked

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        """tokens [B, T] -> embeddings [B, T, D] in the compute dtype (Gemma: times
        sqrt(D), the factor rounded to the compute dtype as transformers does)."""
        dt = self.cfg.compute_dtype
        x = self.embed[...].astype(dt)[tokens]
        return x * jnp.asarray(self.cfg.hidden_size**0.5, dt) if self.cfg.embed_scale else x

    def attention_inputs(self, masks):
        """masks: [(distance, allowed)], per attention of a layer: slot distance query -
        key and the allowed bool mask (causal and valid), [B, T, S] or broadcastable, or
        (None, an `attention.RowMask`: the mask by its parts, for 'ring').
        -> (per_layer(info) -> (inv_freq [Dh/2], [attn bias [B, 1, 1, T, S] or the
        RowMask] per mask), info: the per-layer inputs stacked [L, ...] to scan over, or
        None).

        Models whose layers all attend alike (every family but Gemma) get one shared
        (inv_freq, biases), built once outside the scan; otherwise each layer's window
        limits its keys to distance < window, inside the scanned body."""
        cfg = self.cfg

        def bias(dist, allowed, window=None):
            if isinstance(allowed, RowMask):
                return allowed if window is None else allowed.with_window(window)
            return mask_to_bias(allowed if window is None else allowed & (dist < window))

        if not cfg.per_layer_attention:
            shared = rope_inv_freq(cfg), [bias(*mask) for mask in masks]
            return (lambda _: shared), None

        def per_layer(info):
            inv_freq, window = info
            return inv_freq, [bias(*mask, window) for mask in masks]

        return per_layer, layer_attention_inputs(cfg)

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

        dist_p = jnp.arange(tp)[:, None] - jnp.arange(tp)[None, :]  # [Tp, Tp]
        allowed_p = (dist_p >= 0)[None] & first_of_group(real)[:, None, :]
        dist_c = (tp + jnp.arange(tn))[:, None] - jnp.arange(t)[None, :]  # [Tn, T]
        allowed_c = (dist_c >= 0)[None] & real[:, None, :]  # biases [B, 1, 1, Tn, T]
        per_layer, layer_info = self.attention_inputs([(dist_p, allowed_p), (dist_c, allowed_c)])
        rows_positions = pack(positions)

        def block(layer, x, info):
            inv_freq, (bias_p, bias_c) = per_layer(info)
            out = shared_prompt_block(
                layer, self.constrain_rows(x), rows_positions, inv_freq, bias_p, bias_c, n=n, tp=tp
            )
            return out, None

        x = self.constrain_rows(self.embed_tokens(pack(tokens)))
        x, _ = self.scan_layers(block, x, layer_info, remat=cfg.remat)
        hidden = self.final_norm(x)
        h_p, h_c = hidden[:, :tp], hidden[:, tp:].reshape(b, tn, -1)
        return jnp.concatenate([jnp.repeat(h_p, n, axis=0), h_c], axis=1)

    def output_table(self) -> tuple[jax.Array, bool]:
        """(the output projection as stored, vocab_major): the input embedding [V, D] and
        True when tied, else lm_head [D, V] and False (`objectives.logprobs.OutputLayer`)."""
        if self.cfg.tie_word_embeddings:
            return self.embed[...], True
        return self.lm_head[...], False

    def output_embedding(self) -> jax.Array:
        """[D, V] output projection (the transposed input embedding when tied). The logits
        are hidden @ W, soft-capped by `cfg.final_logit_softcap` where set (Gemma 2): a
        caller computing them itself applies it (`objectives.logprobs.OutputLayer`)."""
        w, vocab_major = self.output_table()
        return w.T if vocab_major else w

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., D] -> f32 logits [..., V] (soft-capped by `final_logit_softcap`)."""
        w = self.output_embedding().astype(self.cfg.compute_dtype)
        z = jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)
        cap = self.cfg.final_logit_softcap
        return z if cap is None else cap * jnp.tanh(z / cap)

    def sequence_scores(self, tokens: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """A sequence classifier's scores f32 [B, num_labels]: the score head on the final
        hidden state of each row's last real token (rows padded on either side), as
        transformers' `*ForSequenceClassification` pools them."""
        hidden, _ = self.hidden_states(tokens, attention_mask)
        t = jnp.arange(tokens.shape[1])
        last = jnp.argmax(t * (attention_mask > 0), axis=1)  # [B]
        h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # [B, D]
        w = self.score[...].astype(self.cfg.compute_dtype)
        return jnp.einsum("bd,dn->bn", h, w, preferred_element_type=jnp.float32)

    def update_balance_bias(self, stats: moe.RouterStats, gamma: float) -> None:
        """DeepSeek-V3's auxiliary-loss-free balancing step, in place: every MoE layer's
        `router_score_bias` moved by `moe.balance_bias_update` from the step's loads
        (`stats`: stacked [L, ...] router stats over all layers, summed over the step's
        microbatches; the dense first layers' are skipped). Stacked layers only."""
        if self.cfg.router_scoring != "sigmoid":
            raise ValueError("update_balance_bias: the model's router has no selection bias")
        bias = self.layers.mlp.router_score_bias
        load = stats.load[self.cfg.first_k_dense_replace :]  # [L - k, E]
        bias.set_value(moe.balance_bias_update(bias.get_value(), load, gamma))

    def init_cache(self, batch_size: int, max_len: int, dtype=None) -> KVCache:
        return init_cache(self.cfg, batch_size, max_len, dtype)
