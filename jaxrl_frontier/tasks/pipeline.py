"""Prompt batches from a task with grain: sharded, shuffled, infinite, checkpointable.

    range(num_examples(split))            # example indices
      [process_index::process_count]      # shard FIRST: each process owns a fixed disjoint slice
      .seed(seed).shuffle()               # same permutation logic on every process
      .repeat(None)                       # infinite; reshuffled (reseeded) every epoch
      .map(index -> example + prompt)
      .batch(batch_size, drop_remainder)  # per-process batch; global batch = B * process_count
      .to_iter_dataset()

Sharding before shuffling makes each process's stream independent of the others' progress and
keeps the shards disjoint whatever the seed. The iterator's `get_state()` is a small dict
(saved with the checkpoint); `set_state()` on a fresh iterator from the same arguments resumes
with exactly the batches the original would have produced next.

A batch is a dict of lists, one entry per example key (`prompt`, `index`, and the task's
fields such as `answer`, `numbers`, `target`), except `index`, an int64 array [B].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from jaxrl_frontier.tasks.base import Example, Task, check_split

# One background thread with a short queue: examples are cheap Python, and a deep prefetch
# only wastes CPU that rollouts need. Restored state is exact regardless of prefetch.
_READ_OPTIONS = grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)


class _LoadExample:
    """index -> example with its prompt (a class, not a lambda: picklable for grain workers)."""

    def __init__(self, task: Task, split: str):
        self.task, self.split = task, split

    def __call__(self, index: int) -> Example:
        ex = self.task.example(self.split, int(index))
        ex["prompt"] = self.task.prompt(ex)
        return ex


def collate(examples: Sequence[Example]) -> dict[str, Any]:
    """List of example dicts -> dict of lists (`index` as an int64 array [B])."""
    batch: dict[str, Any] = {k: [ex[k] for ex in examples] for k in examples[0]}
    batch["index"] = np.asarray(batch["index"], dtype=np.int64)
    return batch


def unbatch(batch: Mapping[str, Any]) -> list[Example]:
    """Dict of lists (a pipeline batch) -> list of example dicts, in row order."""
    n = len(batch["index"])
    return [{k: (int(v[i]) if k == "index" else v[i]) for k, v in batch.items()} for i in range(n)]


def _process_layout(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax  # deferred: data tests need no backend unless they ask for the default

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(
            f"make_prompt_iterator: need 0 <= process_index < process_count, "
            f"got process_index={process_index}, process_count={process_count}"
        )
    return process_index, process_count


def make_prompt_iterator(
    task: Task,
    *,
    split: str,
    batch_size: int,
    seed: int,
    process_index: int | None = None,
    process_count: int | None = None,
) -> grain.DatasetIterator:
    """An infinite iterator of prompt batches (see the module docstring for the layout).

    Args:
      task: any `Task`.
      split: "train" or "eval".
      batch_size: examples per batch on THIS process.
      seed: shuffle seed; the same (task, split, seed, layout) gives the same batches.
      process_index, process_count: the data-parallel layout; default jax.process_index() and
        jax.process_count().
    Returns: a grain iterator with `get_state()` / `set_state(state)`.
    """
    check_split(split)
    if batch_size < 1:
        raise ValueError(f"make_prompt_iterator: batch_size must be >= 1, got {batch_size}")
    pi, pc = _process_layout(process_index, process_count)
    n = task.num_examples(split)
    if n < pc:
        raise ValueError(
            f"make_prompt_iterator: {task!r} has {n} {split} examples, fewer than the "
            f"{pc} processes that must each get a shard"
        )
    ds = grain.MapDataset.range(n)[pi::pc]
    ds = ds.seed(seed).shuffle().repeat(None)
    ds = ds.map(_LoadExample(task, split))
    # drop_remainder is moot on an infinite stream; batches simply run across epoch boundaries.
    ds = ds.batch(batch_size, drop_remainder=True, batch_fn=collate)
    return iter(ds.to_iter_dataset(_READ_OPTIONS))


def eval_examples(task: Task, n: int, seed: int = 0) -> list[Example]:
    """A fixed list of `n` distinct held-out examples (from the eval split), with prompts.

    Draws eval indices in a seeded order and skips repeated prompts (synthetic tasks sample
    instances with replacement), so the list is a set of distinct problems. Raises if the
    eval split holds fewer than `n` distinct prompts.
    """
    size = task.num_examples("eval")
    if n < 1:
        raise ValueError(f"eval_examples: n must be >= 1, got {n}")
    load = _LoadExample(task, "eval")
    order = grain.MapDataset.range(size).seed(seed).shuffle()  # lazy permutation, O(1) memory
    out: list[Example] = []
    seen: set[str] = set()
    for k in range(size):
        ex = load(order[k])
        if ex["prompt"] not in seen:
            seen.add(ex["prompt"])
            out.append(ex)
            if len(out) == n:
                return out
    raise ValueError(
        f"eval_examples: asked for {n} distinct eval examples, {task!r} has only {len(out)}"
    )
