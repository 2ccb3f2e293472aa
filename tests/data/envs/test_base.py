"""data/envs/base.py: the registry and user environment modules, TextEnv's guards, the
train/eval split of seeds."""

import pytest

from jaxrl_frontier.data.envs import (
    ENVS,
    TextEnv,
    env_from_config,
    load_env_module,
    make_env,
    split_seeds,
)


def test_registry_lists_environments_and_names_unknown_ones():
    assert {"calculator", "gridworld", "scripted"} <= set(ENVS.names())
    with pytest.raises(KeyError, match="gridworld"):
        make_env("gridwrld")


def test_user_environment_from_a_module_file(tmp_path):
    f = tmp_path / "my_env.py"
    f.write_text(
        "from jaxrl_frontier.data.envs import ENVS, TextEnv\n"
        "@ENVS.register('echo_test_env')\n"
        "class Echo(TextEnv):\n"
        "    name = 'echo_test_env'\n"
        "    def _reset(self, seed):\n"
        "        return 'say ' + str(seed)\n"
        "    def _step(self, action):\n"
        "        return action, float(action == 'hi'), True, {'success': action == 'hi'}\n"
        "    def state_key(self):\n"
        "        return 0\n"
    )
    try:
        load_env_module(str(f))
        load_env_module(str(f))  # twice: a no-op, not a duplicate registration
        env = make_env("echo_test_env")
        assert env.reset(3) == "say 3" and env.step("hi")[1] == 1.0
        env = env_from_config({"module": str(f), "name": "echo_test_env", "kwargs": {}})
        assert env.reset(4) == "say 4"
    finally:
        ENVS.unregister("echo_test_env")
    with pytest.raises(KeyError, match="'env.name'.*gridworld"):
        env_from_config({"name": "no_such_env"})
    import ml_collections

    cfg = ml_collections.ConfigDict({"name": "gridworld", "module": "", "kwargs": {"size": 3}})
    assert env_from_config(cfg).config.size == 3
    with pytest.raises(FileNotFoundError, match="env.module"):
        load_env_module(str(tmp_path / "missing.py"))
    with pytest.raises(ModuleNotFoundError, match="env.module"):
        load_env_module("no_such_module_for_envs")


def test_split_seeds_are_disjoint_stable_and_about_eval_fraction():
    train = split_seeds("gridworld", "train", 200, eval_fraction=0.2)
    evals = split_seeds("gridworld", "eval", 50, eval_fraction=0.2)
    assert len(set(train)) == 200 and len(set(evals)) == 50 and not set(train) & set(evals)
    assert split_seeds("gridworld", "train", 200, 0.2) == train  # stable
    assert 0.1 < 50 / max(evals) < 0.3  # about eval_fraction of the seeds
    assert not set(evals) & set(split_seeds("gridworld", "train", 50, 0.2, start=max(evals)))
    with pytest.raises(ValueError, match="unknown split"):
        split_seeds("gridworld", "test", 1)
    with pytest.raises(ValueError, match=r"eval_fraction must be in \(0, 1\), got 1.0"):
        split_seeds("gridworld", "train", 1, eval_fraction=1.0)


def test_text_env_guards_the_episode_and_coerces_the_step():
    class Count(TextEnv):
        name = "count"

        def _reset(self, seed):
            self.n = seed
            return f"at {seed}"

        def _step(self, action):
            self.n += int(action)
            return f"at {self.n}", self.n, self.n >= 3, {}  # an int reward, an int-ish done

    env = Count()
    with pytest.raises(RuntimeError, match=r"'count': step\(\) before reset\(\)"):
        env.step("1")
    assert env.reset(1) == "at 1"
    obs, reward, done, _ = env.step(1)  # the action is passed on as text
    assert (obs, reward, done) == ("at 2", 2.0, False) and type(reward) is float
    assert env.step("1")[1:3] == (3.0, True)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("1")
    assert env.reset(0) == "at 0" and env.step("1")[0] == "at 1"  # a new episode
