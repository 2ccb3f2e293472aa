"""The results table (sweeps/collect.py): a run's series from metrics.jsonl and the rollout
log, its record, the spread over seeds, and a hand-made sweep root collected into its CSV
tables."""

import csv
import json
import os

import pytest

from jaxrl_frontier.sweeps.collect import (
    RUNS_CSV,
    TABLE_CSV,
    collect,
    group_runs,
    read_run,
    read_series,
    spread,
)
from jaxrl_frontier.sweeps.launch import ATTEMPTS_FILE, DONE_FILE, RUN_FILE


def write_jsonl(path, rows, torn: str = ""):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.write(torn)


def make_run(root, name, seed, rewards, lr=0.1, done=True):
    workdir = os.path.join(root, name)
    os.makedirs(workdir)
    meta = dict(name=name, config="configs/x.py", overrides={"optimizer.lr": lr, "seed": seed})
    with open(os.path.join(workdir, RUN_FILE), "w") as f:
        json.dump(meta, f)
    rows = [{"step": s, "time": 100.0 + 2 * s, "reward": r} for s, r in enumerate(rewards, 1)]
    write_jsonl(os.path.join(workdir, "metrics.jsonl"), rows)
    write_jsonl(os.path.join(workdir, ATTEMPTS_FILE), [{"seconds": 3.0, "cpu_seconds": 5.0}])
    if done:
        with open(os.path.join(workdir, DONE_FILE), "w") as f:
            json.dump({"wall_seconds": 4.0 + seed, "machine": "m"}, f)
    return workdir


def test_spread_is_the_sample_std():
    assert spread([1.0, 2.0, 6.0]) == dict(
        mean=3.0, std=pytest.approx(7**0.5), min=1.0, max=6.0, n=3
    )
    assert spread([5.0]) == dict(mean=5.0, std=0.0, min=5.0, max=5.0, n=1)


def test_read_series_adds_the_rollout_lengths_and_skips_a_torn_line(tmp_path):
    rows = [{"step": 1, "time": 9.0, "loss": 2.0, "note": "x"}, {"step": 2, "loss": 1.5}]
    write_jsonl(tmp_path / "metrics.jsonl", rows, torn='{"step": 3, "lo')
    rollouts = [
        {"step": 1, "completion": "12", "rewards": {"correctness": 1.0}},
        {"step": 1, "completion": "1234", "rewards": {"correctness": 1.0}},
        {"step": 1, "completion": "9", "rewards": {"correctness": 0.5}},
        {"step": 2, "completion": "123456"},
    ]
    write_jsonl(tmp_path / "rollouts.jsonl", rollouts)
    assert read_series(str(tmp_path)) == {
        "loss": [[1, 2.0], [2, 1.5]],
        "rollouts/length_correct": [[1, 3.0]],
        "rollouts/length_incorrect": [[1, 1.0], [2, 6.0]],
    }


def test_read_run_of_a_finished_and_an_unfinished_run(tmp_path):
    done = read_run(make_run(tmp_path, "a", 1, [0.1, 0.3, 0.2]))
    assert done["group"] == "config=x__optimizer.lr=0.1"
    assert (done["seed"], done["status"], done["step"], done["attempts"]) == (1, "done", 3, 1)
    assert (done["wall_seconds"], done["cpu_seconds"], done["train_seconds"]) == (5.0, 5.0, 4.0)
    assert done["final"] == {"reward": 0.2}
    killed = read_run(make_run(tmp_path, "b", 2, [0.5], done=False))
    assert (killed["status"], killed["wall_seconds"], killed["train_seconds"]) == (
        "incomplete",
        3.0,
        0.0,
    )


def test_groups_average_the_seeds_over_their_common_steps(tmp_path):
    runs = [
        read_run(make_run(tmp_path, "a1", 1, [0.1, 0.3, 0.5])),
        read_run(make_run(tmp_path, "a0", 0, [0.3, 0.5])),
        read_run(make_run(tmp_path, "b0", 0, [0.9], lr=0.2)),
    ]
    a, b = group_runs(runs)
    assert a["seeds"] == [0, 1] and a["overrides"] == {"optimizer.lr": 0.1}
    assert a["final"]["reward"]["mean"] == pytest.approx(0.5)  # finals 0.5 and 0.5
    assert a["curves"]["reward"]["steps"] == [1, 2]  # step 3: seed 0 never logged it
    assert a["curves"]["reward"]["mean"] == pytest.approx([0.2, 0.4])
    assert a["curves"]["reward"]["std"] == pytest.approx([2**0.5 * 0.1] * 2)
    assert a["step"]["mean"] == 2.5 and a["wall_seconds"]["mean"] == 4.5
    assert (b["seeds"], b["final"]["reward"]["std"]) == ([0], 0.0)


def test_collect_writes_the_run_and_group_tables(tmp_path):
    for name, seed, rewards in [("a0", 0, [0.2]), ("a1", 1, [0.4]), ("a2", 2, [0.9])]:
        make_run(tmp_path, name, seed, rewards)
    out = collect(str(tmp_path))
    assert [r["name"] for r in out["runs"]] == ["a0", "a1", "a2"] and len(out["groups"]) == 1
    with open(tmp_path / TABLE_CSV) as f:
        (row,) = list(csv.DictReader(f))
    assert (row["n_seeds"], row["n_done"], row["optimizer.lr"]) == ("3", "3", "0.1")
    assert float(row["reward:mean"]) == pytest.approx(0.5)
    assert float(row["reward:std"]) == pytest.approx(0.13**0.5)  # (0.09 + 0.01 + 0.16) / 2
    with open(tmp_path / RUNS_CSV) as f:
        assert [r["reward"] for r in csv.DictReader(f)] == ["0.2", "0.4", "0.9"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no run directory"):
        collect(str(tmp_path / "empty"))
