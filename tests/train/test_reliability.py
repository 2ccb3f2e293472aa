"""Faults survived with nothing lost (docs/reliability.md): damaged checkpoints, kill -9 at
random moments (also during a save), a full disk, diverging updates, a reward that always
fails, SIGTERM. Each test checks numbers: the final weights against an uninterrupted run's,
and that every log row appears exactly once.
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import FAST, RL, get_config, host_leaves, read_metrics, series
from safetensors.numpy import load_file

from jaxrl_frontier.core.errors import TrainingFault
from jaxrl_frontier.run.trainer import Trainer
from jaxrl_frontier.train.checkpoint import Checkpointer, read_step_meta, step_dirs
from jaxrl_frontier.train.metrics import METRICS_FILE, ROLLOUTS_FILE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CKPT2 = {**RL, "train.steps": 4, "train.checkpoint_every": 2, "train.rollout_log_every": 1}


def read_rollouts(workdir) -> list[dict]:
    with open(os.path.join(workdir, ROLLOUTS_FILE)) as f:
        return [json.loads(line) for line in f]


def assert_logged_once(workdir, steps: int, group_size: int = 8):
    """Each step's train row once, its rollout rows (2 groups) once, in order."""
    rows = read_metrics(workdir)
    assert [r["step"] for r in rows if "train/loss" in r] == list(range(1, steps + 1))
    rollout_steps = [r["step"] for r in read_rollouts(workdir)]
    assert rollout_steps == [s for s in range(1, steps + 1) for _ in range(2 * group_size)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 4-step run (checkpoints at 2 and 4)."""
    workdir = tmp_path_factory.mktemp("ref")
    tr = Trainer(get_config("grpo_arith", {**FAST, **CKPT2}), str(workdir))
    tr.run()
    return workdir, host_leaves(tr.state)


# ============================================================================ damaged checkpoints


def _truncate_largest_array_file(step_dir: Path) -> Path:
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)]
    victim = max(files, key=lambda p: p.stat().st_size)
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 3)
    return victim


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _remove(path: Path) -> Path:
    path.unlink()
    return path


DAMAGE = {
    "bad_state_metadata": lambda d: _write(d / "state" / "_METADATA", "{garbage"),
    "bad_meta": lambda d: _write(d / "meta" / "metadata", "not json"),
    "missing_meta": lambda d: _remove(d / "meta" / "metadata"),
    "truncated_array": _truncate_largest_array_file,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_newest_checkpoint_resumes_from_the_intact_one(reference, tmp_path, capsys, damage):
    ref_dir, ref_state = reference
    workdir = tmp_path / "run"
    shutil.copytree(ref_dir, workdir)
    damaged_file = DAMAGE[damage](workdir / "checkpoints" / "4")
    capsys.readouterr()

    tr = Trainer(get_config("grpo_arith", {**FAST, **CKPT2}), str(workdir))
    summary = tr.run()
    out = capsys.readouterr().out
    assert f"warning: checkpoint step 4 is damaged ({damaged_file}" in out, out
    assert "resumed from step 2" in out
    assert summary["step"] == 4 and not summary["stopped"]
    for x, y in zip(ref_state, host_leaves(tr.state), strict=True):
        np.testing.assert_array_equal(x, y)  # steps 3 and 4 re-run to the same weights
    assert_logged_once(workdir, 4)
    # the re-run steps logged the uninterrupted run's numbers
    want, got = read_metrics(ref_dir), read_metrics(workdir)
    for key in ("train/loss", "reward/total", "train/grad_norm"):
        assert series(want, key) == series(got, key), key


def test_every_checkpoint_damaged_is_an_error_naming_each(reference, tmp_path):
    ref_dir, _ = reference
    workdir = tmp_path / "run"
    shutil.copytree(ref_dir, workdir)
    for step in (2, 4):
        (workdir / "checkpoints" / str(step) / "meta" / "metadata").write_text("{")
    tr = Trainer(get_config("grpo_arith", {**FAST, **CKPT2}), str(workdir))
    with pytest.raises(Exception, match=r"could be restored: step 4: .*; step 2: ") as e:
        tr.run()
    assert "4/meta/metadata" in str(e.value) and "2/meta/metadata" in str(e.value)


# ============================================================================ kill -9


# partial rollouts: every checkpoint holds the next batch's rows begun in its step
PARTIAL = {"rollout.continuous_slots": 4, "rollout.partial_budget": 2}
# a batch produced ahead of the learner: every checkpoint holds the one in flight
AHEAD = {"rollout.max_staleness": 1}


def _cmd(workdir, steps: int, extra: dict | None = None) -> list[str]:
    flags = {
        **{k: v for k, v in FAST.items()},
        **(extra or {}),
        "train.steps": steps,
        "train.checkpoint_every": 2,
        "train.rollout_log_every": 1,
    }
    return [
        sys.executable,
        os.path.join(REPO, "scripts", "train.py"),
        "--config=tests/fixtures/grpo_arith_shaped.py:runlocal",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in flags.items()),
    ]


def _weights(workdir) -> dict[str, np.ndarray]:
    export = Path(workdir) / "export"
    out = {}
    for name in sorted(os.listdir(export)):
        if name.endswith(".safetensors"):
            out.update(load_file(export / name))
    return out


def _train_rows(workdir) -> int:
    path = Path(workdir) / METRICS_FILE
    if not path.exists():
        return 0
    return sum('"train/loss"' in line for line in path.read_text().splitlines())


def _saving(workdir) -> bool:
    """An orbax save in flight: its temporary step directory exists."""
    ckpt = Path(workdir) / "checkpoints"
    return ckpt.exists() and any("tmp" in p.name for p in ckpt.iterdir())


def _committed(workdir) -> bool:
    """A step the checkpointer resumes from: renamed into place under its step number (its
    temporary directory may already hold the commit marker before the rename)."""
    ckpt = Path(workdir) / "checkpoints"
    return ckpt.exists() and any(p.name.isdigit() for p in ckpt.iterdir())


@pytest.mark.parametrize(
    "extra", [{}, PARTIAL, AHEAD], ids=["synchronous", "partial_rollouts", "one_batch_ahead"]
)
def test_kill_9_at_random_moments_then_resume_loses_nothing(tmp_path, extra):
    steps = 10
    ref = tmp_path / "ref"
    proc = subprocess.run(
        _cmd(ref, steps, extra), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    rng = random.Random(0)
    workdir = tmp_path / "killed"
    kills = []  # (how, train rows logged when killed, latest checkpoint then)
    # moments: after a random number of new steps (past the first checkpoint); the instant a
    # save is in flight; at a random moment within 1.5 steps after the leg's first step (in
    # steps measured by the first leg, so a fast machine does not finish the run first)
    plans = [("steps", rng.randint(3, 4)), ("save", None), ("time", rng.uniform(0.1, 1.5))]
    step_seconds, row_times = None, []
    for how, arg in plans:
        p = subprocess.Popen(
            _cmd(workdir, steps, extra),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        prev_rows, new_rows, t0, first_step_at = _train_rows(workdir), 0, time.time(), None
        try:
            while p.poll() is None and time.time() - t0 < 240:
                rows = _train_rows(workdir)
                if rows > prev_rows:
                    row_times.append(time.time())
                new_rows += max(rows - prev_rows, 0)  # (a resume first drops rows)
                prev_rows = rows
                if first_step_at is None and new_rows:
                    first_step_at = time.time()
                if how == "steps" and new_rows >= arg and _committed(workdir):
                    break
                if how == "save" and first_step_at and _saving(workdir):
                    break
                if (
                    how == "time"
                    and first_step_at
                    and time.time() - first_step_at > arg * step_seconds
                ):
                    break
                time.sleep(0.002)
            assert p.poll() is None, f"the run ended before the {how} kill"
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        finally:
            if p.poll() is None:
                p.kill()
        latest = Checkpointer(str(workdir / "checkpoints")).latest_step()
        kills.append((how, _train_rows(workdir), latest))
        if step_seconds is None:  # the first leg's logging pace (rows are logged every step)
            gaps = np.diff(row_times)
            step_seconds = float(np.median(gaps)) if len(gaps) else 0.5
    print("kills (how, train rows on disk, latest checkpoint):", kills)
    latest = [k[2] or 0 for k in kills]
    assert latest == sorted(latest) and latest[-1] >= 2, "no leg resumed from a checkpoint"

    proc = subprocess.run(
        _cmd(workdir, steps, extra), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == steps
    # each killed leg left its workdir lock behind: its pid is gone, so the next one took it
    assert re.search(r"warning: \S+/\.lock: taking over the lock of pid \d+ on host \S+ "
                     r"\(pid \d+ is gone\)", proc.stdout), proc.stdout[-3000:]  # fmt: skip
    assert not (workdir / ".lock").exists()  # released at the end

    assert_logged_once(workdir, steps)
    want, got = read_metrics(ref), read_metrics(workdir)
    for key in ("train/loss", "reward/total", "train/grad_norm"):
        assert series(want, key) == series(got, key), key
    # the checkpoints held what was in flight (the run's last one holds nothing)
    ckpt = str(workdir / "checkpoints")
    metas = [read_step_meta(ckpt, s) for s in step_dirs(ckpt) if s < steps]
    if extra == PARTIAL:  # rows in flight were real: tokens sampled a version back trained on
        assert max(series(got, "rollout/lagged_token_share").values()) > 0
        assert metas and all(m["partial"]["rows"] for m in metas)
    if extra == AHEAD:  # a batch was in flight at every step after the first
        assert max(series(got, "rollout/policy_lag").values()) == 1.0
        assert metas and all(len(m["ahead"]) == 1 for m in metas)
    assert [r["completion"] for r in read_rollouts(ref)] == [
        r["completion"] for r in read_rollouts(workdir)
    ]
    w_ref, w_got = _weights(ref), _weights(workdir)
    assert sorted(w_ref) == sorted(w_got) and w_ref
    for name in w_ref:
        np.testing.assert_array_equal(w_got[name], w_ref[name], err_msg=name)


# ============================================================================ full disk


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m none /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


CHECK_AFTER_FULL_DISK = """
import json, sys
from jaxrl_frontier.train.checkpoint import Checkpointer
workdir = sys.argv[1]
ck = Checkpointer(workdir + "/checkpoints")
lines = open(workdir + "/metrics.jsonl").read().split("\\n")
def parses(line):
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
rows = [line for line in lines if line]
torn = [line for line in rows if not parses(line)]
print(json.dumps(dict(steps=ck.all_steps(), torn=len(torn), rows=len(rows) - len(torn))))
"""


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unshare -rm and tmpfs mounts")
def test_full_disk_is_one_error_line_and_the_previous_checkpoint_stays(tmp_path):
    workdir = tmp_path / "small"
    workdir.mkdir()
    check = tmp_path / "check.py"
    check.write_text(CHECK_AFTER_FULL_DISK)
    cmd = " ".join(f"'{a}'" for a in _cmd(workdir, 10))
    # the disk holds two checkpoints (360 kB each here) and the logs, not a third in flight
    script = (
        f"mount -t tmpfs -o size=900k none '{workdir}' && {cmd} 2>'{tmp_path}/err.txt'; "
        f"echo rc=$?; '{sys.executable}' '{check}' '{workdir}'"
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = (tmp_path / "err.txt").read_text()
    rc = int(proc.stdout.split("rc=")[1].split()[0])
    assert "rc=" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rc == 1, err[-3000:]
    assert err.count("\n") == 1, err[-3000:]  # one line: no traceback, no asyncio noise
    match = re.fullmatch(
        rf"checkpoint error: checkpoint save failed at step (\d+): {re.escape(str(workdir))}/"
        r"checkpoints(/\S+)?: No space left on device \(previous checkpoint: step (\d+)\)\n",
        err,
    )
    assert match, err
    failed, previous = int(match.group(1)), int(match.group(3))
    assert failed == previous + 2 and previous >= 2, (err, result)
    assert previous in result["steps"] and failed not in result["steps"]
    assert result["torn"] == 0 and result["rows"] >= previous


# ============================================================================ diverging updates


def test_diverging_updates_warn_and_stop_the_run_without_an_export(tmp_path, capsys):
    overrides = {**RL, "optimizer.lr": 1e30, "train.steps": 20, "train.max_skipped_updates": 3}
    tr = Trainer(get_config("grpo_arith", {**FAST, **overrides}), str(tmp_path))
    with pytest.raises(TrainingFault, match=r"step 4: 3 updates in a row were skipped") as e:
        tr.run()
    assert "train.max_skipped_updates=3" in str(e.value)
    out = capsys.readouterr().out
    for step, in_a_row in ((2, 1), (3, 2), (4, 3)):
        assert f"warning: step {step}: 1 of 1 updates skipped" in out
        assert f"{in_a_row} skipped in a row" in out
    assert "warning: step 1:" not in out  # the huge update itself was finite
    assert int(tr.state.skipped) == 3 and int(tr.state.step) == 4
    assert not (tmp_path / "export").exists()


# ============================================================================ failing rewards


def test_reward_failing_everywhere_stops_with_the_first_error_shown_once(tmp_path, caplog):
    overrides = {
        **RL,
        "train.steps": 20,
        "rewards.max_failure_steps": 3,
        "eval.at_start": True,
    }
    tr = Trainer(get_config("grpo_arith", {**FAST, **overrides}), str(tmp_path))
    calls = []

    def broken(example, completion):
        calls.append(1)
        raise ZeroDivisionError(f"checker bug #{len(calls)}")

    tr.task.reward = broken
    with caplog.at_level("WARNING"):
        with pytest.raises(TrainingFault, match=r"step 3: the reward failed on every") as e:
            tr.run()
    assert "first failure: ZeroDivisionError: checker bug #1" in str(e.value)
    warnings = [r for r in caplog.records if "later ones are not logged" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is not None  # the traceback, once
    rows = read_metrics(tmp_path)
    assert series(rows, "eval/reward_failed") == {0: 8.0}  # evaluation counts its own
    # the step that trips the rule stops before its row is written (nor is it checkpointed)
    assert series(rows, "reward/failed") == {1: 64.0, 2: 64.0}
    assert len(calls) == 8 + 3 * 64
    assert not (tmp_path / "export").exists()


# ============================================================================ SIGTERM


def test_sigterm_summary_names_the_step_and_resume_prints_it(tmp_path, capsys):
    overrides = {**RL, "train.steps": 3}
    tr = Trainer(get_config("grpo_arith", {**FAST, **overrides}), str(tmp_path))
    write = tr.writer.write_scalars

    def write_then_preempt(step, scalars):
        write(step, scalars)
        if step == 2:
            signal.raise_signal(signal.SIGTERM)

    tr.writer.write_scalars = write_then_preempt
    summary = tr.run()
    assert summary["stopped"] and summary["step"] == 2
    assert "[rl] stopped by SIGTERM at step 2; checkpoint saved" in capsys.readouterr().out
    tr = Trainer(get_config("grpo_arith", {**FAST, **overrides}), str(tmp_path))
    assert tr.run()["step"] == 3
    assert "resumed from step 2 " in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(tmp_path) if "train/loss" in r] == [1, 2, 3]


# ============================================================================ a hang


def test_a_step_that_hangs_dumps_the_stacks_names_the_phase_and_exits(tmp_path):
    """train.hang_timeout_s: a reward that never returns in step 2 -> every thread's stack in
    the run directory, one line naming the step and the phase (scoring), exit status 76,
    soon after the timeout."""
    hang_s = 3
    extra = {
        "task.module": "tests/fixtures/hanging_task.py",
        "task.name": "arith_hangs_in_step_2",
        "train.hang_timeout_s": hang_s,
    }
    start = time.monotonic()
    proc = subprocess.run(
        _cmd(tmp_path, 4, extra), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    elapsed = time.monotonic() - start
    stacks = tmp_path / "hang-0.txt"
    assert proc.returncode == 76, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"hang: step 2 (phase: scoring) ran past train.hang_timeout_s={hang_s} s on process 0; "
        f"every thread's stack is in {stacks}"
    )
    text = stacks.read_text()
    assert text.startswith(f"step 2 (phase: scoring) overran train.hang_timeout_s={hang_s}\n")
    assert re.search(r'File ".*hanging_task.py", line \d+ in reward', text), text
    assert "Current thread" in text or "Thread 0x" in text
    assert _train_rows(tmp_path) == 1  # step 1 logged, step 2 never
    assert elapsed < 240


# ============================================================================ validation up front


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """Our tiny llama, saved in HF format (config.json + model.safetensors)."""
    from flax import nnx

    from jaxrl_frontier.models import hf
    from jaxrl_frontier.models.model_config import ModelConfig
    from jaxrl_frontier.models.transformer import Transformer

    path = tmp_path_factory.mktemp("hf")
    model = Transformer(ModelConfig(64, 32, 64, 2, 4, 2, family="llama"), rngs=nnx.Rngs(0))
    hf.save(model, path)
    return path


def test_malformed_hf_config_names_the_file(tiny_hf, tmp_path):
    from jaxrl_frontier.core.errors import ModelFileError
    from jaxrl_frontier.models import hf

    bad = tmp_path / "bad"
    shutil.copytree(tiny_hf, bad)
    (bad / "config.json").write_text('{"model_type": "llama", "hidden_size": 64,')
    with pytest.raises(
        ModelFileError, match=rf"^{re.escape(str(bad / 'config.json'))}: invalid JSON"
    ):
        hf.load(bad)
    config = json.loads((tiny_hf / "config.json").read_text())
    del config["num_attention_heads"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match=rf"^{re.escape(str(bad / 'config.json'))}: "):
        hf.load(bad)


def test_truncated_safetensors_names_the_file(tiny_hf, tmp_path):
    from jaxrl_frontier.core.errors import ModelFileError
    from jaxrl_frontier.models import hf

    bad = tmp_path / "bad"
    shutil.copytree(tiny_hf, bad)
    weights = bad / "model.safetensors"
    for size in (weights.stat().st_size - 100, 20):  # a cut tensor; a cut header
        with open(weights, "r+b") as f:
            f.truncate(size)
        with pytest.raises(ModelFileError, match=rf"^{re.escape(str(weights))}: "):
            hf.load(bad)


def test_broken_tokenizer_json_names_the_file(tmp_path):
    from jaxrl_frontier.core.errors import ModelFileError
    from jaxrl_frontier.models.tokenizer import HFTokenizer

    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(ModelFileError, match=rf"^{re.escape(str(tmp_path / 'tokenizer.json'))}"):
        HFTokenizer(tmp_path)


def test_long_jsonl_row_is_refused_before_any_model_is_built(tmp_path, monkeypatch):
    from jaxrl_frontier.core.errors import ConfigError
    from jaxrl_frontier.run import roles

    rows = tmp_path / "rows.jsonl"
    questions = ["1+1"] * 26 + ["1+1 " * 20] + ["2+2"]
    rows.write_text("".join(json.dumps({"question": q, "answer": "2"}) + "\n" for q in questions))
    built = []
    monkeypatch.setattr(roles, "build_model", lambda *a, **k: built.append(1) / 0)
    overrides = {"task.name": "jsonl_math", "task.kwargs": {"path": str(rows)}}
    c = get_config("grpo_arith", {**FAST, **overrides, "data.max_prompt_len": 16})
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(rows))}:27: prompt is 82 tokens"):
        Trainer(c, str(tmp_path / "run"))
    assert built == []


@pytest.mark.parametrize("entry", ["script", "console"])
def test_help_prints_usage_and_the_key_groups(entry):
    script = os.path.join(REPO, "scripts", "train.py")
    cmd = [sys.executable, script, "--help"]
    if entry == "console":
        cmd = [
            sys.executable,
            "-c",
            "from jaxrl_frontier.run.cli import train_main; train_main()",
            "-h",
        ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("usage: train.py --config=configs/FILE.py[:ARG] --workdir=DIR")
    for group in ("model:", "rollout:", "optimizer:", "train:", "rewards:", "eval:"):
        assert f"\n  {group} " in out, group
    assert "temperature=1.0" in out and "max_skipped_updates=10" in out
