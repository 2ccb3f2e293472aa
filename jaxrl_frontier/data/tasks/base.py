"""The task contract, the task registry, and the deterministic train/eval split.

A task turns an index into an example (a plain dict), an example into a prompt and a
demonstration, and a (example, completion text) pair into a NAMED reward vector. Every task
returns the same keys, `REWARD_NAMES`, so configs can weight components by name and
multi-reward estimators (GDPO) see a fixed K:

    correctness  1.0 if the completion's answer is right, else 0.0
    format       1.0 if the completion is well formed for the task (it parses), else 0.0
    length       1 - min(len(completion), max_completion_chars) / max_completion_chars, in [0, 1];
                 characters of the decoded completion (tokenizer-independent), a small shaping
                 term that prefers short answers; weight it 0 to ignore it

Examples are dicts of plain Python values (ints, strings, lists of ints) holding at least
`index`; the data pipeline adds `prompt`. They cross process boundaries (grain workers, a
future process-pool reward scorer), so nothing in them may be a closure or a device array.

Splits. Synthetic tasks draw examples with replacement from a large instance space; an instance
belongs to `eval` iff a stable hash (blake2b) of its canonical key falls below
`eval_fraction`, otherwise to `train`. `example(split, i)` draws with a seeded RNG until the
drawn instance hashes into `split` (rejection sampling). Because the hash ignores the seed,
`train` and `eval` are disjoint for every seed, not just within one run.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from jaxrl_frontier.core.registry import Registry

TASKS = Registry("task", key="task.name")

REWARD_NAMES: tuple[str, ...] = ("correctness", "format", "length")
SPLITS: tuple[str, ...] = ("train", "eval")

Example = dict[str, Any]


def read_jsonl(path: str | Path, task: str) -> Iterator[tuple[int, str, dict]]:
    """(line number, 'path:line', the line's object) for each non-blank line of a JSONL file (gzip if it
    ends in .gz), for the reader of task `task` to check its fields. A missing file is a
    FileNotFoundError naming the task; a line that is not JSON, or not a JSON object, a
    ValueError naming `path:line`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{task}: no such file {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, where, obj


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    return split


def hash_unit(key: str) -> float:
    """A stable uniform number in [0, 1) from a string (same on every machine and run)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def length_score(completion: str, max_chars: int) -> float:
    """1 - min(len, max_chars) / max_chars: 1.0 for an empty completion, 0.0 at max_chars."""
    return 1.0 - min(len(completion), max_chars) / max_chars


def reward_vector(correct: bool, well_formed: bool, completion: str, max_chars: int):
    """The standard reward dict, keys in `REWARD_NAMES` order."""
    return {
        "correctness": float(correct),
        "format": float(well_formed),
        "length": length_score(completion, max_chars),
    }


class Task:
    """Base class of every task. Subclasses set `name` and implement the five methods.

    Contract:
      num_examples(split) -> int                 examples addressable in the split (an epoch)
      example(split, index) -> Example           deterministic in (task settings, split, index)
      prompt(example) -> str                     the text the policy continues
      demonstration(example) -> str              a target completion for SFT, without EOS
      reward(example, completion) -> dict        keys exactly `reward_names`, floats
    """

    name: ClassVar[str] = ""
    reward_names: ClassVar[tuple[str, ...]] = REWARD_NAMES
    # a method cluster_key(example) -> hashable groups prompts for the curriculum sources
    # (rl/sources/clustering.py); None: they fall back on the prompt's shape
    cluster_key: Any = None
    # how the held-out evaluation rolls this task's batches (`train/evaluation.py`
    # EVAL_BATCHES): 'completions' samples, decodes and scores each prompt's completions
    evaluation: ClassVar[str] = "completions"

    def num_examples(self, split: str) -> int:
        raise NotImplementedError

    def example(self, split: str, index: int) -> Example:
        raise NotImplementedError

    def prompt(self, example: Example) -> str:
        raise NotImplementedError

    def demonstration(self, example: Example) -> str:
        raise NotImplementedError

    def reward(self, example: Example, completion: str) -> dict[str, float]:
        raise NotImplementedError


class SyntheticTask(Task):
    """A task whose examples are generated from (seed, split, index) by `_generate(rng)`.

    Subclasses implement `_generate(rng: random.Random) -> Example` (without `index`) and
    `split_key(example) -> str`, the canonical form of the instance used for the split hash
    (e.g. sorted numbers + target, so a permuted countdown instance cannot leak across splits).

    Args:
      seed: which instances sit at which index (the data iterator's seed sets the order).
      train_size, eval_size: indices per split; an epoch of the train iterator is train_size.
      eval_fraction: share of the instance space that belongs to eval.
      max_completion_chars: the length reward's scale.
    """

    # Rejection sampling gives up after this many draws: an instance space too small to hold
    # an eval (or train) instance is a configuration error, not something to loop on forever.
    MAX_DRAWS: ClassVar[int] = 10_000

    def __init__(
        self,
        *,
        seed: int = 0,
        train_size: int = 1_000_000,
        eval_size: int = 10_000,
        eval_fraction: float = 0.1,
        max_completion_chars: int = 64,
    ):
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"{self.name}: eval_fraction must be in (0, 1), got {eval_fraction}")
        if train_size < 1 or eval_size < 1:
            raise ValueError(
                f"{self.name}: train_size and eval_size must be >= 1, got {train_size}, {eval_size}"
            )
        if max_completion_chars < 1:
            raise ValueError(
                f"{self.name}: max_completion_chars must be >= 1, got {max_completion_chars}"
            )
        self.seed = int(seed)
        self.sizes = {"train": int(train_size), "eval": int(eval_size)}
        self.eval_fraction = float(eval_fraction)
        self.max_completion_chars = int(max_completion_chars)

    def _generate(self, rng: random.Random) -> Example:
        raise NotImplementedError

    def split_key(self, example: Example) -> str:
        raise NotImplementedError

    def split_of(self, example: Example) -> str:
        """'eval' or 'train', from the instance alone (seed-independent)."""
        u = hash_unit(f"{self.name}|{self.split_key(example)}")
        return "eval" if u < self.eval_fraction else "train"

    def num_examples(self, split: str) -> int:
        return self.sizes[check_split(split)]

    def example(self, split: str, index: int) -> Example:
        check_split(split)
        index = int(index)
        if not 0 <= index < self.sizes[split]:
            raise IndexError(
                f"{self.name}: index {index} outside [0, {self.sizes[split]}) of {split}"
            )
        for draw in range(self.MAX_DRAWS):
            # str seeds are hashed with sha512 by `random`: stable across runs and machines,
            # unaffected by PYTHONHASHSEED.
            rng = random.Random(f"{self.name}|{self.seed}|{split}|{index}|{draw}")
            ex = self._generate(rng)
            if self.split_of(ex) == split:
                ex["index"] = index
                return ex
        raise RuntimeError(
            f"{self.name}: no {split} instance in {self.MAX_DRAWS} draws; the instance space is "
            f"too small for eval_fraction={self.eval_fraction} (widen the task settings)"
        )


def task_parameters(name: str) -> list[tuple[Any, inspect.Parameter]]:
    """(the `__init__`, a keyword parameter of it) over the task `name`'s classes, base class
    first (so a subclass's parameter comes after, and wins, where both have it)."""
    out = []
    for klass in reversed(TASKS.get(name).__mro__):
        if "__init__" in vars(klass) and klass is not object:
            for p in inspect.signature(klass.__init__).parameters.values():
                if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                    out.append((klass.__init__, p))
    return out


def task_defaults(name: str) -> dict[str, Any]:
    """The keyword defaults of the task `name` that are set (not None), over its classes'
    `__init__`s (a subclass's defaults win): the `task.kwargs` it starts from."""
    empty = inspect.Parameter.empty
    return {
        p.name: p.default
        for _, p in task_parameters(name)
        if p.default is not empty and p.default is not None
    }
