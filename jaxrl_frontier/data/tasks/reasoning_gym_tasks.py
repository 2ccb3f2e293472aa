"""`reasoning_gym`: procedurally generated reasoning problems from the reasoning-gym library
(Stojanovski et al., "Reasoning Gym: Reasoning Environments for Reinforcement Learning with
Verifiable Rewards", 2025), one dataset or a weighted mix, scored by the library's own checkers.

reasoning-gym is an optional dependency (`pip install 'jaxrl_frontier[models]'`): it is
imported when the task is built, never by `import jaxrl_frontier`.

Examples. `reasoning_gym.create_dataset(name, size=dataset_size, seed=s, **dataset_kwargs[name])`
builds a dataset whose item `dataset[k]` is a function of (seed, k) (nearly every generator
seeds `random.Random(seed + k)`; a few draw a pool of `size` items up front). Each (dataset,
split) has its own dataset object, seeded by a stable hash of (task seed, split, name), built
once and cached. `example(split, i)` picks the dataset from the weights with an RNG seeded by
(seed, split, i), then draws positions k with RNGs seeded by (seed, split, i, draw) until the
item's split hash agrees with `split` (as `SyntheticTask` does): an item is eval iff
blake2b("reasoning_gym|<dataset>|<question>") falls below `eval_fraction`. The hash sees only
the dataset's name and the question, so train and eval are disjoint whatever the seeds, and
an eval example costs about 1 / eval_fraction generated items (a train one 1 / (1 -
eval_fraction)). The dataset is chosen before the draws, so rejection does not skew the mix.

Cost: an item costs what its generator does. With basic_arithmetic's defaults most take about
0.1 ms, but about 2 in 10,000 divide by a product of four-digit terms, and the generator's
divisor search (a loop to the square root) then takes seconds. Measured on 2 CPU cores:
1,000 train examples 0.1 s, 1,000 eval examples 10 s (9 s of it two such items); with
dataset_kwargs={'basic_arithmetic': {'max_digits': 3}}, 0.07 s and 0.9 s.

Determinism: the same settings give the same examples in one process. In reasoning-gym 0.1.25
five generators iterate over sets of strings (isomorphic_strings, knight_swap,
polynomial_multiplication, ransom_note, word_ladder): their items also depend on the
interpreter's PYTHONHASHSEED; fix it (e.g. PYTHONHASHSEED=0) where runs must repeat them.

Prompt: the question, a blank line, and an instruction asking for the answer format:

  'tags'   <answer>...</answer>, worded as reasoning-gym's own "default" system prompt
           (`reasoning_gym.utils.SYSTEM_PROMPTS`); the answer is the last pair's content,
           stripped (as `reasoning_gym.utils.extract_answer` reads it)
  'boxed'  \\boxed{...} (the MATH convention, which math-tuned instruct models already write;
           `math_answer.last_boxed` reads it)

Rewards:
  correctness  `dataset.score_answer(answer, entry)`: reasoning-gym's checker for that
               dataset, a float in [0, 1] (some give partial credit, kept as is); 0.0 when the
               checker raises on the text (an unparsable answer is a wrong one, not a failure)
  format       1.0 iff the completion holds exactly one answer marker ('tags': one
               <answer>...</answer> pair; 'boxed': one balanced \\boxed{...}) with a
               non-empty answer inside
  length       as in every task

Fallback. Without a marked answer, correctness is 0 unless `fallback` says where else to look:
'last_number' scores the last number in the completion. Small instruct models (e.g.
SmolLM2-135M-Instruct) never write the tags at first, so a run that teaches them the format
has nothing to learn from but the format reward; with the fallback, a right number already
earns correctness while the format reward pulls toward the tags. Default 'none': only the
asked format counts.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import random
import re
from collections.abc import Mapping
from typing import Any

from jaxrl_frontier.data.tasks.base import (
    TASKS,
    Example,
    SyntheticTask,
    check_split,
    hash_unit,
    length_score,
)
from jaxrl_frontier.data.tasks.math_answer import last_boxed

INSTALL_HINT = "pip install 'jaxrl_frontier[models]'"

# The instruction appended to each question, per answer format. 'tags' is reasoning-gym's
# "default" system prompt (reasoning_gym.utils.SYSTEM_PROMPTS), less its first sentence.
INSTRUCTIONS = {
    "tags": (
        "Once you have thought about the reasoning process, provide the answer in the "
        "following format: <answer>answer here</answer>\n"
        "Do not explain your reasoning inside the answer tags, provide only the final answer."
    ),
    "boxed": "Please reason step by step, and put your final answer within \\boxed{}.",
}
ANSWER_FORMATS = tuple(INSTRUCTIONS)
FALLBACKS = ("none", "last_number")

_TAG_PAIR = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def import_reasoning_gym():
    """The reasoning_gym module; an ImportError naming the extra that installs it."""
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError(
            f"task 'reasoning_gym' needs the reasoning-gym package: {INSTALL_HINT}"
        ) from e
    return reasoning_gym


def marked_answer(completion: str, answer_format: str) -> tuple[str | None, bool]:
    """(the answer the completion marked, or None; whether it is well formed: exactly one
    marker holding a non-empty answer). See the module docstring for each format."""
    if answer_format == "tags":
        pairs = _TAG_PAIR.findall(completion)
        answer = pairs[-1].strip() if pairs else None
        one = (
            len(pairs) == 1
            and completion.count("<answer>") == 1
            and completion.count("</answer>") == 1
        )
    else:  # boxed
        boxed = last_boxed(completion)
        answer = boxed.strip() if boxed is not None else None
        one = completion.count("\\boxed{") == 1
    return (answer or None), bool(one and answer)


def last_number(completion: str) -> str | None:
    """The last number written in `completion` (thousands commas and a plus sign dropped), or
    None."""
    numbers = _NUMBER.findall(completion)
    return numbers[-1].replace(",", "").lstrip("+") if numbers else None


def _weights(datasets: str | Mapping[str, float]) -> dict[str, float]:
    """{name: weight} normalised to sum 1, from a name or a mapping; zero weights dropped."""
    if isinstance(datasets, str):
        return {datasets: 1.0}
    if not isinstance(datasets, Mapping) or not datasets:
        raise ValueError(
            "reasoning_gym: datasets must be a dataset name or a non-empty mapping "
            f"{{name: weight}}, got {datasets!r}"
        )
    weights = {}
    for name, w in datasets.items():
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
            raise ValueError(
                f"reasoning_gym: datasets[{name!r}] = {w!r}; a weight must be a finite number >= 0"
            )
        weights[str(name)] = float(w)
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"reasoning_gym: datasets {datasets!r} has no positive weight")
    return {name: w / total for name, w in weights.items() if w > 0}


@TASKS.register("reasoning_gym")
class ReasoningGymTask(SyntheticTask):
    """Problems from reasoning-gym datasets, answered in a marked format (module docstring).

    Args:
      datasets: a reasoning-gym dataset name ('basic_arithmetic'), or {name: weight} for a
        weighted mix (weights are normalised).
      dataset_kwargs: {name: {arg: value}}, each dataset's config fields (its difficulty,
        e.g. basic_arithmetic's min_terms, max_terms, min_digits, max_digits); `size`
        overrides `dataset_size` for that dataset, `seed` is the task's to set.
      dataset_size: positions k each (dataset, split) draws from (its `size`); 20,000 is
        the most word_ladder accepts. Generators that draw a pool up front (acre) build it
        once, in time proportional to it (acre: about 2 s per 10,000).
      answer_format: 'tags' or 'boxed'.
      instruction: the text appended to each question (None: the format's INSTRUCTIONS).
      fallback: 'none' or 'last_number': where correctness looks when no answer is marked.
      (and SyntheticTask's seed, train_size, eval_size, eval_fraction, max_completion_chars)
    Example fields: dataset, question, answer (the reference; None for datasets whose checker
    accepts any valid solution), metadata (the entry's, which the checker reads), position
    (k in the split's dataset), index.
    """

    name = "reasoning_gym"

    def __init__(
        self,
        *,
        datasets: str | Mapping[str, float] = "basic_arithmetic",
        dataset_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        dataset_size: int = 20_000,
        answer_format: str = "tags",
        instruction: str | None = None,
        fallback: str = "none",
        max_completion_chars: int = 1024,
        **kwargs,
    ):
        super().__init__(max_completion_chars=max_completion_chars, **kwargs)
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"reasoning_gym: answer_format {answer_format!r}; allowed: "
                f"{', '.join(ANSWER_FORMATS)}"
            )
        if fallback not in FALLBACKS:
            raise ValueError(
                f"reasoning_gym: fallback {fallback!r}; allowed: {', '.join(FALLBACKS)}"
            )
        if dataset_size < 1:
            raise ValueError(f"reasoning_gym: dataset_size must be >= 1, got {dataset_size}")
        self.answer_format, self.fallback = answer_format, fallback
        self.instruction = INSTRUCTIONS[answer_format] if instruction is None else instruction
        self.weights = _weights(datasets)  # {name: share of the examples}, summing to 1
        self._names, self._mix = tuple(self.weights), tuple(self.weights.values())
        rg = import_reasoning_gym()
        known = rg.factory.DATASETS
        for name in self._names:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=3)
                hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
                raise ValueError(
                    f"reasoning_gym: unknown dataset {name!r}; {hint}"
                    f"known: {', '.join(sorted(known))}"
                )
        dataset_kwargs = {str(k): dict(v) for k, v in (dataset_kwargs or {}).items()}
        stray = sorted(set(dataset_kwargs) - set(self._names))
        if stray:
            raise ValueError(
                f"reasoning_gym: dataset_kwargs names {stray}, which datasets does not "
                f"({', '.join(self._names)})"
            )
        self._config: dict[str, dict[str, Any]] = {}
        for name in self._names:
            config = dict(dataset_kwargs.get(name, {}))
            if "seed" in config:
                raise ValueError(
                    f"reasoning_gym: dataset_kwargs[{name!r}] sets 'seed'; the task seeds each "
                    "split's dataset from its own `seed`"
                )
            config.setdefault("size", int(dataset_size))
            _check_config(name, known[name][1], config)
            self._config[name] = config
        self._datasets: dict[tuple[str, int], Any] = {}

    # ------------------------------------------------------------ datasets

    def dataset_seed(self, name: str, split: str) -> int:
        """The seed of `name`'s dataset for `split`: a stable hash of (seed, split, name)."""
        return int(hash_unit(f"{self.name}|{self.seed}|{split}|{name}") * 2**31)

    def dataset(self, name: str, split: str):
        """`name`'s reasoning-gym dataset for `split`, built on first use and cached."""
        key = (name, self.dataset_seed(name, split))
        ds = self._datasets.get(key)
        if ds is None:
            rg = import_reasoning_gym()
            ds = self._datasets[key] = rg.create_dataset(name, seed=key[1], **self._config[name])
        return ds

    def __getstate__(self):  # pickled for data workers: the datasets are rebuilt there
        return {**self.__dict__, "_datasets": {}}

    # ------------------------------------------------------------ examples

    def split_key(self, example: Example) -> str:
        return f"{example['dataset']}|{example['question']}"

    def example(self, split: str, index: int) -> Example:
        check_split(split)
        index = int(index)
        if not 0 <= index < self.sizes[split]:
            raise IndexError(
                f"{self.name}: index {index} outside [0, {self.sizes[split]}) of {split}"
            )
        stem = f"{self.name}|{self.seed}|{split}|{index}"
        name = self._names[0]
        if len(self._names) > 1:
            name = random.Random(f"{stem}|mix").choices(self._names, weights=self._mix)[0]
        ds, size = self.dataset(name, split), self._config[name]["size"]
        for draw in range(self.MAX_DRAWS):
            position = random.Random(f"{stem}|{draw}").randrange(size)
            entry = ds[position]
            ex = {
                "dataset": name,
                "question": entry["question"],
                "answer": entry["answer"],
                "metadata": entry["metadata"],
                "position": position,
            }
            if self.split_of(ex) == split:
                ex["index"] = index
                return ex
        raise RuntimeError(
            f"{self.name}: no {split} item of {name!r} in {self.MAX_DRAWS} draws; its instance "
            f"space is too small for eval_fraction={self.eval_fraction} (widen "
            f"dataset_kwargs[{name!r}])"
        )

    def cluster_key(self, example: Example) -> str:
        return example["dataset"]

    def prompt(self, example: Example) -> str:
        return f"{example['question']}\n\n{self.instruction}"

    def demonstration(self, example: Example) -> str:
        answer = example["answer"]
        if answer is None:
            raise ValueError(
                f"reasoning_gym: dataset {example['dataset']!r} has no reference answer (its "
                "checker accepts any valid solution), so no demonstration"
            )
        return (
            f"<answer>{answer}</answer>" if self.answer_format == "tags" else f"\\boxed{{{answer}}}"
        )

    # ------------------------------------------------------------ rewards

    def reward(self, example: Example, completion: str) -> dict[str, float]:
        answer, well_formed = marked_answer(completion, self.answer_format)
        if answer is None and self.fallback == "last_number":
            answer = last_number(completion)
        correctness = 0.0 if answer is None else self._check(example, answer)
        return {
            "correctness": correctness,
            "format": float(well_formed),
            "length": length_score(completion, self.max_completion_chars),
        }

    def _check(self, example: Example, answer: str) -> float:
        """reasoning-gym's score of `answer`, clipped to [0, 1]; 0.0 if the checker raises."""
        name = example["dataset"]
        ds = next((d for (n, _), d in list(self._datasets.items()) if n == name), None)
        ds = ds if ds is not None else self.dataset(name, "train")
        entry = {k: example[k] for k in ("question", "answer", "metadata")}
        try:
            score = float(ds.score_answer(answer, entry))
        except Exception:  # the checker choked on model text: a wrong answer
            return 0.0
        return min(max(score, 0.0), 1.0) if math.isfinite(score) else 0.0

    def __repr__(self) -> str:
        mix = ", ".join(f"{n}: {w:.3g}" for n, w in self.weights.items())
        return f"ReasoningGymTask({{{mix}}}, answer_format={self.answer_format!r})"


def _check_config(name: str, config_cls, config: dict[str, Any]) -> None:
    """Build `name`'s config from `config` (with a seed) and run its `validate()`: an unknown
    field or a refused value is a ValueError naming the dataset and its fields."""
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name != "seed"]
    unknown = sorted(set(config) - set(fields))
    if unknown:
        raise ValueError(
            f"reasoning_gym: dataset_kwargs[{name!r}] has unknown fields {unknown}; "
            f"{config_cls.__name__} has: {', '.join(fields)}"
        )
    try:
        built = config_cls(seed=0, **config)
        if callable(getattr(built, "validate", None)):
            built.validate()
    except (AssertionError, ValueError, TypeError) as e:
        raise ValueError(
            f"reasoning_gym: dataset_kwargs[{name!r}] = {config} is refused by "
            f"{config_cls.__name__}: {e}"
        ) from None
