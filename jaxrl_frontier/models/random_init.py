"""Random weights drawn with numpy, for tests and benchmarks.

`nnx` initialisers run one jax.random kernel per parameter shape, and each compiles: for
tiny test models that dominates the runtime, for large benchmark models it is slow. Here the
model is built abstractly and every parameter is filled from one numpy stream instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_frontier.models.transformer import ModelConfig, Transformer


def random_model(
    cfg: ModelConfig,
    *,
    seed: int = 0,
    std: float = 0.05,
    head_std: float | None = None,
    norm_std: float = 0.1,
    legacy_rng: bool = False,
) -> Transformer:
    """A `Transformer` for `cfg` with N(0, std) weights and N(1, norm_std) norm scales.

    head_std: std of an untied output layer (`lm_head`), which sets how sharp the logits
      are (None: `std`).
    legacy_rng: draw from `np.random.RandomState(seed)` instead of `default_rng(seed)`
      (the stream some tests were tuned on).
    """
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.RandomState(seed) if legacy_rng else np.random.default_rng(seed)

    def draw(path, x):
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            value = 1.0 + norm_std * rng.standard_normal(x.shape)
        else:
            scale = head_std if head_std is not None and "lm_head" in name else std
            value = scale * rng.standard_normal(x.shape)
        return jnp.asarray(value, x.dtype)

    nnx.update(model, jax.tree_util.tree_map_with_path(draw, nnx.state(model)))
    return model
