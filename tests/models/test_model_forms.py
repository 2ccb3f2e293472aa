"""models/model_forms.py: the same parameters in another module form, each checked
bitwise against the form it stands for (a module built for the new config, casting at
every use)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SMALL_MODEL, left_padded_batch, random_model
from flax import nnx

from jaxrl_frontier.models import lora
from jaxrl_frontier.models.kv_cache import init_cache
from jaxrl_frontier.models.layers import positions_from_mask
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.model_forms import reconfigured, with_compute_dtype, with_compute_weights

CONFIGS = {  # the options whose weights the forms treat apart: biases, per-head norms
    "llama": ModelConfig(vocab_size=128, **SMALL_MODEL),
    "qwen2": ModelConfig(vocab_size=128, **SMALL_MODEL, qkv_bias=True, family="qwen2"),
    "qwen3": ModelConfig(vocab_size=128, **SMALL_MODEL, qk_norm=True, family="qwen3"),
}
forward = nnx.jit(lambda model, tokens, mask: model(tokens, mask))


def test_with_compute_dtype_is_the_model_built_for_that_dtype():
    """`with_compute_dtype` (a sampler computing in another dtype than the learner): the same
    arrays, adapters attached after construction included, in modules that all compute in
    the new dtype: bitwise the logits of a module built for it (`reconfigured`)."""
    model = random_model(CONFIGS["qwen3"])
    bf16 = with_compute_dtype(model, "bfloat16")
    assert model.cfg.dtype == "float32"  # the source model is untouched
    configs = [m.cfg for _, m in bf16.iter_modules() if hasattr(m, "cfg")]
    assert len(configs) >= 3 and {c.dtype for c in configs} == {"bfloat16"}  # model, attn, mlp
    built = reconfigured(model, model.cfg.replace(dtype="bfloat16"))
    tokens, mask = map(jnp.asarray, left_padded_batch(batch=2, length=8))
    np.testing.assert_array_equal(forward(bf16, tokens, mask), forward(built, tokens, mask))
    assert not np.array_equal(forward(bf16, tokens, mask), forward(model, tokens, mask))
    lora.add_adapters(model, rank=2, alpha=4.0, targets=("q_proj",), key=jax.random.key(1))
    adapted = with_compute_dtype(model, "bfloat16")
    shared = jax.tree.map(lambda a, b: a is b, nnx.state(model), nnx.state(adapted))
    assert lora.has_adapters(adapted) and all(jax.tree.leaves(shared))
    assert with_compute_dtype(model, "float32") is model  # nothing to change


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_with_compute_weights_same_outputs(name):
    """Weights cast to the compute dtype once (the sampler's decode) give bitwise the
    logits and KV-cache decode of casting at every use; norm scales stay f32."""
    model = random_model(CONFIGS[name].replace(dtype="bfloat16"))
    cast = with_compute_weights(model)
    for path, w in nnx.to_flat_state(nnx.state(cast)):
        ndim = w.ndim - (path[0] == "layers")  # one layer's: stacked ones lead with [L]
        assert w.dtype == (jnp.bfloat16 if ndim >= 2 else jnp.float32), path
    tokens, mask = map(jnp.asarray, left_padded_batch(batch=2, length=8))
    np.testing.assert_array_equal(forward(model, tokens, mask), forward(cast, tokens, mask))

    def decode_two(m):  # prefill, then one cached step
        cache = init_cache(m.cfg, 2, 9)
        logits, cache = m(tokens, mask, cache=cache)
        nxt = jnp.argmax(logits[:, -1], axis=-1)[:, None]
        pos = positions_from_mask(mask)[:, -1:] + 1
        return m(nxt, jnp.ones_like(nxt), positions=pos, cache=cache)[0]

    np.testing.assert_array_equal(decode_two(model), decode_two(cast))
    f32 = random_model(CONFIGS[name])
    assert with_compute_weights(f32) is f32  # nothing to cast: the same model
