"""The tiny model, prompts and meshes the sampling tests share (tests/sampling/): one
compiled decode length (TN) and group size (N) everywhere, so the files reuse programs."""

import jax
import numpy as np
from flax import nnx

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.random_init import random_model
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling import SamplingParams

CFG = ModelConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
)
# the same shape with Qwen3.5's hybrid layers: a Gated DeltaNet layer (its decode state a conv
# window and a delta-rule matrix per row) before a gated full-attention one
HYBRID_LAYERS = dict(
    layer_types=("linear_attention", "full_attention"), linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
    linear_conv_kernel_dim=4, attn_output_gate=True, partial_rotary_factor=0.5, qk_norm=True,
    norm_plus_one=True,
)  # fmt: skip
HYBRID_CFG = CFG.replace(**HYBRID_LAYERS)
PAD = 0
TN = 12  # max_new_tokens everywhere: one compiled decode length
N = 2  # group size everywhere
GREEDY = SamplingParams(max_new_tokens=TN, n=N, greedy=True)


def make_model(seed: int = 0) -> Transformer:
    """The tiny model with numpy-drawn weights (no per-shape PRNG compiles: test time).

    Norm weights around 1 so they matter; the output layer is sharp enough (logit std ~1,
    top-2 gaps >> float error) that argmax comparisons are not decided by rounding, while
    sampling stays genuinely random.
    """
    return random_model(CFG, seed=seed, std=0.02, head_std=0.16, legacy_rng=True)


def make_hybrid_model(seed: int = 0) -> Transformer:
    """`make_model`'s draw for the hybrid shape (`HYBRID_CFG`): a `HybridTransformer`."""
    return random_model(HYBRID_CFG, seed=seed, std=0.02, head_std=0.16, legacy_rng=True)


def prompts(lengths, width=14, seed=0):
    """Left-padded host prompts [P, width] of the given lengths (tokens 1..V-1, no pad)."""
    rng = np.random.RandomState(seed)
    tokens = np.zeros((len(lengths), width), np.int32)
    mask = np.zeros((len(lengths), width), np.int32)
    for i, n in enumerate(lengths):
        tokens[i, width - n :] = rng.randint(1, CFG.vocab_size, size=n)
        mask[i, width - n :] = 1
    return tokens, mask


def first_devices_mesh(shape):
    """A mesh of `shape` over the first prod(shape) devices."""
    return shd.make_mesh(shape, devices=jax.devices()[: int(np.prod(shape))])


def placed(model, mesh):
    """`model` with its weights placed on `mesh` by their logical axes."""
    state = nnx.state(model)
    return nnx.merge(nnx.graphdef(model), jax.device_put(state, shd.state_shardings(state, mesh)))
