"""The training entry point (run/cli.py): a config error is one line, the process's exit
message (the trainer is never built)."""

import os

import pytest

from jaxrl_frontier.run import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = "--config=" + os.path.join(REPO, "configs", "grpo_arith.py") + ":runlocal"


def test_train_main_exits_with_the_line():
    argv = ["train.py", CONFIG, "--workdir=unused", "--config.rollout.temprature=0.5"]
    with pytest.raises(SystemExit) as e:
        cli.train_main(argv)
    assert str(e.value) == (
        "config error: --config.rollout.temprature=0.5: no config key 'rollout.temprature'; "
        "did you mean 'rollout.temperature'?"
    )
