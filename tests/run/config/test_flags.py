"""The command line's flag parsing (run/config/flags.py), in process: overrides apply, and
every bad flag is one line naming the flag, the key and the nearest key or the expected type
(nothing is built)."""

import os
import pathlib
import sys

import pytest

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.run.config import flags, resolve

REPO = str(pathlib.Path(__file__).resolve().parents[3])  # tests/run/config/ -> the repository
CONFIG = "--config=" + os.path.join(REPO, "configs", "grpo_arith.py") + ":runlocal"


def _error(*args: str) -> str:
    with pytest.raises(ConfigError) as e:
        flags.parse(["train.py", *args])
    text = str(e.value)
    assert "\n" not in text
    return text


def test_overrides_apply_and_argv_is_left_alone():
    saved = list(sys.argv)
    argv = ["train.py", CONFIG, "--workdir=w", "--config.rollout.temperature=0.5"]
    config, workdir = flags.parse(argv + ["--config.metrics.writers=('jsonl', 'console')"])
    assert workdir == "w" and config.rollout.temperature == 0.5
    assert resolve(config).metrics.writers == ("jsonl", "console")
    assert sys.argv == saved


@pytest.mark.parametrize(
    "flag, expected",
    [
        (  # ml_collections' own text: a repr of its KeyError over two lines
            "--config.rollout.temprature=0.5",
            "no config key 'rollout.temprature'; did you mean 'rollout.temperature'?",
        ),
        ("--config.roll.x=1", "no config key 'roll.x'; did you mean 'rollout'?"),
        (
            "--config.train.collapse.stopp=1",
            "no config key 'train.collapse.stopp'; did you mean 'train.collapse.stop'?",
        ),
        (
            "--config.rollout.temperature=abc",
            "config key 'rollout.temperature' = 'abc': expected a value of type float",
        ),
        (
            "--config.train.steps=1.5",
            "config key 'train.steps' = '1.5': expected a value of type int",
        ),
        (
            "--config.mesh=3",
            "config key 'mesh' = '3': a section: set its keys (--config.mesh.KEY=VALUE)",
        ),
        (
            "--config.rollout.temperature.x=2",
            "config key 'rollout.temperature' is a float, not a section",
        ),
        ("--config.rollout.temperature", "no value; give --config.rollout.temperature=VALUE"),
    ],
)
def test_a_bad_override_is_one_line_naming_the_key(flag, expected):
    assert _error(CONFIG, "--workdir=w", flag) == f"{flag}: {expected}"


def test_a_key_with_no_near_name_lists_the_section():
    text = _error(CONFIG, "--config.eval.zzzz=1")
    assert text == (
        "--config.eval.zzzz=1: no config key 'eval.zzzz'; the keys under 'eval': "
        "at_start, batch, num_prompts, pass_k"
    )


def test_config_file_errors_are_one_line(tmp_path):
    missing = tmp_path / "nope.py"
    assert _error(f"--config={missing}") == (
        f"--config={missing}: [Errno 2] No such file or directory: '{missing}'"
    )
    bad_arg = CONFIG.replace(":runlocal", ":runlocall")
    assert _error(bad_arg, "--config.seed=1") == (
        f"{bad_arg}: ValueError: get_config: unknown variant 'runlocall'; allowed: runlocal"
    )
    typo = tmp_path / "typo.py"  # a file setting a key its (locked) preset lacks
    typo.write_text(
        "from jaxrl_frontier.run import presets\n\n\n"
        "def get_config(arg=None):\n"
        "    c = presets.arithmetic('rl')\n"
        "    c.rollout.temprature = 0.5\n"
        "    return c\n"
    )
    assert _error(f"--config={typo}") == (
        f"--config={typo}: the file sets config key 'temprature', which does not exist; "
        "did you mean 'rollout.temperature'?"
    )


def test_evaluate_script_config_errors_are_the_same_line():
    import importlib.util

    path = os.path.join(REPO, "scripts", "evaluate.py")
    spec = importlib.util.spec_from_file_location("evaluate_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = ["evaluate.py", CONFIG, "--policy=unused", "--config.rollout.temprature=0.5"]
    with pytest.raises(SystemExit) as e:
        script.main(argv)
    assert str(e.value) == (
        "config error: --config.rollout.temprature=0.5: no config key 'rollout.temprature'; "
        "did you mean 'rollout.temperature'?"
    )
