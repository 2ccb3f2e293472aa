"""data/envs/scripted.py: the scripted environment gives exactly its scripted rewards."""

import pytest

from jaxrl_frontier.data.envs import make_env


def test_scripted_env_gives_exactly_the_scripted_rewards():
    env = make_env("scripted", rewards=[0.0, 0.25, -1.0, 2.0])
    assert env.reset(7) == "start 7"
    got = [env.step(f"act {k}") for k in range(4)]
    assert [g[1] for g in got] == [0.0, 0.25, -1.0, 2.0]
    assert [g[2] for g in got] == [False, False, False, True]
    assert [g[0] for g in got] == ["obs 1", "obs 2", "obs 3", "obs 4"]
    assert got[-1][3]["success"] and not got[0][3]["success"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("one more")
