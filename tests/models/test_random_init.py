"""models/random_init.py: weights drawn from one numpy stream in a fixed order (embedding,
final norm, each layer's parameters layer by layer, head), norms around their identity, the
head's own std."""

import numpy as np
from flax import nnx

from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.random_init import random_model

CFG = ModelConfig(16, 8, 16, num_layers=2, num_heads=2, num_kv_heads=1)


def params(model) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


def test_draws_follow_the_stream_layer_by_layer():
    two = params(random_model(CFG, seed=3, std=0.5))
    rng = np.random.default_rng(3)
    np.testing.assert_array_equal(two[("embed",)], np.float32(0.5 * rng.standard_normal((16, 8))))
    legacy = params(random_model(CFG, seed=3, std=0.5, legacy_rng=True))
    want = np.float32(0.5 * np.random.RandomState(3).standard_normal((16, 8)))
    np.testing.assert_array_equal(legacy[("embed",)], want)
    # layer 0 of two stacked layers is the one layer of a one-layer model: drawn layer by layer
    one = params(random_model(CFG.replace(num_layers=1), seed=3, std=0.5))
    for path, value in one.items():
        if path[0] == "layers":
            np.testing.assert_array_equal(two[path][0], value[0], err_msg=str(path))
    assert not np.array_equal(
        two[("layers", "mlp", "up_proj")][1], one[("layers", "mlp", "up_proj")][0]
    )
    assert all(
        np.array_equal(v, params(random_model(CFG, seed=3, std=0.5))[p]) for p, v in two.items()
    )


def test_norms_around_their_identity_and_the_heads_own_std():
    p = params(random_model(CFG, norm_std=0.0, head_std=0.0))
    norms = [v for path, v in p.items() if "norm" in ".".join(path)]
    assert len(norms) == 3 and all(np.all(v == 1.0) for v in norms)
    assert np.all(p[("lm_head",)] == 0.0) and np.std(p[("embed",)]) > 0.01
    plus_one = params(random_model(CFG.replace(norm_plus_one=True), norm_std=0.0))
    assert np.all(plus_one[("final_norm", "weight")] == 0.0)  # scales by 1 + w
