"""Several teachers (`teacher.by_tag`) through the trainer: each rollout row's teacher
log-probs come from the teacher its example's tag names (two teachers that differ), a table
naming only the main teacher builds today's single-teacher run, a full-vocabulary loss runs
with several teachers, and the combinations it does not serve are refused, naming the keys."""

import jax
import numpy as np
import pytest
from conftest import config_error, random_model, small_rl_config
from flax import nnx

from jaxrl_frontier.models import hf
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.rl.learn.forward import make_logp_fn
from jaxrl_frontier.run import trainer as tr
from jaxrl_frontier.run.build import model_config_from


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two teachers of the small config's shape that differ (their own random weights)."""
    cfg = model_config_from(small_rl_config(), CharTokenizer())
    paths = []
    for seed in (1, 2):
        path = tmp_path_factory.mktemp(f"teacher{seed}")
        hf.save(random_model(cfg, seed=seed), path)
        paths.append(str(path))
    return paths


def _config(main: str, by_tag: dict):
    c = small_rl_config()
    c.teacher.update(init="hf", path=main, tag_key="index")
    c.teacher.by_tag = by_tag
    c.objective.update(advantage="opd", weight="pg")
    c.objective.advantage_kwargs = dict(estimator="immediate")
    c.train.steps = 1
    return c


def test_each_row_is_scored_by_its_examples_teacher(checkpoints, tmp_path):
    a, b = checkpoints
    trainer = tr.Trainer(_config(a, {"1": b, "3": b}), str(tmp_path))  # examples 1, 3: b
    assert len(trainer.roles.tagged_teachers) == 1
    examples = [trainer.task.example("train", i) for i in range(4)]
    exp, _ = trainer.step.rollout(examples, jax.random.key(0))
    g = trainer.config.rollout.group_size
    logp = make_logp_fn(nnx.graphdef(trainer.roles.teacher), None)
    mask = np.asarray(exp.loss_mask)
    own = {
        path: np.asarray(logp(nnx.state(hf.load(path)), exp.tokens, exp.attention_mask)) * mask
        for path in (a, b)
    }
    got = np.asarray(exp.teacher_logp)
    for row in range(len(got)):
        path = b if examples[row // g]["index"] in (1, 3) else a
        np.testing.assert_allclose(got[row], own[path][row], rtol=1e-6, atol=1e-6)
    assert np.abs(own[a] - own[b]).max() > 1e-2  # the two teachers differ on these rows


def test_a_table_naming_only_the_main_teacher_is_the_single_teacher_run(checkpoints, tmp_path):
    a, _ = checkpoints
    trainer = tr.Trainer(_config(a, {"1": a}), str(tmp_path))
    assert trainer.roles.tagged_teachers == () and trainer.step.producer.teachers.index_of is None


def test_what_several_teachers_and_a_teachers_own_tokenizer_do_not_serve_is_refused(
    checkpoints,
):
    a, b = checkpoints
    c = _config(a, {})
    c.teacher.tokenizer = "own"
    c.objective.distill = "forward_kl"
    assert (
        "config key 'teacher.tokenizer' = 'own' does not go with: objective.distill = "
        "'forward_kl' (a full-vocabulary loss reads the teachers' logits over the student's "
        "vocabulary)"
    ) in config_error(c)
    c = _config(a, {"1": b})
    c.teacher.init = "scratch"
    assert "teacher.init = 'scratch' (its tags name checkpoints" in config_error(c)
    c = _config(a, {})
    c.teacher.tokenizer = "own"
    c.env.name = "frozenlake"
    assert "'teacher.tokenizer' = 'own' does not go with: env.name = 'frozenlake'" in (
        config_error(c)
    )


def test_a_full_vocabulary_loss_runs_with_several_teachers(checkpoints, tmp_path):
    """`objective.distill` with two teachers of the policy's vocabulary: the update holds
    both (the main one first) and each row's loss reads its own teacher's logits
    (tests/rl/learn/test_several_teachers.py checks the terms by hand)."""
    a, b = checkpoints
    c = _config(a, {"1": b, "3": b})
    c.objective.distill = "forward_kl"
    trainer = tr.Trainer(c, str(tmp_path))
    teachers = trainer.step.learner.frozen["teacher"]
    assert isinstance(teachers, tuple) and len(teachers) == 2
    scalars = trainer.step()(1.0)
    assert np.isfinite(scalars["train/distill_loss"]) and scalars["train/distill_loss"] > 0
