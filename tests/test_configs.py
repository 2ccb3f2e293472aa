"""Every experiment file's `runlocal` variant builds, validates and trains for 2 steps.

The variants run as written except: 2 steps, one device (sharded training is covered by
test_trainer.py's parity test; here every config would compile its programs for 8 devices),
and a small greedy eval at the last step only.
"""

import glob
import importlib.util
import json
import math
import os

import pytest
from test_trainer import REPO, get_config, read_metrics, series

from jaxrl_frontier.checkpoint import Checkpointer
from jaxrl_frontier.config import validate
from jaxrl_frontier.trainer import Trainer

CONFIGS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "configs", "*.py")))
QUICK = {
    "train.steps": 2,
    "mesh.num_devices": 1,
    "eval.at_start": False,
    "eval.num_prompts": 4,
    "eval.batch": 4,
    "eval.pass_k": 1,
}


def test_every_config_is_listed():
    assert {"grpo_arith", "sft_arith", "opd_arith", "opd_jsd_arith", "qwen_math"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_full_config_validates(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    validate(module.get_config(), num_devices=8)  # the full-size run's config is valid too


@pytest.mark.parametrize("name", CONFIGS)
def test_runlocal_trains_two_steps(name, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # relative data paths (qwen_math's sample JSONL)
    c = get_config(name, QUICK)
    tr = Trainer(c, str(tmp_path))
    summary = tr.run()
    assert summary["step"] == 2 and not summary["stopped"]
    assert int(tr.state.step) == 2 and int(tr.state.skipped) == 0
    rows = read_metrics(tmp_path)
    loss_key = "train/nll" if c.mode == "sft" else "train/loss"
    logged = series(rows, loss_key)
    assert 2 in logged
    assert all(math.isfinite(v) for v in logged.values())
    if c.mode == "rl":
        total = series(rows, "reward/total")[2]
        weights = c.objective.reward_weights.to_dict() or {"correctness": 1.0}
        assert 0.0 <= total <= sum(abs(w) for w in weights.values()) + 1e-6
        assert series(rows, "reward/failed")[2] == 0.0
        assert math.isfinite(series(rows, "train/grad_norm")[2])
        if c.teacher.init != "none":
            assert math.isfinite(series(rows, "opd/reverse_kl")[2])
    ev = series(rows, "eval/pass@1_greedy")
    assert 2 in ev and 0.0 <= ev[2] <= 1.0
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 2
    with open(tmp_path / "export" / "config.json") as f:
        exported = json.load(f)
    assert exported["hidden_size"] == c.model.hidden_size
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["train"]["steps"] == 2
