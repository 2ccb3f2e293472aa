"""The generative judge (data/rewards/judge.py): its yes-probability and expected-score
verdicts against a reference computed by hand from transformers' logits on the same judge
prompts, the pairwise mode, whose two orders cancel a judge's preference for the first
position, and the sampled mode's parse rule on hand-written verdicts (its decode:
tests/rl/produce/test_judge_verdicts.py)."""

import math
import types

import numpy as np
import pytest
from conftest import JUDGE_ROWS, hf_logits, judge_question

from jaxrl_frontier.data.rewards.judge import (
    JudgeRole,
    JudgeScorer,
    JudgeSection,
    NextTokenProbs,
    pairwise_scores,
    parse_verdict,
)
from jaxrl_frontier.models.tokenizer import CharTokenizer

TOKENIZER = CharTokenizer()
ROWS = types.SimpleNamespace(**JUDGE_ROWS)
QUESTION = judge_question
OPTIONS = dict(init="random", yes=("y",), no=("n",), chat=False, max_len=40)


@pytest.fixture(scope="module")
def judge(char_judge):
    return char_judge


def reference_probs(torch_model, prompts, ids):
    """softmax of transformers' logits at each prompt's last token, at the given ids."""
    tokens, mask = TOKENIZER.batch_encode(prompts, max_len=40, pad_to_multiple=40, truncate=True)
    z = hf_logits(torch_model, tokens, mask)[:, -1].astype(np.float64)
    p = np.exp(z - z.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True))[:, ids]


@pytest.mark.parametrize("mode", ["yes_prob", "expected_score"])
def test_verdicts_equal_transformers_by_hand(judge, mode):
    torch_model, model = judge
    options = JudgeSection(**OPTIONS, mode=mode, prompt="{question}{completion}?", scale=9)
    probs = NextTokenProbs(JudgeRole(model, TOKENIZER), options)
    scorer = JudgeScorer(probs, TOKENIZER, options, question_of=QUESTION)
    prompts = ["1+2=3?", "1+2=4?", "3+4=7?", "3+4=9?"]
    if mode == "yes_prob":
        p = reference_probs(torch_model, prompts, TOKENIZER.encode("yn"))
        want = p[:, 0] / (p[:, 0] + p[:, 1])
    else:
        p = reference_probs(torch_model, prompts, TOKENIZER.encode("123456789"))
        want = (p * np.arange(1, 10)).sum(1) / p.sum(1)
    got = scorer.score(ROWS)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # with batches of 3 prompts (the last padded), the same verdicts
    small = JudgeScorer(
        NextTokenProbs(JudgeRole(model, TOKENIZER), JudgeSection(**{**OPTIONS, "batch_size": 3})),
        TOKENIZER, options, question_of=QUESTION,
    )  # fmt: skip
    np.testing.assert_allclose(small.score(ROWS), got, rtol=1e-5, atol=1e-7)


def biased_judge(quality: dict, bias: float):
    """P(yes | first, second) = sigmoid(q(first) - q(second) + bias), the verdicts written as
    the prompt '{first}|{second}': a judge that prefers the first position by `bias`."""

    def probs(prompts, ids):
        out = []
        for prompt in prompts:
            first, second = prompt.split("|")
            p = 1 / (1 + math.exp(-(quality[first] - quality[second] + bias)))
            out.append([p, 1 - p])
        return np.asarray(out)

    return probs


def test_pairwise_cancels_the_first_position_bias():
    options = JudgeSection(**OPTIONS, mode="pairwise", prompt="{first}|{second}")
    rows = types.SimpleNamespace(examples=({"q": "a"},), texts=("x", "y", "z", "w"), group_size=4)
    # equal completions: a judge that always prefers the first would give sigmoid(3) = 0.95
    # in one order; both orders give exactly 1/2
    same = JudgeScorer(biased_judge(dict.fromkeys("xyzw", 0.0), 3.0), TOKENIZER, options,
                       question_of=QUESTION)  # fmt: skip
    np.testing.assert_allclose(same.score(rows), 0.5, atol=1e-12)
    # better completions still rank higher under the bias
    quality = dict(x=2.0, y=0.0, z=1.0, w=-1.0)
    scores = JudgeScorer(biased_judge(quality, 3.0), TOKENIZER, options, question_of=QUESTION)
    got = scores.score(rows)
    assert list(np.argsort(-got)) == [0, 2, 1, 3]
    assert got.mean() == pytest.approx(0.5)  # every comparison's two sides sum to 1


def test_pairwise_scores_by_hand_for_two_completions():
    # P(yes | 0 first) = 0.9, P(yes | 1 first) = 0.3: P(0 > 1) = (0.9 + 1 - 0.3) / 2 = 0.8
    table = {(0, 1): 0.9, (1, 0): 0.3}
    got = pairwise_scores(lambda pairs: np.array([table[p] for p in pairs]), 2)
    np.testing.assert_allclose(got, [0.8, 0.2])
    with pytest.raises(ValueError, match="judge.yes': 'yes' is 3 tokens"):
        JudgeScorer(None, TOKENIZER, JudgeSection(init="random"), question_of=QUESTION)


SAMPLED = JudgeSection(**{**OPTIONS, "yes": ("yes", "Yes"), "no": ("no", "No")}, mode="sampled",
                       prompt="{question}{completion}?", max_verdict_tokens=4, batch_size=3)  # fmt: skip


@pytest.mark.parametrize(
    "text, want",
    [
        ("7", 7.0), (" 3/9, since", 3.0), ("Score: 9.", 9.0), ("yes", 1.0), ("No.", 0.0),
        ("Yes, 2", 1.0), ("I'd say 4", 4.0), ("10", None), ("0", None), ("maybe", None),
        ("nothing", None), ("", None), ("#$%", None),
    ],
)  # fmt: skip
def test_parse_verdict_by_the_documented_rule(text, want):
    assert parse_verdict(text, SAMPLED) == want


def test_a_verdict_pattern_that_is_not_a_regex_names_the_key():
    with pytest.raises(ValueError, match="judge.verdict_pattern' = '\\(' is not a regular"):
        JudgeSection(verdict_pattern="(")
    with pytest.raises(ValueError, match="judge.mode"):
        JudgeSection(mode="sample")
