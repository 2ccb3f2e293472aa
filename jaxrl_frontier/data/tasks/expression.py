"""A safe parser for countdown answers: + - * / and parentheses over non-negative integers.

Model output is untrusted text, so it is never handed to `eval` or `ast`: this module tokenizes
against a fixed ASCII alphabet and parses with recursive descent. Anything else (names, calls,
attributes, `**`, `^`, `//`, `%`, decimals, unary signs, unicode digits) is a `ExpressionError`.
Values are exact `Fraction`s, so 7/2*2 == 7 and no float rounding can make a wrong answer right.

Grammar:
    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := INT | '(' expr ')'
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

_DIGITS = frozenset("0123456789")
_OPS = frozenset("+-*/()")
_SPACE = frozenset(" \t\n")

# Bounds so that junk cannot cost much: a pathological completion is rejected, not evaluated.
MAX_CHARS = 256
MAX_DEPTH = 32
MAX_INT_DIGITS = 9


class ExpressionError(ValueError):
    """The text is not a well-formed expression of the grammar."""


@dataclass(frozen=True)
class Parsed:
    """A parsed expression: its exact value (None on division by zero) and the literals used."""

    value: Fraction | None
    numbers: tuple[int, ...]


def _tokenize(text: str) -> list[str]:
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"expression longer than {MAX_CHARS} characters ({len(text)})")
    tokens: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in _SPACE:
            i += 1
        elif ch in _DIGITS:
            j = i
            while j < len(text) and text[j] in _DIGITS:
                j += 1
            if j - i > MAX_INT_DIGITS:
                raise ExpressionError(
                    f"integer at position {i} has more than {MAX_INT_DIGITS} digits"
                )
            tokens.append(text[i:j])
            i = j
        elif ch in _OPS:
            tokens.append(ch)
            i += 1
        else:
            raise ExpressionError(f"character {ch!r} at position {i} is not allowed")
    if not tokens:
        raise ExpressionError("empty expression")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0
        self.numbers: list[int] = []
        self.div_by_zero = False

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExpressionError("unexpected end of expression")
        self.pos += 1
        return tok

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.factor(depth)
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                # Keep parsing: a well-formed expression that divides by zero is a wrong
                # answer (format 1, correctness 0), not a malformed one.
                self.div_by_zero = True
                value = Fraction(0)
            else:
                value = value / rhs
        return value

    def factor(self, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH}")
        tok = self.take()
        if tok == "(":
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise ExpressionError(f"expected ')' at token {self.pos - 1}")
            return value
        if tok[0] in _DIGITS:
            self.numbers.append(int(tok))
            return Fraction(int(tok))
        raise ExpressionError(f"expected a number or '(' at token {self.pos - 1}, got {tok!r}")


def parse_expression(text: str) -> Parsed:
    """Parse and evaluate `text` exactly. Raises `ExpressionError` if it is not well formed."""
    parser = _Parser(_tokenize(text))
    value = parser.expr(0)
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r} at token {parser.pos}")
    return Parsed(None if parser.div_by_zero else value, tuple(parser.numbers))
