"""A population's members in one update (rl/learn/members.py), on stand-in learners whose
"update" adds up the minibatch it is given: each member's rows, knobs and state stacked on
a leading member axis, each member's own minibatch order from its own key stream, each
member's metrics and state taken back (its step advanced); and the layouts not batched.
(The vmapped update against each member's own through a run: tests/run/test_population.py.)"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.rl.learn.learner import minibatch_order
from jaxrl_frontier.rl.learn.members import MemberUpdates
from jaxrl_frontier.rl.learn.train_step import TrainState

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
        f"{named} yet: set population.batched_update = False"
    )
