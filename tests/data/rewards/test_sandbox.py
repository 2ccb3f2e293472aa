"""Sandboxed code execution (data/rewards/sandbox.py, data/tasks/code.py, rewards.SandboxedScorer): every
hostile completion scores 0 while a correct one in the same batch scores 1, the trainer's
process and files are untouched, and training goes on."""

import os
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
from conftest import FAST, get_config, read_metrics, series

from jaxrl_frontier.data.rewards.sandbox import Limits, Sandbox
from jaxrl_frontier.data.rewards.scorer import SandboxedScorer
from jaxrl_frontier.data.tasks import make_task

LIMITS = Limits(cpu_s=1.0, wall_s=3.0, memory_mb=256, output_bytes=4096, processes=16)
TASK = make_task("code", expressions=["a+b"])
EXAMPLE = TASK.example("train", 0)


def _uids_alive() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "uid=,pid=,comm="], capture_output=True, text=True)
    return [line for line in ps.stdout.splitlines() if int(line.split()[0]) >= 61000]


@pytest.fixture(scope="module")
def scorer():
    s = SandboxedScorer(TASK, workers=4, limits=LIMITS)
    yield s
    s.close()


def test_a_correct_completion_scores_1_and_a_wrong_one_0(scorer):
    assert EXAMPLE["expr"] == "a+b" and len(EXAMPLE["tests"]) == 4
    rewards, failed = scorer([EXAMPLE], [" a+b", " a-b", " a+", " True"])
    assert failed == 0
    assert rewards[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0]  # correctness
    assert rewards[:, 1].tolist() == [1.0, 1.0, 0.0, 1.0]  # format: f ran on every input


def test_every_code_problem_is_solved_by_its_reference_and_not_by_a_wrong_answer(scorer):
    """data/code_problems.jsonl: each row's reference completion passes its tests in the
    sandbox; the completion of another row (a wrong function) fails at least one."""
    problems = make_task("code_problems")
    rows = [
        problems.example(s, i) for s in ("train", "eval") for i in range(problems.num_examples(s))
    ]
    assert len(rows) == 28
    sandboxed = SandboxedScorer(problems, workers=4, limits=LIMITS)
    try:
        right, failed = sandboxed(rows, [r["solution"] for r in rows])
        shifted = [rows[(i + 1) % len(rows)]["solution"] for i in range(len(rows))]
        wrong, _ = sandboxed(rows, shifted)
    finally:
        sandboxed.close()
    assert failed == 0 and right[:, 0].tolist() == [1.0] * len(rows)
    assert wrong[:, 0].sum() == 0


def _hostile(secret_path: str, port: int, trainer_pid: int) -> dict[str, str]:
    """Completions of `return` that return a+b only if their attack worked, else -1: f's body
    calls a module-level `attack`, defined after it by the completion, run at each test."""

    def body(*lines: str) -> str:
        code = "\n".join("        " + line for line in lines)
        return (
            " attack(a, b)\n\n\ndef attack(a, b):\n    try:\n"
            + code
            + "\n    except BaseException:\n        return -1\n    return a + b"
        )

    return {
        "infinite loop": body("while True: pass"),
        "fork bomb": body(
            "import os", "while True:", "    try: os.fork()", "    except OSError: pass"
        ),
        "memory bomb": body("x = bytearray(2 * 10**9)", "x[-1] = 1"),
        "huge output": body("print('x' * 10**7)"),
        "read outside": body(f"assert open({secret_path!r}).read() == 'secret'"),
        "read the repo": body(f"open({os.path.abspath(__file__)!r}).read()"),
        "socket": body(
            "import socket",
            f"socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'leak')",
        ),
        "kill parent": body(
            "import os, signal", "os.kill(os.getppid(), signal.SIGKILL)", "raise SystemExit"
        ),
        "kill trainer": body("import os, signal", f"os.kill({trainer_pid}, signal.SIGKILL)"),
        "kill all": body("import os, signal", "os.kill(-1, signal.SIGKILL)", "raise SystemExit"),
        "read env": body("import os", "assert os.environ['JAXRL_TEST_SECRET'] == 'hunter2'"),
        "write outside": body(f"open({secret_path!r}, 'w').write('pwned')"),
    }


def test_every_hostile_completion_scores_0_and_the_trainer_is_untouched(
    scorer, tmp_path, monkeypatch
):
    monkeypatch.setenv("JAXRL_TEST_SECRET", "hunter2")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    received = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                received.append(conn.recv(100))
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    hostile = _hostile(str(secret), server.getsockname()[1], os.getpid())
    # the attacks' control: with the attack made harmless, each returns a+b and passes
    names = list(hostile)
    t0 = time.time()
    rewards, failed = scorer([EXAMPLE], [" a+b", *hostile.values()])
    seconds = time.time() - t0
    stop.set()
    thread.join()
    server.close()
    print(f"{len(names)} hostile completions + 1 correct scored in {seconds:.1f}s")
    print({n: r.status for n, r in zip(["correct", *names], scorer.last_results)})
    assert failed == 0
    assert rewards[0, 0] == 1.0, "the correct completion in the same batch"
    for name, row in zip(names, rewards[1:]):
        assert row[0] == 0.0, name
    assert secret.read_text() == "secret" and received == []
    assert _uids_alive() == [], "a sandboxed process outlived its run"
    assert seconds < 3 * LIMITS.wall_s + 5  # in parallel, each bounded by the wall limit


def test_the_attacks_work_without_their_target_so_the_zeros_are_earned():
    """The same completions in a sandbox-free run of their body would pass: the zeros above
    come from the containment, not from broken test programs (checked for the file read,
    the environment and the socket, which are safe to let succeed here)."""
    import subprocess as sp
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        secret = os.path.join(tmp, "secret.txt")
        with open(secret, "w") as f:
            f.write("secret")
        for name in ("read outside", "read env"):
            source = TASK.program(EXAMPLE, _hostile(secret, 1, 1)[name])
            env = dict(os.environ, JAXRL_TEST_SECRET="hunter2")
            out = sp.run([sys.executable, "-c", source], capture_output=True, text=True, env=env)
            result = type("R", (), dict(status="ok", output=out.stdout))()
            assert TASK.score(EXAMPLE, "", result)["correctness"] == 1.0, name


@pytest.mark.parametrize(
    "source, status, within",
    [
        ("while True: pass", "killed", 2.5),  # RLIMIT_CPU (1 s)
        ("import time; time.sleep(60)", "timeout", 4.0),  # wall (3 s)
        ("print('x' * 10**6)", "output_limit", 2.0),
        ("x = bytearray(10**9)", "error", 2.0),  # MemoryError under RLIMIT_AS
        ("import os; print(sorted(os.environ))", "ok", 2.0),
    ],
)
def test_limits(source, status, within):
    sb = Sandbox(LIMITS)
    t0 = time.time()
    r = sb.run(source)
    assert r.status == status, r
    assert time.time() - t0 < within
    if status == "ok":
        assert r.output.strip() == "['HOME', 'LANG', 'PATH']"  # nothing inherited
    if status == "output_limit":
        assert len(r.output) == LIMITS.output_bytes


def test_namespaces_are_used_where_available():
    sb = Sandbox(LIMITS)
    r = sb.run("import os; print(os.getcwd(), sorted(os.listdir('.')), os.getppid())")
    print("isolation:", sb.isolation)
    if sb.isolation == "namespaces":
        assert r.output.split() == ["/sandbox", "['main.py']", "1"]
    else:
        pytest.skip("no namespaces on this machine: the fallback is tested below")


def test_fallback_guard_refuses_sockets_and_outside_files(tmp_path):
    sb = Sandbox(LIMITS)
    sb.prefix, sb.isolation = [], "rlimits+preamble"  # as on a machine without unshare
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    r = sb.run(f"open({str(outside)!r}).read()")
    assert r.status == "error" and "outside the sandbox directory" in r.output
    r = sb.run("import socket; socket.socket()")
    assert r.status == "error" and "network access is disabled" in r.output
    assert (
        sb.run("open('mine.txt', 'w').write('ok'); print(open('mine.txt').read())").output == "ok\n"
    )


def test_training_goes_on_with_hostile_completions(tmp_path, monkeypatch):
    from jaxrl_frontier.run.trainer import Trainer

    overrides = {
        **FAST,
        "task.name": "code",
        "task.kwargs": {"max_value": 9},  # (replaces FAST's arithmetic settings)
        "data.max_prompt_len": 64,
        "rollout.max_new_tokens": 6,
        "rewards.scorer": "auto",
        "rewards.workers": 4,
        "rewards.wall_seconds": 2.0,
        "rewards.cpu_seconds": 1.0,
        "train.steps": 2,
        "eval.num_prompts": 4,
        "eval.batch": 4,
    }
    tr = Trainer(get_config("grpo_arith", overrides), str(tmp_path))
    assert isinstance(tr.scorer, SandboxedScorer)
    program = tr.task.program
    attacks = list(_hostile(str(tmp_path / "nope"), 9, os.getpid()).values())
    calls = []

    def with_attacks(example, completion):
        calls.append(1)
        if len(calls) % 4 == 0:  # every 4th completion of the run is hostile
            return program(example, attacks[len(calls) // 4 % len(attacks)])
        if len(calls) % 4 == 1:
            return program(example, tr.task.demonstration(example))  # and a 4th correct
        return program(example, completion)

    tr.task.program = with_attacks
    summary = tr.run()
    assert summary["step"] == 2 and not summary["stopped"]
    rows = read_metrics(tmp_path)
    assert series(rows, "reward/failed") == {1: 0.0, 2: 0.0}
    # 64 rows a step, a quarter of them correct
    np.testing.assert_allclose(series(rows, "reward/correctness")[1], 0.25)
    assert len(calls) == 2 * 64 + 4
    assert _uids_alive() == []
