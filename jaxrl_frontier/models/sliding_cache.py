"""The decode's ring cache for sliding-window layers (Gemma 2 / 3).

A sliding layer's query sees only the keys of the last W slots (W = `sliding_window`), so
its cache needs only W slots: slot j of a ring holds the keys of the latest absolute slot
a with a % W == j. A decode step writes its token at slot index % W, over the one that has
just left the window, so the layer's cache never grows with the completion; the full
layers keep their [B, K, S, Dh] caches, grown by the decode's phases.

    KVCache.ring_layers   static, per layer: True where k[i], v[i] are rings [B, K, W, Dh]
    KVCache.ring_valid    [B, W] bool: ring slot j holds a real token (shared by the rings)

Every ring slot holds one of the last W absolute slots, so the window's limit is the ring's
size: a step's bias over a ring is its validity alone. A ring is built from a filled cache
(`to_ring`, after the prefill) and written one token per step (`Transformer.hidden_states`,
scalar index, T = 1); prefill, scoring and the scanned decode use the full caches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_frontier.models.kv_cache import KVCache
from jaxrl_frontier.models.model_config import ModelConfig


def ring_slots(index, window: int) -> jax.Array:
    """[W] the absolute slot each ring slot holds once slots [0, index) are written: the
    latest a < index with a % W == j (negative: never written)."""
    last = index - 1
    return last - jnp.mod(last - jnp.arange(window), window)


def to_ring(cache: KVCache, cfg: ModelConfig) -> KVCache:
    """`cache` (full [B, K, S, Dh] per layer, scalar `index`: slots [0, index) written)
    with each sliding layer's keys and values gathered into a ring of `sliding_window`
    slots, and `ring_valid` the validity of those slots. A cache with no sliding layer, or
    already a ring, comes back as is."""
    sliding = cfg.sliding_layers
    if not any(sliding) or cache.ring_layers:
        return cache
    if jnp.ndim(cache.index) != 0:
        raise ValueError("a ring cache needs one write index for every row (a scalar index)")
    window = cfg.sliding_window
    slots = ring_slots(cache.index, window)  # [W]
    written = slots >= 0
    take = jnp.clip(slots, 0, cache.max_len - 1)

    def ring(x):  # [B, K, S, Dh] -> [B, K, W, Dh]
        return jnp.take(x, take, axis=2)

    k = tuple(ring(x) if s else x for x, s in zip(cache.k, sliding))
    v = tuple(ring(x) if s else x for x, s in zip(cache.v, sliding))
    ring_valid = jnp.take(cache.valid, take, axis=1) & written[None, :]
    return cache.replace(k=k, v=v, ring_valid=ring_valid, ring_layers=sliding)


def cache_bytes(cache: KVCache) -> tuple[int, int]:
    """(bytes of the ring layers' keys and values, bytes of the full layers')."""
    ring = full = 0
    layers = cache.ring_layers or (False,) * len(cache.k)
    for k, v, is_ring in zip(cache.k, cache.v, layers):
        if is_ring:
            ring += k.nbytes + v.nbytes
        else:
            full += k.nbytes + v.nbytes
    return ring, full
