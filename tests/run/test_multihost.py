"""Two processes on localhost (CPU collectives, 4 fake devices each) train exactly as one
process with 8 devices: the same per-step metrics and final parameters, also across a
checkpoint and a resume of the two-process run.

Every process runs the same command (`scripts/train.py` with `distributed.*` set), owns its
own prompts, and contributes its rows to the global arrays; process 0 writes the logs and the
export.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
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


def _env(devices: int) -> dict:
    env = dict(os.environ)
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


def _run_two_processes(workdir, steps: int) -> list[dict]:
    port = _free_port()
    procs = [
        subprocess.Popen(
            _cmd(
                workdir,
                steps,
                {
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
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-4000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


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


def test_two_processes_with_a_resume_equal_one_process(tmp_path):
    single = tmp_path / "single"
    proc = subprocess.run(
        _cmd(single, 4, {}), cwd=REPO, env=_env(8), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    multi = tmp_path / "multi"
    first = _run_two_processes(multi, 2)  # checkpoint at step 2, then stop
    assert [o["step"] for o in first] == [2, 2]
    second = _run_two_processes(multi, 4)  # the same command resumes from step 2
    assert [o["step"] for o in second] == [4, 4]
    assert not os.path.exists(multi / "metrics.jsonl.1")

    want, got = _metrics(single), _metrics(multi)
    assert sorted(got) == sorted(want) and {1, 2, 3, 4} <= set(got)
    for step in want:
        assert set(got[step]) == set(want[step]), step
        for key, value in want[step].items():
            np.testing.assert_allclose(
                got[step][key], value, rtol=1e-5, atol=1e-5, err_msg=f"step {step} {key}"
            )
    assert "train/loss" in want[4] and "eval/pass@1_greedy" in want[4]
    assert all(want[s]["train/grad_norm"] > 1e-3 for s in (1, 2, 3, 4)), "vacuous: no gradient"

    w_single, w_multi = _weights(single), _weights(multi)

    assert sorted(w_single) == sorted(w_multi) and w_single
    for name in w_single:
        np.testing.assert_allclose(
            w_multi[name], w_single[name], rtol=1e-5, atol=1e-5, err_msg=name
        )
    # process 0 alone wrote the logs: one row per logged step, no duplicates
    rows = [json.loads(line) for line in open(multi / "metrics.jsonl")]
    logged = [r["step"] for r in rows if "train/loss" in r]
    assert logged == [1, 2, 3, 4]
