"""Schedules and controllers in a run (run/knobs.py): a scheduled KL coefficient is logged at
its schedule's value at every step and the loss uses it (the update's gradient equals the one
of a loss built with that coefficient as a constant); moving values compile nothing after
the first steps; a run cut mid-schedule and mid-controller resumes bitwise; the entropy
controller acts in a runlocal run; the config errors name their keys."""

import dataclasses
import math

import jax
import numpy as np
import pytest
from conftest import assert_resumed_run_equal, get_config, read_metrics, series, small_rl_config

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.objectives import losses
from jaxrl_frontier.rl.learn.learner import update_layout
from jaxrl_frontier.rl.learn.loss import rl_loss
from jaxrl_frontier.rl.learn.train_step import microbatch_grads
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import trainer as tr
from jaxrl_frontier.run.knobs import KnobPlan
from jaxrl_frontier.train.schedules import Schedule

f32 = lambda x: float(np.float32(x))
KL = "cosine(0.05, 0.005)"


@pytest.fixture(autouse=True, scope="module")
def without_persistent_compilation_cache():
    """This file's learner update programs run without JAX's disk cache: in the full suite
    XLA:CPU's executable (de)serialization segfaulted the worker inside the cache's get / put
    on them, at a point that depends on what the worker ran before (the file passes alone)."""
    from jax._src import compilation_cache

    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    yield
    jax.config.update("jax_enable_compilation_cache", True)
    compilation_cache.reset_cache()


def _config(steps: int, schedules=None, controllers=None, **overrides):
    """small_rl_config with shaped rewards (a random policy gets advantages) and the given
    `schedules` / `controllers` entries ({dotted key: spec})."""
    c = small_rl_config()
    c.objective.reward_weights = dict(correctness=1.0, format=0.5, length=0.1)
    c.optimizer.update(lr=5e-3, warmup_steps=0)
    c.train.update(steps=steps, log_every=1, eval_every=10**6, checkpoint_every=1)
    for section, entries in (("schedules", schedules), ("controllers", controllers)):
        for key, spec in (entries or {}).items():
            *parents, leaf = f"{section}.{key}".split(".")
            node = c
            for p in parents:
                node = node[p]
            node[leaf] = spec
    for key, value in overrides.items():
        section, name = key.split("__")
        c[section][name] = value
    return c


def _trainer(workdir, c):
    trainer = tr.Trainer(c, str(workdir))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    return trainer


def test_scheduled_kl_is_logged_at_every_step_and_the_loss_uses_it(tmp_path):
    steps = 4
    trainer = _trainer(tmp_path, _config(steps, {"objective.kl_coef": KL}))
    assert trainer.roles.ref_params is not None  # objective.kl_coef is 0: loaded for the schedule
    trainer.run()
    rows = read_metrics(tmp_path)
    schedule = Schedule("k", KL, steps)
    logged = series(rows, "schedule/objective.kl_coef")
    # the row of step k holds the value of RL step k - 1 (the policy version it updated)
    assert logged == {k: f32(schedule(k - 1)) for k in range(1, steps + 1)}
    assert logged[1] == f32(0.05) and logged[3] == f32(0.0275)
    pg, kl, loss = (series(rows, f"train/{k}") for k in ("pg_loss", "kl_loss", "loss"))
    for k in range(1, steps + 1):  # L = pg + kl_coef * kl (no entropy bonus); f32 sums
        assert loss[k] == pytest.approx(pg[k] + logged[k] * kl[k], rel=1e-6, abs=1e-9)
    assert kl[steps] > 0  # the policy has left the reference: the term is not 0

    # the gradient of the update at a coefficient == that of the loss with it as a constant
    examples = [trainer.task.example("train", i) for i in range(4)]
    exp, _ = trainer.step.rollout(examples, jax.random.key(7))
    batch = exp.update_batch()
    options = trainer.step.learner.options
    layout = update_layout(
        rows=options.rows,
        group_size=options.group_size,
        completion_len=options.completion_len,
        mesh=trainer.roles.mesh,
        share_prompt=options.share_prompt,
    )
    grads = {}
    for coef in (0.05, 0.5):
        trainer.step.learner.set_knobs({"kl_coef": coef})
        got_loss, got, _ = trainer.step.learner.gradient(exp)
        objective = dataclasses.replace(options.objective, kl_coef=coef)
        by_hand = rl_loss(trainer.roles.graphdef, objective, **layout)
        den = losses.aggregation_denominator(objective, batch["loss_mask"])
        want_loss, want, _ = microbatch_grads(by_hand, trainer.state.params, batch, 1, None, den)
        # the same f32 program but for a traced scalar in place of a constant: equal up to
        # the order XLA fuses the products in (a few ulps of each leaf)
        np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-8)
        grads[coef] = jax.tree.leaves(want)
    # ... and the coefficient matters: the two gradients differ far beyond that tolerance
    moved = max(float(np.abs(a - b).max()) for a, b in zip(grads[0.05], grads[0.5]))
    assert moved > 1e-5, moved


def test_moving_values_compile_nothing_after_the_first_steps(tmp_path, count_compiles):
    """KL and eps_high scheduled, the temperature scheduled, the entropy bonus controlled:
    every value moves at every step, and steps 3 to 6 compile nothing (the update's and the
    sampler's programs take them as arguments) until the export after the last step."""
    knobs = {
        "objective.kl_coef": KL,
        "objective.weight_kwargs.eps_high": "periodic(0.2, 0.3, period=4)",
        "rollout.temperature": "linear(1.0, 0.7)",
    }
    controllers = {"objective.entropy_coef": "entropy(target=10.0, step=0.01)"}  # rises
    trainer = _trainer(tmp_path, _config(6, knobs, controllers))
    update = trainer.step.learner.update
    with count_compiles() as seen:

        def marked(*args, **kwargs):
            seen.append(f"step {int(trainer.state.step) + 1}")
            return update(*args, **kwargs)

        export = trainer.export
        trainer.export = lambda *a: seen.append("export") or export(*a)  # compiles its own
        trainer.step.learner.update = marked
        trainer.run()
    first, last = seen.index("step 3"), seen.index("export")
    assert [s for s in seen[first:last] if not s.startswith("step ")] == [], seen[first:]
    assert [s for s in seen if s.startswith("step ")] == [f"step {k}" for k in range(1, 7)]
    assert any(not s.startswith("step ") for s in seen[:first])  # it did count compiles
    rows = read_metrics(tmp_path)
    for key in [*knobs, *controllers]:
        logged = series(rows, f"schedule/{key}")
        assert all(logged[k] != logged[k + 1] for k in range(1, 6)), (key, logged)  # moves
    ((select, program),) = trainer.step.learner.built_programs()
    assert program._cache_size() == 1 and select._cache_size() == 1


# their own spans, not the horizon: the cut run's train.steps = 2 leaves them as they are
def test_a_rollout_sampled_ahead_uses_and_logs_the_schedule_of_the_step_it_trains(tmp_path):
    """rollout.max_staleness = 1: step k + 1's batch is sampled during step k, with the
    temperature of RL step k (the step that trains on it), as a synchronous run would."""
    temperature = "linear(1.0, 0.5)"
    c = _config(4, {"rollout.temperature": temperature}, rollout__max_staleness=1)
    c.train.checkpoint_every = 10**6  # a checkpoint step samples synchronously
    trainer = _trainer(tmp_path, c)
    generate, sampled = trainer.roles.sampler.generate, []

    def recording(tokens, mask, params, key):
        sampled.append(params.temperature)
        return generate(tokens, mask, params, key)

    trainer.roles.sampler.generate = recording
    trainer.run()
    rows = read_metrics(tmp_path)
    schedule = Schedule("t", temperature, 4)
    assert sampled == [f32(schedule(s)) for s in range(4)]  # what the sampler was given
    assert series(rows, "rollout/policy_lag")[3] == 1.0  # sampled ahead, by the older policy
    assert series(rows, "schedule/rollout.temperature") == {
        k: f32(schedule(k - 1)) for k in range(1, 5)
    }


KNOBS = {
    "objective.kl_coef": "cosine(0.05, 0.005, steps=4)",
    "rollout.temperature": "linear(1.0, 0.6, steps=4)",
}
CONTROLLERS = {
    "objective.entropy_coef": "entropy(target=10.0, step=0.01)",
    "objective.weight_kwargs.eps_high": "clip_fraction(target=0.01, rate=0.5)",
}


def test_a_run_cut_mid_schedule_and_mid_controller_resumes_bitwise(tmp_path):
    """4 uninterrupted steps == 2 steps, then a new trainer on the same workdir for 2 more:
    the same parameters and optimizer state, the same controller states, and the same
    logged numbers (the knobs' values included) at steps 3 and 4."""
    full = _trainer(tmp_path / "full", _config(4, KNOBS, CONTROLLERS))
    full.run()
    _trainer(tmp_path / "cut", _config(2, KNOBS, CONTROLLERS)).run()
    resumed = _trainer(tmp_path / "cut", _config(4, KNOBS, CONTROLLERS))
    resumed.run()
    for step in (3, 4):
        row = assert_resumed_run_equal(full, resumed, tmp_path / "full", tmp_path / "cut", step)
        assert {f"schedule/{k}" for k in [*KNOBS, *CONTROLLERS]} <= set(row)
    assert resumed.knobs.state() == full.knobs.state()
    entropy = full.knobs.controllers["objective.entropy_coef"]
    assert entropy.updates == 4 and entropy.value == pytest.approx(0.04)  # 4 x +0.01


def test_a_resume_with_another_schedule_names_the_key(tmp_path):
    _trainer(tmp_path, _config(1, KNOBS, CONTROLLERS)).run()
    changed = {**KNOBS, "objective.kl_coef": "cosine(0.05, 0.001, steps=4)"}
    with pytest.raises(ConfigError, match="schedules.objective.kl_coef changed"):
        _trainer(tmp_path, _config(2, changed, CONTROLLERS)).run()
    # a schedule that spans the horizon follows train.steps: changing it is refused too
    spans = {**KNOBS, "rollout.temperature": "linear(1.0, 0.6)"}
    _trainer(tmp_path / "h", _config(1, spans)).run()
    with pytest.raises(ConfigError, match="schedules.rollout.temperature changed"):
        _trainer(tmp_path / "h", _config(2, spans)).run()


def test_the_entropy_controller_acts_in_a_runlocal_run(tmp_path, monkeypatch):
    """configs/grpo_schedules_arith.py:runlocal with the entropy target above the warm
    start's entropy: the bonus rises by `step` after each step whose entropy is below the
    band, exactly as the rule says, and the loss carries it (L = pg + kl - coef * H)."""
    c = get_config(
        "grpo_schedules_arith",
        {"train.steps": 4, "train.log_every": 1, "mesh.num_devices": 1, "eval.at_start": False},
    )
    c.controllers.objective.entropy_coef = dict(kind="entropy", target=2.0, band=0.1, step=0.002)
    trainer = _trainer(tmp_path, c)
    trainer.run()
    rows = read_metrics(tmp_path)
    coef, entropy = (series(rows, k) for k in ("schedule/objective.entropy_coef", "train/entropy"))
    assert coef[1] == 0.0  # the configured objective.entropy_coef
    for k in range(1, 4):
        assert entropy[k] < 2.0 - 0.1
        assert coef[k + 1] == f32(coef[k] + 0.002)
    pg, kl, loss = (series(rows, f"train/{k}") for k in ("pg_loss", "kl_loss", "loss"))
    kl_coef = series(rows, "schedule/objective.kl_coef")
    for k in range(1, 5):
        want = pg[k] + kl_coef[k] * kl[k] - coef[k] * entropy[k]
        assert loss[k] == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert coef[4] > 0 and abs(loss[4] - pg[4] - kl_coef[4] * kl[4]) > 1e-4  # it acted


def test_the_entropy_controller_holds_the_band_a_fixed_coefficient_falls_out_of(tmp_path):
    """40 steps at lr 1e-2 on the seconds-long config (shaped rewards): with the entropy
    bonus fixed at its configured 0 the token entropy falls from 4.13 to about 1.1 nats;
    with entropy(target 3.9, band 0.15, step 0.05) the bonus rises while the entropy is
    below the band and the entropy comes back into it. Over the last 10 steps: the fixed run
    is more than 1 nat below the band at every step; the controlled one has its mean inside
    the band and every step within 0.1 of it (a bang-bang rule acting one step late
    overshoots a little)."""
    target, band, last = 3.9, 0.15, range(31, 41)
    spec = f"entropy({target}, band={band}, step=0.05, ceiling=2.0)"
    entropy = {}
    for arm, controllers in (("fixed", None), ("controlled", {"objective.entropy_coef": spec})):
        c = _config(40, None, controllers, optimizer__lr=1e-2)
        c.train.checkpoint_every = 10**6
        _trainer(tmp_path / arm, c).run()
        entropy[arm] = series(read_metrics(tmp_path / arm), "train/entropy")
    assert entropy["fixed"][1] > target and entropy["controlled"][1] > target  # starts above
    assert all(entropy["fixed"][k] < target - band - 1.0 for k in last), entropy["fixed"]
    held = [entropy["controlled"][k] for k in last]
    assert target - band <= sum(held) / len(held) <= target + band, held
    assert all(target - band - 0.1 <= h <= target + band + 0.1 for h in held), held
    coef = series(read_metrics(tmp_path / "controlled"), "schedule/objective.entropy_coef")
    assert coef[1] == 0.0 and coef[40] >= 0.3  # it acted: the bonus that holds the band


# ----------------------------------------------------------------------------- config


def _error(c) -> str:
    with pytest.raises(ConfigError) as e:
        config_lib.validate(c, num_devices=1)
    return str(e.value)


def test_a_key_is_scheduled_or_controlled_not_both():
    c = _config(10, {"objective.kl_coef": KL}, {"objective.kl_coef": "adaptive_kl(0.01)"})
    msg = _error(c)
    assert "'objective.kl_coef' is both scheduled" in msg and "controllers.objective.kl_coef" in msg


@pytest.mark.parametrize(
    "schedules, controllers, overrides, words",
    [
        ({"objective.kl_coef": "linear(0.0, 0.0)"}, {}, {}, ["schedules.objective.kl_coef", "never rises above 0"]),
        ({"objective.kl_coef": "linear(0.1, -0.1)"}, {}, {}, ["schedules.objective.kl_coef", "outside the range", ">= 0"]),
        ({"rollout.temperature": "linear(1.0, 0.0, steps=5)"}, {}, {}, ["schedules.rollout.temperature", "0.0", "> 0"]),
        ({"objective.weight_kwargs.delta_low": "constant(0.1)"}, {}, {}, ["schedules.objective.weight_kwargs.delta_low", "'ppo_clip' has no knob 'delta_low'"]),
        ({"objective.distill_coef": "constant(0.1)"}, {}, {}, ["schedules.objective.distill_coef", "objective.distill is unset"]),
        ({"objective.kl_coef": KL}, {}, {"objective__kl_in_reward": True}, ["schedules.objective.kl_coef", "kl_in_reward"]),
        ({"objective.kl_coef": KL}, {}, {"mode__mode": None}, ["schedules.objective.kl_coef", "RL runs"]),
        ({}, {"objective.kl_coef": "adaptive_kl(0.01)"}, {}, ["controllers.objective.kl_coef", "never rises above 0"]),
        ({}, {"rollout.top_p": "entropy(1.0, init=1.0, floor=0.5, ceiling=1.5)"}, {}, ["controllers.rollout.top_p", "(0, 1]", "got 1.5"]),
        ({"objective.kl_coef": "cosin(0.1, 0.0)"}, {}, {}, ["schedules.objective.kl_coef", "unknown schedule 'cosin'"]),
    ],
)  # fmt: skip
def test_bad_schedules_and_controllers_name_their_key(schedules, controllers, overrides, words):
    sft = overrides.pop("mode__mode", 0) is None
    c = _config(10, schedules, controllers, **overrides)
    if sft:
        c.mode = "sft"
    msg = _error(c)
    assert all(w in msg for w in words), msg


def test_an_unknown_key_is_refused_by_the_schema():
    c = config_lib.base_config().to_dict()
    c["schedules"]["objective"]["kl_cof"] = KL
    with pytest.raises(ConfigError, match="'schedules.objective.kl_cof'.*kl_coef"):
        config_lib.resolve(c)


def test_an_environment_run_schedules_objective_keys_only():
    c = get_config("grpo_frozenlake")
    c.schedules.rollout.temperature = "linear(1.0, 0.5)"
    assert "environment rollouts" in _error(c)
    c.schedules.rollout.temperature = None
    c.schedules.objective.entropy_coef = "linear(0.01, 0.0)"
    config_lib.validate(c, num_devices=1)


def test_a_schedule_from_the_command_line():
    """--config.schedules.<key>=<call>, as scripts/train.py parses it, on any config file."""
    import os

    from absl import flags
    from conftest import REPO
    from ml_collections import config_flags

    argv = [
        "train.py",
        f"--config={os.path.join(REPO, 'configs', 'grpo_arith.py')}:runlocal",
        "--config.schedules.objective.kl_coef=cosine(0.05, 0.005)",
        "--config.controllers.objective.weight_kwargs.eps_high=clip_fraction(target=0.2)",
    ]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "", lock_config=False, flag_values=fv, sys_argv=argv
    )
    fv(argv)
    c = config_lib.resolve(fv.config)
    config_lib.validate(c, num_devices=8)
    plan = KnobPlan.from_config(c, config_lib.RANGES)
    assert plan.keys == ("objective.kl_coef", "objective.weight_kwargs.eps_high")
    assert plan.objective_keys == ("kl_coef", "weight_kwargs.eps_high")
    assert plan.values(0) == {
        "objective.kl_coef": f32(0.05),
        "objective.weight_kwargs.eps_high": f32(0.2),
    }
    assert plan.upper("objective.kl_coef") == pytest.approx(0.05)
    assert math.isclose(plan.values(c.train.steps)["objective.kl_coef"], f32(0.005))
