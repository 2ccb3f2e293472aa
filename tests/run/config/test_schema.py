"""The config schema (run/config/schema.py): the locked defaults (`base_config`), `resolve`'s merge
of a config over them (unknown keys with the nearest name, wrong types, whole sections), the
registry and task kwargs restarted when a command line switches the entry, the unset
placeholders. (The checks `validate` runs after resolving: test_config.py.)"""

import os

import ml_collections
import pytest
from conftest import REPO, config_error, get_config

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.run.config import presets, validate
from jaxrl_frontier.run.config.schema import (
    FREE_FORM,
    base_config,
    entry_defaults,
    registry_entry,
    resolve,
)


def _grpo(arg="runlocal") -> ml_collections.ConfigDict:
    return get_config("grpo_arith", arg=arg)


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


def _resolve_error(given) -> str:
    with pytest.raises(ConfigError) as e:
        resolve(given)
    return str(e.value)


def test_an_unknown_key_names_the_nearest_one_or_the_sections_keys():
    assert _resolve_error({"optimizer": {"lrr": 1.0}}) == (
        "unknown config key 'optimizer.lrr'; did you mean 'optimizer.lr'? (known keys under "
        "'optimizer': " + ", ".join(sorted(base_config().optimizer)) + ")"
    )
    assert _resolve_error({"eval": {"zzzz": 1}}) == (
        "unknown config key 'eval.zzzz' (known keys under 'eval': at_start, batch, num_prompts, "
        "pass_k)"
    )
    msg = _resolve_error({"trainn": {}})
    assert msg.startswith("unknown config key 'trainn'; did you mean 'train'? (known keys: ")
    assert _resolve_error({"seed": "0"}) == ("config key 'seed' = '0' has type str; expected int")


def test_a_free_form_block_is_taken_whole_and_a_section_merged_key_by_key():
    r = resolve({"objective": {"reward_weights": {"anything": 2.0}, "kl_coef": 0.5}})
    assert r.objective.reward_weights.to_dict() == {"anything": 2.0}  # not checked here
    assert r.objective.kl_coef == 0.5
    assert r.objective.weight == base_config().objective.weight  # the others: defaults
    assert resolve({"env": {"kwargs": None}}).env.kwargs.to_dict() == {}
    assert "objective.reward_weights" in FREE_FORM and "task.kwargs" in FREE_FORM


def test_entry_defaults_are_the_set_keyword_defaults_of_the_entry():
    assert entry_defaults("distill", None) == {} and entry_defaults("weight", "") == {}
    assert entry_defaults("weight", "dppo") == dict(delta_low=0.15, delta_high=0.15, ratio_cap=20.0)
    assert entry_defaults("weight", "ppo_clip") == dict(eps_low=0.2, eps_high=0.2)
    with pytest.raises(ConfigError, match="'objective.weight'.*ppo_clip"):
        registry_entry("weight", "ppo_clipp")


def test_unknown_nested_key_is_named_with_its_siblings():
    c = _grpo()
    with pytest.raises(AttributeError, match='"lrr".*locked.*Did you mean "lr"'):
        c.optimizer.lrr = 1.0  # the config is locked: a typo fails where it is written
    c = _grpo().to_dict()  # a plain dict (another source) through validate
    c["optimizer"]["lrr"] = 1.0
    msg = config_error(c)
    assert "'optimizer.lrr'" in msg
    for sibling in ("lr", "b1", "warmup_steps"):
        assert sibling in msg


def test_unknown_top_level_key():
    c = _grpo()
    with pytest.raises(AttributeError, match='"trainn".*Did you mean "train"'):
        c.trainn = ml_collections.ConfigDict(dict(steps=3))
    c = _grpo().to_dict()
    c["trainn"] = dict(steps=3)
    assert "'trainn'" in config_error(c)


def test_wrong_type_names_key_and_types():
    c = _grpo().to_dict()
    c["eval"]["num_prompts"] = "4"
    msg = config_error(ml_collections.ConfigDict(c))
    assert "'eval.num_prompts'" in msg and "str" in msg and "int" in msg
    c = _grpo().to_dict()
    c["train"]["recompute_old_logp"] = 1  # an int where a bool is expected
    assert "'train.recompute_old_logp'" in config_error(ml_collections.ConfigDict(c))


def test_resolve_keeps_section_defaults():
    c = _grpo().to_dict()
    c["mesh"] = dict(data=2)
    r = resolve(c)
    assert (r.mesh.data, r.mesh.fsdp, r.mesh.tensor, r.mesh.num_devices) == (2, 1, 1, 0)
    validate(r, num_devices=2)
    assert "'mesh'" in config_error(r, num_devices=8)  # 2 fixed devices of 8, none taking the rest


def test_switching_the_weight_restarts_its_kwargs_from_the_new_defaults(caplog):
    c = _command_line("--config.objective.weight=dppo")
    with caplog.at_level("INFO", logger="jaxrl_frontier.run.config.schema"):
        r = resolve(c)
    assert r.objective.weight_kwargs.to_dict() == dict(
        delta_low=0.15, delta_high=0.15, ratio_cap=20.0
    )
    assert "eps_high" in caplog.text and "'ppo_clip'" in caplog.text  # what was dropped
    validate(c, num_devices=8)
    assert resolve(r).to_dict() == r.to_dict()  # idempotent
    # a kwarg set for the new entry applies
    c = _command_line(
        "--config.objective.weight=dppo", "--config.objective.weight_kwargs.delta_low=0.1"
    )
    assert resolve(c).objective.weight_kwargs.to_dict() == dict(
        delta_low=0.1, delta_high=0.15, ratio_cap=20.0
    )


def test_switching_the_task_restarts_its_kwargs_from_the_new_defaults(caplog):
    """--config.task.name on a file written for another task: its kwargs start from the new
    task's defaults (the arithmetic ones are dropped, named in the log), and a knob of the new
    task set on the command line applies."""
    from jaxrl_frontier.data.tasks.base import task_defaults

    c = _command_line("--config.task.name=code")
    with caplog.at_level("INFO", logger="jaxrl_frontier.run.config.schema"):
        r = resolve(c)
    assert r.task.kwargs.to_dict() == task_defaults("code")
    assert "'max_digits'" in caplog.text and "'arithmetic'" in caplog.text
    validate(c, num_devices=8)
    assert resolve(r).to_dict() == r.to_dict()  # idempotent
    c = _command_line("--config.task.name=code", "--config.task.kwargs.num_tests=6")
    assert resolve(c).task.kwargs.to_dict() == {**task_defaults("code"), "num_tests": 6}
    # the file's own task: its kwargs as written, the other tasks' unset knobs dropped
    assert resolve(_command_line()).task.kwargs.to_dict() == dict(
        task_defaults("arithmetic"), **presets.RUNLOCAL_ARITH_TASK
    )


def test_shared_kwarg_names_take_the_new_entry_default_unless_set():
    # ppo_clip and cispo both take eps_low / eps_high: the file's 0.2 was written for ppo_clip
    r = resolve(_command_line("--config.objective.weight=cispo"))
    assert r.objective.weight_kwargs.to_dict() == dict(eps_low=1.0, eps_high=0.28)
    c = _command_line(
        "--config.objective.weight=cispo", "--config.objective.weight_kwargs.eps_high=0.3"
    )
    assert resolve(c).objective.weight_kwargs.to_dict() == dict(eps_low=1.0, eps_high=0.3)
    # DAPO's eps_high = 0.28 is not carried over to gspo's (4e-4)
    r = resolve(_command_line("--config.objective.weight=gspo", config="dapo_arith.py"))
    assert r.objective.weight_kwargs.to_dict() == dict(eps_low=3e-4, eps_high=4e-4)


def test_a_sweep_over_weights_is_a_list_of_names():
    from jaxrl_frontier.objectives import WEIGHTS

    for name in WEIGHTS.names():
        c = _command_line(f"--config.objective.weight={name}")
        validate(c, num_devices=8)
        assert resolve(c).objective.weight_kwargs.to_dict() == {
            k: v for k, v in entry_defaults("weight", name).items()
        }, name


def test_switching_advantage_and_aggregation():
    r = resolve(_command_line("--config.objective.advantage=rloo"))
    assert r.objective.advantage_kwargs.to_dict() == {}  # grpo's scale / eps dropped
    c = _command_line(
        "--config.objective.aggregation=seq_mean_token_sum_norm",
        "--config.objective.aggregation_kwargs.max_completion_len=6",
    )
    assert resolve(c).objective.aggregation_kwargs.to_dict() == dict(max_completion_len=6)
    validate(c, num_devices=8)
    c = _command_line(
        "--config.objective.distill=jsd", "--config.objective.distill_kwargs.beta=0.2"
    )
    assert resolve(c).objective.distill_kwargs.to_dict() == dict(beta=0.2)


def test_objective_defaults_are_defined_once():
    from jaxrl_frontier.objectives import losses

    o = base_config().objective
    for key, default in losses.DEFAULTS.items():
        value = o[key].to_dict() if hasattr(o[key], "to_dict") else o[key]
        assert value == default, key
    assert o.distill_coef == 1.0
    with open(os.path.join(REPO, "docs", "objectives.md")) as f:
        row = next(line for line in f if line.startswith("| `distill`, `distill_coef`"))
    assert "`None`, `1.0`, `{}`" in row  # what the docs state


def test_unset_is_none_and_settable_from_the_command_line():
    c = base_config()
    assert c.rollout.cache_dtype is None and c.objective.distill is None
    assert c.distributed.to_dict() == dict(
        coordinator_address=None,
        num_processes=None,
        process_id=None,
        heartbeat_timeout_s=60,
        initialization_timeout_s=300,
        shutdown_timeout_s=300,
        agree_stop=True,
    )
    c = _command_line(
        "--config.rollout.cache_dtype=bfloat16",
        "--config.distributed.num_processes=2",
        "--config.distributed.process_id=1",
        "--config.distributed.coordinator_address=localhost:1234",
    )
    assert c.rollout.cache_dtype == "bfloat16" and c.distributed.num_processes == 2
    validate(c, num_devices=8)
    c.rollout.cache_dtype = "float16"
    msg = config_error(c)
    assert "'rollout.cache_dtype'" in msg and "None" in msg and "'bfloat16'" in msg
