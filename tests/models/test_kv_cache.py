"""models/kv_cache.py: writes at one slot for every row or at each row's own, by hand; an
empty cache's shapes."""

import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.models.kv_cache import init_cache, write_slots
from jaxrl_frontier.models.model_config import ModelConfig


def test_write_slots_at_one_index_and_at_each_rows_own():
    buf = jnp.zeros((2, 5), jnp.int32)  # [B, S]
    new = jnp.asarray([[1, 2], [3, 4]])  # [B, T=2]
    np.testing.assert_array_equal(
        write_slots(buf, new, jnp.int32(1), axis=1), [[0, 1, 2, 0, 0], [0, 3, 4, 0, 0]]
    )
    np.testing.assert_array_equal(
        write_slots(buf, new, jnp.asarray([0, 3]), axis=1), [[1, 2, 0, 0, 0], [0, 0, 0, 3, 4]]
    )
    kv = jnp.zeros((2, 1, 4, 2))  # [B, K, S, Dh], slots on axis 2
    step = jnp.arange(1.0, 5.0).reshape(2, 1, 1, 2)  # one new slot per row
    out = np.asarray(write_slots(kv, step, jnp.asarray([2, 0]), axis=2))
    np.testing.assert_array_equal(out[0, 0, 2], [1, 2])
    np.testing.assert_array_equal(out[1, 0, 0], [3, 4])
    assert np.count_nonzero(out) == 4  # nothing else written


def test_init_cache_is_empty_and_sized_by_the_config():
    cfg = ModelConfig(16, 8, 16, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=4)
    cache = init_cache(cfg, batch_size=2, max_len=6)
    assert len(cache.k) == len(cache.v) == 3 and cache.max_len == 6
    assert cache.k[0].shape == (2, 2, 6, 4) and cache.k[0].dtype == jnp.float32
    assert not bool(cache.valid.any()) and int(cache.index) == 0
    assert init_cache(cfg, 2, 6, dtype=jnp.bfloat16).v[2].dtype == jnp.bfloat16
