"""Two processes on localhost (CPU collectives, 4 fake devices each) train exactly as one
process with 8 devices: the same per-step metrics and final parameters, also across a
checkpoint and a resume of the two-process run.

Every process runs the same command (`scripts/train.py` with `distributed.*` set), owns its
own prompts, and contributes its rows to the global arrays; process 0 writes the logs and the
export. The same runs are stopped by SIGTERM to one process, and killed (one process, or
both) during a step or a save, and resumed (the faults of docs/reliability.md).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Timing and host-side figures differ between runs by nature; everything else must match.
NOT_COMPARED = ("time", "perf/", "rollout/seconds")
FLAGS = {
    "train.checkpoint_every": 2,
    "train.eval_every": 2,  # the first leg of the resumed run ends with an eval too
    "train.log_every": 1,
    "train.rollout_log_every": 1,
}


# tests/fixtures/one_cache_key/sitecustomize.py: the two processes of a leg share the
# persistent-cache entries (else process 1 recompiles every program at every leg)
ONE_CACHE_KEY = os.path.join(REPO, "tests", "fixtures", "one_cache_key")


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ONE_CACHE_KEY, env.get("PYTHONPATH")]))
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
    return env


def _cmd(workdir, steps: int, extra: dict) -> list[str]:
    flags = {**FLAGS, "train.steps": steps, **extra}
    return [
        sys.executable,
        os.path.join(REPO, "scripts", "train.py"),
        "--config=tests/fixtures/grpo_arith_shaped.py:runlocal",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in flags.items()),
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_two_processes(workdir, steps: int, extra: dict | None) -> list[subprocess.Popen]:
    port = _free_port()
    return [
        subprocess.Popen(
            _cmd(
                workdir,
                steps,
                {
                    **(extra or {}),
                    "distributed.coordinator_address": f"127.0.0.1:{port}",
                    "distributed.num_processes": 2,
                    "distributed.process_id": i,
                },
            ),
            cwd=REPO,
            env=_env(4),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]


def _run_two_processes(
    workdir,
    steps: int,
    extra: dict | None = None,
    kill_after_checkpoint: int | None = None,
    said: list | None = None,
) -> list[dict]:
    """Both processes to the end (their summaries; process 0's stdout appended to `said`),
    or killed with SIGKILL once checkpoint `kill_after_checkpoint` is committed (orbax
    renames its directory into place)."""
    procs = _start_two_processes(workdir, steps, extra)
    outs = []
    try:
        if kill_after_checkpoint is not None:
            committed = os.path.join(workdir, "checkpoints", str(kill_after_checkpoint))
            deadline = time.monotonic() + 600
            while not os.path.isdir(committed):
                assert all(p.poll() is None for p in procs), "a process ended before the kill"
                assert time.monotonic() < deadline, "no checkpoint to kill after"
                time.sleep(0.02)
            for p in procs:
                p.kill()
            return []
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-4000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
            if said is not None and not said:
                said.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


def _run_one_process(workdir, steps: int, extra: dict) -> None:
    """The reference: one process with 8 devices, to the end."""
    proc = subprocess.run(
        _cmd(workdir, steps, extra), cwd=REPO, env=_env(8), capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]


def _metrics(workdir) -> dict[int, dict]:
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    by_step: dict[int, dict] = {}
    for row in rows:
        kept = {k: v for k, v in row.items() if k != "step" and not k.startswith(NOT_COMPARED)}
        by_step.setdefault(row["step"], {}).update(kept)
    return by_step


def _weights(workdir) -> dict[str, np.ndarray]:
    export = os.path.join(workdir, "export")
    out = {}
    for name in sorted(os.listdir(export)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(export, name)))
    return out


def _rollouts(workdir) -> list[tuple]:
    rows = [json.loads(line) for line in open(os.path.join(workdir, "rollouts.jsonl"))]
    return [(r["step"], r["prompt"], r["completion"], r["rewards"]) for r in rows]


REFERENCE_STEPS = 10  # long enough for three SIGTERM legs, a kill and a last leg


@pytest.fixture(scope="module")
def one_process_reference(tmp_path_factory):
    """The reference of the synchronous runs: one process with 8 devices, 10 steps."""
    single = tmp_path_factory.mktemp("single")
    _run_one_process(single, REFERENCE_STEPS, {})
    return single


@pytest.fixture(scope="module")
def two_processes_reference(tmp_path_factory):
    """The bitwise reference of the fault legs: 2 processes x 4 devices, uninterrupted."""
    multi = tmp_path_factory.mktemp("two")
    assert [o["step"] for o in _run_two_processes(multi, REFERENCE_STEPS)] == [10, 10]
    return multi


def _assert_equal_to_reference(want_dir, got_dir, exact: bool = False) -> None:
    """Every per-step metric (time keys aside), the rollouts and the exported weights;
    one row per logged step. `exact`: bitwise (two runs of the same processes). Else (1 x 8
    vs 2 x 4 devices) the metrics to rtol 1e-4 and the weights to 1e-5: a mean over hosts
    sums in another order (the advantages' mean differs by 1e-8 relative at step 1), and ten
    updates at lr 5e-3 carry that to at most 2.4e-5 relative (train/grad_norm at step 5;
    weights 1.6e-6 absolute), measured here."""
    want, got = _metrics(want_dir), _metrics(got_dir)
    steps = list(range(1, REFERENCE_STEPS + 1))
    assert sorted(got) == sorted(want) and set(steps) <= set(want)
    for step in want:
        assert set(got[step]) == set(want[step]), step
        if exact:
            assert got[step] == want[step], step
            continue
        for key, value in want[step].items():
            np.testing.assert_allclose(
                got[step][key], value, rtol=1e-4, atol=1e-5, err_msg=f"step {step} {key}"
            )
    assert "train/loss" in want[2] and "eval/pass@1_greedy" in want[2]
    moved = [s for s in steps if want[s]["train/grad_norm"] > 1e-3]  # (a group of equal
    assert len(moved) >= 6, f"vacuous: a gradient at steps {moved} only"  # rewards has none)
    assert _rollouts(got_dir) == _rollouts(want_dir) and len(_rollouts(want_dir)) >= len(steps)
    w_want, w_got = _weights(want_dir), _weights(got_dir)
    assert sorted(w_want) == sorted(w_got) and w_want
    for name in w_want:
        if exact:
            np.testing.assert_array_equal(w_got[name], w_want[name], err_msg=name)
        else:
            np.testing.assert_allclose(
                w_got[name], w_want[name], rtol=1e-5, atol=1e-5, err_msg=name
            )
    # process 0 alone wrote the logs: one row per logged step, no duplicates
    rows = [json.loads(line) for line in open(got_dir / "metrics.jsonl")]
    assert [r["step"] for r in rows if "train/loss" in r] == steps


def test_two_processes_equal_one_process(one_process_reference, two_processes_reference):
    """2 processes x 4 devices train as 1 process x 8: the same metrics to 1e-4 and exported
    weights to 1e-5. (The same 2 processes stopped and resumed end bitwise equal to this
    uninterrupted run: the SIGTERM test below; rollouts ahead and partial rollouts across a
    resume: the two tests after this one.)"""
    _assert_equal_to_reference(one_process_reference, two_processes_reference)
    assert not os.path.exists(two_processes_reference / "metrics.jsonl.1")


ASYNC = {  # rollouts 2 steps ahead; an eval and a checkpoint (neither drains) every 3 steps
    "rollout.max_staleness": 2,
    "train.checkpoint_every": 3,
    "train.eval_every": 3,
}


def _assert_same_run(want: dict, got: dict, w_want: dict, w_got: dict, rtol: float) -> None:
    """Lags and lengths exactly, float metrics and weights to `rtol` (atol 1e-6 for values
    near 0: advantage means ~1e-9, losses ~1e-4; a mean over hosts sums in another order).
    Entropies to atol 1e-4 besides: dH/dz_i = -p_i (log p_i + H), so logits off by d move
    H by up to d * sum_i p_i |log p_i + H| <= d * (V / e + H), about 24 d for V = 64; the
    weights here end up to 1.4e-6 apart, the logits a few 1e-6, and a near-greedy policy's
    H ~ 0.15 then moves by 6e-5 (4e-4 relative, at step 6 of the run with batches ahead)."""
    assert sorted(got) == sorted(want)
    for step in want:
        assert set(got[step]) == set(want[step]), step
        for key, value in want[step].items():
            if key.startswith(("rollout/response_length", "rollout/policy_lag")):  # integers
                assert got[step][key] == value, f"step {step} {key}"
            atol = 1e-4 if "entropy" in key else 1e-6
            np.testing.assert_allclose(
                got[step][key], value, rtol=rtol, atol=atol, err_msg=f"step {step} {key}"
            )
    assert sorted(w_want) == sorted(w_got) and w_want
    for name in w_want:
        # Adam's step m / sqrt(v) of a near-0 gradient component is up to lr (5e-3) whatever
        # its size: its rounding moves such a weight by ~lr x 1e-3
        np.testing.assert_allclose(w_got[name], w_want[name], rtol=rtol, atol=1e-5, err_msg=name)


def _assert_bitwise(want_dir, got_dir) -> None:
    """Two runs of the same 2 processes, one interrupted: every logged metric (time keys
    aside), the rollouts and the exported weights bitwise equal."""
    assert _metrics(got_dir) == _metrics(want_dir)
    assert _rollouts(got_dir) == _rollouts(want_dir)
    w_want, w_got = _weights(want_dir), _weights(got_dir)
    assert sorted(w_want) == sorted(w_got) and w_want
    for name in w_want:
        np.testing.assert_array_equal(w_got[name], w_want[name], err_msg=name)


PARTIAL = {  # partial rollouts: 8 prompts (one per device), 8 slots (one per device)
    "data.prompt_batch": 8,
    "rollout.continuous_slots": 8,
    "rollout.partial_budget": 2,
    "objective.weight": "tis",
    "train.checkpoint_every": 3,
    "train.eval_every": 3,
}


def test_two_processes_with_partial_rollouts_equal_one_process(tmp_path):
    """rollout.partial_budget on 2 processes x 4 devices: each process begins and continues
    its own prompts' rows on its own 4 devices (one slot loop per device, keys by global
    row), and each checkpoint holds every process's rows in flight. Across a resume from
    such a checkpoint, the prompts, completions, rewards and token lags equal those of 1
    process x 8 devices (the same device loops over the same rows) exactly, the other
    metrics and the weights to rtol 2e-4 (the samplers are different programs: f32
    rounding of the log-probs, as with rollouts ahead). The run is killed after step 3's
    checkpoint, then resumed to the end: bitwise the same 2 processes' uninterrupted run.
    (A stop agreed on a SIGTERM saves through the same checkpoint: the fault test below.)"""
    single = tmp_path / "single"
    _run_one_process(single, 6, PARTIAL)
    multi = tmp_path / "multi"
    _run_two_processes(multi, 6, PARTIAL, kill_after_checkpoint=3)  # rows in flight
    held = json.load(open(multi / "checkpoints" / "3" / "meta" / "metadata"))["partial"]
    assert len(held["per_process"]) == 2  # each process's rows in flight
    assert all(len(p["examples"]) == 4 for p in held["per_process"])
    assert [o["step"] for o in _run_two_processes(multi, 6, PARTIAL)] == [6, 6]
    whole = tmp_path / "whole"  # the same 2 processes, never stopped
    assert [o["step"] for o in _run_two_processes(whole, 6, PARTIAL)] == [6, 6]
    _assert_bitwise(whole, multi)

    want, got = _metrics(single), _metrics(multi)
    lags = [want[s]["rollout/token_lag_max"] for s in range(1, 7)]
    assert lags == [0, 1, 1, 1, 1, 1], lags  # rows begun one step before, across the resume
    for step in range(1, 7):
        for key in ("rollout/token_lag_mean", "rollout/lagged_token_share"):
            assert got[step][key] == want[step][key], (step, key)
    assert _rollouts(multi) == _rollouts(single) and len(_rollouts(single)) >= 6
    _assert_same_run(want, got, _weights(single), _weights(multi), rtol=2e-4)


def test_two_processes_keep_the_batches_ahead_across_a_kill(tmp_path):
    """rollout.max_staleness = 2 with the checkpoint at step 3 not an eval: the checkpoint
    does not drain the queue on 2 processes either. It holds the 2 batches in flight (the
    arrays once, each process's results apart); both processes killed with SIGKILL after it
    and resumed give the 1 process x 8 devices run: lags 0, 1, 2, 2, 2, 2, the same prompts,
    completions and rewards exactly (each process samples its own prompts on its own 4
    devices in a background thread, keys by global row), the rest to rtol 2e-4: the samplers
    are different programs (4 local devices vs an 8-device SPMD one), so their log-probs
    differ by f32 rounding (2e-7 relative at step 1), which six updates at lr 5e-3 with
    gradient norms up to 19 carry to at most 9e-5. The kill is of process 0 alone (the
    coordination service with it): process 1 exits 75 at once with one line naming process 0
    and the step. The end is bitwise the same 2 processes' uninterrupted run."""
    kept = {**ASYNC, "train.eval_every": 6}
    single = tmp_path / "single"
    _run_one_process(single, 6, kept)
    multi = tmp_path / "multi"
    waited = _kill_process_0_after_checkpoint(multi, 6, kept, 3)
    print(f"lost process 0: process 1 exited 75 after {waited:.1f} s")
    held = json.load(open(multi / "checkpoints" / "3" / "meta" / "metadata"))["ahead"]
    assert [b["policy_version"] for b in held] == [1, 2]  # steps 4 and 5's batches
    assert [len(b["per_process"]) for b in held] == [2, 2]
    assert [o["step"] for o in _run_two_processes(multi, 6, kept)] == [6, 6]
    whole = tmp_path / "whole"  # the same 2 processes, never stopped
    assert [o["step"] for o in _run_two_processes(whole, 6, kept)] == [6, 6]
    _assert_bitwise(whole, multi)

    want, got = _metrics(single), _metrics(multi)
    lags = [want[s]["rollout/policy_lag"] for s in range(1, 7)]
    assert lags == [0, 1, 2, 2, 2, 2], lags
    assert _rollouts(multi) == _rollouts(single) and len(_rollouts(single)) >= 6
    _assert_same_run(want, got, _weights(single), _weights(multi), rtol=2e-4)


# ============================================================================ faults

HEARTBEAT = 10  # distributed.heartbeat_timeout_s of the fault legs


def _train_rows(workdir) -> list[int]:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    rows = []
    for line in open(path).read().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a row being written
        if "train/loss" in row:
            rows.append(row["step"])
    return rows


def _wait_for(condition, procs, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert all(p.poll() is None for p in procs), f"a process ended before {what}"
        assert time.monotonic() < deadline, f"no {what}"
        time.sleep(0.005)


def _saving_after(workdir, step: int):
    """The step of a save in flight after `step` (its temporary directory exists), else None."""
    ckpt = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(ckpt):
        return None
    for name in os.listdir(ckpt):
        head = name.split(".", 1)[0]
        if "tmp" in name and head.isdigit() and int(head) > step:
            return int(head)
    return None


def _sigterm_leg(workdir, steps: int, extra: dict, after_rows: int) -> tuple[int, float]:
    """Start both processes on `workdir`; once `after_rows` train rows are on disk (and the
    leg logged one), SIGTERM to process 1 alone. Both must agree to stop after the same
    step, save it and exit 0. Returns (the step stopped at, seconds from signal to exit)."""
    before = len(_train_rows(workdir))
    procs = _start_two_processes(workdir, steps, extra)
    try:
        rows = lambda: _train_rows(workdir)  # noqa: E731
        _wait_for(lambda: len(rows()) >= max(after_rows, before + 1), procs, "train row")
        rows_before = len(rows())
        procs[1].send_signal(signal.SIGTERM)
        signalled, rows_after = time.monotonic(), len(rows())
        outs = [p.communicate(timeout=300) for p in procs]
        took = time.monotonic() - signalled
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
    # (a summary's "step" is its last eval's)
    assert all(json.loads(out.strip().splitlines()[-1])["stopped"] for out, _ in outs)
    said = re.search(r"stopped by SIGTERM on process 1 at step (\d+); checkpoint saved", outs[0][0])
    stopped = int(said.group(1))
    # the stop is agreed after every step, just after its row is written: a signal sent when
    # row k is on disk stops them after step k (process 1 not yet in step k's agreement)
    # or k + 1
    assert rows_before <= stopped <= rows_after + 1, (stopped, rows_before, rows_after)
    # both processes saved that step: orbax commits it once every process wrote its shards
    assert max(int(n) for n in os.listdir(workdir / "checkpoints") if n.isdigit()) == stopped
    assert _train_rows(workdir) == list(range(1, stopped + 1))
    return stopped, took


def _kill_process_0_after_checkpoint(workdir, steps: int, extra: dict, step: int) -> float:
    """Start both processes; SIGKILL process 0 once checkpoint `step` is committed. Process 1
    must exit 75 with one line naming process 0 and the step (its coordination client would
    abort it in C++: distributed.CoordinatorWatch). Returns the seconds it took."""
    procs = _start_two_processes(workdir, steps, extra)
    try:
        committed = os.path.join(workdir, "checkpoints", str(step))
        _wait_for(lambda: os.path.isdir(committed), procs, f"checkpoint {step}")
        procs[0].kill()
        killed_at = time.monotonic()
        _, err = procs[1].communicate(timeout=120)
        waited = time.monotonic() - killed_at
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
            p.wait()
    assert procs[1].returncode == 75, err[-3000:]
    assert re.fullmatch(
        rf"lost process 0 of 2 during step [{step}{step + 1}] \(phase: \w+\): its coordination "
        r"service is gone; process 1 exits \(resume from the last checkpoint\)",
        err.strip().splitlines()[-1],
    ), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert waited < 10, waited  # (the heartbeat timeout is 60 s: this is no timeout)
    return waited


def test_sigterm_to_one_process_three_times_a_lost_process_then_resume_bitwise(
    tmp_path, two_processes_reference
):
    """Five legs in one workdir, then the uninterrupted 2 x 4 run:
    1-3. SIGTERM to process 1 alone once `after` train rows are on disk (drawn from a seeded
       RNG, printed): both processes agree to stop after the next step, save it, and exit 0
       (no collective mismatch); each relaunch resumes there.
    4. Process 1 is killed with SIGKILL while a later save is in flight: process 0 exits 75
       within the heartbeat timeout, with one line naming process 1 and the step (no stack
       trace); the half-written step is never restored.
    5. The relaunch resumes from the newest committed step and ends with the uninterrupted
       run's metrics (time keys aside), rollouts and exported weights bitwise, each step's
       row once."""
    extra = {"distributed.heartbeat_timeout_s": HEARTBEAT}
    multi = tmp_path / "multi"
    rng = np.random.default_rng(45)
    stopped, legs = 0, []
    for _ in range(3):  # each leg runs 1 to 3 steps: signal after 1 or 2 new rows
        after = stopped + int(rng.integers(1, 3))
        at, took = _sigterm_leg(multi, REFERENCE_STEPS, extra, after)
        assert at > stopped
        stopped = at
        legs.append((after, at, round(took, 1)))
    print("SIGTERM legs (signal once rows on disk >= N, stopped at, s to exit):", legs)
    assert stopped < REFERENCE_STEPS

    procs = _start_two_processes(multi, REFERENCE_STEPS, extra)
    try:
        _wait_for(lambda: _saving_after(multi, stopped), procs, "save in flight")
        saving = _saving_after(multi, stopped)
        procs[1].kill()
        killed_at = time.monotonic()
        out, err = procs[0].communicate(timeout=HEARTBEAT + 60)
        waited = time.monotonic() - killed_at
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
            p.wait()
    assert procs[0].returncode == 75, err[-3000:]
    assert waited < HEARTBEAT + 5, waited
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"lost process 1 of 2 during step \d+ \(phase: \w+\): it died or was silent past "
        rf"distributed.heartbeat_timeout_s={HEARTBEAT}; process 0 exits \(resume from the "
        r"last checkpoint\)",
        last,
    ), err[-3000:]
    assert "Traceback" not in err and "stack trace" not in err, err[-3000:]
    committed = sorted(int(n) for n in os.listdir(multi / "checkpoints") if n.isdigit())
    print(f"lost process 1: process 0 exited 75 after {waited:.1f} s; save in flight at the "
          f"kill: step {saving}; committed: {committed}")  # fmt: skip
    assert saving > stopped and saving not in committed  # half-written: never committed

    said = []
    last_leg = _run_two_processes(multi, REFERENCE_STEPS, extra, said=said)
    assert [o["step"] for o in last_leg] == [REFERENCE_STEPS] * 2
    assert f"resumed from step {committed[-1]} " in said[0]  # the previous complete one
    _assert_equal_to_reference(two_processes_reference, multi, exact=True)
