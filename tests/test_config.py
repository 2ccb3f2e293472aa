"""Config validation: every error names the offending key (and the allowed values)."""

import importlib.util
import os
import subprocess
import sys

import ml_collections
import pytest

from jaxrl_frontier.config import ConfigError, base_config, resolve, validate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _grpo(arg="runlocal") -> ml_collections.ConfigDict:
    path = os.path.join(REPO, "configs", "grpo_arith.py")
    spec = importlib.util.spec_from_file_location("grpo_arith_cfg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def _error(c, num_devices=8) -> str:
    with pytest.raises(ConfigError) as e:
        validate(c, num_devices=num_devices)
    return str(e.value)


def test_base_and_grpo_configs_are_valid():
    validate(base_config(), num_devices=8)
    validate(_grpo(), num_devices=8)
    validate(_grpo(None), num_devices=8)


def test_unknown_nested_key_is_named_with_its_siblings():
    c = _grpo()
    c.optimizer.lrr = 1.0
    msg = _error(c)
    assert "'optimizer.lrr'" in msg
    for sibling in ("lr", "b1", "warmup_steps"):
        assert sibling in msg


def test_unknown_top_level_key():
    c = _grpo()
    c.trainn = ml_collections.ConfigDict(dict(steps=3))
    assert "'trainn.steps'" in _error(c)


def test_wrong_type_names_key_and_types():
    c = _grpo().to_dict()
    c["eval"]["num_prompts"] = "4"
    msg = _error(ml_collections.ConfigDict(c))
    assert "'eval.num_prompts'" in msg and "str" in msg and "int" in msg
    c = _grpo().to_dict()
    c["train"]["recompute_old_logp"] = 1  # an int where a bool is expected
    assert "'train.recompute_old_logp'" in _error(ml_collections.ConfigDict(c))


def test_bad_choice_lists_allowed_values():
    c = _grpo()
    c.model.dtype = "float16"
    msg = _error(c)
    assert "'model.dtype'" in msg and "'float32'" in msg and "'bfloat16'" in msg
    c = _grpo()
    c.optimizer.schedule = "exp"
    msg = _error(c)
    assert "'optimizer.schedule'" in msg and "'cosine'" in msg


def test_batch_not_divisible_by_minibatches():
    c = _grpo()  # 4 prompts x 4 completions = 16 rollouts
    c.train.minibatches = 3
    msg = _error(c)
    assert "train.minibatches" in msg and "16" in msg


def test_group_size_one_is_rejected_for_rl():
    c = _grpo()
    c.rollout.group_size = 1
    assert "'rollout.group_size'" in _error(c)


def test_microbatch_not_divisible_by_batch_devices():
    c = _grpo()
    c.rollout.group_size = 3  # 12 rollouts in 2 minibatches of 6 over 8 data devices
    msg = _error(c)
    assert "microbatch of 6" in msg and "8 devices" in msg and "mesh.data" in msg
    validate(c, num_devices=2)  # 6 / 2 is fine


def test_mesh_not_dividing_device_count():
    c = _grpo()
    c.mesh.data = 3
    msg = _error(c)
    assert "'mesh'" in msg and "3" in msg
    c = _grpo()
    c.mesh.num_devices = 16
    assert "'mesh.num_devices'" in _error(c)
    c = _grpo()
    c.mesh.update(data=2, fsdp=2, tensor=2)
    validate(c, num_devices=8)


def test_unknown_weight_lists_known_ones():
    c = _grpo()
    c.objective.weight = "ppo_clipp"
    msg = _error(c)
    assert "objective.weight" in msg
    for known in ("ppo_clip", "dppo", "cispo", "pg"):
        assert known in msg


def test_weight_kwarg_not_accepted():
    c = _grpo()
    c.objective.weight_kwargs.epsx = 0.1
    msg = _error(c)
    assert "objective.weight_kwargs" in msg and "'epsx'" in msg and "eps_low" in msg


def test_unknown_advantage_and_aggregation():
    c = _grpo()
    c.objective.advantage = "grpoo"
    assert "objective.advantage" in _error(c)
    c = _grpo()
    c.objective.aggregation = "token_meen"
    assert "objective.aggregation" in _error(c)


def test_reward_weight_names_checked_against_the_task():
    c = _grpo()
    c.objective.reward_weights = dict(correctnes=1.0)
    msg = _error(c)
    assert "'objective.reward_weights.correctnes'" in msg and "correctness, format" in msg
    c = _grpo()
    c.objective.reward_weights = dict(correctness=1.0, format=0.5)
    validate(c, num_devices=8)


def test_task_kwargs_checked_against_the_task():
    c = _grpo()
    c.task.kwargs.max_digitz = 1
    msg = _error(c)
    assert "'task.kwargs.max_digitz'" in msg and "max_digits" in msg
    c = _grpo()
    c.task.name = "arithmeticc"
    assert "'task.name'" in _error(c)


def test_paths_required_for_non_scratch_init():
    c = _grpo()
    c.model.init = "checkpoint"
    assert "'model.path'" in _error(c)
    c = _grpo()
    c.teacher.init = "hf"
    assert "'teacher.path'" in _error(c)


def test_resolve_keeps_section_defaults():
    c = _grpo().to_dict()
    c["mesh"] = dict(data=2)
    r = resolve(c)
    assert (r.mesh.data, r.mesh.fsdp, r.mesh.tensor, r.mesh.num_devices) == (2, 1, 1, 0)
    validate(r, num_devices=2)
    assert "'mesh'" in _error(r, num_devices=8)  # 2 fixed devices of 8, none taking the rest


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
