"""The `runlocal` variants of the configs that read a pretrained checkpoint (Gemma-3-270M,
SmolLM2-135M-Instruct: models/pretrained.py) train 2 steps and log their recorded metrics
(tests/runlocal_check.py). Apart from tests/run/test_configs.py because each takes
about a minute here (the checkpoints' loads, compiles at their shapes, a checkpoint and an
export of their size): a file the suite's schedule runs in a process of its own.
"""

import pytest
from conftest import REPO
from runlocal_check import PRETRAINED_CONFIGS, assert_runlocal_trains, fetch_pretrained


@pytest.fixture(scope="module", autouse=True)
def pretrained_checkpoints():
    """The named checkpoints the configs train, fetched once."""
    fetch_pretrained()


@pytest.mark.parametrize("name", PRETRAINED_CONFIGS)
def test_runlocal_trains_two_steps(name, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    assert_runlocal_trains(name, tmp_path)
