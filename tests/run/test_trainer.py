"""Trainer: sharded == single device, exact resume (SFT and RL), SIGTERM, learning signals,
TensorBoard output, fault tolerance.

Runs use the `runlocal` configs shrunk further (`FAST`): one device unless a test says
otherwise, no step-0 eval, a 4-prompt greedy eval only at the last step. Every Trainer
compiles its own jitted closures; the persistent compilation cache (enabled in conftest.py,
one temporary directory per session, shared with the subprocesses) turns every compile
after the first of a given program into a cache read, which keeps this file within budget.
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import FAST, REPO, RL, get_config, host_leaves, read_metrics, series  # noqa: E402

from jaxrl_frontier.core import sharding  # noqa: E402
from jaxrl_frontier.core.errors import ConfigError  # noqa: E402
from jaxrl_frontier.rl.learn.loss import rl_loss  # noqa: E402
from jaxrl_frontier.rl.learn.train_step import make_update_fn  # noqa: E402
from jaxrl_frontier.rl.produce.producer import RolloutProducer  # noqa: E402
from jaxrl_frontier.run import trainer as trainer_lib  # noqa: E402
from jaxrl_frontier.run.build import objective_section  # noqa: E402
from jaxrl_frontier.run.trainer import Trainer  # noqa: E402
from jaxrl_frontier.train.checkpoint import Checkpointer  # noqa: E402
from jaxrl_frontier.train.metrics import METRICS_FILE  # noqa: E402
from jaxrl_frontier.train.sft import encode_demonstrations  # noqa: E402


def run(name: str, workdir, overrides: dict) -> tuple[Trainer, dict]:
    tr = Trainer(get_config(name, {**FAST, **overrides}), str(workdir))
    return tr, tr.run()


# ============================================================================ fixtures


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    """An uninterrupted 4-step GRPO run (the resume reference; TensorBoard test input)."""
    workdir = tmp_path_factory.mktemp("grpo4")
    tr, summary = run("grpo_arith", workdir, {**RL, "train.steps": 4, "train.checkpoint_every": 2})
    return workdir, tr, summary


@pytest.fixture(scope="module")
def arith_teacher(tmp_path_factory):
    """A small SFT model on 1-digit addition, exported to <workdir>/export (the OPD teacher)."""
    workdir = tmp_path_factory.mktemp("teacher")
    overrides = {
        "train.steps": 150,
        "optimizer.lr": 3e-3,
        "optimizer.warmup_steps": 0,
        "optimizer.schedule": "constant",
    }
    _, summary = run("sft_arith", workdir, overrides)
    return workdir, summary


# ============================================================================ sharding


def test_one_rl_step_sharded_equals_single_device(tmp_path):
    """A GRPO step on a data=2 x fsdp=2 x tensor=2 mesh gives the one-device parameters."""
    common = {**RL, "train.steps": 1, "optimizer.lr": 1e-3}
    single = Trainer(get_config("grpo_arith", {**FAST, **common}), str(tmp_path / "one"))
    init = host_leaves(single.state.params)
    single.evaluate = lambda num_prompts=None: {}  # eval is not under test: skip its compiles
    # the same Experience's gradient on both meshes, from the same fresh state (one Adam step
    # from a fresh state is -lr * sign(g) and would hide a wrong gradient scale)
    examples = [single.task.example("train", i) for i in range(8)]
    exp1, _ = single.step.rollout(examples, jax.random.key(7))
    g1 = jax.device_get(single.step.learner.gradient(exp1)[1])
    single.run()
    sharded_cfg = get_config(
        "grpo_arith",
        {**FAST, **common, "mesh.num_devices": 0, "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2},
    )
    sharded = Trainer(sharded_cfg, str(tmp_path / "eight"))
    assert sharded.roles.mesh.devices.size == 8 and dict(sharded.roles.mesh.shape) == dict(
        data=2, fsdp=2, sequence=1, tensor=2
    )
    assert any(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(sharded.state.params))
    assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(sharded.state.params)), (
        "no parameter is sharded on the 2x2x2 mesh"
    )
    sharded.evaluate = lambda num_prompts=None: {}
    exp8, _ = sharded.step.rollout(examples, jax.random.key(7))
    np.testing.assert_array_equal(np.asarray(exp1.tokens), np.asarray(exp8.tokens))
    g8 = sharded.step.learner.gradient(exp8)[1]
    assert max(float(np.abs(x).max()) for x in jax.tree.leaves(g1)) > 1e-4
    for x, y in zip(jax.tree.leaves(g1), jax.tree.leaves(g8), strict=True):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-4, atol=1e-6)
    sharded.run()

    # same rollouts and rewards, then the same parameters
    m1, m8 = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "eight")
    for key in ("reward/total", "reward/format", "rollout/response_length"):
        assert series(m1, key) == series(m8, key), key
    np.testing.assert_allclose(
        series(m1, "train/loss")[1], series(m8, "train/loss")[1], rtol=0, atol=1e-5
    )
    a, b = host_leaves(single.state.params), host_leaves(sharded.state.params)
    moved = max(float(np.abs(x - x0).max()) for x, x0 in zip(a, init))
    assert moved > 1e-4, "the step did not change the parameters: the comparison is vacuous"
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)


# ============================================================================ resume


def test_rl_resume_is_bitwise_identical(grpo_run, tmp_path):
    ref_dir, ref, ref_summary = grpo_run
    assert ref_summary["step"] == 4 and not ref_summary["stopped"]

    _, first = run("grpo_arith", tmp_path, {**RL, "train.steps": 2, "train.checkpoint_every": 2})
    assert first["step"] == 2
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 2
    resumed, second = run(
        "grpo_arith", tmp_path, {**RL, "train.steps": 4, "train.checkpoint_every": 2}
    )
    assert second["step"] == 4 and int(resumed.state.step) == 4

    for x, y in zip(host_leaves(ref.state), host_leaves(resumed.state), strict=True):
        np.testing.assert_array_equal(x, y)  # params, optimizer state, step, RNG, skipped
    # the resumed steps logged exactly the uninterrupted run's numbers
    want, got = read_metrics(ref_dir), read_metrics(tmp_path)
    assert [r["step"] for r in got] == [1, 2, 2, 3, 4, 4]  # train rows + the final evals
    for key in ("train/loss", "reward/total", "train/grad_norm"):
        assert series(want, key) == series(got, key), key


def test_sft_preempted_then_resumed_is_bitwise_identical(tmp_path):
    """SFT (warmup + cosine schedule) stopped by SIGTERM after step 2 of 4, then resumed."""
    overrides = {"train.steps": 4}  # the file's schedule: warmup + cosine
    ref, ref_summary = run("sft_arith", tmp_path / "ref", overrides)
    assert ref_summary == dict(stopped=False, step=4, history=ref.history)

    tr = Trainer(get_config("sft_arith", {**FAST, **overrides}), str(tmp_path / "cut"))
    write = tr.writer.write_scalars

    def write_then_preempt(step, scalars):
        write(step, scalars)
        if step == 2:
            signal.raise_signal(signal.SIGTERM)  # what a scheduler's preemption sends

    tr.writer.write_scalars = write_then_preempt
    handler = signal.getsignal(signal.SIGTERM)
    stopped = tr.run()
    assert stopped["stopped"] and stopped["step"] == 2
    assert Checkpointer(str(tmp_path / "cut" / "checkpoints")).all_steps() == [2]
    assert not os.path.exists(tmp_path / "cut" / "export")
    assert signal.getsignal(signal.SIGTERM) is handler  # restored after run()

    resumed, summary = run("sft_arith", tmp_path / "cut", overrides)
    assert summary["step"] == 4 and not summary["stopped"]
    for x, y in zip(host_leaves(ref.state), host_leaves(resumed.state), strict=True):
        np.testing.assert_array_equal(x, y)
    assert series(read_metrics(tmp_path / "ref"), "train/nll") == series(
        read_metrics(tmp_path / "cut"), "train/nll"
    )
    assert os.path.exists(tmp_path / "cut" / "export" / "config.json")


def _train_cmd(workdir, steps: int) -> list[str]:
    flags = {**FAST, "train.steps": steps, "train.checkpoint_every": 10**6}
    return [
        sys.executable,
        os.path.join(REPO, "scripts", "train.py"),
        "--config=configs/grpo_arith.py:runlocal",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in flags.items()),
    ]


def test_sigterm_saves_and_the_same_command_resumes(tmp_path):
    workdir = tmp_path / "run"
    log = open(tmp_path / "log.txt", "w")
    proc = subprocess.Popen(
        _train_cmd(workdir, 10_000), cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True
    )
    try:
        deadline = time.time() + 240
        while True:  # wait until it is training (a few steps logged)
            assert proc.poll() is None, open(tmp_path / "log.txt").read()[-3000:]
            assert time.time() < deadline, "the training subprocess logged no steps"
            metrics = workdir / METRICS_FILE
            if metrics.exists() and len(series(read_metrics(workdir), "train/loss")) >= 3:
                break
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert proc.returncode == 0, open(tmp_path / "log.txt").read()[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    stop_step = summary["step"]
    assert summary["stopped"] is True and 3 <= stop_step < 10_000
    assert Checkpointer(str(workdir / "checkpoints")).latest_step() == stop_step
    logged = sorted(series(read_metrics(workdir), "train/loss"))
    assert logged == list(range(1, stop_step + 1))

    proc = subprocess.run(
        _train_cmd(workdir, stop_step + 2), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["step"] == stop_step + 2 and summary["stopped"] is False
    logged = sorted(series(read_metrics(workdir), "train/loss"))
    assert logged == list(range(1, stop_step + 3))  # continued at stop_step + 1, no repeats
    assert Checkpointer(str(workdir / "checkpoints")).latest_step() == stop_step + 2


# ============================================================================ learning


def test_grpo_raises_mean_reward(tmp_path):
    """From scratch, correctness + format shaping: the format reward is learnt in ~30 steps."""
    overrides = {**RL, "train.steps": 40}
    _, summary = run("grpo_arith", tmp_path, overrides)
    assert summary["step"] == 40
    reward = series(read_metrics(tmp_path), "reward/total")
    assert sorted(reward) == list(range(1, 41))
    first = np.mean([reward[s] for s in range(1, 6)])
    last = np.mean([reward[s] for s in range(36, 41)])
    print(f"GRPO mean reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > first + 0.2, (first, last)
    fmt = series(read_metrics(tmp_path), "reward/format")
    assert np.mean([fmt[s] for s in range(36, 41)]) > 0.6


def test_opd_lowers_reverse_kl_to_the_teacher(arith_teacher, tmp_path):
    teacher_dir, teacher_summary = arith_teacher
    nll = series(read_metrics(teacher_dir), "train/nll")
    assert nll[150] < 0.5 * nll[1], (nll[1], nll[150])  # the teacher learnt the task
    assert os.path.exists(teacher_dir / "export" / "config.json")

    overrides = {
        **RL,
        "teacher.init": "checkpoint",
        "teacher.path": str(teacher_dir),
        "train.steps": 40,
    }
    tr, summary = run("opd_arith", tmp_path, overrides)
    assert summary["step"] == 40
    assert tr.config.objective.advantage == "opd" and tr.config.objective.weight == "pg"
    kl = series(read_metrics(tmp_path), "opd/reverse_kl")
    assert sorted(kl) == list(range(1, 41))
    first = np.mean([kl[s] for s in range(1, 6)])
    last = np.mean([kl[s] for s in range(36, 41)])
    print(f"OPD sampled-token reverse KL: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last < 0.75 * first, (first, last)


# ============================================================================ outputs


def test_tensorboard_event_files_hold_the_expected_tags(grpo_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    workdir, _, _ = grpo_run
    acc = EventAccumulator(str(workdir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected = {
        "train/loss",
        "train/grad_norm",
        "train/update_skipped",
        "train/skipped_updates_total",
        "reward/total",
        "reward/correctness",
        "reward/format",
        "reward/failed",
        "eval/pass@1_greedy",
        "perf/tokens_per_second",
        "perf/step_seconds",
        "rollout/response_length",
        "rollout/zero_variance_groups",
    }
    assert expected <= tags, expected - tags
    jsonl = read_metrics(workdir)
    for tag in ("train/loss", "train/grad_norm", "reward/total", "rollout/response_length"):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [1, 2, 3, 4]
        want = series(jsonl, tag)
        for e in events:
            assert np.isfinite(e.value)
            np.testing.assert_allclose(e.value, want[e.step], rtol=1e-6)
    (ev,) = acc.Scalars("eval/pass@1_greedy")
    assert ev.step == 4 and 0.0 <= ev.value <= 1.0
    assert all(e.value > 0 for e in acc.Scalars("perf/tokens_per_second"))
    assert all(1.0 <= e.value <= 3.0 for e in acc.Scalars("rollout/response_length"))
    assert [e.value for e in acc.Scalars("train/skipped_updates_total")] == [0.0] * 4


# ============================================================================ faults


def _synthetic_rl_batch(tr: Trainer, seed: int = 0) -> dict:
    """A random batch of the runs' shape ([64, 5 + 3]), so the update compiles once."""
    rng = np.random.RandomState(seed)
    rows, t = 64, 8
    loss_mask = np.zeros((rows, t), np.float32)
    loss_mask[:, 5:] = 1.0
    return dict(
        tokens=rng.randint(4, tr.roles.policy.cfg.vocab_size, size=(rows, t)).astype(np.int32),
        attention_mask=np.ones((rows, t), np.int32),
        loss_mask=loss_mask,
        old_logp=np.full((rows, t), -2.0, np.float32) * loss_mask,
        advantages=rng.randn(rows, 1).astype(np.float32) * loss_mask,
    )


def test_nonfinite_update_is_skipped_and_counted(tmp_path):
    tr = Trainer(get_config("grpo_arith", {**FAST, **RL}), str(tmp_path))
    keys = ["tokens", "attention_mask", "loss_mask", "old_logp", "advantages"]
    update = make_update_fn(
        tr.roles.graphdef,
        tr.tx,
        rl_loss(tr.roles.graphdef, objective_section(tr.config.objective)),
        1,
        tr.state_sharding,
        {k: sharding.batch_sharding(tr.roles.mesh, 2) for k in keys},
    )
    before = host_leaves(tr.state)  # the update donates the state: copy first
    bad = _synthetic_rl_batch(tr)
    bad["advantages"][3, 6] = np.nan
    state, m = update(tr.state, sharding.shard_batch(bad, tr.roles.mesh))
    assert not np.isfinite(float(m["loss"]))
    assert float(m["update_skipped"]) == 1.0 and int(state.skipped) == 1
    after_bad = host_leaves(state)
    n_params = len(jax.tree.leaves(state.params))
    n_opt = len(jax.tree.leaves(state.opt_state))
    for x, y in zip(before[: n_params + n_opt], after_bad[: n_params + n_opt]):
        np.testing.assert_array_equal(x, y)  # params and optimizer state untouched

    inf_grad = _synthetic_rl_batch(tr, seed=1)
    inf_grad["old_logp"][0, 7] = -np.inf  # ratio exp(logp - old) = inf on one token
    state, m = update(state, sharding.shard_batch(inf_grad, tr.roles.mesh))
    assert float(m["update_skipped"]) == 1.0 and int(state.skipped) == 2

    good = _synthetic_rl_batch(tr, seed=2)
    state, m = update(state, sharding.shard_batch(good, tr.roles.mesh))
    assert np.isfinite(float(m["loss"])) and float(m["update_skipped"]) == 0.0
    assert int(state.skipped) == 2
    moved = [
        float(np.abs(x - np.asarray(y)).max())
        for x, y in zip(before[:n_params], jax.tree.leaves(state.params))
    ]
    assert max(moved) > 1e-4


def test_nonfinite_advantages_in_a_run_skip_that_step_and_go_on(tmp_path, monkeypatch):
    original = RolloutProducer.produce
    calls = []

    def produce(self, *args, **kwargs):
        calls.append(1)
        exp, info = original(self, *args, **kwargs)
        if len(calls) == 2:
            exp = exp.replace(advantages=exp.advantages * np.nan)
        return exp, info

    monkeypatch.setattr(RolloutProducer, "produce", produce)
    tr, summary = run("grpo_arith", tmp_path, {**RL, "train.steps": 3})
    assert summary["step"] == 3 and int(tr.state.skipped) == 1
    rows = read_metrics(tmp_path)
    assert series(rows, "train/update_skipped") == {1: 0.0, 2: 1.0, 3: 0.0}
    assert series(rows, "train/skipped_updates_total") == {1: 0.0, 2: 1.0, 3: 1.0}
    assert np.isfinite(series(rows, "train/loss")[3])


def test_raising_reward_scores_zero_is_counted_and_the_run_goes_on(tmp_path):
    tr = Trainer(get_config("grpo_arith", {**FAST, **RL, "train.steps": 2}), str(tmp_path))
    real = tr.task.reward
    calls = []  # (format reward it would have had, raised)

    def flaky(example, completion):
        raises = len(calls) % 3 == 0
        calls.append((real(example, completion)["format"], raises))
        if raises:
            raise RuntimeError("checker bug")
        return real(example, completion)

    tr.task.reward = flaky
    summary = tr.run()
    assert summary["step"] == 2
    rows = read_metrics(tmp_path)
    n = 8 * 8  # prompts x group per step; the final eval's calls come after
    failed, fmt = series(rows, "reward/failed"), series(rows, "reward/format")
    for step in (1, 2):
        chunk = calls[(step - 1) * n : step * n]
        assert failed[step] == sum(r for _, r in chunk) > 0
        np.testing.assert_allclose(fmt[step], np.mean([0.0 if r else f for f, r in chunk]))


def test_bad_jsonl_row_names_file_and_line(tmp_path):
    path = tmp_path / "math.jsonl"
    good = json.dumps({"question": "1 + 1?", "answer": "#### 2"})
    path.write_text(f"{good}\n{good}\n{{not json\n{good}\n")
    c = get_config("qwen_math", {"mesh.num_devices": 1, "task.kwargs.path": str(path)})
    with pytest.raises(ValueError, match=f"{path}:3"):
        Trainer(c, str(tmp_path / "run"))


# ============================================================================ helpers


def test_encode_demonstrations_layout():
    from jaxrl_frontier.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    b = encode_demonstrations(tok, ["1+2=", "10+20="], ["3", "30"], 8, 4)
    assert b["tokens"].shape == (2, 12)
    prompt = tok.encode("1+2=")
    np.testing.assert_array_equal(b["tokens"][0, :8], [0, 0, 0, tok.bos_id, *prompt])
    np.testing.assert_array_equal(b["tokens"][0, 8:], [*tok.encode("3"), tok.eos_id, 0, 0])
    np.testing.assert_array_equal(b["attention_mask"][0], [0] * 3 + [1] * 7 + [0, 0])
    np.testing.assert_array_equal(b["loss_mask"][1], [0] * 8 + [1, 1, 1, 0])
    with pytest.raises(ValueError, match="max_new_tokens=4"):
        encode_demonstrations(tok, ["1+2="], ["12345"], 8, 4)


def test_trainer_needs_a_workdir():
    from jaxrl_frontier.core.errors import ConfigError

    with pytest.raises(ConfigError, match="workdir"):
        Trainer(get_config("grpo_arith", FAST))


def test_train_function_runs_and_exports(tmp_path):
    summary = trainer_lib.train(get_config("grpo_arith", {**FAST, "train.steps": 1}), str(tmp_path))
    assert summary["step"] == 1 and summary["history"]["eval"][-1]["step"] == 1
    assert os.path.exists(tmp_path / "export" / "config.json")
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["train"]["steps"] == 1  # the resolved config is written


def test_stop_at_pass1_finishes_early_and_stays_finished(tmp_path, monkeypatch):
    """train.stop_at_pass1: the first eval at or above the target ends the run (checkpoint +
    export); running the same config again trains no further."""
    scores = iter([0.2, 0.6, 0.9])
    monkeypatch.setattr(
        Trainer, "evaluate", lambda self, n=None: {"eval/pass@1_greedy": next(scores)}
    )
    overrides = {"train.steps": 10, "train.eval_every": 2, "train.stop_at_pass1": 0.5}
    tr, summary = run("sft_arith", tmp_path, overrides)
    assert summary["step"] == 4 and not summary["stopped"]
    assert [e["step"] for e in summary["history"]["eval"]] == [2, 4]
    assert summary["history"]["target_reached_at"] == 4
    assert os.path.exists(os.path.join(tmp_path, "export", "config.json"))
    assert Checkpointer(os.path.join(tmp_path, "checkpoints")).latest_step() == 4
    tr2, again = run("sft_arith", tmp_path, overrides)
    assert again["step"] == 4 and int(tr2.state.step) == 4


# ============================================================================ mends


def test_dropout_grpo_update_runs_the_sub_network_that_sampled_each_row(tmp_path):
    """Dropout-GRPO: the update's log-probs under the rollout's own MLP masks equal the
    sampler's, so the first update is on-policy (ratio 1); the full network is not."""
    c = get_config("grpo_arith", {**FAST, **RL, "rollout.dropout_rate": 0.3})
    trainer = Trainer(c, str(tmp_path))
    examples = [trainer.task.example("train", i) for i in range(8)]
    exp, _ = trainer.step.rollout(examples, jax.random.key(0))
    assert exp.dropout_keys is not None and trainer.step.learner.update_groups == 1
    _, _, m = trainer.step.learner.gradient(exp)
    np.testing.assert_allclose(float(m["ratio_mean"]), 1.0, atol=1e-5)
    assert float(m["approx_kl"]) < 1e-6
    full = (
        trainer.step.logp_fn(trainer.state.params, exp.tokens, exp.attention_mask) * exp.loss_mask
    )
    gap = np.abs(np.asarray(full) - np.asarray(exp.old_logp)).max()
    assert gap > 1e-2, "dropout changes nothing here: the check above would be vacuous"


def test_resume_with_another_decay_horizon_is_refused(tmp_path):
    cosine = {**RL, "optimizer.schedule": "cosine", "train.checkpoint_every": 2}
    run("grpo_arith", tmp_path, {**cosine, "train.steps": 2})
    with pytest.raises(ConfigError, match="train.steps x epochs"):
        run("grpo_arith", tmp_path, {**cosine, "train.steps": 4})
    with pytest.raises(ConfigError, match="optimizer.lr"):
        run("grpo_arith", tmp_path, {**cosine, "train.steps": 2, "optimizer.lr": 1e-3})


def test_rl_resume_with_a_cosine_schedule_is_bitwise_identical(tmp_path):
    cosine = {**RL, "optimizer.schedule": "cosine", "train.steps": 4, "train.checkpoint_every": 10}
    ref, _ = run("grpo_arith", tmp_path / "ref", cosine)
    tr = Trainer(get_config("grpo_arith", {**FAST, **cosine}), str(tmp_path / "cut"))
    write = tr.writer.write_scalars

    def write_then_preempt(step, scalars):
        write(step, scalars)
        if step == 2:
            signal.raise_signal(signal.SIGTERM)

    tr.writer.write_scalars = write_then_preempt
    assert tr.run()["step"] == 2
    resumed, summary = run("grpo_arith", tmp_path / "cut", cosine)
    assert summary["step"] == 4
    for x, y in zip(host_leaves(ref.state), host_leaves(resumed.state), strict=True):
        np.testing.assert_array_equal(x, y)
    lr = [series(read_metrics(tmp_path / d), "train/loss") for d in ("ref", "cut")]
    assert lr[0] == lr[1]
