"""Restarts that need nobody (sweeps/supervise.py, scripts/launch.py): a trainer killed twice
is restarted twice and ends with every step logged once; a job that fails the same way every
time stops after its budget and says why. (The SLURM requeue decision: test_launch.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

from conftest import FAST

from jaxrl_frontier.sweeps.supervise import Job, RestartPolicy, supervise

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_job_failing_the_same_way_stops_after_its_budget(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(
        "import os, sys\n"
        "print('warming up', file=sys.stderr)\n"
        "raise SystemExit(f'config error: key train.stepz (pid {os.getpid()}) is unknown')\n"
    )
    said, slept = [], []
    job = Job([sys.executable, str(script)])
    policy = RestartPolicy(max_restarts=5, same_failure_limit=3, backoff_s=2.0)
    attempt = supervise(job, policy, say=said.append, sleep=slept.append)
    assert not attempt.ok and attempt.returncodes == [1]
    assert attempt.signature == "exit 1: config error: key train.stepz (pid N) is unknown"
    assert slept == [2.0, 4.0]  # two restarts, the back-off doubling
    assert said[-1] == (
        "[launch] stopping: the job failed the same way 3 times in a row (exit 1: config "
        "error: key train.stepz (pid N) is unknown); a restart will not help"
    )
    # different failures each time: the restart budget stops it
    flaky = tmp_path / "flaky.py"
    flaky.write_text(
        "import os, sys\n"
        f"n = len(os.listdir({str(tmp_path)!r}))\n"
        f"open(os.path.join({str(tmp_path)!r}, f'a{{n}}'), 'w').close()\n"
        "raise SystemExit('failure ' + 'x' * n)\n"
    )
    said.clear()
    attempt = supervise(
        Job([sys.executable, str(flaky)]), RestartPolicy(max_restarts=2), said.append, id
    )
    assert said[-1] == "[launch] stopping: the restart budget (2) is spent"
    assert sum("failed" in m for m in said) == 3


def test_processes_get_the_distributed_flags():
    cmds = Job(["python", "train.py", "--workdir=w"], processes=3).commands()
    port = cmds[0][3].rsplit(":", 1)[1]
    assert [c[3:] for c in cmds] == [
        [
            f"--config.distributed.coordinator_address=127.0.0.1:{port}",
            "--config.distributed.num_processes=3",
            f"--config.distributed.process_id={i}",
        ]
        for i in range(3)
    ]
    assert Job(["python", "t.py"]).commands() == [["python", "t.py"]]


def _train_steps(workdir) -> list[int]:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    steps = []
    for line in open(path).read().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "train/loss" in row:
            steps.append(row["step"])
    return steps


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_a_trainer_killed_twice_is_restarted_twice_and_logs_every_step_once(tmp_path):
    steps = 6
    flags = {**FAST, "train.steps": steps, "train.checkpoint_every": 2}
    train_args = [
        "--config=tests/fixtures/grpo_arith_shaped.py:runlocal",
        f"--workdir={tmp_path}",
        *(f"--config.{k}={v}" for k, v in flags.items()),
    ]
    cmd = [sys.executable, "scripts/launch.py", "--backoff=0.1", "--", *train_args]
    launcher = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for kill in (1, 2):  # once a new checkpoint is committed after the last kill
            target = 2 * kill
            deadline = time.monotonic() + 240
            while not os.path.isdir(tmp_path / "checkpoints" / str(target)):
                assert launcher.poll() is None and time.monotonic() < deadline
                time.sleep(0.01)
            trainers = _children(launcher.pid)
            assert len(trainers) == 1
            os.kill(trainers[0], signal.SIGKILL)
        out, err = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    err = err.decode()
    assert launcher.returncode == 0, err[-3000:]
    assert "[launch] restart 1 of 5 in 0.1 s" in err and "[launch] restart 2 of 5 in 0.2 s" in err
    assert "restart 3" not in err and err.count("failed: process 0 exit -9") == 2
    assert _train_steps(tmp_path) == list(range(1, steps + 1))
    assert json.loads(out.decode().strip().splitlines()[-1])["step"] == steps
