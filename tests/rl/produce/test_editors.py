"""Rollout editors and reward shapers: DAPO's overlong shaping and truncated masking, DRE
(verified prefix kept exactly, stop-token log-prob from a teacher-forced forward)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_rl_config
from flax import nnx

from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.rl.experience import RolloutRows
from jaxrl_frontier.rl.produce.editors import (
    DynamicRolloutEditing,
    MaskTruncated,
    OverlongShaping,
    build_editors,
    overlong_penalty,
)
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import trainer as tr
from jaxrl_frontier.run.config import sections
from jaxrl_frontier.sampling import Rollout

TASK = make_task("arithmetic", max_digits=1, ops="+", prompt_template="{a}{op}{b}=")
TOK = CharTokenizer()


def _rows(examples, texts, tn=4, eos=True) -> RolloutRows:
    """Rows of the given completion texts (each + EOS when `eos`), padded to tn."""
    ids = [TOK.encode(t) + ([TOK.eos_id] if eos else []) for t in texts]
    tok = np.full((len(ids), tn), TOK.pad_id, np.int32)
    mask = np.zeros((len(ids), tn), np.int32)
    for b, x in enumerate(ids):
        tok[b, : len(x)], mask[b, : len(x)] = x[:tn], 1
    logp = -0.1 * mask.astype(np.float32)
    return RolloutRows(tuple(examples), tok, mask, mask.copy(), logp, tuple(texts))


def test_overlong_penalty_by_hand():
    # L_max = 6, L_cache = 2: 0 up to 4 tokens, (4 - |y|) / 2 on (4, 6], -1 beyond
    got = overlong_penalty(np.asarray([3, 4, 5, 6, 7]), 6, 2)
    np.testing.assert_allclose(got, [0.0, 0.0, -0.5, -1.0, -1.0])
    rows = _rows([TASK.example("train", 0)] * 2, ["12", "1234"], tn=6)  # 3 and 5 tokens
    out = OverlongShaping(6, 2)(rows, np.ones((2, 3), np.float32))
    np.testing.assert_allclose(out, [[1, 1, 1, 1.0], [1, 1, 1, 0.5]])  # 1 + R_len
    with pytest.raises(ValueError, match="rollout.overlong_cache"):
        OverlongShaping(6, 7)


def test_mask_truncated_zeroes_the_loss_of_rows_without_a_stop_token():
    ex = TASK.example("train", 0)
    ended = _rows([ex], ["12"], tn=4)
    cut = _rows([ex], ["1234"], tn=4, eos=False)
    rows = ended.replace(
        completion_tokens=np.concatenate([ended.completion_tokens, cut.completion_tokens]),
        completion_mask=np.concatenate([ended.completion_mask, cut.completion_mask]),
        policy_mask=np.concatenate([ended.policy_mask, cut.policy_mask]),
        policy_logp=np.concatenate([ended.policy_logp, cut.policy_logp]),
        texts=("12", "1234"),
    )
    editor = MaskTruncated(TOK.eos_id)
    out = editor.edit(rows)
    np.testing.assert_array_equal(out.policy_mask, [[1, 1, 1, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(out.completion_mask, rows.completion_mask)  # still scored
    assert editor.metrics() == {"rollout/truncated_share": 0.5}


def test_dre_keeps_exactly_the_verified_prefix():
    ex = dict(TASK.example("train", 0))
    ans = str(ex["answer"])
    texts = [ans + "  ", ans, ans + "9", " " + ans + " "]  # G = 4, one prompt
    rows = _rows([ex], texts, tn=5)
    dre = DynamicRolloutEditing(TASK, TOK, bonus=0.1)
    out = dre.edit(rows)
    n = len(ans)
    # row 0: correct with trailing spaces -> its answer + EOS; row 1 already minimal; row 2
    # wrong ("<ans>9"), untouched; row 3: " <ans> " -> the shortest verified prefix " <ans>"
    want0 = TOK.encode(ans) + [TOK.eos_id]
    np.testing.assert_array_equal(out.completion_tokens[0, : n + 1], want0)
    assert (out.completion_tokens[0, n + 1 :] == TOK.pad_id).all()
    np.testing.assert_array_equal(out.completion_mask[0], [1] * (n + 1) + [0] * (4 - n))
    np.testing.assert_array_equal(out.completion_tokens[1:3], rows.completion_tokens[1:3])
    want3 = TOK.encode(" " + ans) + [TOK.eos_id]
    np.testing.assert_array_equal(out.completion_tokens[3, : n + 2], want3)
    assert out.texts == (ans, ans, ans + "9", " " + ans)
    # the prefix keeps its behaviour log-probs; the stop token's is left to the recompute
    np.testing.assert_allclose(out.policy_logp[0, :n], -0.1)
    assert out.policy_logp[0, n] == 0.0
    assert out.policy_mask[0, n] == 1  # the inserted stop token is trained
    shaped = dre(out, np.zeros((4, 3), np.float32))
    np.testing.assert_allclose(shaped[:, 3], [0.1, 0.0, 0.0, 0.1])  # edited rows preferred
    # tokens after the answer: row 0 had 2 spaces + EOS after "<ans>" + EOS -> 2; row 3 -> 1
    assert dre.metrics() == {
        "dre/edited": 2.0,
        "dre/tokens_after_answer_before": 3.0,
        "dre/tokens_after_answer_after": 0.0,
    }


def test_dre_measures_the_tokens_after_the_answer_after_editing():
    """`after` is measured on the edited rows: rows left with text after their answer count."""
    ex = dict(TASK.example("train", 0))
    ans = str(ex["answer"])
    rows = _rows([ex], [ans + "  ", ans, ans + "9", " " + ans + " "], tn=5)
    dre = DynamicRolloutEditing(TASK, TOK, bonus=0.1)
    assert dre.tokens_after_answer(rows) == 3  # as the edit's `before`
    out = dre.edit(rows)
    assert dre.tokens_after_answer(out) == 0
    # an edit that left row 0 as it was: its 2 trailing spaces are still after the answer
    half = out.replace(
        completion_tokens=np.concatenate([rows.completion_tokens[:1], out.completion_tokens[1:]]),
        completion_mask=np.concatenate([rows.completion_mask[:1], out.completion_mask[1:]]),
        texts=(rows.texts[0], *out.texts[1:]),
    )
    assert dre.tokens_after_answer(half) == 2


def test_build_editors_reads_the_config_and_names_the_key():
    c = config_lib.base_config()
    c.rollout.editors = ("dre",)
    c.rollout.mask_truncated, c.rollout.overlong_cache = True, 2
    editors, shapers = build_editors(sections.editor_options(c), task=TASK, tokenizer=TOK)
    assert [type(e).__name__ for e in editors] == ["DynamicRolloutEditing", "MaskTruncated"]
    assert [s.reward_names for s in shapers] == [("dre",), ("overlong",)]
    c.rollout.editors = ("nope",)
    with pytest.raises(config_lib.ConfigError, match="rollout.editors"):
        build_editors(sections.editor_options(c), task=TASK, tokenizer=TOK)


class AnswerThenSpaces:
    """A sampler that answers every prompt correctly, then pads with spaces up to Tn - 1 and
    stops: every row is a correct rollout that keeps generating after its answer."""

    mesh, stats = None, {}  # a Sampler's: no mesh of its own, no decode statistics

    def update_weights(self, weights, version=None):
        pass

    def generate(self, tokens, mask, params, key):
        n, tn = params.n, params.max_new_tokens
        rows = []
        for t, m in zip(np.asarray(tokens), np.asarray(mask)):
            a, b = TOK.decode(t[m.astype(bool)].tolist()).rstrip("=").split("+")
            ids = TOK.encode(str(int(a) + int(b)))
            ids = ids + TOK.encode(" " * (tn - 1 - len(ids))) + [TOK.eos_id]
            rows += [ids] * n
        comp = np.asarray(rows, np.int32)
        ones = np.ones_like(comp)
        j = jnp.asarray
        return Rollout(
            prompt_tokens=j(np.repeat(tokens, n, 0)),
            prompt_mask=j(np.repeat(mask, n, 0)),
            completion_tokens=j(comp),
            completion_mask=j(ones),
            policy_mask=j(ones),
            lengths=j(ones.sum(1)),
            finish_reason=j(np.zeros(len(comp), np.int32)),
            sample_logp=j(-ones.astype(np.float32)),
            policy_logp=j(-ones.astype(np.float32)),
            policy_version=j(np.zeros(len(comp), np.int32)),
            group_size=n,
        )


def test_dre_through_the_producer_recomputes_the_edited_log_probs_by_a_forward(tmp_path):
    c = small_rl_config()
    c.rollout.max_new_tokens = 5
    c.rollout.editors = ("dre",)
    c.train.update(steps=2, log_every=1, eval_every=10**6, checkpoint_every=10**6)
    trainer = tr.Trainer(c, str(tmp_path))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    trainer.step.producer.sampler = AnswerThenSpaces()
    exp, info = trainer.step.rollout(trainer.source.next_batch(), jax.random.key(0))
    tok, am = np.asarray(exp.tokens), np.asarray(exp.attention_mask)
    tp = tok.shape[1] - 5
    for b, res in enumerate(r for r in info["results"] for _ in range(4)):
        ans = TOK.encode(str(res.example["answer"]))
        np.testing.assert_array_equal(tok[b, tp : tp + len(ans) + 1], ans + [TOK.eos_id])
        assert am[b, tp:].sum() == len(ans) + 1
    # every edited token's old log-prob = a teacher-forced forward of the edited sequence
    model = nnx.merge(trainer.roles.graphdef, trainer.state.params)
    logits = model(exp.tokens, exp.attention_mask)
    direct = jnp.take_along_axis(
        jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32)), exp.tokens[:, 1:, None], -1
    )[..., 0]
    lm = np.asarray(exp.loss_mask)[:, 1:]
    np.testing.assert_allclose(
        np.asarray(exp.old_logp)[:, 1:] * lm, np.asarray(direct) * lm, atol=2e-5
    )
    assert (np.asarray(exp.old_logp)[:, tp:] != 0).sum() == lm.sum()  # no placeholder left
    # the dre component marks every (edited) row; the metrics count them
    np.testing.assert_allclose(np.asarray(exp.rewards)[:, -1], 0.1)
    m = {k: float(v) for k, v in info["metrics"].items()}
    assert m["dre/edited"] == 16 and m["dre/tokens_after_answer_after"] == 0
    assert m["dre/tokens_after_answer_before"] == sum(
        5 - (len(str(r.example["answer"])) + 1) for r in info["results"] for _ in range(4)
    )
    # and a short run trains with it, logging its metrics
    trainer.run()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert all("dre/edited" in r for r in rows if "train/loss" in r)


def test_overlong_shaping_and_truncated_masking_through_the_trainer(tmp_path):
    c = small_rl_config()
    c.rollout.update(mask_truncated=True, overlong_cache=1)
    c.train.update(steps=2, log_every=1, eval_every=10**6, checkpoint_every=10**6)
    trainer = tr.Trainer(c, str(tmp_path))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    exp, info = trainer.step.rollout(trainer.source.next_batch(), jax.random.key(0))
    ends = np.asarray([res.lengths for res in info["results"]]).reshape(-1)
    cut = np.asarray(exp.loss_mask).sum(1) == 0  # masked rows
    # a masked row ran to the 3-token budget without a stop token: its overlong reward is
    # 1 + R_len = 0 (|y| = L_max); every 3-token row is at 0, shorter ones at 1
    np.testing.assert_allclose(np.asarray(exp.rewards)[:, -1], np.where(ends == 3, 0.0, 1.0))
    last = np.asarray(exp.tokens)[:, -1]
    np.testing.assert_array_equal(cut, (ends == 3) & (last != TOK.eos_id))  # exactly the cut
    trainer.run()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 2
    assert all({"rollout/truncated_share", "reward/overlong"} <= set(r) for r in steps)
