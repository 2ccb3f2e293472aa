"""The experiment files' starting points (run/config/presets.py): a preset's values, the `runlocal`
shrink (and the warm start it starts from), the end of every get_config (`finish`): every
knob of the chosen entries at its default, every other knob of its registry an unset
placeholder, the choices recorded as written."""

import os

import pytest

from jaxrl_frontier.data.tasks.base import task_defaults
from jaxrl_frontier.run.config import base_config, presets


def test_arithmetic_is_3_digit_addition_with_a_2_layer_char_model():
    c = presets.arithmetic("rl")
    assert (c.mode, c.task.name, c.task.kwargs.to_dict()) == (
        "rl",
        "arithmetic",
        presets.ARITH_TASK,
    )
    m = c.model
    assert (m.hidden_size, m.intermediate_size, m.num_layers, m.num_heads, m.num_kv_heads) == (
        128, 384, 2, 4, 2,
    )  # fmt: skip
    assert (m.init, m.path) == ("checkpoint", "runs/sft_arith")  # RL starts from the SFT run
    assert presets.arithmetic("sft").model.init == "scratch"
    code = presets.code("rl")
    assert (code.task.name, code.data.max_prompt_len, code.rollout.max_new_tokens) == (
        "code_problems", 72, 40,
    )  # fmt: skip
    assert code.model.path == "runs/sft_code" and code.model.hidden_size == 128


def test_runlocal_shrinks_to_a_tiny_model_from_its_warm_start():
    c = presets.arithmetic("rl", runlocal=True)
    assert c.task.kwargs.to_dict() == presets.RUNLOCAL_ARITH_TASK  # 1-digit addition
    arith1 = os.path.join(presets.REPO, "data", "warm_starts", "arith1")
    assert (c.model.init, c.model.path) == ("checkpoint", arith1)
    assert (c.model.hidden_size, c.model.intermediate_size) == (32, 64)
    assert (c.data.prompt_batch, c.rollout.group_size, c.optimizer.grad_accum) == (4, 4, 1)
    assert (c.train.steps, c.train.log_every, c.train.eval_every, c.train.sft_batch) == (
        4, 2, 2, 16,
    )  # fmt: skip
    assert (c.eval.num_prompts, c.eval.batch, c.eval.pass_k) == (8, 8, 2)
    sft = presets.arithmetic("sft", runlocal=True)  # no warm start for SFT: from scratch
    assert (sft.model.init, sft.model.path) == ("scratch", "")


def test_shrink_moves_the_stages_to_the_first_steps_and_a_teacher_to_scratch():
    c = base_config()
    c.train.minibatches = 4
    c.teacher.update(init="checkpoint", path="runs/teacher")
    c.stages = (dict(step=50, overrides={"train.epochs": 2}), dict(step=80, overrides={}))
    presets.shrink(c)
    assert [s["step"] for s in c.stages] == [1, 2]
    assert c.stages[0]["overrides"] == {"train.epochs": 2}
    assert (c.teacher.init, c.teacher.path) == ("scratch", "")
    assert c.train.minibatches == 2  # min(4, 2)


@pytest.mark.parametrize(
    "mode, task, env, name",
    [
        ("rl", "arithmetic", "", "arith1"),
        ("rl", "code_problems", "", "code"),
        ("rl", "jsonl_math", "", "math"),
        ("rl", "arithmetic", "gridworld", "frozenlake"),
        ("rl", "arithmetic", "calculator", "calculator"),
        ("rl", "column_addition", "", None),  # no warm start of its own
        ("sft", "arithmetic", "", None),
    ],
)
def test_the_warm_start_of_each_task_family(mode, task, env, name):
    c = base_config()
    c.mode, c.task.name, c.env.name = mode, task, env
    want = None if name is None else os.path.join(presets.REPO, presets.WARM_STARTS_DIR, name)
    assert presets.warm_start(c) == want


def test_finish_spells_out_the_chosen_entries_and_leaves_the_others_unset():
    c = presets.finish(presets.arithmetic("rl"), None)
    o = c.objective
    assert o.as_written.to_dict() == dict(
        weight="ppo_clip", weight_kwargs=dict(eps_low=0.2, eps_high=0.2),
        advantage="grpo", advantage_kwargs=dict(eps=1e-6, scale="group"),
        aggregation="token_mean", aggregation_kwargs={},
        distill=None, distill_kwargs={},
    )  # fmt: skip
    # the chosen weight's knobs at their defaults; dppo's as unset floats a flag can set
    assert (o.weight_kwargs.eps_low, o.weight_kwargs.eps_high) == (0.2, 0.2)
    assert o.weight_kwargs.delta_low is None
    assert o.weight_kwargs.get_type("delta_low") is float
    assert set(o.weight_kwargs) == set(presets.registry_knobs("weight"))
    assert (
        set(o.distill_kwargs) == set(presets.registry_knobs("distill")) == {"eta", "top_k", "beta"}
    )
    # the task's defaults under the file's kwargs; another task's knob unset
    written = {**task_defaults("arithmetic"), **presets.ARITH_TASK}
    assert c.task.as_written.to_dict() == dict(name="arithmetic", kwargs=written)
    assert c.task.kwargs.max_digits == 3 and c.task.kwargs.num_tests is None
    assert c.task.kwargs.get_type("num_tests") is int


def test_the_registries_knobs_and_their_types():
    weight = presets.registry_knobs("weight")
    assert (weight["eps_low"], weight["delta_low"], weight["relative"]) == (float, float, bool)
    assert presets.registry_knobs("aggregation") == {"max_completion_len": int}
    assert "reward_weights" not in presets.registry_knobs("advantage")  # from the batch
    tasks = presets.task_knobs()
    assert (tasks["max_digits"], tasks["ops"], tasks["num_tests"]) == (int, str, int)


def test_finish_takes_runlocal_or_nothing():
    assert presets.finish(presets.arithmetic("sft"), "runlocal").train.steps == 4
    assert presets.finish(presets.arithmetic("sft"), "").train.steps == base_config().train.steps
    with pytest.raises(ValueError, match="unknown variant 'big'; allowed: runlocal"):
        presets.finish(presets.arithmetic("sft"), "big")
