"""The RL step (run/rl_step.py, built by run/rl_build.py) wiring its stages in the trainer:
a custom PromptSource and RolloutEditor plug into the loop, and every weight, advantage,
aggregation and distillation name runs two steps with the step's learner gradient equal to
`objective_loss` on the same batch. (Each stage alone: tests/rl/sources/test_base.py,
tests/rl/produce/test_producer.py, tests/rl/learn/test_learner.py.)
"""

import json

import jax
import numpy as np
import pytest
from conftest import small_rl_config
from flax import nnx

from jaxrl_frontier.objectives import (
    TokenStats,
    advantages,
    aggregation,
    distillation,
    logprobs,
    losses,
    weights,
)
from jaxrl_frontier.rl.experience import RolloutRows
from jaxrl_frontier.rl.produce.editors import RolloutEditor
from jaxrl_frontier.rl.sources.base import PromptSource
from jaxrl_frontier.run import trainer as tr


class ReplayUnsolved(PromptSource):
    """A PromptSource written in a test: half of each batch replays prompts that none of a
    group's completions solved, the rest comes from a uniform source."""

    def __init__(self, fresh):
        self.fresh, self.queue, self.seen = fresh, [], []

    def next_batch(self):
        batch = self.fresh.next_batch()
        replay = self.queue[: len(batch) // 2]
        self.queue = self.queue[len(replay) :]
        return replay + batch[: len(batch) - len(replay)]

    def observe(self, results):
        self.seen.append([r.index for r in results])
        self.queue += [r.example for r in results if r.correct == 0.0]

    def state(self):
        return {"fresh": self.fresh.state(), "queue": self.queue}

    def restore(self, state):
        self.fresh.restore(state["fresh"])
        self.queue = state["queue"]


class FirstTokenOnly(RolloutEditor):
    """A RolloutEditor written in a test: keep each completion's first token only."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def edit(self, rows: RolloutRows) -> RolloutRows:
        self.calls += 1
        mask = rows.completion_mask.copy()
        mask[:, 1:] = 0
        tokens = np.where(mask == 1, rows.completion_tokens, self.tokenizer.pad_id)
        texts = tuple(self.tokenizer.decode(t[:1].tolist(), skip_special=True) for t in tokens)
        return rows.replace(completion_tokens=tokens, completion_mask=mask, texts=texts)


def test_a_custom_source_and_editor_plug_into_the_loop(tmp_path):
    c = small_rl_config()
    c.train.update(steps=3, log_every=1, eval_every=10**6, checkpoint_every=10**6)
    c.eval.update(num_prompts=4, batch=4, pass_k=1)
    trainer = tr.Trainer(c, str(tmp_path))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    source = trainer.step.source = ReplayUnsolved(trainer.source)
    editor = FirstTokenOnly(trainer.tokenizer)
    trainer.step.producer.editors = (editor,)
    trainer.run()
    assert editor.calls == 3 and len(source.seen) == 3
    # an untrained policy solves nothing: step 2 replays two of step 1's prompts
    assert source.seen[1][:2] == source.seen[0][:2]
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["rollout/response_length"] for r in rows if "train/loss" in r] == [1.0] * 3
    exp, _ = trainer.step.rollout(trainer.source.next_batch(), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(exp.loss_mask).sum(1), np.ones(16))


def _plain_loss(graphdef, objective):
    """The objective on full logits: no chunking, no shared prompt, no microbatches."""

    def loss(params, batch):
        logits = nnx.merge(graphdef, params)(batch["tokens"], batch["attention_mask"])
        stats = TokenStats(
            logp=logprobs.token_logprobs(logits, batch["tokens"]),
            old_logp=batch["old_logp"],
            mask=batch["loss_mask"],
            ref_logp=batch.get("ref_logp"),
            teacher_logp=batch.get("teacher_logp"),
            sc_logp=batch.get("sc_logp"),
            sc_kl=batch.get("sc_kl"),
        )
        extra = {}
        if batch.get("teacher_logits") is not None:
            extra = dict(teacher_logits=batch["teacher_logits"], tokens=batch["tokens"])
        return losses.objective_loss(stats, batch["advantages"], objective, logits=logits, **extra)[
            0
        ]

    return loss


NAMES = (
    [("weight", n) for n in weights.WEIGHTS.names()]
    # progress cannot train (run/config/validate.py); gae needs a critic (tests/rl/methods/test_ppo.py)
    + [("advantage", n) for n in advantages.ADVANTAGES.names() if n not in ("progress", "gae")]
    + [("aggregation", n) for n in aggregation.AGGREGATIONS.names()]
    + [("distill", n) for n in distillation.DISTILL_LOSSES.names()]
)


def _wired(tmp_path, kind: str, name: str) -> tr.Trainer:
    c = small_rl_config()
    c.teacher.init = "scratch"  # OPD, IW-OPD and the distillation losses read a teacher
    c.objective.reward_weights = dict(correctness=1.0, format=0.5, length=0.1)
    c.objective[kind] = name
    c.optimizer.update(lr=1e-2, warmup_steps=0)
    c.train.update(steps=2, eval_every=10**6, checkpoint_every=10**6, log_every=1)
    trainer = tr.Trainer(c, str(tmp_path))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    return trainer


@pytest.mark.parametrize("kind,name", NAMES, ids=[f"{k}={n}" for k, n in NAMES])
def test_every_objective_name_runs_two_steps_and_its_gradient_is_objective_loss(
    tmp_path, kind, name
):
    trainer = _wired(tmp_path, kind, name)
    assert trainer.run()["step"] == 2
    exp, _ = trainer.step.rollout(trainer.source.next_batch(), jax.random.key(5))
    _, got, _ = trainer.step.learner.gradient(exp)
    batch = dict(exp.update_batch())
    assert ("sc_logp" in batch) == (name == "sc_grpo")  # the pass runs when the weight needs it
    if kind == "distill":
        teacher = nnx.merge(nnx.graphdef(trainer.roles.teacher), trainer.roles.teacher_params)
        batch["teacher_logits"] = teacher(exp.tokens, exp.attention_mask)
    objective = trainer.step.learner.objective
    want = jax.grad(_plain_loss(trainer.roles.graphdef, objective))(trainer.state.params, batch)
    scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(want))
    assert scale > 1e-5, "a zero gradient would make the comparison vacuous"
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5 * scale)
