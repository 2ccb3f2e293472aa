"""The SFT step the loop runs (run/steps.py), on a stand-in update and prompt source: one
update per step on the source's next batch, its scalars under train/, the skipped-update
guard of train.max_skipped_updates, the source's state in a checkpoint and back; and the
`mode` registry that picks a step."""

import contextlib
import types

import pytest

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.run import rl_step, steps  # noqa: F401  (rl_step: registers "rl")
from jaxrl_frontier.run.config import base_config, resolve
from jaxrl_frontier.train.guards import TrainingFault


class Source:
    """Batches 0, 1, 2, ... ; its state is the next batch's number."""

    def __init__(self):
        self.next = 0

    def next_batch(self):
        self.next += 1
        return [self.next - 1]

    def state(self):
        return {"next": self.next}

    def restore(self, state):
        self.next = state["next"]


def _step(skip=lambda batch: False, max_skipped=2):
    c = resolve(base_config())
    c.mode = "sft"
    c.train.max_skipped_updates = max_skipped
    said, seen = [], []

    def update(state, examples):  # total + the batch's number; nll = 1 / (total + 1)
        seen.append(examples)
        skipped = skip(examples[0])
        total = state.total if skipped else state.total + examples[0]
        new = types.SimpleNamespace(step=state.step + 1, total=total)
        return new, {"nll": 1.0 / (total + 1), "update_skipped": skipped}

    dog = types.SimpleNamespace(phase=lambda name: contextlib.nullcontext())
    step = steps.SFTRunStep(
        c,
        update,
        types.SimpleNamespace(step=0, total=0),
        Source(),
        lambda: "2 steps",
        guard=steps.run_guard(c, say=said.append, scorer=None),
        say=said.append,
        watchdog=dog,
    )
    return step, said, seen


def test_modes_name_their_steps():
    assert steps.STEPS.names() == ["rl", "sft"]
    assert steps.STEPS.get("sft") is steps.sft_step
    with pytest.raises(ConfigError, match="config key 'mode': unknown training step 'sfd'"):
        steps.STEPS.get("sfd")


def test_each_step_updates_on_the_next_batch_and_reports_its_scalars():
    step, said, seen = _step()
    assert (step.tag, step.shown, step.evaluates_at_start) == ("sft", {"nll": "train/nll"}, False)
    step.begin(0, 2)
    assert said == ["[sft] 2 steps"]
    step.begin(5, 2)  # a resumed run says nothing
    assert said == ["[sft] 2 steps"]
    scalars = [step()(0.1) for _ in range(3)]
    assert seen == [[0], [1], [2]] and (step.state.step, step.state.total) == (3, 0 + 1 + 2)
    assert scalars == [  # every metric of the update, prefixed, as floats
        {"train/nll": nll, "train/update_skipped": 0.0} for nll in (1.0, 0.5, 0.25)
    ]
    assert step.hooks() == [] and step.checkpoint_meta() == {"data": {"next": 3}}
    with step.paused():  # nothing is produced in the background
        pass
    step.close()


def test_a_checkpoint_restores_the_sources_place():
    step, _, seen = _step()
    step()
    meta = step.checkpoint_meta()
    fresh, _, fresh_seen = _step()
    fresh.restore(meta)
    fresh()
    assert seen == [[0]] and fresh_seen == [[1]]
    fresh.restore({"data": None})  # a checkpoint without the source's state: left as is
    fresh()
    assert fresh_seen == [[1], [2]]


def test_skipped_updates_warn_and_too_many_in_a_row_stop_the_run():
    step, said, _ = _step(skip=lambda batch: batch in (1, 2), max_skipped=2)
    step()
    step()  # batch 1 skipped: a warning
    assert len(said) == 1 and said[0].startswith("warning: step 2: 1 of 1 updates skipped")
    with pytest.raises(TrainingFault, match=r"step 3: 2 updates in a row .*max_skipped_updates=2"):
        step()
