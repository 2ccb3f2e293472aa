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
    return KVCache(
        k=tuple(jnp.zeros(k_shape, dtype) for _ in range(cfg.num_layers)),
        v=tuple(jnp.zeros(v_shape, dtype) for _ in range(cfg.num_layers)),
        valid=jnp.zeros((batch_size, max_len), bool),
        index=jnp.zeros((), jnp.int32),
    )
