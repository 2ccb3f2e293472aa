"""rl/batch_supply.py on a scripted step: which prompts and weights each step's batch comes
from (produced now, ahead by the weights of the step that started it, begun by partial
rollouts, drawn for a population's sampling), and what a checkpoint holds of it (the prompt
source's place before a batch in flight, the partial rows) and a fresh supply resumes."""

import jax
import pytest

from jaxrl_frontier.rl.batch_supply import BatchSupply, SupplyOptions
from jaxrl_frontier.rl.produce.production import Production


def seed(key) -> int:
    """n of jax.random.key(n)."""
    return int(jax.random.key_data(key)[-1])


class CountingSource:
    """Batch i is [2i, 2i + 1]; its state is the next batch's index."""

    def __init__(self):
        self.i = 0

    def next_batch(self):
        self.i += 1
        return [2 * self.i - 2, 2 * self.i - 1]

    def state(self):
        return {"i": self.i}

    def restore(self, state):
        self.i = state["i"]


class EchoProducer:
    """(examples, the weights' version) as the Experience; info as a producer reports it."""

    local = False

    def produce(self, examples, weights, key, **options):
        info = {"results": [], "policy_version": options["version"], "key": seed(key)}
        return (tuple(examples), weights["policy"]), info


class Rows:
    """The rollout sampler's partial rows, as a checkpoint holds them."""

    def __init__(self, rows=()):
        self.rows = list(rows)

    def state(self):
        return {"rows": self.rows}

    def restore(self, state):
        self.rows = list(state["rows"])


class ScriptedStep:
    """The `Producing` side: weights 'w@v' at version v, keys key(0), key(1), ..."""

    def __init__(self):
        self.source, self.version, self.keys, self.begun = CountingSource(), 0, 0, []
        self.copies = []

    def production(self, copy=False, step=None):
        self.copies.append(copy)
        weights = {"policy": f"w@{self.version}", "reference": None, "teacher": None}
        return Production(EchoProducer(), weights, self.version, {}, self.source)

    def sample_key(self):
        self.keys += 1
        return jax.random.key(self.keys - 1)

    def begin_next(self, examples, key):
        self.begun.append((examples, seed(key)))


def supply_of(**options):
    step = ScriptedStep()
    return BatchSupply(SupplyOptions(**options), step, Rows()), step


def test_without_options_each_batch_is_produced_now_by_the_current_weights():
    supply, step = supply_of(steps=3)
    (exp, info) = supply.take(1, 0)
    assert exp == ((0, 1), "w@0") and info["key"] == 0
    supply.start_ahead(1)  # max_staleness 0: nothing ahead
    step.version = 1
    assert supply.take(2, 1)[0] == ((2, 3), "w@1")
    assert supply.state() == {"data": {"i": 2}}
    supply.close()


def test_a_batch_ahead_is_sampled_by_the_weights_of_the_step_that_started_it():
    supply, step = supply_of(max_staleness=1, steps=3, checkpoint_every=10)
    assert supply.take(1, 0)[0] == ((0, 1), "w@0")
    supply.start_ahead(1)  # batch 2's prompts drawn now, sampled by a copy of w@0
    assert supply.ahead.in_flight == 1 and step.copies[-1] is True
    # a checkpoint that drains: the source's state from before the batch in flight
    assert supply.state() == {"data": {"i": 1}, "stale": {"dropped": 0, "resampled": 0}}
    step.version = 1
    exp, info = supply.take(2, 1)
    assert exp == ((2, 3), "w@0") and info["policy_version"] == 0  # lag 1 = k: kept
    supply.start_ahead(2)  # step 3 is the last: it would be taken at step 3, so room
    assert supply.ahead.in_flight == 1
    supply.close()


def test_a_stale_batch_is_sampled_again_when_asked():
    supply, step = supply_of(max_staleness=1, steps=4, checkpoint_every=10, resample_stale=True)
    supply.take(1, 0)
    supply.start_ahead(1)
    step.version = 3  # the learner moved on by 3: lag 3 > k
    exp, _ = supply.take(2, 3)
    assert exp == ((2, 3), "w@3") and (supply.ahead.dropped, supply.ahead.resampled) == (1, 1)
    supply.close()


def test_partial_rollouts_begin_the_next_batch_and_a_checkpoint_holds_it():
    supply, step = supply_of(partial=True, steps=3, boundaries=frozenset({2}))
    assert supply.take(1, 0)[0] == ((0, 1), "w@0")
    assert step.begun == [([2, 3], 1)]  # the next batch and its key, begun in this decode
    supply.rows.rows = ["row of 2", "row of 3"]
    meta = supply.state()
    assert (
        meta["partial"]["examples"] == [2, 3] and meta["partial"]["rows"]["rows"][0] == "row of 2"
    )

    fresh, fresh_step = supply_of(partial=True, steps=3, boundaries=frozenset({2}))
    fresh.restore(meta, mesh=None)  # a resumed run: the begun batch, its key and rows
    assert fresh.next_batch[0] == [2, 3] and seed(fresh.next_batch[1]) == 1
    assert fresh.rows.rows == ["row of 2", "row of 3"]
    # step 2 ends a stage: its batch is the begun one, and nothing is begun past it
    exp, _ = supply.take(2, 0)
    assert exp == ((2, 3), "w@0") and step.begun == [([2, 3], 1)]
    supply.close()
    fresh.close()


def test_a_drawn_batch_is_the_next_one_taken():
    supply, step = supply_of(steps=3)
    examples, key = supply.draw()  # a population member's request
    assert (examples, seed(key)) == ([0, 1], 0)
    exp, info = supply.take(1, 0)
    assert exp == ((0, 1), "w@0") and info["key"] == 0 and supply.drawn is None
    assert supply.take(2, 0)[0] == ((2, 3), "w@0")  # then the next prompts again
    supply.close()


@pytest.mark.parametrize("keeps", [False, True])
def test_a_checkpoint_saves_batches_in_flight_whole_only_where_every_part_can(keeps):
    supply, step = supply_of(
        max_staleness=1, steps=4, checkpoint_every=1, keeps_rows_in_flight=keeps
    )
    supply.take(1, 0)
    # step 1 ends with a checkpoint, before step 2 takes the batch: room only if it saves
    # the batch whole
    supply.start_ahead(1)
    assert supply.ahead.in_flight == int(keeps) and supply.keeps_in_flight == keeps
    supply.close()
