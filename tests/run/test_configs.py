"""Every experiment file is documented and its full-size config validates; the `runlocal`
variants of those that train a model from scratch or a warm start of ours train 2 steps
and log their recorded metrics (tests/runlocal_check.py; the configs that read a
pretrained checkpoint: tests/run/test_pretrained_configs.py).
"""

import glob
import importlib.util
import os

import pytest
from conftest import REPO
from runlocal_check import CONFIGS, FROM_SCRATCH_CONFIGS, assert_runlocal_trains, fetch_pretrained

from jaxrl_frontier.run.config import resolve, validate


def test_every_config_is_documented():
    """Each configs/<name>.py is named in the README or a page of docs/ (a user finds it)."""
    pages = [os.path.join(REPO, "README.md"), *glob.glob(os.path.join(REPO, "docs", "*.md"))]
    text = "\n".join(open(p).read() for p in pages)
    assert [n for n in CONFIGS if n not in text] == []


@pytest.fixture(scope="module", autouse=True)
def pretrained_checkpoints():
    """The named checkpoints the full configs name, fetched once."""
    fetch_pretrained()


@pytest.mark.parametrize("name", CONFIGS)
def test_full_config_validates(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    full, local = module.get_config(), module.get_config("runlocal")
    validate(full, num_devices=8)  # the full-size run's config is valid too
    r = resolve(full)
    assert resolve(r).to_dict() == r.to_dict()  # resolving is idempotent
    # runlocal is the same experiment, smaller: same mode, objective and task (or env)
    assert (local.mode, local.objective.weight, local.objective.advantage) == (
        full.mode, full.objective.weight, full.objective.advantage,
    )  # fmt: skip
    assert (local.task.name, local.env.name) == (full.task.name, full.env.name)
    assert local.train.steps <= full.train.steps


@pytest.mark.parametrize("name", FROM_SCRATCH_CONFIGS)
def test_runlocal_trains_two_steps(name, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # relative data paths (qwen_math's sample JSONL)
    assert_runlocal_trains(name, tmp_path)
