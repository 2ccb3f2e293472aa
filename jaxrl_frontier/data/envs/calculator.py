"""A calculator tool-use environment for arithmetic word problems.

Each episode is one word problem. Each turn the policy either calls the calculator or
answers:

    <calc>3*(4+5)</calc>      -> observation <result>27</result>, reward 0, not done
    <answer>27</answer>       -> reward `correct_reward` if 27 is the answer else 0, done
    anything else             -> observation naming the two forms, `invalid_penalty`

When a turn holds both, the answer counts (the call is ignored). The tags are `ToolSyntax`
fields, so a tokenizer without `<` and `>` can use other markers.

The evaluator is safe: the expression is parsed with `ast` (mode 'eval') and only numbers,
+ - * / // % ** and parentheses are allowed (a whitelist of node types; nothing is ever
passed to eval). Arithmetic is exact (`fractions.Fraction`); a power's exponent is an
integer of at most `MAX_EXPONENT` in magnitude, the expression at most `MAX_EXPRESSION_CHARS`
characters and every intermediate value at most `MAX_MAGNITUDE` in magnitude, so no call can
take long or use much memory. Errors (division by zero, syntax, a disallowed node) come back
as `<result>error: ...</result>`.
"""

from __future__ import annotations

import ast
import dataclasses
import random
import re
from collections.abc import Hashable
from fractions import Fraction

from jaxrl_frontier.data.envs.base import ENVS, StepResult, TextEnv

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 16
MAX_MAGNITUDE = 10**15


class CalcError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message says why."""


_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: Fraction(a // b),
    ast.Mod: lambda a, b: a % b,
}


def _check(x: Fraction) -> Fraction:
    if abs(x) > MAX_MAGNITUDE or x.denominator > MAX_MAGNITUDE:
        raise CalcError("value too large")
    return x


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        # bool is an int subclass: True + 1 is not arithmetic on numbers the problem holds
        if type(node.value) not in (int, float):
            raise CalcError(f"not a number: {node.value!r}")
        return _check(Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        v = _eval(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if b.denominator != 1 or abs(b) > MAX_EXPONENT:
                raise CalcError(f"exponent must be an integer in [-{MAX_EXPONENT}, {MAX_EXPONENT}]")
            if a == 0 and b < 0:
                raise CalcError("division by zero")
            return _check(a ** int(b))
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise CalcError(f"operator not allowed: {type(node.op).__name__}")
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and b == 0:
            raise CalcError("division by zero")
        return _check(op(a, b))
    raise CalcError(f"not allowed: {type(node).__name__}")


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression (module docstring); CalcError otherwise."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalcError("syntax error") from None
    return _eval(tree)


def format_number(x: Fraction) -> str:
    """An integer as itself, otherwise a decimal rounded to 6 places (trailing zeros cut)."""
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.6f}".rstrip("0").rstrip(".")


_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)(?:\s*/\s*(\d+))?\s*$")


def parse_answer(text: str) -> Fraction | None:
    """A number written as an integer, a decimal or a fraction a/b (commas between thousands
    allowed); None if the text is not one."""
    m = _NUMBER.match(text.replace(",", ""))
    if not m:
        return None
    value = Fraction(m.group(1))
    if m.group(2):
        if int(m.group(2)) == 0:
            return None
        value /= int(m.group(2))
    return value


@dataclasses.dataclass(frozen=True)
class ToolSyntax:
    """The markers of a call, its result and the final answer."""

    call_open: str = "<calc>"
    call_close: str = "</calc>"
    result_open: str = "<result>"
    result_close: str = "</result>"
    answer_open: str = "<answer>"
    answer_close: str = "</answer>"

    def find(self, text: str, open_: str, close: str) -> str | None:
        """The content of the LAST open_ ... close span of `text`, or None."""
        end = text.rfind(close)
        if end < 0:
            return None
        start = text.rfind(open_, 0, end)
        return None if start < 0 else text[start + len(open_) : end]


# (template, expression); {a}, {b}, {c} are drawn numbers, the expression gives the answer.
_NAMES = ("ana", "ben", "carla", "dev", "emma", "farid", "grace", "hugo")
_ITEMS = ("apples", "pencils", "stickers", "marbles", "cards", "books")
PROBLEMS = (
    (
        "{name} has {a} boxes of {b} {item}. {name} gives away {c} {item}. "
        "how many {item} are left?",
        "{a}*{b}-{c}",
    ),
    (
        "{name} buys {a} {item} at {b} dollars each and pays with {c} dollars. "
        "how many dollars of change does {name} get?",
        "{c}-{a}*{b}",
    ),
    (
        "{name} reads {a} pages a day for {b} days, then {c} pages more. how many pages in total?",
        "{a}*{b}+{c}",
    ),
    (
        "{c} {item} are shared equally by {a} friends, and each friend then gets {b} more. "
        "how many {item} does each friend have?",
        "{c}/{a}+{b}",
    ),
    (
        "{name} has {a} {item} and {b} friends give {name} {c} {item} each. "
        "how many {item} does {name} have now?",
        "{a}+{b}*{c}",
    ),
)


def make_problem(seed: int, max_number: int = 50) -> dict:
    """A word problem, its expression and its answer (an int), deterministic in the seed."""
    rng = random.Random(f"calculator|{seed}")
    k = rng.randrange(len(PROBLEMS))
    template, expr = PROBLEMS[k]
    a, b = rng.randint(2, max_number), rng.randint(2, max_number)
    if k == 1:  # change: the payment covers the price
        c = a * b + rng.randint(1, max_number)
    elif k == 3:  # equal shares divide evenly
        c = a * rng.randint(2, max_number)
    else:
        c = rng.randint(2, max_number)
    if k == 0:
        c = rng.randint(1, a * b)  # never more than there are
    values = dict(a=a, b=b, c=c, name=rng.choice(_NAMES), item=rng.choice(_ITEMS))
    expression = expr.format(**values)
    answer = evaluate(expression)
    assert answer.denominator == 1  # the templates keep answers whole
    return {
        "question": template.format(**values),
        "expression": expression,
        "answer": int(answer),
    }


@ENVS.register("calculator")
class CalculatorEnv(TextEnv):
    """Arithmetic word problems with a calculator tool (module docstring).

    Args:
      max_number: the largest number drawn into a problem.
      correct_reward: the reward of a correct final answer (a wrong one gets 0).
      call_penalty: added for each calculator call (0: calls are free).
      invalid_penalty: added for a turn that neither calls nor answers.
      syntax: ToolSyntax fields (dict), to change the markers.
    """

    name = "calculator"

    def __init__(
        self,
        max_number: int = 50,
        correct_reward: float = 1.0,
        call_penalty: float = 0.0,
        invalid_penalty: float = 0.0,
        syntax: dict | None = None,
    ):
        super().__init__()
        if max_number < 2:
            raise ValueError(f"calculator: max_number must be >= 2, got {max_number}")
        self.max_number = int(max_number)
        self.correct_reward = float(correct_reward)
        self.call_penalty = float(call_penalty)
        self.invalid_penalty = float(invalid_penalty)
        self.syntax = ToolSyntax(**(syntax or {}))
        self.problem: dict = {}
        self.calls = 0

    def _reset(self, seed: int) -> str:
        self.problem = make_problem(seed, self.max_number)
        self.calls = 0
        s = self.syntax
        return (
            f"{self.problem['question']}\n"
            f"use {s.call_open}expression{s.call_close} to calculate and "
            f"{s.answer_open}number{s.answer_close} to answer.\n"
        )

    def state_key(self) -> Hashable:
        return (self.problem.get("expression"), self.calls)

    def _step(self, action: str) -> StepResult:
        s = self.syntax
        answer = s.find(action, s.answer_open, s.answer_close)
        if answer is not None:
            value = parse_answer(answer)
            correct = value is not None and value == self.problem["answer"]
            info = {"success": correct, "invalid": value is None, "state": self.state_key()}
            return "", self.correct_reward if correct else 0.0, True, info
        call = s.find(action, s.call_open, s.call_close)
        if call is not None:
            self.calls += 1
            try:
                result = format_number(evaluate(call))
            except CalcError as e:
                result = f"error: {e}"
            info = {"success": False, "invalid": False, "state": self.state_key()}
            return f"{s.result_open}{result}{s.result_close}\n", self.call_penalty, False, info
        info = {"success": False, "invalid": True, "state": self.state_key()}
        hint = (
            f"write {s.call_open}expression{s.call_close} or {s.answer_open}number"
            f"{s.answer_close}\n"
        )
        return hint, self.invalid_penalty, False, info
