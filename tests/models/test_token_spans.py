"""Token spans and the map between two tokenizations of one text (models/token_spans.py):
by hand on the characters, and between SmolLM2-135M-Instruct's byte-level BPE and
Gemma-3-270M's SentencePiece on texts with multi-byte characters, digits and whitespace
runs: every teacher token lands on the student token where its text ends, and the sum is
kept."""

import numpy as np
import pytest

from jaxrl_frontier.models import pretrained, token_spans
from jaxrl_frontier.models.tokenizer import CharTokenizer, load_tokenizer

TEXTS = (
    "12 + 345 = 357",
    "naïve café:   Ünïcödé  ok",
    "x\n\n   y\t\t7 — 😀 done",
)


def test_spans_and_owners_by_hand():
    chars = CharTokenizer()
    assert token_spans.ends(chars, chars.encode("ab c")).tolist() == [1, 2, 3, 4]
    # student "ab|c|de" (ends 2, 3, 5) against teacher "a|bcd|e" (ends 1, 4, 5): "a" ends
    # in student token 0, "bcd" in token 2, "e" in token 2; student token 1 gets nothing
    owner = token_spans.owners(np.array([2, 3, 5]), np.array([1, 4, 5]))
    assert owner.tolist() == [0, 2, 2]
    got = token_spans.to_student_tokens(np.array([-1.0, -2.0, -0.5]), owner, 3)
    np.testing.assert_allclose(got, [-1.0, 0.0, -2.5])
    # a teacher token of no characters goes with the one before it
    assert token_spans.owners(np.array([2, 3]), np.array([1, 1, 3])).tolist() == [0, 0, 1]


@pytest.fixture(scope="module")
def tokenizers():
    return tuple(
        load_tokenizer(pretrained.fetch(name, say=lambda _: None))
        for name in ("smollm2-135m-instruct", "gemma-3-270m")
    )


@pytest.mark.parametrize("text", TEXTS)
def test_two_real_tokenizations_of_one_text(tokenizers, text):
    smol, gemma = tokenizers
    for student, teacher in ((smol, gemma), (gemma, smol)):
        s_ids, t_ids = student.encode(text), teacher.encode(text)
        s_ends, t_ends = token_spans.ends(student, s_ids), token_spans.ends(teacher, t_ids)
        for tok, ids, e in ((student, s_ids, s_ends), (teacher, t_ids, t_ends)):
            decoded = tok.decode(ids)
            assert decoded == text and e[-1] == len(text) and (np.diff(e) >= 0).all()
        owner = token_spans.owners(s_ends, t_ends)
        for j, i in enumerate(owner):  # teacher token j's last character is in token i
            if t_ends[j] > (t_ends[j - 1] if j else 0):
                last = t_ends[j] - 1
                assert (s_ends[i - 1] if i else 0) <= last < s_ends[i]
        logp = -np.arange(1.0, len(t_ids) + 1)
        got = token_spans.to_student_tokens(logp, owner, len(s_ids))
        assert got.sum() == pytest.approx(logp.sum())  # every teacher token counted once
