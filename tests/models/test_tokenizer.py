"""Tokenizers: round trips, left padding, save/load, an offline HF tokenizer, error messages."""

import json

import numpy as np
import pytest

from jaxrl_frontier.models.tokenizer import (
    DEFAULT_CHARS,
    CharTokenizer,
    HFTokenizer,
    load_tokenizer,
)

SENTENCES = [
    "the cat sat on the mat.",
    "what is 12 + 30? the answer is 42.",
    "a dog and a cat ran to the park",
    "so the total is \\boxed{7}",
]


@pytest.fixture
def hf_dir(tmp_path):
    """A tiny byte-level BPE trained in memory on a few sentences, saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES * 5, trainer=trainer)
    d = tmp_path / "hf"
    d.mkdir()
    tok.save(str(d / "tokenizer.json"))
    return d


# ---------------------------------------------------------------- CharTokenizer


def test_char_round_trip_and_layout():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == 4 + len(DEFAULT_CHARS)
    for text in ["123+45=168", "(3*7)-25/5", "\\boxed{1,000} #### 3.0", "", "a_b;c:d?"]:
        ids = tok.encode(text)
        assert all(4 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text


def test_char_decode_specials_and_eos():
    tok = CharTokenizer()
    ids = [tok.bos_id, *tok.encode("12"), tok.eos_id, *tok.encode("99"), tok.pad_id]
    assert tok.decode(ids) == "1299"
    assert tok.decode(ids, stop_at_eos=True) == "12"
    assert tok.decode(ids, skip_special=False) == "<bos>12<eos>99<pad>"
    assert tok.decode(np.asarray(ids), skip_special=False, stop_at_eos=True) == "<bos>12"


def test_char_ids_past_the_alphabet_decode_as_the_replacement_character():
    """A model with more rows than the alphabet (a padded vocabulary) may sample them."""
    tok = CharTokenizer()
    ids = tok.encode("12") + [tok.vocab_size, 511] + tok.encode("3")
    assert tok.decode(ids) == "12\ufffd\ufffd3"
    with pytest.raises(ValueError, match="negative id -1"):
        tok.decode([-1])


def test_char_unknown_character_error_names_char_and_position():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match=r"'X'.*position 3"):
        tok.encode("12+X5")
    with pytest.raises(ValueError, match=r"'é'.*position 0"):
        tok.encode("é")
    assert tok.encode("1X", errors="replace") == [tok.encode("1")[0], tok.unk_id]


def test_batch_encode_left_padding():
    tok = CharTokenizer()
    tokens, mask = tok.batch_encode(["1+1=", "12+345="], pad_to_multiple=4)
    assert tokens.dtype == np.int32 and mask.dtype == np.int32
    assert tokens.shape == mask.shape == (2, 8)  # longest is 8 with BOS, already a multiple of 4
    np.testing.assert_array_equal(mask[0], [0, 0, 0, 1, 1, 1, 1, 1])
    np.testing.assert_array_equal(mask[1], np.ones(8))
    np.testing.assert_array_equal(tokens[0, :3], [tok.pad_id] * 3)
    assert tokens[0, 3] == tok.bos_id and tokens[1, 0] == tok.bos_id
    np.testing.assert_array_equal(tokens[0, 4:], tok.encode("1+1="))
    # Every row ends at column T-1: the decode position is shared.
    assert tok.batch_decode(tokens) == ["1+1=", "12+345="]

    tokens, mask = tok.batch_encode(["1", "22"], add_bos=False, pad_to_multiple=8)
    assert tokens.shape == (2, 8)
    assert mask.sum(1).tolist() == [1, 2]


def test_batch_encode_max_len_error_and_truncate():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match=r"text 1 is 7 tokens long.*max_len=5"):
        tok.batch_encode(["1", "123456"], max_len=5)
    tokens, mask = tok.batch_encode(["1", "123456"], max_len=5, truncate=True)
    assert tokens.shape == (2, 5)
    assert tokens[1, 0] == tok.bos_id
    assert tok.decode(tokens[1]) == "3456"  # keeps the end of the prompt
    # pad_to_multiple is capped by max_len: pad_to_multiple=max_len gives one static shape.
    tokens, _ = tok.batch_encode(["1"], max_len=16, pad_to_multiple=16)
    assert tokens.shape == (1, 16)


def test_char_save_load(tmp_path):
    tok = CharTokenizer(DEFAULT_CHARS + "XYZ")
    tok.save(tmp_path / "ckpt")
    back = load_tokenizer(tmp_path / "ckpt")
    assert isinstance(back, CharTokenizer) and back == tok
    assert back.encode("XY1") == tok.encode("XY1")
    assert back != CharTokenizer()


def test_char_duplicate_chars_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        CharTokenizer("abca")


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="jaxrl_tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "jaxrl_tokenizer.json").write_text(json.dumps({"class": "sentencepiece"}))
    with pytest.raises(ValueError, match=r"unknown tokenizer class 'sentencepiece'.*char"):
        load_tokenizer(tmp_path)


# ---------------------------------------------------------------- HFTokenizer


def test_hf_round_trip_and_specials_from_names(hf_dir):
    tok = HFTokenizer(hf_dir)
    assert tok.pad_id == 0 and tok.bos_id == 1 and tok.eos_id == 2
    for text in SENTENCES + ["unseen words: zebra quux 9!"]:
        ids = tok.encode(text)
        assert tok.bos_id not in ids
        assert tok.decode(ids) == text
    ids = tok.encode("the cat")
    assert tok.decode([*ids, tok.eos_id, *tok.encode(" junk")], stop_at_eos=True) == "the cat"


def test_hf_left_padding(hf_dir):
    tok = HFTokenizer(hf_dir)
    texts = ["the cat", "what is 12 + 30? the answer is 42."]
    tokens, mask = tok.batch_encode(texts, pad_to_multiple=8)
    assert tokens.shape[1] % 8 == 0
    n0 = len(tok.encode(texts[0])) + 1
    assert mask[0].sum() == n0 and mask[0, -n0:].all() and not mask[0, :-n0].any()
    assert (tokens[0, :-n0] == tok.pad_id).all() and tokens[0, -n0] == tok.bos_id
    assert tok.batch_decode(tokens) == texts


def test_hf_specials_passed_in_and_config(hf_dir):
    tok = HFTokenizer(hf_dir, eos="<pad>", pad=2, no_bos=True)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (2, None, 0)
    tokens, mask = tok.batch_encode(["the cat"])  # no BOS to add
    assert mask.sum() == len(tok.encode("the cat"))
    with pytest.raises(ValueError, match=r"eos token '<nope>' from argument"):
        HFTokenizer(hf_dir, eos="<nope>")
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<s>"}))
    assert HFTokenizer(hf_dir).eos_id == 1


def test_hf_save_load(hf_dir, tmp_path):
    tok = HFTokenizer(hf_dir, no_bos=True)
    tok.save(tmp_path / "ckpt")
    back = load_tokenizer(tmp_path / "ckpt")
    assert isinstance(back, HFTokenizer) and back == tok
    assert back.bos_id is None
    assert back.encode(SENTENCES[1]) == tok.encode(SENTENCES[1])
    # A plain HF model directory (tokenizer.json only) loads too.
    assert isinstance(load_tokenizer(hf_dir), HFTokenizer)
