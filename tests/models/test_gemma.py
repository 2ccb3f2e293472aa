"""Gemma 2 and Gemma 3 (text) against transformers on the same weights.

Tiny random models are built with transformers in the test (every parameter redrawn, norm
weights around 0 as Gemma's (1 + w) norms store them), with sliding-window layers whose
window (4) is shorter than the sequences, a query pre-attention scalar other than the head
dim, soft-capping (Gemma 2), and two RoPE bases with linear scaling on the global layers
(Gemma 3). Checked: logits on a left-padded batch, greedy continuations from our sampler,
and save -> transformers load (the config mapping: tests/models/test_architectures.py).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import hf_logits, left_padded_batch, rel_diff
from flax import nnx

from jaxrl_frontier.models import hf
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling import Sampler, SamplingParams

WINDOW = 4
BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    query_pre_attn_scalar=24,  # not head_dim: the scale is checked
    sliding_window=WINDOW,
)
LOCAL_GLOBAL = ["sliding_attention", "sliding_attention", "full_attention"]
CASES = {
    "gemma2": (
        "Gemma2Config",
        dict(num_hidden_layers=2, attn_logit_softcapping=1.0, final_logit_softcapping=3.0),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=3,
            layer_types=LOCAL_GLOBAL,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
    ),
}
REL_TOL = 1e-5  # max |ours - transformers| / max |logit|, f32


def build_hf(case: str):
    """A random tiny transformers Gemma (eval, f32, eager attention: soft-capping)."""
    import torch
    import transformers

    cls_name, extra = CASES[case]
    config = getattr(transformers, cls_name)(**BASE, **extra, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((0.3 if "norm" in name else 0.1) * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """case -> (checkpoint dir, torch model, our loaded model), built once per case."""
    cache = {}

    def get(case):
        if case not in cache:
            torch_model = build_hf(case)
            path = tmp_path_factory.mktemp(case)
            # Gemma 3 through the sharded path (index + several files)
            torch_model.save_pretrained(path, max_shard_size="100KB" if case == "gemma3" else "5GB")
            cache[case] = (path, torch_model, hf.load(path))
        return cache[case]

    return get


def with_config(model, cfg):
    """The model's weights under another config of the same shapes."""
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    return nnx.merge(nnx.graphdef(abstract), nnx.state(model))


@pytest.mark.parametrize("case", sorted(CASES))
def test_logit_parity_and_round_trip(case, gemma, tmp_path):
    from transformers import AutoModelForCausalLM

    path, torch_model, model = gemma(case)
    assert type(torch_model).__name__ == {"gemma2": "Gemma2ForCausalLM"}.get(
        case, "Gemma3ForCausalLM"
    )
    if case == "gemma3":
        assert (path / "model.safetensors.index.json").is_file()
    tokens, mask = left_padded_batch(length=12)  # 12 > window 4
    ref = hf_logits(torch_model, tokens, mask)
    got = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))
    diff = rel_diff(got, ref, mask)
    print(f"{case}: max |logit diff| / max |logit| = {diff:.1e}")
    assert diff < REL_TOL

    # the window, the soft-caps and the local RoPE base each move the logits: not vacuous
    cfg = model.cfg
    variants = {"no window": dict(sliding_window=64)}
    if case == "gemma2":
        variants["no attention soft-cap"] = dict(attn_logit_softcap=None)
        variants["no final soft-cap"] = dict(final_logit_softcap=None)
    else:
        variants["one RoPE base"] = dict(rope_local_theta=cfg.rope_theta)
    for name, change in variants.items():
        other = with_config(model, cfg.replace(**change))
        got = np.asarray(other(jnp.asarray(tokens), jnp.asarray(mask)))
        assert rel_diff(got, ref, mask) > 100 * REL_TOL, name

    # our save -> transformers loads the same class and gives the same logits
    out = tmp_path / "saved"
    hf.save(model, out, base_config=hf.read_config(path), max_shard_size="100KB")
    assert (out / "model.safetensors.index.json").is_file()
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert "lm_head.weight" not in weight_map  # tied, as transformers writes it
    assert "model.layers.0.pre_feedforward_layernorm.weight" in weight_map
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(reloaded).__name__ == type(torch_model).__name__
    assert reloaded.config.layer_types == torch_model.config.layer_types
    assert rel_diff(hf_logits(reloaded, tokens, mask), ref, mask) < REL_TOL


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_continuation_matches_transformers(case, gemma):
    """Our sampler's greedy tokens are transformers' argmax at every step (teacher-forced
    over the prompt and our completion: the same as stepping greedily while they agree)."""
    path, torch_model, model = gemma(case)
    tn = 10
    tokens, mask = left_padded_batch(batch=2, length=8, seed=1)  # prompts of 8 and 6 tokens
    sampler = Sampler(model, pad_id=0, prompt_buckets=(8,), decode_phases=2)
    params = SamplingParams(max_new_tokens=tn, greedy=True)
    ro = sampler.generate(tokens, mask, params, jax.random.key(0))
    completion = np.asarray(ro.completion_tokens)
    full = np.concatenate([tokens, completion], 1)  # 18 positions: past the window
    full_mask = np.concatenate([mask, np.ones_like(completion)], 1)
    ref = hf_logits(torch_model, full, full_mask)[:, 7:-1]  # the logits predicting each token
    np.testing.assert_array_equal(completion, ref.argmax(-1))
    top2 = np.sort(ref, -1)[..., -2:]
    assert (top2[..., 1] - top2[..., 0]).min() > 1e-4  # no near-tie decided by rounding


def test_sliding_window_ring_cache_decode(gemma):
    """Gemma 3's sliding layers decode from rings of `sliding_window` slots: the same
    tokens and log-probs as the full-cache decode, and their cache stays W slots while the
    full layer's grows to prompt + completion."""
    from jaxrl_frontier.models.sliding_cache import cache_bytes
    from jaxrl_frontier.sampling.params import Knobs, Plan

    _, _, model = gemma("gemma3")
    tokens, mask = left_padded_batch(batch=2, length=8, seed=2)
    params = SamplingParams(max_new_tokens=14, greedy=True)  # the rings wrap 3 times
    key = jax.random.key(0)
    out = {}
    for ring in (True, False):
        sampler = Sampler(
            model, pad_id=0, prompt_buckets=(8,), decode_phases=2, sliding_window_cache=ring
        )
        (tok, msk), _ = sampler.pad_prompts(tokens, mask)
        plan, knobs, state = Plan.of(params), Knobs.of(params, 0), sampler.weights()
        slots = sampler.first_cache_size(8, plan) - 8
        cache, logits0, plen = sampler.prefill(
            state, tok, msk, key, knobs, n=1, use_dropout=False, slots=slots
        )
        version = np.int32(0)
        out[ring] = sampler.decode(
            state, cache, logits0, plen, (tok, msk), key, knobs, version, plan=plan
        )
    (ro_ring, cache_ring), (ro_full, cache_full) = out[True], out[False]
    np.testing.assert_array_equal(ro_ring.completion_tokens, ro_full.completion_tokens)
    np.testing.assert_allclose(ro_ring.policy_logp, ro_full.policy_logp, atol=1e-5)

    b, k, dh, size = 2, 2, 16, 8 + 14
    assert cache_ring.ring_layers == (True, True, False)
    for i, shape in enumerate([(b, k, WINDOW, dh)] * 2 + [(b, k, size, dh)]):
        assert cache_ring.k[i].shape == cache_ring.v[i].shape == shape
    assert all(x.shape == (b, k, size, dh) for x in cache_full.k + cache_full.v)
    ring_bytes, full_bytes = cache_bytes(cache_ring)
    assert ring_bytes == 2 * 2 * b * k * WINDOW * dh * 4  # 2 sliding layers, k and v, f32
    assert full_bytes == 2 * b * k * size * dh * 4


# Gemma 3's instruct chat template: <bos>, a system message folded into the first user
# turn, roles alternating user / model, each turn closed by <end_of_turn>.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/'
    '...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {{- message['content'] | trim }}\n"
    "    {{- '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]


def test_gemma_chat_template_through_the_chat_path(tmp_path):
    """Gemma's template renders as transformers renders it, its turns stop at
    <end_of_turn> (and the EOS), a prompt drops the template's <bos> (the tokenizer adds
    its own), and a multi-turn context extends turn by turn."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from jaxrl_frontier.data.tasks.chat import ChatPrompts, ChatTemplate
    from jaxrl_frontier.models.tokenizer import HFTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=GEMMA_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["what is 12 + 30? the answer is 42. user model"] * 4, trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in GEMMA_SPECIALS])
    tok.save(str(tmp_path / "tokenizer.json"))
    config = dict(
        tokenizer_class="PreTrainedTokenizerFast",
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        chat_template=GEMMA3_TEMPLATE,
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))

    chat, ours = ChatTemplate.from_dir(tmp_path), HFTokenizer(tmp_path)
    ref = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    conversation = [
        {"role": "system", "content": "You solve arithmetic."},
        {"role": "user", "content": "what is 12 + 30? "},
        {"role": "assistant", "content": "42"},
        {"role": "user", "content": "and 7 * 6?"},
    ]
    for gen in (True, False):
        text = chat.render(conversation, add_generation_prompt=gen)
        assert text == ref.apply_chat_template(
            conversation, add_generation_prompt=gen, tokenize=False
        )
    assert text.startswith("<bos><start_of_turn>user\nYou solve arithmetic.\n\nwhat is 12 + 30?")
    assert chat.assistant_suffix == "<end_of_turn>\n"
    end_of_turn, eos = ours.encode("<end_of_turn>"), ours.encode("<eos>")
    assert chat.stop_token_ids(ours) == end_of_turn + eos
    prompts = ChatPrompts(type("Task", (), {"prompt": lambda self, x: x})(), chat)
    assert (
        prompts.prompt("2+2?") == "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n"
    )
    turn = chat.turn_text(ours, conversation[1:3], [conversation[3]])
    assert turn == "\n<start_of_turn>user\nand 7 * 6?<end_of_turn>\n<start_of_turn>model\n"


def test_shared_prompt_forward_with_sliding_windows():
    """The update's shared-prompt forward (each group's prompt run once) builds the sliding
    layers' windows over the packed rows: the per-row forward's hidden states."""
    from jaxrl_frontier.models.random_init import random_model

    v4 = dict(BASE, architectures=["Gemma3ForCausalLM"], num_hidden_layers=3)
    cfg = hf.config_from_hf(dict(v4, sliding_window=3, sliding_window_pattern=3))
    assert cfg.sliding_layers == (True, True, False)
    model = random_model(cfg, std=0.2, norm_std=0.3)
    rng = np.random.RandomState(0)
    groups, n, tp, tn = 2, 2, 6, 5
    prompt_mask = np.ones((groups, tp), np.int32)
    prompt_mask[1, :2] = 0  # a left-padded prompt
    mask = np.concatenate([np.repeat(prompt_mask, n, 0), np.ones((groups * n, tn), np.int32)], 1)
    prompt = rng.randint(1, 128, (groups, tp))
    tokens = np.concatenate([np.repeat(prompt, n, 0), rng.randint(1, 128, (groups * n, tn))], 1)
    tokens, mask = jnp.asarray(tokens * mask), jnp.asarray(mask)
    graphdef, state = nnx.split(model)
    per_row = jax.jit(lambda s: nnx.merge(graphdef, s).hidden_states(tokens, mask)[0])
    per_row = np.asarray(per_row(state))
    shared = jax.jit(
        lambda s: nnx.merge(graphdef, s).hidden_states_shared_prompt(
            tokens, mask, prompt_len=tp, group_size=n
        )
    )(state)
    real = np.asarray(mask).astype(bool)
    # f32 hidden states of size ~4 through 3 layers: a few roundings apart
    assert np.abs(np.asarray(shared) - per_row)[real].max() < 1e-5 * np.abs(per_row).max()


def test_gemma2_chunked_logprobs_apply_the_final_softcap(gemma):
    """The update's chunked log-probs (hidden states and the output layer, no [B, T, V]
    logits), on padded rows and on packed ones, soft-cap the logits as `Transformer.logits`
    does: the full-logit log-probs."""
    from jaxrl_frontier.objectives.logprobs import OutputLayer
    from jaxrl_frontier.rl.learn.forward import apply_hidden, make_logp_fn
    from jaxrl_frontier.rl.learn.packing import PackSpec

    _, _, model = gemma("gemma2")
    graphdef, state = nnx.split(model)
    tokens, mask = map(jnp.asarray, left_padded_batch(length=12))
    assert isinstance(apply_hidden(graphdef)(state, tokens, mask)[1], OutputLayer)
    chunked = np.asarray(make_logp_fn(graphdef, 5)(state, tokens, mask))  # 5: a ragged chunk
    full = np.asarray(make_logp_fn(graphdef, None)(state, tokens, mask))
    real = np.asarray(mask)[:, 1:].astype(bool)
    np.testing.assert_allclose(chunked[:, 1:][real], full[:, 1:][real], atol=1e-5)
    # packed rows (`train.pack_tokens`) soft-cap too: two rows of up to 12 tokens a slot row
    # (a row's first token has no real predecessor there: scored 0, so compared from its 2nd)
    packed = np.asarray(make_logp_fn(graphdef, 5, pack=PackSpec(24))(state, tokens, mask))
    after = real & np.asarray(mask)[:, :-1].astype(bool)
    np.testing.assert_allclose(packed[:, 1:][after], full[:, 1:][after], atol=1e-5)
    uncapped = with_config(model, model.cfg.replace(final_logit_softcap=None))
    graphdef_u, state_u = nnx.split(uncapped)
    other = np.asarray(make_logp_fn(graphdef_u, 5)(state_u, tokens, mask))
    assert np.abs(other - chunked)[:, 1:][real].max() > 1e-2  # the cap matters here


def test_gemma3_multimodal_checkpoint_loads_its_language_model(tmp_path):
    """A Gemma3ForConditionalGeneration checkpoint: its text_config and its
    language_model.model.* tensors load (the vision tower is skipped) and give the
    multimodal model's text-only logits; a hub-style text_config that omits keys takes
    transformers' defaults."""
    import torch
    import transformers

    text = dict(BASE, num_hidden_layers=3, layer_types=LOCAL_GLOBAL)
    vision = dict(
        model_type="siglip_vision_model",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=8,
    )
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=125,
        eoi_token_index=126,
        image_token_index=127,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    torch_model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in torch_model.named_parameters():
            p.copy_((0.3 if "norm" in name else 0.1) * torch.randn_like(p))
    torch_model.save_pretrained(tmp_path)
    model = hf.load(tmp_path)
    assert model.cfg.family == "gemma3_text"  # saved back as a Gemma3ForCausalLM
    tokens, mask = left_padded_batch(length=12, vocab=120)  # no image tokens
    ref = hf_logits(torch_model, tokens, mask)
    got = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))
    assert rel_diff(got, ref, mask) < REL_TOL

    hub_style = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    }
    cfg = hf.config_from_hf(hub_style)
    assert (cfg.vocab_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (262208, 8, 4, 256)
    assert cfg.sliding_layers.count(False) == 34 // 6 and cfg.rope_theta == 1e6
