"""One update for a population's members: their learners' states stacked on a leading [N]
axis and one vmapped program (`train_step.make_update_fn(members=)`) in place of N updates.

    MemberUpdates(learners).update(experiences, next_keys) -> [metrics per optimizer step]
                                                             for each member

Each member keeps its own minibatch order (its own RNG stream, `Learner.update`'s), its own
knob values (`frozen['knobs']`, stacked) and, after the update, its own state: the result
is member i's `Learner.update` up to the order of floating-point reductions (a vmapped matmul
may sum in another order). The learners share one structure (a population's members:
run/population/driver.py); packed rows and a learned critic are not batched (refused).

On a mesh with a population axis (`mesh.population = P`, core/sharding.py) the stacked
state, minibatch and knobs [N, ...] are placed with their member axis on it (`stacked`):
each block of devices updates N / P members, with their rows and weights split inside it as
a member's own. Each member's own state stays replicated over that axis (what its other
programs read), so the stacking and unstacking are reshards onto and off it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.learn.learner import Learner, minibatch_order
from jaxrl_frontier.rl.learn.train_step import stacked


def check_member_blocks(blocks: int, members: int) -> None:
    """A population axis of `blocks` blocks of devices holds whole members: N / P each."""
    if members % blocks:
        raise ConfigError(
            f"config key 'mesh.population' = {blocks} must divide the population's {members} "
            "members (population.size)"
        )


class MemberUpdates:
    """The vmapped update of `learners` (module docstring)."""

    def __init__(self, learners: Sequence[Learner]):
        first = learners[0]
        r2 = first.options.routing_replay == "first_update"
        if first.pack is not None or first.critic is not None or r2:
            what = {True: "model.moe.routing_replay = 'first_update'"}.get(r2) or (
                "train.pack_tokens" if first.pack is not None else "critic"
            )
            raise ConfigError(
                f"config key 'population.batched_update': the members' update is not batched "
                f"with {what} yet: set population.batched_update (and population.lora) = False"
            )
        axis = sharding.population_axis(first.mesh)
        if axis:
            check_member_blocks(first.mesh.shape[axis], len(learners))
        self.learners = list(learners)
        self._programs: dict[tuple[str, ...], Callable] = {}

    def _program(self, keys: tuple[str, ...]) -> Callable:
        """The vmapped update for a batch with these keys (built once per key set)."""
        if keys not in self._programs:
            self._programs[keys] = self.learners[0].update_program(keys, members={"knobs": 0})
        return self._programs[keys]

    def _stacked_state(self):
        """The members' train states and frozen inputs (their knobs stacked; the rest, a
        LoRA base or a teacher, every member's one array, passed once)."""
        learners, first = self.learners, self.learners[0]
        state = _stack(
            [lr.state for lr in learners], jax.tree.map(lambda x: x.sharding, first.state)
        )
        frozen = None
        if first.frozen is not None:
            frozen = dict(first.frozen)
            if "knobs" in frozen:
                knobs = [lr.frozen["knobs"] for lr in learners]
                frozen["knobs"] = _stack(knobs, jax.tree.map(lambda x: x.sharding, knobs[0]))
        return state, frozen

    def _batches(self, experiences: Sequence[Experience]) -> tuple[list[dict], tuple[str, ...]]:
        """Each member's update batch and the batch's keys (one program per key set)."""
        batches = [e.update_batch() for e in experiences]
        return batches, tuple(sorted(batches[0]))

    def _minibatch(self, batches: list[dict], keys: tuple[str, ...], rows: list) -> dict:
        """Member i's rows `rows[i]` of its batch, stacked [N, ...] on the member axis."""
        first = self.learners[0]
        select = first.programs(keys)[0]
        batch_sh = {k: sharding.batch_sharding(first.mesh, 2) for k in keys}
        return _stack([select(b, r) for b, r in zip(batches, rows, strict=True)], batch_sh)

    def lowered(self, experiences: Sequence[Experience]) -> jax.stages.Lowered:
        """The vmapped update of every member's first minibatch, lowered (not run): its
        `.compile().memory_analysis()` shows what the program holds per device."""
        batches, keys = self._batches(experiences)
        order = jnp.arange(self.learners[0].minibatch_rows)
        mb = self._minibatch(batches, keys, [order] * len(batches))
        state, frozen = self._stacked_state()
        args = (state, mb) if frozen is None else (state, mb, frozen)
        return self._program(keys).lower(*args)

    def update(
        self, experiences: Sequence[Experience], next_keys: Sequence[Callable[[], jax.Array]]
    ) -> list[list[dict]]:
        """Epochs x minibatches of one update of every member (each its own Experience and
        key stream); each member's metrics, as `Learner.update` returns them."""
        learners, first = self.learners, self.learners[0]
        batches, keys = self._batches(experiences)
        update = self._program(keys)
        # every epoch's order first: each key drawn moves the member's RNG in its state, which
        # is stacked next (the update never reads the RNG, so the draws' order is the same)
        orders = [
            [minibatch_order(k(), first.rows, first.update_groups) for k in next_keys]
            for _ in range(first.epochs)
        ]
        state, frozen = self._stacked_state()
        metrics: list[list[dict]] = [[] for _ in learners]
        rows = first.minibatch_rows
        for epoch in orders:
            for j in range(first.minibatches):
                mb = self._minibatch(batches, keys, [o[j * rows : (j + 1) * rows] for o in epoch])
                if frozen is None:
                    state, m = update(state, mb)
                else:
                    state, m = update(state, mb, frozen)
                for i in range(len(learners)):
                    metrics[i].append(jax.tree.map(lambda x, i=i: x[i], m))
        for i, lr in enumerate(learners):
            own = jax.tree.map(lambda x, i=i: x[i], state)
            own = jax.device_put(own, jax.tree.map(lambda x: x.sharding, lr.state))
            lr.state = own.replace(step=own.step + 1)
        return metrics


def _stack(trees: list, shardings):
    """The trees stacked on a new leading axis [N, ...], placed by `shardings` (a member's)
    with the member axis on the mesh's population axis (replicated without one: `stacked`)."""
    return jax.device_put(jax.tree.map(lambda *xs: jnp.stack(xs), *trees), stacked(shardings))
