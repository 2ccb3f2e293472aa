"""`column_addition`: addition written out column by column, a completion of tens of tokens.

Prompt "123+459=", completion "3+9+0=12,2+5+1=08,1+4+0=05,0582": one `x+y+c=ss,` block per
column from the right (the two digits, the carry in, their two-digit sum), then the sum with
`digits + 1` digits. With `digits=3` a completion is 31 characters (32 tokens with EOS), five
times arithmetic's: long enough for token-position effects (where along a completion a
teacher's signal lands) to show, and each block depends on the one before through its carry.

`correctness` checks the final number only (the worked columns may be wrong and the answer
right); `format` checks the whole layout: `digits` column blocks, then a number.
"""

from __future__ import annotations

import random
import re

from jaxrl_frontier.data.tasks.base import TASKS, Example, SyntheticTask, reward_vector


def worked_sum(a: int, b: int, digits: int) -> str:
    """The demonstration: column blocks right to left, then a + b zero-padded to digits + 1."""
    blocks, carry = [], 0
    for k in range(digits):
        x, y = a // 10**k % 10, b // 10**k % 10
        total = x + y + carry
        blocks.append(f"{x}+{y}+{carry}={total:02d},")
        carry = total // 10
    return "".join(blocks) + f"{a + b:0{digits + 1}d}"


@TASKS.register("column_addition")
class ColumnAddition(SyntheticTask):
    """a + b with `digits`-digit zero-padded operands, answered as a worked column sum.

    Args:
      digits: operand width (operands are uniform in [0, 10**digits)).
      (and SyntheticTask's seed, train_size, eval_size, eval_fraction, max_completion_chars)
    Example fields: a, b, answer (int), index.
    """

    name = "column_addition"

    def __init__(self, *, digits: int = 3, max_completion_chars: int = 48, **kwargs):
        super().__init__(max_completion_chars=max_completion_chars, **kwargs)
        if not 1 <= digits <= 9:
            raise ValueError(f"column_addition: digits must be in [1, 9], got {digits}")
        self.digits = digits
        block = r"[0-9]\+[0-9]\+[01]=[0-9]{2},"
        self._layout = re.compile(rf"\s*(?:{block}){{{digits}}}([0-9]+)\s*")

    def _generate(self, rng: random.Random) -> Example:
        a, b = rng.randrange(10**self.digits), rng.randrange(10**self.digits)
        return {"a": a, "b": b, "answer": a + b}

    def split_key(self, example: Example) -> str:
        return f"{example['a']}+{example['b']}"

    def prompt(self, example: Example) -> str:
        d = self.digits
        return f"{example['a']:0{d}d}+{example['b']:0{d}d}="

    def demonstration(self, example: Example) -> str:
        return worked_sum(int(example["a"]), int(example["b"]), self.digits)

    def reward(self, example: Example, completion: str) -> dict[str, float]:
        m = self._layout.fullmatch(completion)
        correct = m is not None and int(m.group(1)) == int(example["answer"])
        return reward_vector(correct, m is not None, completion, self.max_completion_chars)
