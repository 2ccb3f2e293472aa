"""Config validation (`validate`): every error names the offending key (and the allowed
values). (The schema's merge, its did-you-mean errors and the kwargs restarted by a
switch of entry: test_schema.py.)"""

import os
import subprocess
import sys

import ml_collections
import pytest
from conftest import REPO, config_error, get_config

from jaxrl_frontier.run import build
from jaxrl_frontier.run.config import base_config, validate


def _grpo(arg="runlocal") -> ml_collections.ConfigDict:
    return get_config("grpo_arith", arg=arg)


def test_base_and_grpo_configs_are_valid():
    validate(base_config(), num_devices=8)
    validate(_grpo(), num_devices=8)
    validate(_grpo(None), num_devices=8)
    # and the checks do reject: one bad key in each of them is an error naming it
    for c in (base_config(), _grpo(), _grpo(None)):
        c.rollout.top_p = 1.5
        assert "'rollout.top_p' = 1.5" in config_error(c)


def test_bad_choice_lists_allowed_values():
    c = _grpo()
    c.model.dtype = "float16"
    msg = config_error(c)
    assert "'model.dtype'" in msg and "'float32'" in msg and "'bfloat16'" in msg
    c = _grpo()
    c.optimizer.schedule = "exp"
    msg = config_error(c)
    assert "'optimizer.schedule'" in msg and "'cosine'" in msg


def test_attention_and_unroll_keys_are_checked():
    c = _grpo()
    c.model.attention = "flash"
    msg = config_error(c)
    assert "'model.attention'" in msg and "'dot_product'" in msg and "'cudnn'" in msg
    c = _grpo()
    c.model.attention = "cudnn"  # cuDNN's kernel takes bf16 / fp16 only
    assert "'model.attention' = 'cudnn'" in config_error(
        c
    ) and "model.dtype = 'float32'" in config_error(c)
    c.model.dtype = "bfloat16"
    validate(c, num_devices=8)
    c.model.scan_unroll = 0
    built = build.model_config_from(c, build.build_tokenizer(c))
    assert (built.attention, built.scan_unroll, built.dtype) == ("cudnn", 0, "bfloat16")
    c = _grpo()
    c.model.scan_unroll = -1
    assert "'model.scan_unroll'" in config_error(c)


def test_batch_not_divisible_by_minibatches():
    c = _grpo()  # 4 prompts x 4 completions = 16 rollouts
    c.train.minibatches = 3
    msg = config_error(c)
    assert "train.minibatches" in msg and "16" in msg


def test_group_size_one_is_rejected_for_rl():
    c = _grpo()
    c.rollout.group_size = 1
    assert "'rollout.group_size'" in config_error(c)


def test_microbatch_not_divisible_by_batch_devices():
    c = _grpo()
    c.rollout.group_size = 3  # 12 rollouts in 2 minibatches of 6 over 8 data devices
    msg = config_error(c)
    assert "microbatch of 6" in msg and "8 devices" in msg and "mesh.data" in msg
    validate(c, num_devices=2)  # 6 / 2 is fine


def test_mesh_not_dividing_device_count():
    c = _grpo()
    c.mesh.data = 3
    msg = config_error(c)
    assert "'mesh'" in msg and "3" in msg
    c = _grpo()
    c.mesh.num_devices = 16
    assert "'mesh.num_devices'" in config_error(c)
    c = _grpo()
    c.mesh.update(data=2, fsdp=2, tensor=2)
    validate(c, num_devices=8)


def test_unknown_weight_lists_known_ones():
    c = _grpo()
    c.objective.weight = "ppo_clipp"
    msg = config_error(c)
    assert "objective.weight" in msg
    for known in ("ppo_clip", "dppo", "cispo", "pg"):
        assert known in msg


def test_weight_kwarg_not_accepted():
    c = _grpo()
    c.objective.weight_kwargs.epsx = 0.1
    msg = config_error(c)
    assert "objective.weight_kwargs" in msg and "'epsx'" in msg and "eps_low" in msg


def test_unknown_advantage_and_aggregation():
    c = _grpo()
    c.objective.advantage = "grpoo"
    assert "objective.advantage" in config_error(c)
    c = _grpo()
    c.objective.aggregation = "token_meen"
    assert "objective.aggregation" in config_error(c)


def test_reward_weight_names_checked_against_the_task():
    c = _grpo()
    c.objective.reward_weights = dict(correctnes=1.0)
    msg = config_error(c)
    assert "'objective.reward_weights.correctnes'" in msg and "correctness, format" in msg
    c = _grpo()
    c.objective.reward_weights = dict(correctness=1.0, format=0.5)
    validate(c, num_devices=8)


def test_task_kwargs_checked_against_the_task():
    c = _grpo()
    c.task.kwargs.max_digitz = 1
    msg = config_error(c)
    assert "'task.kwargs.max_digitz'" in msg and "max_digits" in msg
    c = _grpo()
    c.task.name = "arithmeticc"
    assert "'task.name'" in config_error(c)


def test_paths_required_for_non_scratch_init():
    c = _grpo()
    c.model.update(init="checkpoint", path="")
    assert "'model.path'" in config_error(c)
    c = _grpo()
    c.teacher.init = "hf"
    assert "'teacher.path'" in config_error(c)


def test_cli_unknown_key_exits_nonzero_naming_it(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "scripts", "train.py"),
            "--config=configs/grpo_arith.py:runlocal",
            f"--workdir={tmp_path / 'run'}",
            "--config.optimizer.lrr=1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "optimizer.lrr" in proc.stderr + proc.stdout
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


# --------------------------------------------------------------------------- command line


def _command_line(*overrides, config="grpo_arith.py:runlocal"):
    """The config a `--config=configs/FILE --config.k=v ...` command line builds (the
    ml-collections flag, as scripts/train.py defines it): overrides applied to get_config's
    ConfigDict, before resolve / validate."""
    from absl import flags
    from ml_collections import config_flags

    argv = ["train.py", f"--config={os.path.join(REPO, 'configs', config)}", *overrides]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "", lock_config=False, flag_values=fv, sys_argv=argv
    )
    fv(argv)
    return fv.config


def test_kwarg_typos_are_still_errors():
    from absl import flags

    # ml-collections itself: no such key (scripts/train.py names the override)
    with pytest.raises(
        (flags.Error, AttributeError), match='(?s)delta_lw.*Did you mean "delta_low"'
    ):
        _command_line(
            "--config.objective.weight=dppo", "--config.objective.weight_kwargs.delta_lw=0.1"
        )
    # a knob of another entry, without switching to it: unknown for the chosen one
    msg = config_error(_command_line("--config.objective.weight_kwargs.delta_low=0.1"))
    assert "objective.weight_kwargs" in msg and "'delta_low'" in msg
    assert "'ppo_clip'" in msg and "eps_low, eps_high" in msg
    c = _command_line("--config.objective.weight=dppo")
    c.objective.weight_kwargs.epsx = 0.1  # a file adding a key the new entry does not take
    msg = config_error(c)
    assert "'epsx'" in msg and "delta_low" in msg


def test_progress_cannot_be_the_training_advantage():
    c = _grpo()
    c.objective.advantage = "progress"
    msg = config_error(c)
    assert "'objective.advantage'" in msg and "'progress'" in msg
    assert "0 at step 0" in msg and "test-time" in msg


@pytest.mark.parametrize(
    "key, value",
    [("train.recompute_old_logp", True), ("rollout.editors", ("dre",))],
)
def test_tis_against_recomputed_behaviour_log_probs_is_refused(key, value):
    """TIS weighs trainer over sampler probabilities; recomputed old log-probs make it 1."""
    c = _grpo()
    c.objective.weight = "tis"
    section, name = key.split(".")
    c[section][name] = value
    msg = config_error(c)
    assert "'objective.weight' = 'tis'" in msg and repr(key) in msg
    c[section][name] = False if key.startswith("train") else ()
    validate(c, num_devices=8)  # the sampler's own log-probs: accepted


def test_advantage_kwargs_supplied_from_the_batch_are_refused():
    c = _grpo().to_dict()
    c["objective"]["advantage_kwargs"]["reward_weights"] = [1.0, 0.5]
    assert "'objective.advantage_kwargs.reward_weights'" in config_error(c)


# ---------------------------------------------------------------- ranges (docs/reliability.md)


@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("rollout.temperature", -1.0, "a finite number > 0"),
        ("rollout.temperature", 0.0, "a finite number > 0"),
        ("rollout.top_p", 0.0, "in (0, 1]"),
        ("rollout.top_p", 1.5, "in (0, 1]"),
        ("rollout.min_p", 1.0, "in [0, 1)"),
        ("rollout.dropout_rate", 1.0, "in [0, 1)"),
        ("rollout.max_new_tokens", 0, "> 0"),
        ("data.max_prompt_len", -3, "> 0"),
        ("optimizer.lr", 0.0, "> 0"),
        ("optimizer.lr", float("inf"), "> 0"),
        ("optimizer.lr", float("nan"), "> 0"),
        ("optimizer.b2", 1.0, "in [0, 1)"),
        ("optimizer.max_grad_norm", -1.0, ">= 0"),
        ("train.checkpoint_every", 0, "> 0"),
        ("train.stop_at_pass1", 1.5, "in [0, 1]"),
        ("train.max_skipped_updates", -1, ">= 0"),
        ("rewards.memory_mb", 0, "> 0"),
        ("rewards.wall_seconds", -1.0, "> 0"),
        ("eval.pass_k", 0, "> 0"),
    ],
)
def test_out_of_range_values_name_the_key_and_the_range(key, value, allowed):
    c = _grpo()
    section, name = key.split(".")
    c[section][name] = value
    msg = config_error(c)
    assert msg.startswith(f"config key {key!r} = {value!r}; allowed: ")
    assert msg.endswith(allowed), msg


def test_in_range_edges_are_accepted():
    c = _grpo()
    c.rollout.top_p, c.rollout.min_p, c.optimizer.max_grad_norm = 1.0, 0.0, 0.0
    c.train.max_skipped_updates, c.rewards.max_failure_steps = 0, 0
    validate(c, num_devices=8)
    # one step past each closed edge is refused
    for key, value in (("rollout.top_p", 1.0 + 1e-6), ("rollout.min_p", -1e-6)):
        bad = _grpo()
        section, name = key.split(".")
        bad[section][name] = value
        assert f"config key {key!r}" in config_error(bad)


def test_every_range_key_exists_in_the_schema():
    from jaxrl_frontier.run.config import RANGES

    c = base_config()
    for key in RANGES:
        node = c
        for part in key.split("."):
            assert part in node, key
            node = node[part]


def test_rewards_scorer_choices():
    c = _grpo()
    c.rewards.scorer = "remote"
    assert config_error(c) == (
        "config key 'rewards.scorer' = 'remote'; allowed: 'auto', 'in_process', 'sandboxed'"
    )


@pytest.fixture
def user_task_name():
    """The registry is process-wide: the task the test's module registers is taken back."""
    from jaxrl_frontier.data.tasks import TASKS

    yield "my_arith_from_test_config"
    TASKS.unregister("my_arith_from_test_config")


def test_task_module_registers_a_user_task(tmp_path, user_task_name):
    module = tmp_path / "my_tasks.py"
    module.write_text(
        "from jaxrl_frontier.data.tasks import TASKS\n"
        "from jaxrl_frontier.data.tasks.arithmetic import Arithmetic\n\n"
        "@TASKS.register('my_arith_from_test_config')\n"
        "class MyArith(Arithmetic):\n"
        "    name = 'my_arith_from_test_config'\n"
    )
    c = _grpo()
    c.task.name = "my_arith_from_test_config"
    assert "my_arith_from_test_config" in config_error(c)  # unknown without the module
    c.task.module = str(module)
    validate(c, num_devices=8)
    validate(c, num_devices=8)  # importing twice registers once
    c.task.module = str(tmp_path / "nope.py")
    assert config_error(c).startswith("config key 'task.module' = ")
    c.task.module = "no_such_module_xyz"
    assert "No module named 'no_such_module_xyz'" in config_error(c)
