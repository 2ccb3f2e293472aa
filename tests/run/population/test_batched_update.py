"""A population's members in one update (run/population/batched_update.py), on stand-in learners whose
"update" adds up the minibatch it is given: each member's rows, knobs and state stacked on
a leading member axis, each member's own minibatch order from its own key stream, each
member's metrics and state taken back (its step advanced); and the layouts not batched.
On a mesh with a population axis: the member axis placed on it, and real learners' update
there equal to the same on one device.
(The vmapped update against each member's own through a run: tests/run/population/test_driver.py.)"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import SMALL_MODEL, random_experience, random_model
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.rl.learn.learner import Learner, LearnerOptions, minibatch_order
from jaxrl_frontier.rl.learn.train_step import TrainState, init_train_state, stacked
from jaxrl_frontier.run.population.batched_update import MemberUpdates

ROWS, GROUPS = 4, 2  # 2 groups of 2 rows; minibatches of one group each
X = np.array([[1.0], [2.0], [4.0], [8.0]], np.float32)  # a minibatch's sum names its rows


class StandIn:
    """What `MemberUpdates` reads of a `Learner`. Its update program, called on the stacked
    states and minibatches, adds each member's minibatch sum to its params and reports it."""

    def __init__(self, i, mesh, *, epochs=2, pack=None, critic=None, replay="none"):
        self.options = types.SimpleNamespace(routing_replay=replay)
        self.pack, self.critic, self.mesh = pack, critic, mesh
        self.rows, self.update_groups = ROWS, GROUPS
        self.epochs, self.minibatches, self.minibatch_rows = epochs, 2, ROWS // 2
        self.state = TrainState(
            params=jnp.float32(1000.0 * i),
            opt_state=(),
            step=jnp.int32(5),
            rng=jnp.zeros((2,), jnp.uint32),
            skipped=jnp.int32(0),
        )
        self.frozen = {"knobs": {"kl_coef": jnp.float32(0.1 * (i + 1))}}
        self.built = []

    def programs(self, keys):
        select = lambda batch, idx: {k: v[idx] for k, v in batch.items()}  # noqa: E731
        return select, None  # the members' update is `update_program`'s

    def update_program(self, keys, members=None):
        self.built.append((keys, members))

        def update(state, mb, frozen):
            total = mb["x"].sum(axis=(1, 2))  # [members]
            metrics = {"loss": total, "kl_coef": frozen["knobs"]["kl_coef"]}
            return state.replace(params=state.params + total), metrics

        return update


def _experience(scale):
    return types.SimpleNamespace(update_batch=lambda: {"x": jnp.asarray(X * scale)})


def _stream(seed):
    """A member's key stream (`RLStep.next_key`): keys seed, seed + 1, ..."""
    count = iter(range(seed, seed + 100))
    return lambda: jax.random.key(next(count))


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh((1, 1, 1), jax.devices()[:1])


def test_each_member_trains_on_its_own_rows_in_its_own_order(mesh):
    learners = [StandIn(0, mesh), StandIn(1, mesh)]
    members = MemberUpdates(learners)
    metrics = members.update([_experience(1), _experience(10)], [_stream(0), _stream(50)])
    # 2 epochs x 2 minibatches of one group each: {1 + 2, 4 + 8} x the member's scale
    for i, (scale, seed) in enumerate(((1, 0), (10, 50))):
        assert len(metrics[i]) == 4
        losses = [float(m["loss"]) for m in metrics[i]]
        assert sorted(losses[:2]) == sorted(losses[2:]) == [3.0 * scale, 12.0 * scale]
        # the order of each epoch: the member's next key's, as `Learner.update` draws it
        for epoch in range(2):
            order = minibatch_order(jax.random.key(seed + epoch), ROWS, GROUPS)
            want = [float(X[order[j * 2 : j * 2 + 2]].sum()) * scale for j in range(2)]
            assert losses[epoch * 2 : epoch * 2 + 2] == want
        assert [float(m["kl_coef"]) for m in metrics[i]] == pytest.approx([0.1 * (i + 1)] * 4)
        # its own state back, one step on: params + both epochs' rows
        state = learners[i].state
        assert float(state.params) == 1000.0 * i + 2 * 15.0 * scale
        assert int(state.step) == 6 and state.params.shape == ()
    # one program, built by the first learner, vmapped over the members' knobs
    assert learners[0].built == [(("x",), {"knobs": 0})] and learners[1].built == []


def test_the_program_is_built_once_per_key_set(mesh):
    learners = [StandIn(0, mesh, epochs=1), StandIn(1, mesh, epochs=1)]
    members = MemberUpdates(learners)
    for _ in range(2):
        members.update([_experience(1), _experience(1)], [_stream(0), _stream(0)])
    assert len(learners[0].built) == 1
    # two updates of one epoch over every row: + 2 x 15 each, two steps on
    assert float(learners[0].state.params) == 30.0
    assert float(learners[1].state.params) == 1000.0 + 30.0
    assert [int(lr.state.step) for lr in learners] == [7, 7]


@pytest.mark.parametrize(
    "option, named",
    [
        (dict(pack="spec"), "train.pack_tokens"),
        (dict(critic="critic"), "critic"),
        (dict(replay="first_update"), "model.moe.routing_replay = 'first_update'"),
    ],
)
def test_layouts_not_batched_are_refused_naming_the_key(mesh, option, named):
    with pytest.raises(ConfigError) as e:
        MemberUpdates([StandIn(0, mesh, **option), StandIn(1, mesh, **option)])
    assert str(e.value) == (
        f"config key 'population.batched_update': the members' update is not batched with "
        f"{named} yet: set population.batched_update (and population.lora) = False"
    )


def test_a_population_mesh_places_the_member_axis_on_it():
    """On a mesh with a population axis (4 blocks of 2 devices) the stacked state, minibatch
    and knobs have their member axis on 'population', the member's own layout inside; each
    member's state comes back as it was placed (replicated over the axis)."""
    mesh = sharding.make_mesh((1, 2, 1), jax.devices()[:8], population=4)
    learners = [StandIn(i, mesh, epochs=1) for i in range(4)]
    for lr in learners:
        lr.state = jax.device_put(lr.state, sharding.replicated(mesh))
        lr.frozen = jax.device_put(lr.frozen, sharding.replicated(mesh))
    seen = []
    update = learners[0].update_program

    def spy(keys, members=None):
        program = update(keys, members)

        def run(state, mb, frozen):
            seen.append((state.params, mb["x"], frozen["knobs"]["kl_coef"]))
            return program(state, mb, frozen)

        return run

    learners[0].update_program = spy
    with pytest.raises(ConfigError, match=r"'mesh.population' = 4 must divide the population's 3"):
        MemberUpdates(learners[:3])
    MemberUpdates(learners).update([_experience(i + 1) for i in range(4)], [_stream(0)] * 4)
    params, x, knob = seen[0]
    assert params.sharding.spec == jax.sharding.PartitionSpec("population")
    assert x.sharding.spec == jax.sharding.PartitionSpec("population", "fsdp", None)
    assert knob.sharding.spec == jax.sharding.PartitionSpec("population")
    for i, lr in enumerate(learners):
        assert lr.state.params.sharding == sharding.replicated(mesh)
        assert float(lr.state.params) == 1000.0 * i + 15.0 * (i + 1)


def _members_update(mesh, n=4):
    """n real learners (their own random weights, rows and key streams) updated at once on
    `mesh`: (each member's params, each member's metrics) on the host."""
    options = LearnerOptions(
        objective=dict(weight="ppo_clip", aggregation="token_mean", advantage="grpo"),
        rows=16, group_size=4, completion_len=3, epochs=1, minibatches=2, grad_accum=1,
    )  # fmt: skip
    tx, learners = optax.adam(1e-2), []
    for i in range(n):
        model = random_model(ModelConfig(vocab_size=20, **SMALL_MODEL), i)
        graphdef, params = nnx.split(sharding.shard_model(model, mesh))
        state = init_train_state(tx, params, mesh, jax.random.key(i))
        learners.append(Learner(graphdef, tx, state, options, mesh=mesh, log=lambda m: None))
    metrics = MemberUpdates(learners).update(
        [random_experience(seed=i) for i in range(n)], [_stream(10 * i) for i in range(n)]
    )
    params = [jax.device_get(lr.state.params) for lr in learners]
    return params, jax.device_get(metrics), learners


def _apart(a, b) -> tuple[float, float]:
    """(largest weight difference, largest relative metric difference) of two
    `_members_update` results."""
    weights = max(
        float(np.abs(x - y).max())
        for got, want in zip(a[0], b[0], strict=True)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    )
    metrics = 0.0
    for got, want in zip(a[1], b[1], strict=True):
        for x, y in zip(got, want, strict=True):
            assert x.keys() == y.keys()
            for k in x:
                gap = abs(float(x[k]) - float(y[k])) / max(abs(float(y[k])), 1.0)
                metrics = max(metrics, gap)
    return weights, metrics


def test_members_split_over_a_population_axis_equal_one_device():
    """4 members on 4 population blocks x fsdp 2 (8 devices), their stacked state's member
    axis on 'population' and each member's weights on fsdp inside, against the same members
    with population 1: on one block's mesh (fsdp 2, 2 devices) and on one device.

    Equal up to the order of f32 reductions. Against fsdp 2 alone the population axis only
    moves whole members to their own devices: measured 3.4e-7 on the weights (a few ulp of
    the O(1) weights) after two Adam steps, 3.2e-7 relative on the metrics. Against one device
    each gradient is also summed in another order (fsdp's halves, the vmapped matmuls), and
    Adam divides each gradient by its own running scale, so an element whose two steps'
    gradients nearly cancel moves by lr x a ratio sensitive to a ~1e-6 relative change:
    measured 1.7e-5 (fsdp 2 alone against one device: the same 1.7e-5), metrics 5.5e-7
    relative. The bounds leave 5x room or more."""
    split = sharding.make_mesh((1, 2, 1), jax.devices()[:8], population=4)
    got = _members_update(split)
    block = _members_update(sharding.make_mesh((1, 2, 1), jax.devices()[:2]))
    one = _members_update(sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    print("population 4 x fsdp 2 against fsdp 2, one device:", _apart(got, block), _apart(got, one))
    weights, metrics = _apart(got, block)
    assert weights < 2e-6 and metrics < 2e-6
    weights, metrics = _apart(got, one)
    assert weights < 1e-4 and metrics < 1e-5
    # each member's state back on its own layout: replicated over population
    own = got[2][0].state.params["embed"].get_value().sharding
    assert own.mesh == split and "population" not in jax.tree.leaves(tuple(own.spec))
    # the stacked state's layout: member axis on population, a member's own split inside
    state_sh = jax.tree.map(lambda x: x.sharding, got[2][0].state)
    embed = stacked(state_sh).params["embed"].get_value()
    assert embed.spec[0] == "population" and "fsdp" in jax.tree.leaves(tuple(embed.spec[1:]))


def test_eight_members_on_a_population_axis_of_eight_equal_one_device():
    """8 members, one per device (mesh.population = 8), against the vmapped population of
    the same 8 on one device: each block's member is updated alone (a vmap of size 1) where
    the one device's vmapped matmuls sum the 8 in another order; the same bounds as above
    (Adam magnifies a reordered near-cancelling gradient, measured up to ~2e-5)."""
    split = sharding.make_mesh((1, 1, 1), jax.devices()[:8], population=8)
    got = _members_update(split, n=8)
    one = _members_update(sharding.make_mesh((1, 1, 1), jax.devices()[:1]), n=8)
    weights, metrics = _apart(got, one)
    print("population 8 against one device:", weights, metrics)
    assert weights < 1e-4 and metrics < 1e-5
    state_sh = jax.tree.map(lambda x: x.sharding, got[2][0].state)
    assert stacked(state_sh).params["embed"].get_value().spec[0] == "population"
