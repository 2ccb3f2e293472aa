"""One trainer per workdir (train/workdir_lock.py): a live holder refuses a second trainer,
naming it, before anything is written; a dead or silent holder is taken over with a warning;
the heartbeat thread keeps the file fresh."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import FAST, get_config

from jaxrl_frontier.core.errors import WorkdirLocked
from jaxrl_frontier.train.workdir_lock import LOCK_FILE, WorkdirLock


def _write_holder(workdir, host: str, pid: int, age_s: float) -> None:
    record = dict(host=host, pid=pid, token="other", heartbeat=time.time() - age_s, step=7)
    (workdir / LOCK_FILE).write_text(json.dumps(record))


@pytest.fixture
def live_pid():
    """The pid of a live process that is not this one."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_live_holder_on_this_host_refuses_and_a_dead_one_is_taken_over(tmp_path, live_pid):
    host = socket.gethostname()
    _write_holder(tmp_path, host, live_pid, age_s=0.0)
    said = []
    lock = WorkdirLock(tmp_path, heartbeat_s=0.05, stale_after_s=0.5, say=said.append)
    with pytest.raises(WorkdirLocked, match=rf"in use by pid {live_pid} on host {host}, at step 7"):
        lock.start()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == live_pid  # untouched

    # the same holder past its heartbeat is still alive (same host: its pid is checked)
    _write_holder(tmp_path, host, live_pid, age_s=3600.0)
    with pytest.raises(WorkdirLocked):
        lock.start()
    os.kill(live_pid, 9)  # killed, not yet reaped: a zombie, dead all the same
    time.sleep(0.2)
    lock.start()  # pid gone: taken over
    try:
        assert said == [
            f"warning: {tmp_path / LOCK_FILE}: taking over the lock of pid {live_pid} on host "
            f"{host} (pid {live_pid} is gone)"
        ]
        first = lock.read()
        assert first["pid"] == os.getpid() and first["token"] == lock.token
        time.sleep(0.3)  # the heartbeat thread refreshes it
        assert lock.read()["heartbeat"] > first["heartbeat"]
        lock.after_step(12)
        time.sleep(0.2)
        assert lock.read()["step"] == 12
    finally:
        lock.close()
    assert not (tmp_path / LOCK_FILE).exists()


def test_another_hosts_holder_is_judged_by_its_heartbeat(tmp_path):
    said = []
    _write_holder(tmp_path, "node-17", 4242, age_s=1.0)
    lock = WorkdirLock(tmp_path, heartbeat_s=1.0, stale_after_s=30.0, say=said.append)
    with pytest.raises(WorkdirLocked, match=r"in use by pid 4242 on host node-17"):
        lock.start()
    _write_holder(tmp_path, "node-17", 4242, age_s=45.0)
    lock.start()
    lock.close()
    assert len(said) == 1 and "no heartbeat for 45 s, more than 30 s" in said[0]
    with pytest.raises(ValueError, match="stale_after_s"):
        WorkdirLock(tmp_path, heartbeat_s=10, stale_after_s=5)


def test_a_second_trainer_refuses_before_writing_anything(tmp_path, live_pid):
    """The Trainer takes the lock before it writes: a refused one leaves the directory as it
    was (only the holder's lock file there), and the CLI says so in one line, exit 1."""
    from jaxrl_frontier.run.cli import train_main
    from jaxrl_frontier.run.trainer import Trainer

    _write_holder(tmp_path, socket.gethostname(), live_pid, age_s=0.0)
    before = (tmp_path / LOCK_FILE).read_text()
    with pytest.raises(WorkdirLocked, match=f"pid {live_pid}"):
        Trainer(get_config("grpo_arith", FAST), str(tmp_path))
    assert os.listdir(tmp_path) == [LOCK_FILE] and (tmp_path / LOCK_FILE).read_text() == before

    argv = ["train.py", "--config=configs/grpo_arith.py:runlocal", f"--workdir={tmp_path}"]
    cwd, old_argv = os.getcwd(), sys.argv
    try:
        os.chdir(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        sys.argv = argv
        with pytest.raises(SystemExit) as e:
            train_main(argv)
    finally:
        os.chdir(cwd)
        sys.argv = old_argv
    assert str(e.value).startswith(
        f"workdir locked: workdir {tmp_path} is in use by pid {live_pid}"
    )
    assert os.listdir(tmp_path) == [LOCK_FILE]
