"""data/envs/task.py: an environment's seeds as task examples (the split agrees with
`split_seeds`), prompts through the observation template and a chat template,
demonstrations, and the `env` section's checks."""

import ml_collections
import pytest

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data.envs import split_seeds
from jaxrl_frontier.data.envs.task import EnvTask, check_env_config, section_get
from jaxrl_frontier.data.tasks.chat import ChatTemplate
from jaxrl_frontier.models.tokenizer import CharTokenizer

CHAT = ChatTemplate(
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def test_seeds_of_a_split_are_the_split_seeds_ones():
    task = EnvTask({"name": "scripted", "eval_fraction": 0.5, "train_size": 5, "eval_size": 3})
    evals = split_seeds("scripted", "eval", 20, eval_fraction=0.5)
    assert [task.split_of(s) for s in evals] == ["eval"] * 20
    assert {task.split_of(s) for s in range(max(evals)) if s not in evals} == {"train"}
    for split in ("train", "eval"):
        seeds = [task.example(split, i)["seed"] for i in range(task.num_examples(split))]
        assert all(task.split_of(s) == split for s in seeds) and len(set(seeds)) == len(seeds)
        assert seeds == [task.seed_of(split, i) for i in range(len(seeds))]  # stable
    assert task.example("eval", 2)["index"] == 2
    assert (task.num_examples("train"), task.num_examples("eval")) == (5, 3)
    with pytest.raises(ValueError, match="unknown split"):
        task.example("test", 0)


def test_prompts_and_observations_through_the_templates():
    section = {"name": "scripted", "observation_template": "> {observation}"}
    plain = EnvTask(section)
    assert plain.prompt({"seed": 7}) == "> start 7"
    assert plain.observation_text("obs 1") == "> obs 1"
    chat = EnvTask(section, CHAT, CharTokenizer(), system="be brief")
    assert chat.prompt({"seed": 7}) == "system: be brief\nuser: > start 7\nassistant: "
    # the rest of the assistant's turn, the observation as the user's, the next cue
    assert chat.observation_text("obs 1") == "\nuser: > obs 1\nassistant: "


def test_demonstrations_and_rewards():
    task = EnvTask({"name": "scripted", "demonstrations": ("up", "down")})
    demos = [task.demonstration({"index": i}) for i in range(40)]
    assert set(demos) == {"up", "down"}
    assert demos == [task.demonstration({"index": i}) for i in range(40)]
    with pytest.raises(NotImplementedError, match="'env.demonstrations'"):
        EnvTask({"name": "scripted"}).demonstration({"index": 0})
    with pytest.raises(NotImplementedError, match="rewards come from playing episodes"):
        task.reward({"index": 0, "seed": 1}, "up")


def test_section_get_reads_mappings_and_attributes():
    assert section_get({"a": 1}, "a") == 1 and section_get({}, "a", 2) == 2
    box = ml_collections.ConfigDict({"a": 3})
    assert section_get(box, "a") == 3 and section_get(box, "b", 4) == 4
    assert section_get(type("S", (), {"a": 5})(), "a") == 5


def test_check_env_config_names_the_bad_key():
    def env(**changes):
        base = dict(
            module="", name="scripted", credit="gigpo", max_turns=2, turn_tokens=8,
            obs_tokens=8, max_tokens=0,
        )  # fmt: skip
        return ml_collections.ConfigDict({**base, **changes})

    assert check_env_config(env()) == ("return", "success")
    for changes, match in [
        ({"name": "gridwrld"}, r"'env.name' = 'gridwrld'; allowed: .*gridworld"),
        ({"credit": "td"}, r"'env.credit' = 'td'; allowed: episode, gigpo, 3spo"),
        ({"turn_tokens": 0}, r"'env.turn_tokens' = 0 must be >= 1"),
        ({"max_tokens": -1}, r"'env.max_tokens' = -1 must be >= 0"),
        ({"module": "no_such_module_for_envs"}, r"'env.module' = 'no_such_module_for_envs'"),
    ]:
        with pytest.raises(ConfigError, match=match):
            check_env_config(env(**changes))
