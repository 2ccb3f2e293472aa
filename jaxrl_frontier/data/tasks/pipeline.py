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

from jaxrl_frontier.data.tasks.base import Example, Task, check_split

# One background thread with a short queue: examples are cheap Python, and a deep prefetch
# only wastes CPU that rollouts need. Restored state is exact regardless of prefetch.
READ_OPTIONS = grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)


class LoadExample:
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
    ds = ds.map(LoadExample(task, split))
    # drop_remainder is moot on an infinite stream; batches simply run across epoch boundaries.
    ds = ds.batch(batch_size, drop_remainder=True, batch_fn=collate)
    return iter(ds.to_iter_dataset(READ_OPTIONS))


def eval_examples(task: Task, n: int, seed: int = 0) -> list[Example]:
    """A fixed list of `n` distinct held-out examples (from the eval split), with prompts.

    Draws eval indices in a seeded order and skips repeated prompts (synthetic tasks sample
    instances with replacement), so the list is a set of distinct problems. Raises if the
    eval split holds fewer than `n` distinct prompts.
    """
    size = task.num_examples("eval")
    if n < 1:
        raise ValueError(f"eval_examples: n must be >= 1, got {n}")
    load = LoadExample(task, "eval")
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


# A file-backed split or one up to this size is checked whole; a larger one (a synthetic
# task's instance space, whose prompt lengths its settings bound) on its first examples:
# 10,000 arithmetic examples take about a second to draw.
FULL_CHECK_MAX = 2_000
SAMPLE_CHECK = 512


class TruncatedPrompts:
    """A task whose prompts are cut to `max_len` tokens (BOS included), keeping their end: the
    end of a prompt holds the question and the cue the completion continues."""

    def __init__(self, task: Task, tokenizer, max_len: int):
        self._task, self._tokenizer, self._max_len = task, tokenizer, max_len

    def prompt(self, example: Example) -> str:
        text = self._task.prompt(example)
        ids = self._tokenizer.encode(text)
        if len(ids) + 1 <= self._max_len:
            return text
        return self._tokenizer.decode(ids[len(ids) - (self._max_len - 1) :], skip_special=False)

    def __getattr__(self, name):  # everything else is the task's
        return getattr(self._task, name)

    def __repr__(self) -> str:
        return f"TruncatedPrompts({self._task!r}, max_len={self._max_len})"


def check_prompt_lengths(task: Task, tokenizer, max_len: int, *, truncate: bool = False) -> Task:
    """Every prompt of every split fits `max_len` tokens (with BOS), checked before training.

    A file-backed split (examples with a `line`) or any split of at most FULL_CHECK_MAX
    examples is checked whole; a larger one on its first SAMPLE_CHECK examples. A prompt too
    long is a ConfigError (a ValueError) naming the file and line (or the split and index) and the key
    `data.max_prompt_len`; with `truncate` the task is returned wrapped in TruncatedPrompts.
    """
    from jaxrl_frontier.core.errors import ConfigError

    for split in ("train", "eval"):
        n = task.num_examples(split)
        first = task.example(split, 0) if n else {}
        whole = n <= FULL_CHECK_MAX or "line" in first
        for i in range(n if whole else min(n, SAMPLE_CHECK)):
            ex = task.example(split, i)
            try:
                length = len(tokenizer.encode(task.prompt(ex))) + 1  # + BOS
            except ValueError as e:  # a character the tokenizer cannot encode
                where = _where(task, split, ex, i)
                raise ConfigError(f"{where}: prompt cannot be encoded: {e}") from None
            if length <= max_len:
                continue
            if truncate:
                return TruncatedPrompts(task, tokenizer, max_len)
            raise ConfigError(
                f"{_where(task, split, ex, i)}: prompt is {length} tokens (with BOS), longer "
                f"than config key 'data.max_prompt_len' = {max_len}; raise it, shorten the "
                "prompt, or set data.truncate_prompts=True to keep the last tokens"
            )
    return task


def _where(task, split: str, example: Example, index: int) -> str:
    files = getattr(task, "_files", None)
    if "line" in example and files:
        return f"{files[split]}:{example['line']}"
    return f"task {getattr(task, 'name', type(task).__name__)!r} {split} example {index}"
