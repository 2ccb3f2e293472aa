"""Qwen3.5 (models/hybrid.py, models/qwen3_5.py) against transformers' `Qwen3_5ForCausalLM`
and `Qwen3_5MoeForCausalLM` on the same tiny random weights.

One tiny random model per variant (built by transformers in f32, eager attention, every
parameter redrawn by `conftest.redrawn`): hidden 32, 3 layers (linear, full, linear),
4 query / 2 kv heads of 16 (a quarter rotated), linear attention with 2 key heads of 8 and 4
value heads of 8, a 4-tap conv; dense: MLP 48; MoE: 4 experts of 16, top 2, a gated shared
expert of 24. Checked: the logits on a left-padded batch; save -> transformers load -> the
same tensors and logits, and our loader reads them back; our `Sampler`'s greedy tokens
equal transformers' `generate`, its log-probs the full forward's, and a linear layer's cache
does not grow with the completion; the gradient of a log-prob loss equals transformers'
autograd; a hub-style multimodal directory loads; the refusals (packed rows, remat, LoRA,
the other samplers).

Tolerance: the logits' scale is O(1-10); an f32 value passes through some hundreds of
roundings (norms, projections over at most 64 inputs, a delta rule summed in chunks by us
and by transformers in another order), which puts ours and transformers' ~1e-6 of the
scale apart: 1e-5 of the scale is the bound.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_save_round_trip, hf_logits, left_padded_batch, redrawn, rel_diff
from flax import nnx

from jaxrl_frontier.models import hf
from jaxrl_frontier.models.hybrid import HybridTransformer
from jaxrl_frontier.models.lora import add_adapters
from jaxrl_frontier.models.transformer import reconfigured
from jaxrl_frontier.sampling import Sampler, SamplingParams
from jaxrl_frontier.sampling.continuous import ContinuousSampler
from jaxrl_frontier.sampling.speculative import SpeculativeSampler

HF_QWEN3_5 = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    eos_token_id=None,  # generate's tokens all count
)
VARIANTS = {
    "dense": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(intermediate_size=48)),
    "moe": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
        ),
    ),  # fmt: skip
}
REL_TOL = 1e-5  # max |ours - transformers| / max |logit| (module docstring)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request, tmp_path_factory):
    """(variant, directory, torch model, our model, our jitted forward): the tiny random
    Qwen3.5 saved by transformers and loaded by `hf.load`; the forward is shared by the
    tests (one compile per input shape)."""
    import transformers

    config_cls, model_cls, extra = VARIANTS[request.param]
    config = getattr(transformers, config_cls)(**HF_QWEN3_5, **extra)
    config._attn_implementation = "eager"
    model = redrawn(getattr(transformers, model_cls)(config).eval(), 0.1)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    ours = hf.load(path)
    graphdef, state = nnx.split(ours)
    forward = jax.jit(lambda state, t, m: nnx.merge(graphdef, state)(t, m))
    return request.param, path, model, ours, lambda t, m: np.asarray(forward(state, t, m))


def test_logit_parity_and_round_trip(checkpoint, tmp_path):

    variant, path, torch_model, model, forward = checkpoint
    cfg = model.cfg
    assert isinstance(model, HybridTransformer)
    assert cfg.family == {"dense": "qwen3_5_text", "moe": "qwen3_5_moe_text"}[variant]
    assert cfg.linear_layers == (True, False, True) and cfg.rope_dim == 4
    assert cfg.num_experts == (4 if variant == "moe" else 0)
    tokens, mask = left_padded_batch(batch=2, length=18)  # the decode test's shape
    ref = hf_logits(torch_model, tokens, mask)
    diff = rel_diff(forward(tokens, mask), ref, mask)
    print(f"{variant}: max |logit diff| / max |logit| = {diff:.1e}")
    assert diff < REL_TOL

    assert_save_round_trip(model, torch_model, tmp_path, tokens, mask, REL_TOL)


PROMPTS = np.random.RandomState(1).randint(1, 128, size=(2, 6)).astype(np.int32)


def test_greedy_decode_equals_transformers(checkpoint):
    """10 greedy tokens after prompts of 6 (the sampler left-pads them to 8): the prefill
    runs the delta rule chunk-parallel, each decode step token by token from the cache's
    conv and delta states."""
    import torch

    variant, _, torch_model, model, forward = checkpoint
    if variant != "dense":  # the MoE's decode is this code with the MoE's MLP: its compile
        pytest.skip("is left out to keep the file fast (the MoE logits are checked above)")
    sampler = Sampler(model, pad_id=0, prompt_buckets=(8,), decode_phases=1)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    rollout = sampler.generate(PROMPTS, np.ones_like(PROMPTS), params, jax.random.key(0))
    with torch.no_grad():
        ref = torch_model.generate(
            torch.as_tensor(PROMPTS, dtype=torch.long), max_new_tokens=10, do_sample=False,
            attention_mask=torch.ones(PROMPTS.shape, dtype=torch.long), pad_token_id=0,
        )[:, 6:].numpy()  # fmt: skip
    np.testing.assert_array_equal(np.asarray(rollout.completion_tokens), ref)

    # the decode's log-probs are the full (chunk-parallel) forward's up to f32 rounding
    seq = rollout.sequences()
    logits = forward(seq.tokens, seq.attention_mask)
    logp = jax.nn.log_softmax(logits[:, 7:-1], -1)
    full = np.take_along_axis(np.asarray(logp), np.asarray(seq.tokens)[:, 8:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(rollout.policy_logp), full, atol=1e-4)
    # and the full forward's greedy tokens over the rollout are the decode's
    greedy = np.argmax(np.asarray(logits[:, 7:-1]), -1)
    np.testing.assert_array_equal(greedy, np.asarray(seq.tokens)[:, 8:])


def nbytes(a) -> int:
    return int(np.prod(a.shape)) * a.dtype.itemsize


def layer_bytes(cache, i: int) -> int:
    """Layer i's cache bytes: keys, values and a linear layer's conv and delta states."""
    parts = (cache.k[i], cache.v[i], cache.conv[i], cache.delta[i])
    return sum(nbytes(a) for a in parts if a is not None)


def test_linear_layer_cache_is_fixed_size(checkpoint):
    """A linear layer's state (conv window + delta matrix) is the same size at 8 and at 512
    slots; an attention layer's keys and values grow with the slots."""
    cfg = checkpoint[3].cfg
    short, long = (jax.eval_shape(lambda n=n: checkpoint[3].init_cache(2, n)) for n in (8, 512))
    for i, linear in enumerate(cfg.linear_layers):
        if linear:
            state = (cfg.linear_conv_kernel_dim - 1) * 64 + 4 * 8 * 8  # conv C = 64; Hv Dk Dv
            assert layer_bytes(short, i) == layer_bytes(long, i) == 2 * 4 * state
        else:
            assert layer_bytes(long, i) == 64 * layer_bytes(short, i)
    assert nbytes(long.k[0]) == 0  # a linear layer's k holds no slots
    assert cfg.num_params() == hf.count_params(checkpoint[3])


def test_refusals(checkpoint):
    """Packed rows, remat, LoRA and the samplers that edit the cache per row refuse, naming
    why."""
    if checkpoint[0] != "dense":
        pytest.skip("one variant is enough")
    model = checkpoint[3]
    tokens = jnp.ones((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="packed rows"):
        model.hidden_states(tokens, positions=jnp.zeros((1, 4), jnp.int32),
                            segment_ids=jnp.ones((1, 4), jnp.int32))  # fmt: skip
    with pytest.raises(ValueError, match="remat"):
        reconfigured(model, model.cfg.replace(remat="full"))
    with pytest.raises(ValueError, match="Qwen3.5"):
        add_adapters(model, rank=2, alpha=4.0, targets=("q_proj",), key=jax.random.key(0))
    with pytest.raises(ValueError, match="linear-attention layers"):
        ContinuousSampler(model, slots=2, pad_id=0)
    with pytest.raises(ValueError, match="linear-attention layers"):
        SpeculativeSampler(model, 1, pad_id=0)


def test_multimodal_checkpoint_loads_its_language_model(checkpoint, tmp_path):
    """A hub-style `Qwen3_5(Moe)ForConditionalGeneration` directory (the text config under
    `text_config`, tensors under `model.language_model.`, a vision tower and `mtp.*` layers
    beside them) loads as the same language model."""
    import json

    from safetensors.numpy import load_file, save_file

    variant, path, _, model, _ = checkpoint
    text = json.loads((path / "config.json").read_text())
    name = {"dense": "Qwen3_5ForConditionalGeneration", "moe": "Qwen3_5MoeForConditionalGeneration"}
    config = {"architectures": [name[variant]], "model_type": text["model_type"][: -len("_text")],
              "text_config": text, "vision_config": {"depth": 1}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = {
        n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n: a
        for n, a in load_file(path / "model.safetensors").items()
    }
    extra = np.zeros((2, 2), np.float32)
    save_file({**tensors, "model.visual.proj.weight": extra, "mtp.fc.weight": extra},
              tmp_path / "model.safetensors")  # fmt: skip
    loaded = hf.load(tmp_path)
    assert loaded.cfg == model.cfg
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(loaded))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_update_gradient_equals_transformers(checkpoint):
    """The gradient of the update's kind of loss (the summed log-probs of a left-padded
    batch's real next tokens) in every parameter equals transformers' autograd: the
    chunk-parallel delta rule's backward through the whole hybrid stack. (Dense only: the
    MoE's compile is left out to keep the file fast.)"""
    import torch

    from jaxrl_frontier.models.qwen3_5 import hybrid_tensor_specs

    variant, _, torch_model, model, _ = checkpoint
    if variant != "dense":
        pytest.skip("one variant is enough")
    tokens, mask = left_padded_batch(batch=2, length=18)
    weight = (mask[:, :-1] * mask[:, 1:]).astype(np.float32)  # real token -> real next token
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    torch_model.zero_grad()
    logits = torch_model(
        input_ids=torch.as_tensor(tokens, dtype=torch.long),
        attention_mask=torch.as_tensor(mask, dtype=torch.long),
        position_ids=torch.as_tensor(positions, dtype=torch.long),
    ).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    picked = logp.gather(-1, torch.as_tensor(tokens[:, 1:, None], dtype=torch.long))[..., 0]
    (picked * torch.as_tensor(weight)).sum().backward()
    ref = {n: p.grad.numpy() for n, p in torch_model.named_parameters()}

    graphdef, state = nnx.split(model)

    def loss(state):
        lp = jax.nn.log_softmax(nnx.merge(graphdef, state)(tokens, mask)[:, :-1], -1)
        return jnp.sum(jnp.take_along_axis(lp, tokens[:, 1:, None], -1)[..., 0] * weight)

    grads = dict(nnx.to_flat_state(jax.jit(jax.grad(loss))(state)))
    worst = {}  # per tensor: max |ours - transformers| / max |transformers|
    for spec in hybrid_tensor_specs(model.cfg):
        ours = spec.to_hf(np.asarray(grads[spec.path].get_value()))
        theirs = ref[spec.hf_name]
        worst[spec.hf_name] = np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-30)
    name = max(worst, key=worst.get)
    print(f"gradients: worst {name} {worst[name]:.1e} of its largest entry")
    assert worst[name] < 1e-4
