"""`countdown`: reach a target from given numbers with + - * / and parentheses.

Prompt "use 3, 7, 25, 50 to make 81:", completion e.g. "(50-25)*3+7-1"... which would be wrong
(1 is not given). The completion must be an expression only (see `data/tasks/expression.py`, a safe
parser: nothing is ever `eval`ed). `format` = it parses; `correctness` = it parses, every literal
is one of the given numbers used at most as often as it was given, and its exact (Fraction)
value equals the target. Division by zero parses but is wrong.

Instances are solvable by construction: the target is the value of a random expression over a
random subset of the numbers (at least two), whose text is kept as the example's `solution`.
Intermediate values are kept positive integers (exact divisions only), as in the game.
"""

from __future__ import annotations

import random
from collections import Counter

from jaxrl_frontier.data.tasks.base import TASKS, Example, SyntheticTask, reward_vector
from jaxrl_frontier.data.tasks.expression import ExpressionError, parse_expression

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_LEAF_PREC = 3


def _wrap(text: str, prec: int, need: int, strict: bool) -> str:
    """Parenthesise a child of precedence `prec` under an operator of precedence `need`."""
    return f"({text})" if prec < need or (strict and prec == need) else text


@TASKS.register("countdown")
class Countdown(SyntheticTask):
    """Numbers and a target; answer with an arithmetic expression.

    Args:
      num_numbers: how many numbers are given.
      min_number, max_number: their range (inclusive).
      max_target: targets lie in [1, max_target].
      prompt_template: formatted with numbers ("3, 7, 25, 50") and target.
      (and SyntheticTask's seed, train_size, eval_size, eval_fraction, max_completion_chars)
    Example fields: numbers (list[int], sorted), target (int), solution (str), index.
    """

    name = "countdown"

    def __init__(
        self,
        *,
        num_numbers: int = 4,
        min_number: int = 1,
        max_number: int = 50,
        max_target: int = 500,
        prompt_template: str = "use {numbers} to make {target}:",
        max_completion_chars: int = 64,
        **kwargs,
    ):
        super().__init__(max_completion_chars=max_completion_chars, **kwargs)
        if num_numbers < 2:
            raise ValueError(f"countdown: num_numbers must be >= 2, got {num_numbers}")
        if not 1 <= min_number <= max_number:
            raise ValueError(
                f"countdown: need 1 <= min_number <= max_number, got {min_number}, {max_number}"
            )
        if max_target < 1:
            raise ValueError(f"countdown: max_target must be >= 1, got {max_target}")
        self.num_numbers = num_numbers
        self.min_number = min_number
        self.max_number = max_number
        self.max_target = max_target
        self.prompt_template = prompt_template

    def _random_solution(self, rng: random.Random, numbers: list[int]) -> tuple[int, str] | None:
        """Combine a random subset pairwise with random ops; None if the draw is unusable."""
        k = rng.randint(2, len(numbers))
        # nodes: (value, text, precedence)
        nodes = [(n, str(n), _LEAF_PREC) for n in rng.sample(numbers, k)]
        while len(nodes) > 1:
            i, j = rng.sample(range(len(nodes)), 2)
            (a, ta, pa), (b, tb, pb) = nodes[i], nodes[j]
            ops = ["+", "*"]
            if a != b:
                ops.append("-")
            if b > 1 and a % b == 0:
                ops.append("/")
            op = rng.choice(ops)
            if op == "-" and b > a:  # keep intermediates positive
                (a, ta, pa), (b, tb, pb) = (b, tb, pb), (a, ta, pa)
            value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0}[op]
            need = _PREC[op]
            text = f"{_wrap(ta, pa, need, False)}{op}{_wrap(tb, pb, need, op in '-/')}"
            nodes = [n for m, n in enumerate(nodes) if m not in (i, j)] + [(value, text, need)]
        value, text, _ = nodes[0]
        if not 1 <= value <= self.max_target:
            return None
        return value, text

    def _generate(self, rng: random.Random) -> Example:
        for _ in range(1000):  # a few draws at most: most random expressions land in range
            numbers = sorted(
                rng.randint(self.min_number, self.max_number) for _ in range(self.num_numbers)
            )
            for _ in range(20):
                found = self._random_solution(rng, numbers)
                if found is not None:
                    target, solution = found
                    return {"numbers": numbers, "target": target, "solution": solution}
        raise RuntimeError(
            f"countdown: no target in [1, {self.max_target}] reachable from numbers in "
            f"[{self.min_number}, {self.max_number}] after 1000 draws; raise max_target"
        )

    def split_key(self, example: Example) -> str:
        # Sorted numbers + target: the same puzzle in another order is the same instance.
        return f"{sorted(example['numbers'])}->{example['target']}"

    def prompt(self, example: Example) -> str:
        numbers = ", ".join(str(n) for n in example["numbers"])
        return self.prompt_template.format(numbers=numbers, target=example["target"])

    def demonstration(self, example: Example) -> str:
        return example["solution"]

    def reward(self, example: Example, completion: str) -> dict[str, float]:
        try:
            parsed = parse_expression(completion)
        except ExpressionError:
            return reward_vector(False, False, completion, self.max_completion_chars)
        available = Counter(int(n) for n in example["numbers"])
        used = Counter(parsed.numbers)
        within = all(used[n] <= available[n] for n in used)
        correct = within and parsed.value is not None and parsed.value == int(example["target"])
        return reward_vector(correct, True, completion, self.max_completion_chars)
