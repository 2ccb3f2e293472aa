"""A checkpoint's multi-token-prediction (MTP) module ("DeepSeek-V3 Technical Report", §2.2:
one more decoder layer, trained beside the model to predict the token after next), run as
the speculative sampler's draft (`rollout.speculative.draft = 'mtp'`, sampling/mtp_draft.py).

    h'_i = W_eh [RMSNorm_e(Emb(t_{i+1})); RMSNorm_h(h_i)]      [.., 2D] -> [.., D]
    g_i  = RMSNorm_head(Block(h'_<=i))                          one decoder layer (its own cache)
    q(t_{i+2} | t_<=i+1) = softmax(g_i W_out)

h_i: the policy's final-normed hidden state at token i; Emb and W_out: the policy's own (the
report shares them between the model and its MTP modules), so they are not held here and
follow the policy's updates; the block, with its own latent attention and mixture of
experts, and the three norms and W_eh stay as the checkpoint has them. Drafting past the
first token feeds g_i back as the next step's h (the normed output, like the policy's).

`MultiTokenPredictor` is a one-layer `Transformer` whose first layer's input is h' rather
than a token's embedding (`Transformer.hidden_states(embeds=...)`) and whose final norm is
RMSNorm_head; it holds no embedding and no LM head.

In a Hugging Face checkpoint (DeepSeek-V3, `num_nextn_predict_layers` of them) module j is
layer `model.layers.{L + j}` (L = num_hidden_layers): `enorm`, `hnorm`, `eh_proj` [D, 2D],
`shared_head.norm`, the block's tensors under a layer's usual names, and copies of the
policy's embedding and head (`embed_tokens`, `shared_head.head`), which are not read.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.models.layers import make_param, rms_norm
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.tensor_map import TensorSpec, tensor_specs
from jaxrl_frontier.models.transformer import Transformer

# the config.json key that counts a checkpoint's MTP modules (after its decoder layers)
HF_COUNT_KEY = "num_nextn_predict_layers"


def block_config(cfg: ModelConfig) -> ModelConfig:
    """The config of the module's one layer: the policy's last layer's kind (DeepSeek-V3:
    latent attention and the mixture of experts)."""
    return cfg.replace(num_layers=1, first_k_dense_replace=0)


class MultiTokenPredictor(Transformer):
    """`policy`'s MTP module (module docstring): `mtp(policy, tokens, previous, ...)`."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        if cfg.num_labels or any(cfg.linear_layers):
            raise ValueError(
                "a multi-token-prediction module follows a causal LM of full attention"
            )
        super().__init__(block_config(cfg), rngs=rngs)
        del self.embed  # the policy's
        if not cfg.tie_word_embeddings:
            del self.lm_head
        d = cfg.hidden_size
        self.enorm, self.hnorm = rms_norm(cfg, d, rngs), rms_norm(cfg, d, rngs)
        self.eh_proj = make_param(rngs, (2 * d, d), (None, "embed"), jnp.dtype(cfg.param_dtype))

    def mesh(self):
        return shd.mesh_of(self.eh_proj[...])

    def __call__(
        self,
        policy: Transformer,
        tokens: jax.Array,
        previous: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        positions: jax.Array | None = None,
        cache=None,
    ):
        """tokens int32 [B, T] (t_{i+1}), previous [B, T, D] (h_i) -> (g [B, T, D], the
        updated cache or None); the draft's logits are `policy.logits(g)`. attention_mask,
        positions, cache: as `Transformer.hidden_states` (position i is h_i's)."""
        dt = self.cfg.compute_dtype
        fused = jnp.concatenate(
            [self.enorm(policy.embed_tokens(tokens)), self.hnorm(previous.astype(dt))], -1
        )
        x = jnp.einsum("btf,fd->btd", fused, self.eh_proj[...].astype(dt))
        return self.hidden_states(
            tokens, attention_mask, positions=positions, cache=cache, embeds=x
        )


def mtp_tensor_specs(cfg: ModelConfig, index: int, expert_tensors: str) -> list[TensorSpec]:
    """The tensors the module at `model.layers.{index}` is read from and saved to (module
    docstring), in `tensor_map`'s terms; not the embedding and head copies."""
    d, pre = cfg.hidden_size, f"model.layers.{index}."
    specs = [
        TensorSpec(pre + "enorm.weight", ("enorm", "weight"), (d,), (d,), False),
        TensorSpec(pre + "hnorm.weight", ("hnorm", "weight"), (d,), (d,), False),
        TensorSpec(pre + "eh_proj.weight", ("eh_proj",), (d, 2 * d), (2 * d, d), True),
    ]
    for spec in tensor_specs(block_config(cfg), expert_tensors):
        if spec.path[0] in ("embed", "lm_head"):
            continue
        name = spec.hf_name.replace("model.layers.0.", pre)
        if spec.path[0] == "final_norm":
            name = pre + "shared_head.norm.weight"
        specs.append(dataclasses.replace(spec, hf_name=name))
    return specs


def shared_copies(index: int) -> tuple[str, str]:
    """The names of module `index`'s copies of the policy's embedding and head."""
    pre = f"model.layers.{index}."
    return pre + "embed_tokens.weight", pre + "shared_head.head.weight"
