"""The judge's sampled verdicts (rl/produce/judge_verdicts.py): a tiny random judge's greedy
verdict tokens equal transformers' `generate` on the same prompts (two batches of 3, the
last padded), and a JudgeScorer over them parses each verdict or counts it as a failure
scored `judge.unparsed_score`."""

import dataclasses
import types

import numpy as np
import pytest
from conftest import JUDGE_ROWS, judge_question

from jaxrl_frontier.data.rewards.judge import JudgeRole, JudgeScorer, JudgeSection, parse_verdict
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.rl.produce.judge_verdicts import SampledVerdicts

TOKENIZER = CharTokenizer()
ROWS = types.SimpleNamespace(**JUDGE_ROWS)
QUESTION = judge_question
SAMPLED = JudgeSection(init="random", chat=False, max_len=40, mode="sampled",
                       prompt="{question}{completion}?", max_verdict_tokens=4, batch_size=3)  # fmt: skip


@pytest.fixture(scope="module")
def judge(char_judge):
    return char_judge


@pytest.fixture(scope="module")
def verdicts(judge):
    """One SampledVerdicts over our tiny judge (its programs compiled once for the module)."""
    return SampledVerdicts(JudgeRole(judge[1], TOKENIZER), SAMPLED)


def test_greedy_verdict_tokens_equal_transformers_generate(judge, verdicts):
    import torch

    torch_model, _ = judge
    prompts = ["1+2=3?", "1+2=4?", "3+4=7?", "3+4=9?"]  # two batches of 3: the last padded
    tokens, mask = verdicts.token_rows(prompts)
    for row, prompt in enumerate(prompts):
        ids = torch.as_tensor([[TOKENIZER.bos_id, *TOKENIZER.encode(prompt)]])
        with torch.no_grad():
            out = torch_model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=4,
                eos_token_id=TOKENIZER.eos_id, pad_token_id=TOKENIZER.pad_id,
            )  # fmt: skip
        want = out[0, ids.shape[1] :].tolist()
        got = tokens[row, : mask[row].sum()].tolist()
        assert got == want, (prompt, got, want)


def test_sampled_scores_count_and_score_the_parse_failures(verdicts):
    texts = {"1+2=3?": "yes!", "1+2=4?": "12", "3+4=7?": "7", "3+4=9?": "huh"}
    options = dataclasses.replace(SAMPLED, unparsed_score=-1.0)
    scorer = JudgeScorer(lambda prompts: [texts[p] for p in prompts], TOKENIZER, options,
                         question_of=QUESTION)  # fmt: skip
    out = scorer(ROWS, np.zeros((4, 1), np.float32))
    np.testing.assert_allclose(out[:, 1], [1.0, -1.0, 7.0, -1.0])
    assert scorer.metrics()["judge/parse_failures"] == 2.0
    # the tiny random judge's own verdicts: each parsed or counted, none lost
    real = JudgeScorer(verdicts, TOKENIZER, SAMPLED, question_of=QUESTION)
    scores = real.score(ROWS)
    texts = verdicts(["1+2=3?", "1+2=4?", "3+4=7?", "3+4=9?"])
    failed = sum(parse_verdict(t, SAMPLED) is None for t in texts)
    assert real.parse_failures == failed and scores.shape == (4,)
