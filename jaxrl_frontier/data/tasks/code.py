"""`code`: write the body of a small Python function; the reward runs it against unit tests.

Prompt (a function header and a comment stating what it returns):

    def f(a, b):
        # a*b+a, e.g. f(2, -3) = -4
        return

(the worked input is not among the tests; it also makes prompts of one expression distinct,
which held-out evaluation needs) and the completion finishes the function (" a*b+a"). The completion is model-written code, so
the task is scored by `rewards.SandboxedScorer` (`scorer = "sandboxed"`): `program(example,
completion)` is the source run in `data/rewards/sandbox.py` (prompt + completion + a harness that calls `f`
on each test input and prints one JSON line per result), and `score(example, completion,
result)` compares those lines, in this process, with the expected values, which never enter
the sandbox. A completion can therefore only pass by computing the right values; whatever
it prints, reads or breaks, it cannot claim a pass it did not earn.

Rewards: `correctness` = every test passes; `format` = the program ran to the harness and
`f` returned a JSON-able value for every test; `length` as in every task.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from jaxrl_frontier.data.tasks.base import (
    TASKS,
    Example,
    SyntheticTask,
    Task,
    check_split,
    hash_unit,
    read_jsonl,
    reward_vector,
)

# The small set of problems committed with the repo (written in CharTokenizer's alphabet).
CODE_PROBLEMS_PATH = Path(__file__).resolve().parents[3] / "data" / "code_problems.jsonl"

# Expressions of a and b the task asks for, each with its value (trusted: no eval).
EXPRESSIONS = {
    "a+b": lambda a, b: a + b,
    "a-b": lambda a, b: a - b,
    "a*b": lambda a, b: a * b,
    "a*b+a": lambda a, b: a * b + a,
    "a+b+b": lambda a, b: a + 2 * b,
    "a*a-b": lambda a, b: a * a - b,
    "(a+b)*b": lambda a, b: (a + b) * b,
    "a-b*b": lambda a, b: a - b * b,
}
RESULT_TAG = "@@jaxrl-result "  # the harness's lines; anything else in the output is ignored

HARNESS = """

def _jaxrl_harness():
    import json, sys
    for args in json.loads({cases!r}):
        try:
            line = json.dumps({{"value": {entry}(*args)}})
        except BaseException as e:  # the completion's own failure: that test fails
            line = json.dumps({{"error": type(e).__name__}})
        sys.stdout.write({tag!r} + line + "\\n")
    sys.stdout.flush()


_jaxrl_harness()
"""


@TASKS.register("code")
class CodeTask(SyntheticTask):
    """Complete `def f(a, b): # <expr>  return` so that f matches <expr> on `num_tests` inputs.

    Args:
      expressions: which of EXPRESSIONS to draw from (all by default).
      max_value: test inputs are integers in [-max_value, max_value].
      num_tests: unit tests per example.
      (and SyntheticTask's seed, train_size, eval_size, eval_fraction, max_completion_chars)
    Example fields: expr, entry, shown (the prompt's worked [[a, b], value]), tests
    ([[a, b], expected] pairs), index.
    """

    name = "code"
    scorer = "sandboxed"  # model-written code: never run in the trainer's process

    def __init__(
        self,
        *,
        expressions: tuple[str, ...] | list[str] | None = None,
        max_value: int = 9,
        num_tests: int = 4,
        max_completion_chars: int = 32,
        **kwargs,
    ):
        super().__init__(max_completion_chars=max_completion_chars, **kwargs)
        self.expressions = tuple(expressions or EXPRESSIONS)
        unknown = [e for e in self.expressions if e not in EXPRESSIONS]
        if unknown or not self.expressions:
            raise ValueError(
                f"code: unknown expressions {unknown}; allowed: {', '.join(EXPRESSIONS)}"
            )
        if max_value < 1 or num_tests < 1:
            raise ValueError(
                f"code: max_value and num_tests must be >= 1, got {max_value}, {num_tests}"
            )
        self.max_value, self.num_tests = int(max_value), int(num_tests)

    def _generate(self, rng: random.Random) -> Example:
        expr = rng.choice(self.expressions)
        fn = EXPRESSIONS[expr]
        draw = lambda: [rng.randint(-self.max_value, self.max_value) for _ in range(2)]
        args = [draw() for _ in range(self.num_tests)]
        shown = draw()
        return {
            "expr": expr,
            "entry": "f",
            "shown": [shown, fn(*shown)],
            "tests": [[a, fn(*a)] for a in args],
        }

    def split_key(self, example: Example) -> str:
        return f"{example['expr']}|{json.dumps(example['shown'])}|{json.dumps(example['tests'])}"

    def prompt(self, example: Example) -> str:
        (a, b), value = example["shown"]
        spec = f"{example['expr']}, e.g. {example['entry']}({a}, {b}) = {value}"
        return f"def {example['entry']}(a, b):\n    # {spec}\n    return"

    def demonstration(self, example: Example) -> str:
        return f" {example['expr']}"

    def program(self, example: Example, completion: str) -> str:
        """The source the sandbox runs: the function, then the harness (inputs only)."""
        cases = json.dumps([args for args, _ in example["tests"]])
        harness = HARNESS.format(cases=cases, entry=example["entry"], tag=RESULT_TAG)
        return self.prompt(example) + completion + "\n" + harness

    def score(self, example: Example, completion: str, result) -> dict[str, float]:
        """Rewards from a `sandbox.SandboxResult`: the tagged lines against the expected
        values (parsed here, as data: bounded by the sandbox's output limit)."""
        values = []
        if result.status == "ok":
            for line in result.output.splitlines():
                if line.startswith(RESULT_TAG):
                    try:
                        values.append(json.loads(line[len(RESULT_TAG) :]))
                    except ValueError:
                        values.append({"error": "unparsable"})
        tests = example["tests"]
        complete = len(values) == len(tests)
        ran = complete and all("value" in v for v in values)
        correct = ran and all(
            v["value"] == expected
            and type(v["value"]) is type(expected)  # True == 1 and 1.0 == 1: the type counts
            for v, (_, expected) in zip(values, tests, strict=True)
        )
        return reward_vector(correct, ran, completion, self.max_completion_chars)

    def reward(self, example: Example, completion: str) -> dict[str, float]:
        raise RuntimeError(
            "code: the reward runs model-written code and is only computed by the sandboxed "
            "scorer (rewards.scorer = 'sandboxed' or 'auto'); never in the trainer's process"
        )


@TASKS.register("code_problems")
class CodeProblems(Task):
    """Complete a Python function from a file of problems; the reward runs it on the row's
    tests in the sandbox, as `code` does.

    Each JSONL row: `prompt` (the function's header, a comment saying what it returns, and
    `return`), `entry` (the function's name), `tests` ([[args], expected] pairs) and
    `solution` (a reference completion: the SFT demonstration). A row is eval iff a stable
    hash of its prompt falls below `eval_fraction`, so the split survives reordering the file.

    Args:
      path: the JSONL file (default: data/code_problems.jsonl, 28 problems).
      eval_fraction: share of the problems held out.
      max_completion_chars: the length reward's scale.
    """

    name = "code_problems"
    scorer = "sandboxed"  # model-written code: never run in the trainer's process
    program = CodeTask.program
    score = CodeTask.score
    reward = CodeTask.reward

    def __init__(
        self,
        *,
        path: str = str(CODE_PROBLEMS_PATH),
        eval_fraction: float = 0.25,
        max_completion_chars: int = 48,
    ):
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"code_problems: eval_fraction must be in (0, 1), got {eval_fraction}")
        self.max_completion_chars = int(max_completion_chars)
        rows = {"train": [], "eval": []}
        for row in read_code_problems(path):
            u = hash_unit(f"code_problems|{row['prompt']}")
            rows["eval" if u < eval_fraction else "train"].append(row)
        if not rows["train"] or not rows["eval"]:
            raise ValueError(
                f"code_problems: {path} splits into {len(rows['train'])} train and "
                f"{len(rows['eval'])} eval problems at eval_fraction={eval_fraction}: need both"
            )
        self.rows = rows

    def num_examples(self, split: str) -> int:
        return len(self.rows[check_split(split)])

    def example(self, split: str, index: int) -> Example:
        return {**self.rows[check_split(split)][int(index)], "index": int(index)}

    def prompt(self, example: Example) -> str:
        return example["prompt"]

    def demonstration(self, example: Example) -> str:
        return example["solution"]


def read_code_problems(path: str | Path) -> list[Example]:
    """The rows of a code-problems JSONL file, checked: a bad line is a ValueError naming
    `path:line` and what is wrong."""
    rows = []
    for _, where, row in read_jsonl(path, "code_problems"):
        missing = [k for k in ("prompt", "entry", "tests", "solution") if k not in row]
        if missing:
            raise ValueError(
                f"{where}: missing fields {missing} (need prompt, entry, tests, solution)"
            )
        if not row["tests"] or not all(isinstance(t, list) and len(t) == 2 for t in row["tests"]):
            raise ValueError(f"{where}: 'tests' must be a non-empty list of [args, expected] pairs")
        rows.append({k: row[k] for k in ("prompt", "entry", "tests", "solution")})
    return rows
