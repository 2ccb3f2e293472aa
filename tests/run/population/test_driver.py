"""A population (run/population/driver.py): every member equals the solo run of its own config
(bitwise: the members run the same compiled programs), prompts shared with `same_prompts`,
one compile for all members, a resume after a kill, a stop signal that stops every member
after the same step, PBT's copies through a run. (The keys a population refuses:
test_population_config.py; PBT's plan: test_pbt.py.)"""

from __future__ import annotations

import json
import os
import signal

import jax
import ml_collections
import numpy as np
import pytest
from conftest import RL, Killed, small_rl_config, with_population

from jaxrl_frontier.rl.learn.optimizer import learning_rate
from jaxrl_frontier.run import trainer as tr
from jaxrl_frontier.run.population import driver as population
from jaxrl_frontier.train import hooks

STEPS = 4
# batched sampling: a vmapped matmul may reduce in another order; seen <= 9.5e-7 (2 f32 ulp at
# |logp| ~ 4.4), the bound leaves 10x room
LOGP_ATOL = 1e-5


def base_config():
    c = small_rl_config()
    for key, value in RL.items():  # shaped rewards: advantages from the first step
        section, name = key.split(".")
        c[section][name] = value
    c.objective.kl_coef = 0.05
    c.train.update(steps=STEPS, log_every=1, eval_every=10**6, checkpoint_every=2)
    c.train.rollout_log_every = 1
    c.eval.update(num_prompts=8, batch=8, pass_k=1)
    return c


def population_config_of(size=2, **vary):
    return with_population(base_config(), size, **vary)


def rows(workdir, name="metrics.jsonl"):
    with open(os.path.join(workdir, name)) as f:
        out = [json.loads(line) for line in f]
    untimed = lambda r: {k: v for k, v in r.items() if "time" not in k and "second" not in k}  # noqa: E731
    return [untimed(r) for r in out]


def stubbed(pop):
    for member in pop.members:  # no eval programs: the members' equality is the point
        member.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    return pop


def recording(pop):
    """Each member's batches as its step collects them (host copies), [member][step]."""
    seen = [[] for _ in pop.members]
    for i, member in enumerate(pop.members):

        def spy(collect=member.step.collect, i=i):
            got = collect()
            fields = ("tokens", "rewards", "old_logp", "loss_mask")
            seen[i].append({k: np.asarray(getattr(got["exp"], k)) for k in fields})
            return got

        member.step.collect = spy
    return seen


def assert_close_rows(got_dir, want_dir, tag=None):
    """The logged steps equal, every metric to 1e-4 relative (vmapped or split matmuls sum
    f32 in another order: the batched tests' bound)."""
    got, want = rows(got_dir), rows(want_dir)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), (tag, a["step"], k)


def assert_same_batches(got, want):
    """Recorded batches (`recording`): tokens, rewards and masks equal, behaviour log-probs
    to LOGP_ATOL."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for k in ("tokens", "rewards", "loss_mask"):
            np.testing.assert_array_equal(g[k], w[k])
        np.testing.assert_allclose(g["old_logp"], w["old_logp"], rtol=0, atol=LOGP_ATOL)


@pytest.fixture(scope="module")
def two_members(tmp_path_factory):
    """A population of 2 (seeds 0, 1; kl_coef 0.02, 0.1), run whole, with the compiles of
    each member's first step counted."""
    root = str(tmp_path_factory.mktemp("pop"))
    c = population_config_of(objective__kl_coef=(0.02, 0.1))
    pop = stubbed(population.Population(c, root))
    compiles: dict[int, list] = {}
    seen: list[str] = []
    listener = lambda event, duration, **kw: (  # noqa: E731
        seen.append(kw.get("fun_name", "")) if "backend_compile" in event else None
    )

    class CountFirstStep(hooks.Hook):  # the compiles of each member's first step
        def __init__(self, i):
            self.i = i

        def after_step(self, end):
            if end.done == 1:
                compiles[self.i] = list(seen)
                seen.clear()

    for i, member in enumerate(pop.members):
        member.hooks.insert(0, CountFirstStep(i))
    pop.seen = recording(pop)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        summary = pop.run()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return root, pop, summary, compiles


def test_members_record_their_values_and_compile_once(two_members):
    root, pop, summary, compiles = two_members
    want = [{"seed": 0, "objective.kl_coef": 0.02}, {"seed": 1, "objective.kl_coef": 0.1}]
    assert json.load(open(os.path.join(root, "population.json")))["members"] == want
    assert [m["values"] for m in summary["members"]] == want
    assert [m["step"] for m in summary["members"]] == [STEPS, STEPS]
    for i, values in enumerate(want):
        cfg = json.load(open(os.path.join(root, "members", str(i), "config.json")))
        assert cfg["seed"] == values["seed"] and cfg["data"]["seed"] == 0  # same_prompts
        assert cfg["schedules"]["objective"]["kl_coef"] == values["objective.kl_coef"]
        assert cfg["population"]["size"] == 0  # an ordinary run's config
        kl = [r["schedule/objective.kl_coef"] for r in rows(pop.member_dir(i)) if "train/loss" in r]
        assert kl == pytest.approx([values["objective.kl_coef"]] * STEPS)
    # member 0's first step compiled the sampler and the update; member 1's first step runs
    # those programs (its own optimizer init and key splits aside: none of the big ones)
    big = ("update", "generate", "logp", "prefill", "decode")
    assert any(any(b in name for b in big) for name in compiles[0])
    assert not [name for name in compiles[1] if any(b in name for b in big)], compiles[1]


def test_same_prompts_for_every_member(two_members):
    root, pop, _, _ = two_members
    prompts = lambda i: [  # noqa: E731
        (r["step"], r["prompt"]) for r in rows(pop.member_dir(i), "rollouts.jsonl")
    ]
    assert {step for step, _ in prompts(0)} == set(range(1, STEPS + 1))
    assert prompts(0) == prompts(1)
    tokens = lambda i: [r["completion"] for r in rows(pop.member_dir(i), "rollouts.jsonl")]  # noqa: E731
    assert tokens(0) != tokens(1)  # each member samples with its own seed and weights


def test_a_member_equals_the_solo_run_of_its_config(two_members, tmp_path):
    root, pop, _, _ = two_members
    member = pop.members[1]
    solo_cfg = ml_collections.ConfigDict(
        json.load(open(os.path.join(pop.member_dir(1), "config.json")))
    )
    solo = tr.Trainer(solo_cfg, str(tmp_path))
    solo.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    solo.run()
    assert rows(pop.member_dir(1)) == rows(str(tmp_path))
    assert rows(pop.member_dir(1), "rollouts.jsonl") == rows(str(tmp_path), "rollouts.jsonl")
    for a, b in zip(jax.tree.leaves(member.state), jax.tree.leaves(solo.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_killed_population_resumes_bitwise(two_members, tmp_path):
    _, full, _, _ = two_members
    c = population_config_of(objective__kl_coef=(0.02, 0.1))
    pop = stubbed(population.Population(c, str(tmp_path)))

    class KillAfter(hooks.Hook):  # member 1's checkpoint of step 2 on disk, then dead
        def after_step(self, end):
            if end.done == 2:
                pop.members[1].ckpt.wait()
                raise Killed

    pop.members[1].hooks.append(KillAfter())
    with pytest.raises(Killed):
        pop.run()
    resumed = stubbed(population.Population(c, str(tmp_path)))
    resumed.run()
    for i in range(2):
        assert rows(resumed.member_dir(i)) == rows(full.member_dir(i))
        state, want = resumed.members[i].state, full.members[i].state
        for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_signal_stops_every_member_after_the_same_step(tmp_path):
    c = population_config_of()  # seeds 0, 1
    pop = stubbed(population.Population(c, str(tmp_path)))

    class Signal(hooks.Hook):  # SIGTERM after member 1's step 1: every member stops at 2
        def after_step(self, end):
            if end.done == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    pop.members[1].hooks.append(Signal())
    summary = pop.run()
    assert summary["stopped"] and [m["step"] for m in summary["members"]] == [2, 2]
    for i in range(2):
        assert sorted(os.listdir(os.path.join(pop.member_dir(i), "checkpoints")))[-1] == "2"


def pbt_population(workdir):
    """4 members (kl_coef 0.02 .. 0.08) with PBT every 2 steps on a scripted eval: member i
    scores i / 10, so member 0 copies member 3 at steps 2 (and 4 is the last step: none)."""
    c = population_config_of(
        size=4, objective__kl_coef=(0.02, 0.04, 0.06, 0.08), optimizer__lr=(5e-3,) * 4
    )
    c.train.eval_every = 2
    c.population.pbt.update(every=2, fraction=0.25, factors=(0.5, 2.0))
    pop = population.Population(c, str(workdir))
    for i, member in enumerate(pop.members):
        member.evaluate = lambda num_prompts=None, i=i: {"eval/pass@1_greedy": i / 10}
    return pop


@pytest.fixture(scope="module")
def pbt_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pbt")
    pop = pbt_population(root)
    seen = {}
    exploit = pop.exploit

    def spy(step):  # the weights right after the copies
        exploit(step)
        seen[step] = [jax.device_get(m.state.params) for m in pop.members]

    pop.exploit = spy
    pop.run()
    return pop, seen


def test_pbt_copies_the_top_member_and_perturbs_its_values(pbt_run):
    pop, seen = pbt_run
    assert sorted(seen) == [2]  # step 4 is the run's last: no copies after it
    after = seen[2]
    for a, b in zip(jax.tree.leaves(after[0]), jax.tree.leaves(after[3]), strict=True):
        np.testing.assert_array_equal(a, b)  # member 0 holds member 3's weights exactly
    differ = lambda x, y: any(  # noqa: E731
        not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y))
    )
    assert differ(after[1], after[3]) and differ(after[2], after[3])  # the others kept theirs
    (row,) = rows(pop.workdir, "lineage.jsonl")
    assert (row["step"], row["member"], row["copied_from"]) == (2, 0, 3)
    assert (row["score"], row["source_score"]) == (0.0, 0.3)
    new = row["values"]["objective.kl_coef"]
    before = {"objective.kl_coef": pytest.approx(0.02), "optimizer.lr": pytest.approx(5e-3)}
    assert row["values_before"] == before
    assert new in (pytest.approx(0.04), pytest.approx(0.16))  # 0.08 x 0.5 or x 2.0
    lr = row["values"]["optimizer.lr"]  # in member 0's optimizer state from step 2 on
    assert lr in (pytest.approx(2.5e-3), pytest.approx(1e-2))
    assert learning_rate(pop.members[0].state.opt_state) == pytest.approx(lr)
    assert learning_rate(pop.members[3].state.opt_state) == pytest.approx(5e-3)
    kl = [r["schedule/objective.kl_coef"] for r in rows(pop.member_dir(0)) if "train/loss" in r]
    assert kl == pytest.approx([0.02, 0.02, new, new])


@pytest.mark.parametrize("member,step", [(3, 2), (1, 4)])
def test_a_killed_pbt_population_resumes_bitwise(pbt_run, tmp_path, member, step):
    """Killed after `member` saved `step`: (3, 2) every member holds step 2, saved before
    its copies; (1, 4) members 0 and 1 hold step 4 and 2 and 3 only step 2, so 0 and 1 roll
    back to step 2 (their step 4 set aside) and the copies of step 2 are made again."""
    full, _ = pbt_run
    pop = pbt_population(tmp_path)

    class KillAfter(hooks.Hook):
        def after_step(self, end):
            if end.done == step:
                pop.members[member].ckpt.wait()
                raise Killed

    pop.members[member].hooks.append(KillAfter())
    with pytest.raises(Killed):
        pop.run()
    newest = [max(m.ckpt.all_steps()) for m in pop.members]
    assert newest == ([2, 2, 2, 2] if step == 2 else [4, 4, 2, 2])
    resumed = pbt_population(tmp_path)
    resumed.run()
    if step == 4:
        for i in (0, 1):
            aside = os.listdir(resumed.member_dir(i) + "/checkpoints.set_aside")
            assert [name.split("-")[0] for name in aside] == ["4"]
    assert rows(resumed.workdir, "lineage.jsonl") == rows(full.workdir, "lineage.jsonl")
    for i in range(4):
        assert rows(resumed.member_dir(i)) == rows(full.member_dir(i))
        state, want = resumed.members[i].state, full.members[i].state
        for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_batched_update_equals_the_members_own(two_members, tmp_path):
    """One vmapped update of both members (population.batched_update) against each member's
    own update: the same prompts and rewards, metrics and weights equal up to the order of
    f32 reductions (the vmapped matmuls' batch axis: a few ulp per step, grown over 4
    Adam steps at lr 5e-3 on O(0.1) weights)."""
    _, full, _, _ = two_members
    c = population_config_of(objective__kl_coef=(0.02, 0.1))
    c.population.batched_update = True
    pop = stubbed(population.Population(c, str(tmp_path)))
    pop.run()
    for i in range(2):
        assert_close_rows(pop.member_dir(i), full.member_dir(i), i)
        state, ref = pop.members[i].state, full.members[i].state
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref.params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        assert int(state.step) == STEPS


def test_batched_sampling_equals_each_members_own_rollouts(two_members, tmp_path):
    """Both members' rollouts of a step in one vmapped sampler program
    (population.batched_sampling), compiled once, against each member's own sampler call:
    the same tokens and rewards, behaviour log-probs and metrics up to the order of f32
    reductions."""
    _, full, _, _ = two_members
    c = population_config_of(objective__kl_coef=(0.02, 0.1))
    c.population.batched_sampling = True
    pop = stubbed(population.Population(c, str(tmp_path)))
    seen, names = recording(pop), []
    listener = lambda event, duration, **kw: (  # noqa: E731
        names.append(kw.get("fun_name", "")) if "backend_compile" in event else None
    )
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        pop.run()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    generate = [n for n in names if "members_generate" in n]
    assert pop.sampling.compiles == 1 and len(generate) == 1, names
    assert not [n for n in names if "prefill" in n or "decode" in n], names  # no plain sampler
    for i in range(2):
        assert len(seen[i]) == STEPS
        assert_same_batches(seen[i], full.seen[i])
        assert_close_rows(pop.member_dir(i), full.member_dir(i), i)
        assert rows(pop.member_dir(i), "rollouts.jsonl") == rows(
            full.member_dir(i), "rollouts.jsonl"
        )


def test_members_split_over_a_population_mesh_axis_equal_the_members_own(two_members, tmp_path):
    """mesh.population = 2 on 2 devices: each member's batched update (and batched rollout)
    on its own device, the rest of its step on both, replicated. The same rows, rewards and
    metrics as each member's own run on one device, up to the order of f32 reductions (the
    bounds of the batched tests above)."""
    _, full, _, _ = two_members
    c = population_config_of(objective__kl_coef=(0.02, 0.1))
    c.mesh.update(num_devices=2, population=2)
    c.population.update(batched_update=True, batched_sampling=True)
    pop = stubbed(population.Population(c, str(tmp_path)))
    seen = recording(pop)
    pop.run()
    assert dict(pop.members[0].step.learner.mesh.shape)["population"] == 2
    for i in range(2):
        assert_same_batches(seen[i], full.seen[i])
        assert_close_rows(pop.member_dir(i), full.member_dir(i), i)
        state, ref = pop.members[i].state, full.members[i].state
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref.params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_a_varied_learning_rate_lives_in_the_optimizer_state(tmp_path):
    """optimizer.lr varies through the optimizer state (optimizer.lr_in_state): member 1
    equals the solo run of its config bit for bit, and the plain optimizer at its lr up to
    the rounding of lr x schedule."""
    from jaxrl_frontier.rl.learn.optimizer import with_learning_rate

    c = population_config_of(optimizer__lr=(1e-3, 5e-3))
    c.train.steps = 2
    pop = stubbed(population.Population(c, str(tmp_path / "pop")))
    pop.run()
    assert [learning_rate(m.state.opt_state) for m in pop.members] == pytest.approx([1e-3, 5e-3])
    cfg = json.load(open(os.path.join(pop.member_dir(1), "config.json")))
    assert cfg["optimizer"]["lr"] == 5e-3 and cfg["optimizer"]["lr_in_state"] is True
    runs = {}
    for in_state in (True, False):
        solo_cfg = ml_collections.ConfigDict(cfg)
        solo_cfg.optimizer.lr_in_state = in_state
        solo = tr.Trainer(solo_cfg, str(tmp_path / f"solo{in_state}"))
        solo.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
        solo.run()
        runs[in_state] = solo.state.params
    member = jax.tree.leaves(pop.members[1].state.params)
    for a, b, p in zip(member, jax.tree.leaves(runs[True]), jax.tree.leaves(runs[False])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_allclose(np.asarray(a), np.asarray(p), rtol=1e-5, atol=1e-6)
    moved = with_learning_rate(pop.members[0].state.opt_state, 2e-3)
    assert learning_rate(moved) == pytest.approx(2e-3)


def test_a_lora_population_holds_its_base_once(tmp_path):
    """population.lora: adapters of each member on one exported policy, every member's rows
    in one vmapped update and one vmapped rollout program. The frozen base (and the
    reference, the base itself) are the first member's arrays, passed once (in_axes None):
    the compiled update's arguments hold the base once and N adapter states; member 1
    equals its solo run up to the order of f32 reductions (as the batched update's test)."""
    start = tr.Trainer(base_config(), str(tmp_path / "start"))
    path = start.export(str(tmp_path / "start" / "export"))
    start.close()
    c = population_config_of(objective__kl_coef=(0.02, 0.1))
    c.train.steps = 2
    c.model.update(init="checkpoint", path=path)
    c.model.lora.update(rank=4, alpha=8.0)
    c.population.lora = True
    pop = stubbed(population.Population(c, str(tmp_path / "pop")))
    last = {}
    for i, member in enumerate(pop.members):  # each member's last batch, for the lowering

        def spy(collect=member.step.collect, i=i):
            got = collect()
            last[i] = got["exp"]
            return got

        member.step.collect = spy
    pop.run()
    first, second = (m.roles for m in pop.members)
    assert second.base_params is first.base_params and second.ref_params is first.ref_params
    assert pop.members[1].step.learner.frozen["base"] is first.base_params
    n_base = len(jax.tree.leaves(first.base_params))
    assert pop.sampling.shared_leaves == n_base > 0 and pop.sampling.compiles == 1
    # the compiled update's arguments: N adapter states + the stacked minibatch + the base
    # and the other frozen inputs once (a base per member would add (N - 1) x base_bytes)
    lowered = pop.updates.lowered([last[0], last[1]])
    held = lowered.compile().memory_analysis().argument_size_in_bytes
    nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))  # noqa: E731
    base_bytes = nbytes(first.base_params)
    states = sum(nbytes(m.state) for m in pop.members)
    frozen = pop.members[0].step.learner.frozen
    once = states + base_bytes + nbytes({k: v for k, v in frozen.items() if k != "base"})
    assert once <= held < once + base_bytes // 2, (held, once, base_bytes)
    assert base_bytes > 4 * nbytes(pop.members[0].state.params)  # the adapters are small
    cfg = ml_collections.ConfigDict(json.load(open(os.path.join(pop.member_dir(1), "config.json"))))
    assert cfg.population.lora is False  # a member's config is an ordinary solo LoRA run
    solo = tr.Trainer(cfg, str(tmp_path / "solo"))
    solo.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    solo.run()
    assert_close_rows(pop.member_dir(1), str(tmp_path / "solo"))
    got, want = pop.members[1].state.params, solo.state.params
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
