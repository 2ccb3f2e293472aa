"""Prompt sources: which prompts an RL (or SFT) step trains on.

A `PromptSource` is the first stage of a step:

    next_batch() -> this process's examples          (list of example dicts, prompt-major)
    observe(results)                                  per-prompt results after scoring
    state() / restore(state)                          saved with every checkpoint (JSON)

The loop calls `next_batch()`, hands the examples to the `RolloutProducer`, and passes the
Experience's per-prompt results back through `observe`, so a source that schedules by
difficulty (dynamic sampling, ADS, replay) sees how its prompts went.

Sources are chosen by `data.source` from `SOURCES` (name -> builder). Every process runs the
same global stream and keeps its own slice of each global batch: the same run sees the same
prompts on one host or many, and a group never spans processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import numpy as np

from jaxrl_frontier.core.capabilities import ALL, Capabilities
from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.data.defaults import (
    AdsSection,
    DataSspoSection,
    DynamicSection,
    EnvOptions,
    ZppoSection,
)
from jaxrl_frontier.data.tasks.base import Example, Task, check_split
from jaxrl_frontier.data.tasks.pipeline import READ_OPTIONS, LoadExample
from jaxrl_frontier.rl.experience import PromptResult, ScoredRows
from jaxrl_frontier.rl.methods.step_credit import StateScores


class PromptSource:
    """The prompt-scheduling stage (see the module docstring). A source subclasses this and
    implements the first four methods; the optional capabilities below default to none, and
    the producer calls them on every source.
    """

    def next_batch(self) -> list[Example]:
        raise NotImplementedError

    def observe(self, results: Sequence[PromptResult]) -> None:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    # what the runs it serves may need of it (core/capabilities.py); a source may schedule
    # by how its prompts went, so by default not beside a free-running producer
    capabilities: Capabilities = Capabilities.all_but(
        free_running="it reads the results as it draws",
        environment="it draws task prompts, not an environment's episodes",
    )

    # ---- optional capabilities

    # 3SPO: the visited-state scores the environment producer's step credit reads
    state_scores: StateScores | None = None
    # whether `resize` can change the prompt batch mid-run (a stage of the run, run/config/stages.py)
    resizable: bool = False
    # whether it reads the run's verified teacher answers (`use_teacher`): the run then builds
    # them when it has a teacher (ZPPO's BCQ references)
    wants_teacher_answers: bool = False

    def resize(self, batch_size: int) -> None:
        """Draw batches of `batch_size` prompts from the next prompt on (`resizable` only)."""
        raise NotImplementedError(f"{type(self).__name__} cannot change its prompt batch")

    def metrics(self) -> dict[str, float]:
        """Host scalars logged at every step (e.g. ADS's cluster probabilities)."""
        return {}

    def use_teacher(self, answers: Callable[[list[Example]], list[str | None]]) -> None:
        """Handed the run's verified teacher answers when it has a teacher (ZPPO's BCQ
        references); ignored by default."""
        del answers

    def select(
        self, draw: ScoredRows, more: Callable[[int], ScoredRows]
    ) -> tuple[ScoredRows, dict[str, float]]:
        """The groups the step trains on: (rows of exactly the draw's prompt count, host
        metrics). `draw` holds the scored rows of `next_batch()`'s prompts; `more(i)` draws
        the i-th extra batch (i = 1, 2, ...) of fresh prompts from this source. Every process
        must call `more` the same number of times (the sampler runs on the global batch), so
        decide on global counts. Default: the draw as it is (dynamic sampling filters)."""
        del more
        return draw, {}


SOURCES = Registry("prompt source", key="data.source", default_part=PromptSource)


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """What a prompt source's builder reads, built by `run/config/sections.py`: `data.source`, the
    run's seed, each source's own block (`data.dynamic`, `data.ads`, `data.sspo`,
    `data.zppo`), the reward weights the advantages use (`objective.reward_weights`, with
    the rollout shapers' components `shaped`) and, in an environment run, the `env` section
    (`environment`)."""

    name: str = "uniform"
    seed: int = 0
    dynamic: DynamicSection = dataclasses.field(default_factory=DynamicSection)
    ads: AdsSection = dataclasses.field(default_factory=AdsSection)
    sspo: DataSspoSection = dataclasses.field(default_factory=DataSspoSection)
    zppo: ZppoSection = dataclasses.field(default_factory=ZppoSection)
    reward_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    shaped: tuple[str, ...] = ()
    environment: EnvOptions | None = None


class LocalSlice:
    """A global batch of indices -> this process's examples (picklable for grain)."""

    def __init__(self, task: Task, split: str, process_index: int, process_count: int):
        self.load = LoadExample(task, split)
        self.process_index, self.process_count = process_index, process_count

    def __call__(self, indices: np.ndarray) -> list[Example]:
        per = len(indices) // self.process_count
        mine = indices[self.process_index * per : (self.process_index + 1) * per]
        return [self.load(i) for i in mine]


class UniformSource(PromptSource):
    """Uniform prompts: a seeded shuffle of the split, reshuffled every epoch (grain).

    range(n).seed(seed).shuffle().repeat()  ->  global batches of `batch_size` indices  ->
    this process's slice [i B / N, (i + 1) B / N), loaded. The iterator state is exact: a
    restored source yields the batches the original would have yielded next. `resize`
    batches the rest of the same stream by another size (the stream is cut at the next
    prompt, `offset` prompts in; the state then records the offset and the size).
    """

    resizable = True
    capabilities = ALL  # it never reads the results

    def __init__(
        self,
        task: Task,
        *,
        batch_size: int,
        seed: int,
        split: str = "train",
        process_index: int = 0,
        process_count: int = 1,
    ):
        check_split(split)
        self._stream = grain.MapDataset.range(task.num_examples(split)).seed(seed).shuffle()
        self._stream = self._stream.repeat(None)  # prompt indices, reshuffled every epoch
        self._local = LocalSlice(task, split, process_index, process_count)
        self._first = batch_size  # the batching the state of a never-resized source implies
        self._batching(batch_size, 0)

    def _batching(self, batch_size: int, offset: int) -> None:
        """Batches of `batch_size` from the stream's prompt `offset` on."""
        count = self._local.process_count
        if batch_size < 1 or batch_size % count:
            raise ValueError(
                f"prompt batch {batch_size} must be a positive multiple of the "
                f"{count} processes (each owns whole prompts)"
            )
        self.batch_size, self._offset = batch_size, offset
        ds = self._stream[offset:] if offset else self._stream
        ds = ds.batch(batch_size, drop_remainder=True, batch_fn=np.asarray).map(self._local)
        self._it = iter(ds.to_iter_dataset(READ_OPTIONS))

    def next_batch(self) -> list[Example]:
        return next(self._it)

    def observe(self, results: Sequence[PromptResult]) -> None:
        del results  # uniform: how prompts went does not change what comes next

    def resize(self, batch_size: int) -> None:
        if batch_size != self.batch_size:  # drawn so far: whole batches since the offset
            drawn = self._offset + self._it.get_state()["next_index"] * self.batch_size
            self._batching(batch_size, drawn)

    def state(self) -> dict[str, Any]:
        out = {"iterator": _jsonable_state(self._it.get_state())}
        if (self.batch_size, self._offset) != (self._first, 0):  # resized
            out.update(batch_size=self.batch_size, offset=self._offset)
        return out

    def restore(self, state: dict[str, Any]) -> None:
        batching = (state.get("batch_size", self._first), state.get("offset", 0))
        if batching != (self.batch_size, self._offset):
            self._batching(*batching)
        self._it.set_state(_from_jsonable_state(state["iterator"]))


@SOURCES.register("uniform", part=UniformSource)
def uniform(
    task: Task, options: SourceOptions, *, batch_size: int, process_index: int, process_count: int
):
    """`data.source = 'uniform'`: every prompt equally often (the default)."""
    return UniformSource(
        task,
        batch_size=batch_size,
        seed=options.seed,
        process_index=process_index,
        process_count=process_count,
    )


def make_source(
    task: Task,
    options: SourceOptions,
    *,
    batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
) -> PromptSource:
    """The source `options.name` (`data.source`) for global batches of `batch_size`."""
    builder = SOURCES.get(options.name)
    return builder(
        task,
        options,
        batch_size=batch_size,
        process_index=process_index,
        process_count=process_count,
    )


def _jsonable_state(state):
    """grain states may hold bytes; the checkpoint's metadata is JSON."""
    if isinstance(state, bytes):
        return {"__bytes__": state.decode("latin-1")}
    return state


def _from_jsonable_state(state):
    if isinstance(state, dict) and "__bytes__" in state:
        return state["__bytes__"].encode("latin-1")
    return state
