"""The decoder's KV cache (`KVCache`: every layer's keys and values, which slots hold real
tokens, the next slot to write) and the writes into it (`write_slots`). With left-padded
prompts every row's next token lands in the same slot, so causality in slot space is
causality in time; `valid` masks padding slots (models/transformer.py). Sliding-window
layers may hold rings of W slots instead (models/sliding_cache.py)."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from jaxrl_frontier.models.model_config import ModelConfig


@flax.struct.dataclass
class KVCache:
    """Every layer's keys and values for incremental decoding.

    k, v:  tuples of L arrays [B, K, S, Dh] (K kv heads, S cache slots; see the module
           docstring); latent attention (`ModelConfig.kv_lora_rank` R > 0, DeepSeek): k
           holds each token's normed latent [B, 1, S, R] and v its rotated rope key
           [B, 1, S, Dr], shared by the heads (`layers.LatentAttention`)
    valid: [B, S] bool       slot holds a real (non-padding) token
    index: int32 []          next slot to write (the same for every row), or int32 [B]:
                             each row's own (continuous batching: rows start at other times)
    """

    k: jax.Array
    v: jax.Array
    valid: jax.Array
    index: jax.Array
    # sliding layers' rings (models/sliding_cache.py): their [B, W] validity, and per layer
    # whether k[i], v[i] are rings of W slots (static; () = no rings)
    ring_valid: jax.Array | None = None
    ring_layers: tuple[bool, ...] = flax.struct.field(pytree_node=False, default=())
    # linear-attention layers (Qwen3.5, `ModelConfig.linear_layers`): per layer, None for
    # an attention layer, else its fixed-size state (models/linear_attention.py): conv
    # [B, Kc - 1, C] (the last Kc - 1 conv inputs) and delta [B, Hv, Dk, Dv] f32 (the
    # delta rule's matrix); such a layer's k[i], v[i] hold no slots' data ([B, 1, S, 0])
    conv: tuple | None = None
    delta: tuple | None = None
    # a forward over T tokens keeps each linear layer's state after every one of them
    # (conv [B, T, Kc - 1, C], delta [B, T, Hv, Dk, Dv], by the token-by-token rule), so that
    # a speculative round can keep the state after its last accepted token (`at_step`)
    keep_steps: bool = flax.struct.field(pytree_node=False, default=False)

    def at_step(self, step: jax.Array) -> KVCache:
        """A `keep_steps` cache's linear states after token `step` [B] (int32, per row) of
        its last forward, as a plain cache; attention layers' slots are kept as written
        (a later write rewrites the rejected ones before any query reads them)."""
        pick = lambda x: jnp.take_along_axis(x, step.reshape((-1,) + (1,) * (x.ndim - 1)), 1)[:, 0]
        conv, delta = jax.tree.map(pick, (self.conv, self.delta))
        return self.replace(conv=conv, delta=delta, keep_steps=False)

    @property
    def max_len(self) -> int:
        return self.valid.shape[1]


def write_slots(buf: jax.Array, new: jax.Array, index, axis: int) -> jax.Array:
    """buf with `new` written at slots [index, index + T) of `axis` (T = new.shape[axis]).
    index: int32 [] (every row at the same slots: one dynamic update slice), or [B] (row b at
    its own slots, B = the leading axis: continuous batching; a scatter of the T new
    entries per row, which XLA updates in place)."""
    if jnp.ndim(index) == 0:
        return jax.lax.dynamic_update_slice_in_dim(buf, new, index, axis)
    t = new.shape[axis]
    rows = jnp.arange(buf.shape[0])[:, None]  # [B, 1]
    slots = index[:, None] + jnp.arange(t)[None, :]  # [B, T]
    where = (rows,) + (slice(None),) * (axis - 1) + (slots,)
    # advanced indices apart from the leading one move the [B, T] dims first
    return buf.at[where].set(jnp.moveaxis(new, axis, 1), unique_indices=True)


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache of `max_len` slots (prompt + generated tokens)."""
    dtype = dtype or cfg.compute_dtype
    k_shape = v_shape = (batch_size, cfg.num_kv_heads, max_len, cfg.resolved_head_dim)
    if cfg.kv_lora_rank:  # latent attention: the normed latent and the rotated rope key
        k_shape = (batch_size, 1, max_len, cfg.kv_lora_rank)
        v_shape = (batch_size, 1, max_len, cfg.qk_rope_head_dim)
    linear = cfg.linear_layers
    empty = (batch_size, 1, max_len, 0)  # a linear layer's: no per-slot data
    cache = KVCache(
        k=tuple(jnp.zeros(empty if lin else k_shape, dtype) for lin in linear),
        v=tuple(jnp.zeros(empty if lin else v_shape, dtype) for lin in linear),
        valid=jnp.zeros((batch_size, max_len), bool),
        index=jnp.zeros((), jnp.int32),
    )
    if not any(linear):
        return cache
    states = [init_linear_state(cfg, batch_size, dtype) if lin else (None, None) for lin in linear]
    return cache.replace(conv=tuple(s[0] for s in states), delta=tuple(s[1] for s in states))


def linear_dims(cfg: ModelConfig) -> tuple[int, int, int, int, int]:
    """(Hk, Dk, Hv, Dv, conv channels C = 2 Hk Dk + Hv Dv) of a linear-attention layer."""
    hk, dk = cfg.linear_num_key_heads, cfg.linear_key_head_dim
    hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    return hk, dk, hv, dv, 2 * hk * dk + hv * dv


def init_linear_state(cfg: ModelConfig, batch_size: int, dtype=None):
    """A linear-attention layer's empty state: (conv [B, Kc - 1, C] in `dtype`, delta
    [B, Hv, Dk, Dv] f32), zeros."""
    _, dk, hv, dv, ch = linear_dims(cfg)
    conv = jnp.zeros((batch_size, cfg.linear_conv_kernel_dim - 1, ch), dtype or cfg.compute_dtype)
    return conv, jnp.zeros((batch_size, hv, dk, dv), jnp.float32)
