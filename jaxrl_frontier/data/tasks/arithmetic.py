"""`arithmetic`: integer +, -, * on operands of up to `max_digits` digits.

Prompt "123+45=", completion "168". The completion must be just an integer (surrounding
whitespace allowed): `format` checks that, `correctness` additionally checks the value.
"""

from __future__ import annotations

import random
import re

from jaxrl_frontier.data.tasks.base import TASKS, Example, SyntheticTask, reward_vector

ALLOWED_OPS = "+-*"
_INT_RE = re.compile(r"\s*(-?[0-9]+)\s*")  # ASCII digits only: "١٢" (Arabic-Indic) is not an int


@TASKS.register("arithmetic")
class Arithmetic(SyntheticTask):
    """a <op> b = ? with a, b of 1..max_digits digits (digit count uniform, then value uniform).

    Args:
      max_digits: operands have 1..max_digits digits.
      ops: a string of operators drawn uniformly, a subset of "+-*".
      allow_negative: if False, subtraction puts the larger operand first (answer >= 0).
      prompt_template: formatted with a, op, b.
      (and SyntheticTask's seed, train_size, eval_size, eval_fraction, max_completion_chars)
    Example fields: a, b (int), op (str), answer (int), index.
    """

    name = "arithmetic"

    def __init__(
        self,
        *,
        max_digits: int = 3,
        ops: str = ALLOWED_OPS,
        allow_negative: bool = False,
        prompt_template: str = "{a}{op}{b}=",
        max_completion_chars: int = 16,
        **kwargs,
    ):
        super().__init__(max_completion_chars=max_completion_chars, **kwargs)
        if not 1 <= max_digits <= 18:
            raise ValueError(f"arithmetic: max_digits must be in [1, 18], got {max_digits}")
        bad = sorted(set(ops) - set(ALLOWED_OPS))
        if not ops or bad:
            raise ValueError(
                f"arithmetic: ops {ops!r} has unsupported {bad}; allowed: a non-empty subset "
                f"of {ALLOWED_OPS!r}"
            )
        self.max_digits = max_digits
        self.ops = "".join(dict.fromkeys(ops))  # dedupe, keep order: draws stay uniform
        self.allow_negative = allow_negative
        self.prompt_template = prompt_template

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(1, self.max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(low, 10**digits - 1)

    def _generate(self, rng: random.Random) -> Example:
        a, b = self._operand(rng), self._operand(rng)
        op = rng.choice(self.ops)
        if op == "-" and not self.allow_negative and b > a:
            a, b = b, a
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        return {"a": a, "b": b, "op": op, "answer": answer}

    def split_key(self, example: Example) -> str:
        return f"{example['a']}{example['op']}{example['b']}"

    def prompt(self, example: Example) -> str:
        return self.prompt_template.format(a=example["a"], op=example["op"], b=example["b"])

    def demonstration(self, example: Example) -> str:
        return str(example["answer"])

    def reward(self, example: Example, completion: str) -> dict[str, float]:
        m = _INT_RE.fullmatch(completion)
        correct = m is not None and int(m.group(1)) == int(example["answer"])
        return reward_vector(correct, m is not None, completion, self.max_completion_chars)
