"""Random weights drawn with numpy, for tests and benchmarks.

`nnx` initialisers run one jax.random kernel per parameter shape, and each compiles: for
tiny test models that dominates the runtime, for large benchmark models it is slow. Here the
model is built abstractly and every parameter is filled from one numpy stream instead.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_frontier.models.hybrid import model_class
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.transformer import Transformer


def random_model(
    cfg: ModelConfig,
    *,
    seed: int = 0,
    std: float = 0.05,
    head_std: float | None = None,
    norm_std: float = 0.1,
    legacy_rng: bool = False,
) -> Transformer:
    """A `Transformer` for `cfg` with N(0, std) weights and N(1, norm_std) norm scales
    (weights N(0, norm_std) where norms scale by 1 + w: `cfg.norm_plus_one`).

    head_std: std of an untied output layer (`lm_head`), which sets how sharp the logits
      are (None: `std`).
    legacy_rng: draw from `np.random.RandomState(seed)` instead of `default_rng(seed)`
      (the stream some tests were tuned on).
    """
    model = nnx.eval_shape(lambda: model_class(cfg)(cfg, rngs=nnx.Rngs(0)))
    per_layer = isinstance(model.layers, nnx.List)  # a hybrid model: no stacked arrays
    rng = np.random.RandomState(seed) if legacy_rng else np.random.default_rng(seed)

    def draw(name, shape):
        if "norm" in name:  # (a linear-attention layer's gated norm scales by w)
            plus_one = cfg.norm_plus_one and not name.endswith("attn.norm.weight")
            return (0.0 if plus_one else 1.0) + norm_std * rng.standard_normal(shape)
        scale = head_std if head_std is not None and "lm_head" in name else std
        return scale * rng.standard_normal(shape)

    # Draw in the order of per-layer parameters (embedding, final norm, layer 0's
    # parameters, layer 1's, ..., head), filling the stacked [L, ...] arrays layer by layer,
    # so a seed gives the same weights as when each layer had its own arrays.
    flat = list(nnx.to_flat_state(nnx.state(model)))
    done = set()
    for path, var in flat:
        abstract = var.get_value()
        if path[0] != "layers" or per_layer:
            value = draw(".".join(map(str, path)), abstract.shape)
            var.set_value(jnp.asarray(value, abstract.dtype))
        elif path not in done:  # the first stacked parameter: draw every layer's now
            stacked = [(p, v) for p, v in flat if p[0] == "layers"]
            host = {p: np.empty(v.get_value().shape, v.get_value().dtype) for p, v in stacked}
            # L layers, or L - k after DeepSeek's k dense ones (`Transformer.dense_layers`)
            for i in range(next(iter(host.values())).shape[0]):
                for p, a in host.items():
                    a[i] = draw(".".join(map(str, p)), a.shape[1:])
            for p, v in stacked:
                v.set_value(jnp.asarray(host.pop(p)))
            done.update(p for p, _ in stacked)
    return model
