"""train.offload_optimizer: the optimizer state in pinned host memory between updates.

CPU devices list a 'pinned_host' memory kind, but it is the same RAM: a run asking for the
offload there is refused with the key named. The placement itself is tested on CPU through
`allow_shared_memory` (the same program a TPU or GPU compiles, with the transfers in it).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import FAST, get_config

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.rl.learn.train_step import (
    init_train_state,
    make_update_fn,
    optimizer_memory_kind,
)


def _mesh():
    return sharding.make_mesh((1, 1, 1), jax.devices()[:1])


def test_cpu_refuses_the_offload_naming_the_key(tmp_path):
    from jaxrl_frontier.run.trainer import Trainer

    assert optimizer_memory_kind(False, _mesh()) is None
    c = get_config("grpo_arith", {**FAST, "train.offload_optimizer": True})
    with pytest.raises(ConfigError, match=r"'train\.offload_optimizer' = True: the CPU backend"):
        Trainer(c, str(tmp_path))


def _loss(params, batch):
    """sum((W x)^2) + sum(b): [4, 3] weights, [3, 2] inputs."""
    return jnp.sum((params["w"] @ batch["x"]) ** 2) + jnp.sum(params["b"]), {}


def test_offloaded_state_lives_on_host_and_updates_as_on_device():
    mesh = _mesh()
    kind = optimizer_memory_kind(True, mesh, allow_shared_memory=True)
    assert kind == "pinned_host"
    tx = optax.adamw(0.1)
    batch = {"x": jnp.arange(6.0).reshape(3, 2) / 6}
    repl = sharding.replicated(mesh)
    out = {}
    for k in (None, kind):
        params = {"w": jnp.full((4, 3), 0.5), "b": jnp.ones((3,))}
        params = jax.device_put(params, repl)
        state = init_train_state(tx, params, mesh, jax.random.key(0), memory_kind=k)
        adam = state.opt_state[0]
        want = k or "device"
        assert {x.sharding.memory_kind for x in jax.tree.leaves((adam.mu, adam.nu))} == {want}
        assert adam.count.sharding.memory_kind == "device"  # not parameter-shaped: stays
        shardings = jax.tree.map(lambda x: x.sharding, state)
        update = make_update_fn(None, tx, _loss, 1, shardings, {"x": repl})
        for _ in range(3):
            state, _ = update(state, batch)
        adam = state.opt_state[0]
        assert {x.sharding.memory_kind for x in jax.tree.leaves((adam.mu, adam.nu))} == {want}
        out[k] = state
    for a, b in zip(jax.tree.leaves(out[None]), jax.tree.leaves(out[kind])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # against optax by hand: three plain AdamW steps
    params = {"w": jnp.full((4, 3), 0.5), "b": jnp.ones((3,))}
    opt = tx.init(params)
    for _ in range(3):
        g = jax.grad(lambda p: _loss(p, batch)[0])(params)
        updates, opt = tx.update(g, opt, params)
        params = optax.apply_updates(params, updates)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(out[kind].params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6)
