"""models/sliding_cache.py: which absolute slot each ring slot holds, a filled cache gathered
into rings on its sliding layers only, and the bytes each kind of layer holds."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.models.kv_cache import init_cache
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.sliding_cache import cache_bytes, ring_slots, to_ring

CFG = ModelConfig(
    16, 8, 16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=2,
    layer_types=("sliding_attention", "full_attention"), sliding_window=3,
)  # fmt: skip


def test_ring_slots_hold_the_latest_slot_of_their_residue():
    np.testing.assert_array_equal(ring_slots(5, 3), [3, 4, 2])  # slots 0..4 written
    np.testing.assert_array_equal(ring_slots(3, 3), [0, 1, 2])
    np.testing.assert_array_equal(ring_slots(2, 3), [0, 1, -1])  # ring slot 2: never written


def test_to_ring_gathers_the_sliding_layers_window():
    cache = init_cache(CFG, batch_size=1, max_len=6)
    slots = jnp.arange(6.0).reshape(1, 1, 6, 1) * jnp.ones((1, 1, 6, 2))  # key = its slot
    valid = jnp.asarray([[False, True, True, True, True, False]])  # slot 0: padding
    cache = cache.replace(k=(slots, slots), v=(slots, slots), valid=valid, index=jnp.int32(5))
    ring = to_ring(cache, CFG)
    assert ring.ring_layers == (True, False)
    np.testing.assert_array_equal(ring.k[0][0, 0, :, 0], [3, 4, 2])  # slots 3, 4, 2
    assert ring.k[1].shape == (1, 1, 6, 2)  # the full layer keeps its cache
    np.testing.assert_array_equal(ring.ring_valid, [[True, True, True]])
    early = to_ring(cache.replace(index=jnp.int32(2)), CFG)  # slots 0, 1 written
    np.testing.assert_array_equal(early.ring_valid, [[False, True, False]])
    assert to_ring(ring, CFG) is ring  # already rings
    full_only = CFG.replace(layer_types=None)
    assert to_ring(cache, full_only) is cache
    with pytest.raises(ValueError, match="scalar index"):
        to_ring(cache.replace(index=jnp.asarray([5])), CFG)
    # f32 [1, 1, W=3, 2] keys and values on the ring layer, [1, 1, 6, 2] on the full one
    assert cache_bytes(ring) == (2 * 3 * 2 * 4, 2 * 6 * 2 * 4)
    assert cache_bytes(cache) == (0, 2 * 2 * 6 * 2 * 4)
