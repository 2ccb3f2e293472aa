"""The reward model as a reward shaper (data/rewards/reward_model.py): its normalisations by
hand, the rows' texts as it reads them (plain and chat), its scores equal to the classifier's
own forward whatever the batch size, and the column it appends."""

import types

import numpy as np
import pytest
from conftest import random_model

from jaxrl_frontier.data.rewards.reward_model import (
    RewardModelRole,
    RewardModelScorer,
    RewardModelSection,
    normalized,
)
from jaxrl_frontier.data.tasks.chat import ChatTemplate
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.tokenizer import CharTokenizer

TOKENIZER = CharTokenizer()
CFG = ModelConfig(
    vocab_size=TOKENIZER.vocab_size, hidden_size=16, intermediate_size=32, num_layers=1,
    num_heads=2, num_kv_heads=1, num_labels=2,
)  # fmt: skip
MODEL = random_model(CFG)
ROWS = types.SimpleNamespace(
    examples=({"q": "1+2="}, {"q": "3+4="}), texts=("3", "4", "7", "8"), group_size=2
)
TEMPLATE = ChatTemplate(
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}", name="toy"
)


def scorer(chat_template=None, **options):
    role = RewardModelRole(MODEL, TOKENIZER, chat_template)
    options = RewardModelSection(init="random", max_len=12, label=1, **options)
    return RewardModelScorer(
        role, options, prompt_of=lambda e: "q: " + e["q"], question_of=lambda e: e["q"]
    )


def test_normalisations_by_hand():
    s = np.array([1.0, 3.0, 2.0, 2.0])
    np.testing.assert_array_equal(normalized(s, "none", 2), s)
    z = (s - 2.0) / (np.sqrt(0.5) + 1e-6)  # mean 2, std sqrt(0.5) over the batch
    np.testing.assert_allclose(normalized(s, "batch", 2), z, rtol=1e-6)
    # per group: (1, 3) -> (-1, 1); (2, 2) -> (0, 0) (std 0: the 1e-6 guard)
    np.testing.assert_allclose(normalized(s, "group", 2), [-1, 1, 0, 0], atol=1e-5)


def test_the_texts_it_reads_plain_and_chat():
    assert scorer().texts(ROWS) == ["q: 1+2=3", "q: 1+2=4", "q: 3+4=7", "q: 3+4=8"]
    chat = scorer(TEMPLATE, template="chat").texts(ROWS)
    assert chat[2] == "<user>3+4=<assistant>7"
    with pytest.raises(ValueError, match="reward_model.template' = 'chat'"):
        scorer(None, template="chat")


def test_scores_are_the_classifiers_and_the_column_is_appended():
    texts = scorer().texts(ROWS)
    tokens, mask = TOKENIZER.batch_encode(texts, max_len=12, pad_to_multiple=12, truncate=True)
    want = np.asarray(MODEL.sequence_scores(tokens, mask))[:, 1]  # label 1
    np.testing.assert_allclose(scorer().score(texts), want, rtol=1e-6)
    # 3 rows a forward: the last batch padded to 3 rows, the padding dropped
    np.testing.assert_allclose(scorer(batch_size=3).score(texts), want, rtol=1e-5, atol=1e-6)
    rm = scorer(normalize="group")
    out = rm(ROWS, np.ones((4, 2), np.float32))
    assert out.shape == (4, 3) and (out[:, :2] == 1).all()
    np.testing.assert_allclose(out[:, 2], normalized(want, "group", 2), rtol=1e-4, atol=1e-5)
    assert rm.metrics()["reward_model/score_mean"] == pytest.approx(float(want.mean()), rel=1e-5)
