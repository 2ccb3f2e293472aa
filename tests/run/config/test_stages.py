"""Stages (run/config/stages.py, `config.stages`): a 4-step run switching at step 2 to a larger group
and completion budget trains steps 3-4 on the new shapes, compiles them at step 3 only, and
a run cut right after the boundary resumes bitwise; rollouts sampled ahead stop at the
boundary; the prompt stream continues across a new prompt batch; the learning-rate horizon
counts each stage's updates; the config errors name the stage and the key."""

import pytest
from conftest import assert_resumed_run_equal, host_leaves, read_metrics, series, small_rl_config

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data.tasks import task_for
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.rl.sources.base import UniformSource
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import trainer as tr
from jaxrl_frontier.run.build import total_updates
from jaxrl_frontier.run.config import sections
from jaxrl_frontier.train import hooks

GROW = {"rollout.group_size": 8, "rollout.max_new_tokens": 5}


def _config(steps: int, stages=({"step": 2, "overrides": GROW},), **train):
    """small_rl_config (4 prompts x 4 completions of 3 tokens) with shaped rewards (a random
    policy gets advantages), logs at every step, a checkpoint every 2 steps, and `stages`."""
    c = small_rl_config()
    c.objective.reward_weights = dict(correctness=1.0, format=0.5, length=0.1)
    c.optimizer.update(lr=5e-3, warmup_steps=0)
    c.train.update(steps=steps, log_every=1, eval_every=10**6, checkpoint_every=2, **train)
    c.stages = stages
    return c


def _trainer(workdir, c):
    trainer = tr.Trainer(c, str(workdir))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}  # its own programs
    return trainer


def test_a_boundary_switches_the_shapes_and_compiles_once(tmp_path, count_compiles):
    """Steps 1-2 train on 4 x 4 rows of 3 tokens, steps 3-4 on 4 x 8 rows of 5; step 3
    compiles (the new shapes), step 4 compiles nothing, and each step logs its stage."""
    trainer = _trainer(tmp_path, _config(4))
    assert trainer.step.learner.options.group_size == 4
    shapes = {}

    class Marked(hooks.Hook):  # the learner is rebuilt at the boundary: mark each step
        def begin(self, start):
            self.mark(start + 1)

        def after_step(self, end):  # after the stage switch: the next step's learner
            if not end.last:
                self.mark(end.done + 1)

        def mark(self, step):
            seen.append(f"step {step}")
            update = trainer.step.learner.update

            def recording(exp, next_key):
                shapes[step] = (exp.tokens.shape[0], exp.loss_mask.shape[1])
                return update(exp, next_key)

            trainer.step.learner.update = recording

    with count_compiles() as seen:
        export = trainer.export
        trainer.export = lambda *a: seen.append("export") or export(*a)  # compiles its own
        trainer.hooks.append(Marked())
        trainer.run()
    width = {k: w for k, (_, w) in shapes.items()}  # prompt + completion tokens
    assert {k: rows for k, (rows, _) in shapes.items()} == {1: 16, 2: 16, 3: 32, 4: 32}
    assert width[1] == width[2] and width[3] == width[4] == width[1] + 2  # 3 -> 5 tokens
    assert (
        trainer.step.learner.options.group_size == 8 and trainer.config.rollout.max_new_tokens == 5
    )
    assert trainer.launch_config.rollout.group_size == 4  # what checkpoints record
    step3, step4, end = (seen.index(m) for m in ("step 3", "step 4", "export"))
    assert [s for s in seen[step3 + 1 : step4] if not s.startswith("step ")] != []  # compiles
    assert seen[step4 + 1 : end] == [], seen[step4:]  # ... once: nothing at step 4
    rows = read_metrics(tmp_path)
    assert series(rows, "stage/index") == {1: 0, 2: 0, 3: 1, 4: 1}
    length = series(rows, "rollout/response_length")  # a random policy runs to the budget
    assert length[1] == length[2] == 3.0 and 3.0 < min(length[3], length[4]) <= 5.0


def test_a_run_cut_right_after_the_boundary_resumes_bitwise(tmp_path):
    """4 uninterrupted steps == 2 steps (checkpoint at the boundary, before the switch),
    then a new trainer on the same workdir for 2 more: the same weights, optimizer state
    and logged numbers at steps 3 and 4, the prompt batch grown from 4 to 8 included."""
    grow = ({"step": 2, "overrides": {**GROW, "data.prompt_batch": 8}},)
    full = _trainer(tmp_path / "full", _config(4, grow))
    full.run()
    cut = _trainer(tmp_path / "cut", _config(2, grow))
    cut.run()
    assert cut.step.stage_index == 0 and int(cut.state.step) == 2  # ended at the boundary
    resumed = _trainer(tmp_path / "cut", _config(4, grow))
    resumed.run()
    assert resumed.step.stage_index == 1 and resumed.source.batch_size == 8
    for step in (3, 4):
        row = assert_resumed_run_equal(full, resumed, tmp_path / "full", tmp_path / "cut", step)
        assert row["stage/index"] == 1
    for a, b in zip(host_leaves(full.state.params), host_leaves(resumed.state.params), strict=True):
        assert (a == b).all()
    assert resumed.source.state() == full.source.state()  # the same prompts drawn


def test_rollouts_ahead_stop_at_a_boundary(tmp_path):
    """rollout.max_staleness = 1: the batch of step k + 1 is sampled during step k, except
    across the boundary (step 3's batch is sampled at step 3, by the new producer)."""
    c = _config(4)
    c.rollout.max_staleness = 1
    c.train.checkpoint_every = 10**6  # a checkpoint step samples synchronously too
    trainer = _trainer(tmp_path, c)
    trainer.run()
    lag = series(read_metrics(tmp_path), "rollout/policy_lag")
    assert lag == {1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0}


def test_a_uniform_source_resized_continues_its_stream():
    """4 prompts twice, then batches of 8: the same prompts in the same order as one stream
    of 8s after the first 8 prompts; a state taken after the resize restores exactly into a
    source built with the first batch size."""
    c = small_rl_config()
    task = task_for(sections.task_options(config_lib.resolve(c)), CharTokenizer())
    prompts = lambda batch: [e["prompt"] for e in batch]
    one = UniformSource(task, batch_size=4, seed=0)
    whole = UniformSource(task, batch_size=8, seed=0)
    first = prompts(one.next_batch()) + prompts(one.next_batch())
    assert first == prompts(whole.next_batch())
    one.resize(8)
    state = one.state()
    assert state["batch_size"] == 8 and state["offset"] == 8
    after = [prompts(one.next_batch()) for _ in range(2)]
    assert after == [prompts(whole.next_batch()) for _ in range(2)]
    again = UniformSource(task, batch_size=4, seed=0)
    again.restore(state)
    assert [prompts(again.next_batch()) for _ in range(2)] == after


def test_the_learning_rate_horizon_counts_each_stage():
    """train.minibatches 1 -> 2 at step 2 of 4: 2 x 1 + 2 x 2 = 6 optimizer steps."""
    c = _config(4, ({"step": 2, "overrides": {"train.minibatches": 2}},))
    assert total_updates(config_lib.resolve(c)) == 6
    assert total_updates(config_lib.resolve(_config(4, ()))) == 4


def test_a_stage_switches_the_weight_function_with_its_defaults():
    c = _config(4, ({"step": 3, "overrides": {"objective.weight": "dppo"}},))
    c = config_lib.resolve(c)
    before, after = config_lib.at_step(c, 2), config_lib.at_step(c, 3)
    assert before.objective.weight == "ppo_clip"
    assert after.objective.weight == "dppo"
    assert set(after.objective.weight_kwargs) == {"delta_low", "delta_high", "ratio_cap"}


def test_a_resume_with_a_changed_started_stage_is_refused(tmp_path):
    _trainer(tmp_path, _config(2)).run()  # ends at the boundary of step 2: stage 1 started
    changed = ({"step": 2, "overrides": {"rollout.group_size": 6}},)
    with pytest.raises(ConfigError, match=r"other stages than the checkpoint's"):
        _trainer(tmp_path, _config(4, changed)).run()


@pytest.mark.parametrize(
    "stages, words",
    [
        ([{"step": 2, "overrides": {"optimizer.lr": 1e-3}}], r"stages\[0\]\.overrides\.optimizer"),
        ([{"step": 0, "overrides": GROW}], r"stages\[0\]\.step' = 0"),
        ([{"step": 5, "overrides": GROW}], r"stages\[0\]\.step' = 5"),
        ([{"step": 2, "overrides": GROW}, {"step": 2, "overrides": GROW}], r"stages\[1\]\.step"),
        (
            [{"step": 2, "overrides": {"rollout.group_size": 1}}],
            r"stages\[0\].*rollout\.group_size",
        ),
        ([{"step": 2, "overrides": {"rollout.group_size": "8"}}], r"stages\[0\].*type str"),
        (
            [{"step": 2, "overrides": {"objective.weight": "nope"}}],
            r"stages\[0\].*objective\.weight",
        ),
        ([{"step": 2}], r"stages\[0\]' must be dict"),
        ([{"step": 2, "overrides": {"train.minibatches": 3}}], r"stages\[0\].*not divisible"),
    ],
)
def test_bad_stages_name_the_stage_and_key(stages, words):
    c = _config(4, stages)
    with pytest.raises(ConfigError, match=words):
        config_lib.validate(c, num_devices=1)


def test_a_key_is_staged_or_scheduled_not_both():
    c = _config(4, ({"step": 2, "overrides": {"objective.weight_kwargs.eps_high": 0.3}},))
    c.schedules.objective.weight_kwargs.eps_high = "linear(0.2, 0.3)"
    with pytest.raises(ConfigError, match=r"'objective\.weight_kwargs\.eps_high' is both staged"):
        config_lib.validate(c, num_devices=1)
    c = _config(4, ({"step": 2, "overrides": {"objective.weight": "dppo"}},))
    c.controllers.objective.weight_kwargs.eps_high = "clip_fraction(target=0.1)"
    with pytest.raises(ConfigError, match="the weight's knobs belong to the weight"):
        config_lib.validate(c, num_devices=1)


def test_stages_are_for_rl_runs():
    c = _config(4)
    c.mode = "sft"
    with pytest.raises(ConfigError, match="stages act on RL runs"):
        config_lib.validate(c, num_devices=1)
