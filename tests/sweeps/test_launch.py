"""Sweep launchers (sweeps/launch.py): a 2 x 2 grid with 2 seeds of a tiny runlocal config
run, collected and skipped on a re-run, a resumed run, the slurm launcher's array job through
submitit's local executor and its requeue decision, a sweep packed into a population, and
the core pinning.

Runs use grpo_arith:runlocal shrunk further (1-digit addition, 2 steps, one device, a
4-prompt eval at the last step only) and run in this process (`inprocess=True`, through
the CLI's entry point), so the persistent compilation cache of conftest.py serves every
compile after the first.
"""

import csv
import json
import os

import numpy as np
import pytest

from jaxrl_frontier.sweeps.collect import RESULTS_JSON, TABLE_CSV, collect
from jaxrl_frontier.sweeps.launch import (
    ATTEMPTS_FILE,
    DONE_FILE,
    RequeueingRunOne,
    Run,
    cpu_slots,
    launch_local,
    launch_slurm,
    plan,
    requeue_decision,
)

TINY = {
    "mesh.num_devices": 1,
    "task.kwargs.max_digits": 1,
    "task.kwargs.prompt_template": "{a}{op}{b}=",
    "data.max_prompt_len": 5,
    "data.prompt_batch": 4,
    "rollout.max_new_tokens": 3,
    "rollout.group_size": 4,
    "train.steps": 2,
    "train.minibatches": 1,
    "train.log_every": 1,
    "train.eval_every": 2,
    "train.checkpoint_every": 2,
    "train.rollout_log_every": 1,
    "eval.at_start": False,
    "eval.num_prompts": 4,
    "eval.batch": 4,
    "eval.pass_k": 1,
}


def write_sweep(tmp_path, body: str, name: str = "sweep.py") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


GRID_SWEEP = f"""
from jaxrl_frontier.sweeps import grid, product, seeds

TINY = {TINY!r}

def get_sweep():
    axes = grid(**{{"optimizer.lr": [1e-3, 3e-3], "objective.advantage": ["grpo", "rloo"]}})
    return product(axes, seeds(2), [TINY])
"""


# ============================================================================ runs


@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grid")
    sweep = write_sweep(tmp, GRID_SWEEP)
    root = str(tmp / "root")
    runs = plan(sweep, "configs/grpo_arith.py:runlocal", root)
    said: list[str] = []
    results = launch_local(runs, say=said.append, inprocess=True)
    return sweep, root, runs, results, said


def test_grid_with_seeds_runs_and_collects(grid_sweep):
    sweep, root, runs, results, said = grid_sweep
    assert len(runs) == 8 and len({r.workdir for r in runs}) == 8
    assert [r["status"] for r in results] == ["done"] * 8, [r.get("error") for r in results]
    assert said[0] == "[sweep] 8 runs, 0 finished before"
    assert said[1].startswith("[sweep] run 1/8 ") and "done in" in said[1]
    for run in runs:
        done = json.load(open(os.path.join(run.workdir, DONE_FILE)))
        assert done["summary"]["step"] == 2 and done["wall_seconds"] > 0
        cfg = json.load(open(os.path.join(run.workdir, "config.json")))
        given = dict(run.overrides)
        assert cfg["seed"] == given["seed"]
        assert cfg["optimizer"]["lr"] == given["optimizer.lr"]
        assert cfg["objective"]["advantage"] == given["objective.advantage"]

    out = collect(root)
    assert len(out["runs"]) == 8 and len(out["groups"]) == 4
    with open(os.path.join(root, TABLE_CSV)) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4 and {row["n_seeds"] for row in table} == {"2"}
    # mean and std over seeds against the runs' own metrics.jsonl
    for row in table:
        members = [r for r in runs if r.group == row["group"]]
        assert len(members) == 2
        finals = []
        for r in members:
            with open(os.path.join(r.workdir, "metrics.jsonl")) as f:
                rows = [json.loads(line) for line in f]
            finals.append([x for x in rows if "reward/total" in x][-1]["reward/total"])
        assert float(row["reward/total:mean"]) == pytest.approx(np.mean(finals))
        assert float(row["reward/total:std"]) == pytest.approx(np.std(finals, ddof=1))
    results_json = json.load(open(os.path.join(root, RESULTS_JSON)))
    curve = results_json["groups"][0]["curves"]["reward/total"]
    assert curve["steps"] == [1, 2] and len(curve["mean"]) == 2


def test_rerun_skips_finished_and_resumes_a_killed_run(grid_sweep):
    sweep, root, runs, _, _ = grid_sweep
    killed = runs[3]
    os.remove(os.path.join(killed.workdir, DONE_FILE))  # as if killed after its last save
    said: list[str] = []
    again = plan(sweep, "configs/grpo_arith.py:runlocal", root)
    assert [r.workdir for r in again] == [r.workdir for r in runs]  # stable names
    results = launch_local(again, say=said.append, inprocess=True)
    assert [r["status"] for r in results] == ["skipped"] * 3 + ["done"] + ["skipped"] * 4
    assert said[0] == "[sweep] 8 runs, 7 finished before"
    assert "skipped (finished before)" in said[1]
    attempts = open(os.path.join(killed.workdir, ATTEMPTS_FILE)).read().splitlines()
    assert len(attempts) == 2
    for run in runs:
        if run is not killed:
            assert len(open(os.path.join(run.workdir, ATTEMPTS_FILE)).read().splitlines()) == 1
    # the resumed run restored step 2 and did not log any step twice
    with open(os.path.join(killed.workdir, "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f if "train/loss" in line]
    assert steps == [1, 2]


def test_slurm_launcher_runs_an_array_job_with_submitits_local_executor(tmp_path):
    sweep = write_sweep(
        tmp_path,
        "from jaxrl_frontier.sweeps import product, seeds\n"
        f"def get_sweep():\n    return product(seeds(2), [{TINY!r}])\n",
    )
    root = tmp_path / "root"
    runs = plan(sweep, "configs/grpo_arith.py:runlocal", str(root))
    said: list[str] = []
    params = dict(timeout_min=10, cpus_per_task=1, slurm_array_parallelism=2)
    results = launch_slurm(
        runs, say=said.append, folder=str(tmp_path / "submitit"), cluster="local", params=params
    )
    assert [r["status"] for r in results] == ["done", "done"], said
    assert said[1].startswith("[sweep] submitted array job ") and "(2 tasks)" in said[1]
    for run in runs:
        assert json.load(open(os.path.join(run.workdir, DONE_FILE)))["summary"]["step"] == 2
    # the same command again submits nothing
    said.clear()
    results = launch_slurm(
        runs, say=said.append, folder=str(tmp_path / "submitit"), cluster="local"
    )
    assert [r["status"] for r in results] == ["skipped", "skipped"]
    assert said[0] == "[sweep] 2 runs, 2 finished before; 0 in one array job"


def test_a_pinned_run_records_the_cores_it_had():
    import os

    from jaxrl_frontier.sweeps.launch import machine

    assert machine([0]).endswith(", 1 core")
    assert machine([0, 1, 2]).endswith(", 3 cores")
    n = len(os.sched_getaffinity(0))
    assert machine().endswith(f", {n} core{'s' if n > 1 else ''}")


POPULATION_SWEEP = f"""
from jaxrl_frontier.sweeps import grid, product, seeds

TINY = {TINY!r}

def get_sweep():
    kl = grid(**{{"objective.kl_coef": [0.01, 0.05]}})
    return product(kl, seeds(2), [TINY], [{{"objective.advantage": "rloo"}}])
"""


def test_a_sweep_packed_into_a_population_collects_as_its_runs(tmp_path):
    from jaxrl_frontier.sweeps import populations

    sweep = write_sweep(tmp_path, POPULATION_SWEEP)
    root = str(tmp_path / "root")
    solo = plan(sweep, "configs/grpo_arith.py:runlocal", root)
    runs = populations.pack(solo, 4)
    assert len(solo) == 4 and len(runs) == 1 and len(runs[0].members) == 4
    given = dict(runs[0].overrides)
    assert given["population.vary.seed"] == (0, 1, 0, 1)
    assert given["population.vary.objective.kl_coef"] == (0.01, 0.01, 0.05, 0.05)
    assert given["objective.advantage"] == "rloo" and given["population.same_prompts"] is False
    (result,) = launch_local(runs, say=lambda _: None, inprocess=True)
    assert result["status"] == "done", result.get("error")
    out = collect(root)
    assert sorted(r["name"] for r in out["runs"]) == sorted(r.name for r in solo)
    assert [g["seeds"] for g in out["groups"]] == [[0, 1], [0, 1]]
    assert all(r["status"] == "done" and r["step"] == 2 for r in out["runs"])
    for i, member in enumerate(solo):  # each member ran its own run's seed and value
        cfg = json.load(open(os.path.join(populations.member_dir(runs[0], i), "config.json")))
        want = dict(member.overrides)
        assert cfg["seed"] == want["seed"] and cfg["data"]["seed"] is None
        assert cfg["schedules"]["objective"]["kl_coef"] == want["objective.kl_coef"]
    whole = json.load(open(os.path.join(runs[0].workdir, DONE_FILE)))["wall_seconds"]
    shares = [r["wall_seconds"] for r in out["runs"]]  # each member's 1/4 of the job's time
    assert shares == pytest.approx([whole / 4] * 4, abs=0.01)
    assert populations.pack(solo, 3)[1] is solo[3]  # a group's rest of one runs alone


def test_slurm_requeue_decision(tmp_path):
    """A preempted or timed-out SLURM task is requeued (submitit's checkpoint returns a
    DelayedSubmission of the same task) until its budget is spent or the run is done."""
    run = Run("lr=0.1", "configs/grpo_arith.py:runlocal", (("optimizer.lr", 0.1),), str(tmp_path))
    task = RequeueingRunOne(max_requeues=2)
    for n in (1, 2):
        assert requeue_decision(run, 2) == (True, f"lr=0.1: requeue {n} of 2")
        delayed = task.checkpoint(run, True)
        assert delayed.function is task and delayed.args == (run, True)
    assert task.checkpoint(run, True) is None
    assert requeue_decision(run, 2) == (
        False,
        "lr=0.1: requeued 2 times already (max_requeues=2); not requeued: resume it with the "
        "same sweep command",
    )
    (tmp_path / DONE_FILE).write_text("{}")
    assert requeue_decision(run, 5) == (False, "lr=0.1: finished; not requeued")


def test_cpu_slots_cut_the_cores_among_the_workers(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 0, 1, 2, 3, 4})
    assert cpu_slots(1, 1) == [None]  # one worker: unpinned
    assert cpu_slots(2, 1) == [[0, 1, 2], [3, 4, 5]]
    assert cpu_slots(0, 2) == [[0, 1], [2, 3], [4, 5]]  # 0: one worker per 2 cores
    assert cpu_slots(0, 8) == [None]  # fewer cores than one run asks: one worker
    assert cpu_slots(4, 1) == [[0], [1], [2], [3]]


def test_a_run_gives_the_train_script_its_flags(tmp_path):
    run = Run("r", "configs/x.py:runlocal", (("optimizer.lr", 0.001), ("seed", 3)), str(tmp_path))
    assert run.train_args() == [
        "--config=configs/x.py:runlocal",
        f"--workdir={tmp_path}",
        "--config.optimizer.lr=0.001",
        "--config.seed=3",
    ]
    assert not run.done
    (tmp_path / DONE_FILE).write_text("{}")
    assert run.done
