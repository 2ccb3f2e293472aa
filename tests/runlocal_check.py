"""A config's `runlocal` variant trained for 2 steps, and what it logs checked
(`assert_runlocal_trains`): for tests/run/test_configs.py (the configs that train a model
from scratch or one of our warm starts) and tests/run/test_pretrained_configs.py (those
that read a pretrained checkpoint, about a minute each, in a test process of their own).
The variants run as written except: 2 steps, one device (sharded training is covered by
test_trainer.py's parity test; here every config would compile its programs for 8
devices), and a small greedy eval at the last step only.
"""

import glob
import importlib.metadata
import json
import math
import os
import re

import jax
import jax.numpy as jnp
import pytest
from conftest import REPO, get_config, host_leaves, read_metrics, series
from flax import nnx

from jaxrl_frontier.core.machine import cpu_info
from jaxrl_frontier.models import lora, pretrained
from jaxrl_frontier.objectives import losses
from jaxrl_frontier.rl.learn.loss import router_terms
from jaxrl_frontier.run.config import resolve
from jaxrl_frontier.run.trainer import Trainer
from jaxrl_frontier.train.checkpoint import Checkpointer

CONFIGS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "configs", "*.py")))


def _source(name: str) -> str:
    with open(os.path.join(REPO, "configs", f"{name}.py")) as f:
        return f.read()


# the configs that read a named pretrained checkpoint (models/pretrained.py) for a role
PRETRAINED_CONFIGS = [
    n for n in CONFIGS if any(f'"{p}"' in _source(n) for p in pretrained.PRETRAINED)
]
FROM_SCRATCH_CONFIGS = [n for n in CONFIGS if n not in PRETRAINED_CONFIGS]


def fetch_pretrained() -> None:
    """The named checkpoints the configs read, fetched once (a no-op when cached)."""
    text = "".join(_source(n) for n in CONFIGS)
    for name in pretrained.PRETRAINED:
        if f'"{name}"' in text:
            pretrained.fetch(name, say=lambda _: None)


QUICK = {
    "train.steps": 2,
    "mesh.num_devices": 1,
    "eval.at_start": False,
    "eval.num_prompts": 4,
    "eval.batch": 4,
    "eval.pass_k": 1,
}

# Each runlocal run's logged metrics, recorded once (`JAXRL_RECORD_RUNLOCAL=1 pytest
# tests/run/test_configs.py`) and compared at every run: a refactor that changes no math logs the
# same numbers. Keys that measure time are left out.
RECORDS = os.path.join(REPO, "tests", "fixtures", "runlocal_metrics")
TIMED = re.compile(r"time|seconds|per_s|/s$|_s$|throughput|tokens_per|wall|compile")


def logged_numbers(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not TIMED.search(k)} for r in rows]


def xla_flags() -> list[str]:
    """The XLA flags the programs compile under (tests/conftest.py's): another emitter or
    optimisation level rounds differently."""
    return sorted(f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f)


def check_record(name: str, rows: list[dict]) -> None:
    """Bitwise against the record on the CPU it was made on (same model, vector extensions,
    jax and XLA flags); elsewhere to rtol 1e-3. Another vector width reorders the f32
    reductions (each off by at most ~n * 6e-8 for a reduction of length n <= 512 here, 3e-5),
    and the first update amplifies that: Adam's first step moves each weight by lr * sign(g)
    (bias-corrected m / sqrt(v)), so a gradient element within rounding of 0 may take the
    other sign, and the second step's metrics then differ by more than the reordering alone
    (measured: 2.9e-4 on sft_frozenlake's train/grad_norm, a Zen 3 AVX2 CPU against the
    AVX-512 record)."""
    path = os.path.join(RECORDS, f"{name}.json")
    got = logged_numbers(rows)
    machine = dict(cpu_info(), jax=importlib.metadata.version("jax"), xla_flags=xla_flags())
    machine.pop("cpu_count")
    if os.environ.get("JAXRL_RECORD_RUNLOCAL"):
        os.makedirs(RECORDS, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"machine": machine, "rows": got}, f, indent=0, sort_keys=True)
        return
    if not os.path.exists(path):
        pytest.fail(f"no record {path}: make it with JAXRL_RECORD_RUNLOCAL=1")
    with open(path) as f:
        record = json.load(f)
    assert [sorted(r) for r in got] == [sorted(r) for r in record["rows"]], "logged keys differ"
    if record["machine"] == machine:
        assert got == record["rows"]
        return
    for mine, theirs in zip(got, record["rows"]):
        for key, value in theirs.items():
            if isinstance(value, float):
                assert math.isclose(mine[key], value, rel_tol=1e-3, abs_tol=1e-6), (
                    key,
                    mine[key],
                    value,
                )
            else:
                assert mine[key] == value, key


# RL configs whose runlocal variant has no warm start yet (presets.warm_start): their random
# policy earns no reward, so every group agrees and the policy-gradient term is 0. Listed so
# that giving one a warm start makes this fail here until it moves to the checks below.
NO_WARM_START: dict[str, str] = {
    "gemma3_math": "a tiny random Gemma 3 (the architecture through the trainer): no warm start",
}


def capture_first_update(learner) -> dict:
    """Wrap the learner's update program to keep, at its first call, the weights before
    it, the minibatch it trains on, its frozen arguments (host copies: the update donates
    its state) and the loss it reports (summed into the step's train/loss)."""
    seen, programs = {}, learner.programs

    def wrapped(keys):
        select, update = programs(keys)

        def first(state, mb, *frozen):
            if seen:
                return update(state, mb, *frozen)
            seen.update(
                params=jax.device_get(state.params),
                batch=jax.device_get(dict(mb)),
                frozen=jax.device_get(frozen[0]) if frozen else {},
            )
            state, metrics = update(state, mb, *frozen)
            seen["loss"] = float(metrics["loss"])
            return state, metrics

        return select, first

    learner.programs = wrapped
    return seen


def objective_recompute(tr, seen) -> float | None:
    """The first minibatch update's loss from the objectives package on the captured
    minibatch, the model forward in full (no shared prompt, no chunking; LoRA's adapters
    combined with the base): what the learner should have reported. None where the
    learner's loss is more than the objective (a critic's value loss, PACT's term) or runs
    under Dropout-GRPO masks."""
    c, learner = tr.config, tr.step.learner
    if learner.critic is not None or c.pact.enabled or c.rollout.dropout_rate > 0:
        return None
    frozen = seen["frozen"] or {}
    cfg = learner.options.objective
    if "knobs" in frozen:  # scheduled / controlled coefficients: this step's values
        cfg = losses.with_values(cfg, frozen["knobs"])
    batch = {k: jnp.asarray(v) for k, v in seen["batch"].items()}
    if cfg.distill:
        teacher = nnx.merge(nnx.graphdef(tr.roles.teacher), frozen["teacher"])
        batch["teacher_logits"] = teacher(batch["tokens"], batch["attention_mask"])
    routing = batch.pop("routing", None)  # MoE routing replay: the rollout's experts
    apply = lambda p, t, m: nnx.merge(tr.roles.graphdef, p)(t, m)
    if routing is not None:
        apply = lambda p, t, m: (lambda x: x.logits(x.hidden_states(t, m, routing=routing)[0]))(
            nnx.merge(tr.roles.graphdef, p)
        )
    params = seen["params"]
    if "base" in frozen:  # LoRA: the learner trains the adapters over the frozen base
        params = lora.combine(frozen["base"], params)
    loss, _ = losses.loss_fn(params, batch, cfg, apply_fn=apply)
    model = nnx.merge(tr.roles.graphdef, params)
    if model.cfg.num_experts:  # an MoE policy's loss adds the router's terms
        _, _, stats = model.hidden_states(
            batch["tokens"], batch["attention_mask"], router_stats=True
        )
        loss = loss + router_terms(stats, cfg)[0]
    return float(loss)


# Runlocal variants another config's runlocal trains whole: the two resolved configs differ
# only in the sections and keys named (checked in the test), which the other adds on top, so
# its run trains everything this one would. Only for real checkpoints, whose runs cost about a
# minute each here: SmolLM2's GRPO run is the judge config's run without the judge.
TRAINED_WITHIN: dict[str, tuple[str, tuple[str, ...]]] = {
    "smollm2_reasoning": ("judge_reasoning", ("judge.", "objective.reward_weights")),
}


def flat(tree: dict, prefix: str = "") -> dict:
    """A nested config dict as {dotted key: value}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def assert_trained_within(name: str) -> None:
    other, keys = TRAINED_WITHIN[name]
    mine, theirs = (flat(resolve(get_config(n, QUICK)).to_dict()) for n in (name, other))
    differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    assert differ and all(k.startswith(keys) for k in differ), (other, differ)


def assert_runlocal_trains(name: str, tmp_path) -> None:
    """Config `name`'s runlocal variant trains 2 steps in `tmp_path` (the working directory
    the repository, for relative data paths): it logs its record's numbers, a finite loss,
    rewards in range, a moving policy (a warm start), the loss the objectives package
    computes on its first minibatch, an eval, a checkpoint and an export."""
    if name in TRAINED_WITHIN:
        assert_trained_within(name)
        return
    c = get_config(name, QUICK)
    tr = Trainer(c, str(tmp_path))
    before = host_leaves(tr.state.params)
    seen = capture_first_update(tr.step.learner) if c.mode == "rl" else {}
    summary = tr.run()
    assert summary["step"] == 2 and not summary["stopped"]
    assert int(tr.state.step) == 2 and int(tr.state.skipped) == 0
    rows = read_metrics(tmp_path)
    check_record(name, rows)
    loss_key = "train/nll" if c.mode == "sft" else "train/loss"
    logged = series(rows, loss_key)
    assert 2 in logged
    assert all(math.isfinite(v) for v in logged.values())
    if c.mode == "rl":
        total = series(rows, "reward/total")[2]
        weights = c.objective.reward_weights.to_dict() or {"correctness": 1.0}
        if c.reward_model.init != "none":  # a score, not in [0, 1]: logged raw and as reward
            assert math.isfinite(series(rows, "reward_model/score_std")[2])
            total -= weights.pop("reward_model", 0.0) * series(rows, "reward/reward_model")[2]
        assert -1e-6 <= total <= sum(abs(w) for w in weights.values()) + 1e-6
        assert series(rows, "reward/failed")[2] == 0.0
        assert math.isfinite(series(rows, "train/grad_norm")[2])
        if c.teacher.init != "none":
            assert math.isfinite(series(rows, "opd/reverse_kl")[2])
        if c.model.moe.num_experts:  # the router's metrics are logged
            assert 1.0 <= series(rows, "train/moe/load_max")[2] <= c.model.moe.num_experts
            assert (
                0.0
                < series(rows, "train/moe/router_entropy")[2]
                <= math.log(c.model.moe.num_experts)
            )
        # it trains: its groups disagree (a warm start), so the gradient and the update are
        # not 0 (a weight function that returned zeros would fail here)
        moved = max(float(abs(a - b).max()) for a, b in zip(before, host_leaves(tr.state.params)))
        if name in NO_WARM_START:
            assert series(rows, "diag/zero_signal_share")[2] == 1.0, NO_WARM_START[name]
        else:
            assert series(rows, "train/grad_norm")[2] > 0.0 and moved > 0.0
        # the logged loss is the objectives package's on the same batch and weights; the
        # two paths differ in reduction order only (chunked vs full log-softmax, a shared
        # prompt forward): a few f32 roundings of terms of size ~1. Not for a pretrained
        # checkpoint's config: its first update's loss is its PPO term at ratio 1, minus
        # the mean of group-centred advantages, 0 up to rounding (both runs log ~1e-8), so
        # the check would hold whatever the loss path did, at the cost of a [B, T, V]
        # forward at the checkpoint's vocabulary (34 s at Gemma 3's 262k)
        want = None if c.model.init == "hf" else objective_recompute(tr, seen)
        if want is not None:
            assert seen["loss"] == pytest.approx(want, rel=1e-4, abs=1e-5), (seen["loss"], want)
        if c.data.source == "dynamic":  # DAPO: the update holds no zero-variance group
            assert series(rows, "rollout/zero_variance_groups")[2] == 0.0
    ev = series(rows, "eval/pass@1_greedy")
    assert 2 in ev and 0.0 <= ev[2] <= 1.0
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 2
    with open(tmp_path / "export" / "config.json") as f:
        exported = json.load(f)
    assert exported["hidden_size"] == c.model.hidden_size
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["train"]["steps"] == 2
