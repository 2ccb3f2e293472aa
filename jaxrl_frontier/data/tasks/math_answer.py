"""Final-answer extraction and normalisation for math word problems.

Completions mark their final answer with `\\boxed{...}` (MATH style, braces may nest) or
`#### ...` (GSM8K style, to the end of the line). The last marker wins: models often restate
intermediate results before the final one. Normalisation makes "1,000", "1000.0", "$1000" and
"\\frac{2000}{2}" compare equal: numbers become canonical exact fractions ("1000", "-3/4"),
other answers are compared with whitespace collapsed and lowercased.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOXED = "\\boxed{"
_HASHES = "####"
_NUMBER_RE = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
_FRACTION_RE = re.compile(r"([-+]?[0-9]+)\s*/\s*([0-9]+)")
_LATEX_FRAC_RE = re.compile(r"(-?)\\[dt]?frac\{\s*(-?[0-9]+)\s*\}\{\s*([0-9]+)\s*\}")
_THOUSANDS_RE = re.compile(r"(?<=[0-9]),(?=[0-9]{3}(?![0-9]))")


def last_boxed(text: str) -> str | None:
    """Contents of the last balanced `\\boxed{...}` in `text`, or None."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len(_BOXED) : i - 1]
        start = text.rfind(_BOXED, 0, start)  # unbalanced (truncated output): try an earlier one
    return None


def after_hashes(text: str) -> str | None:
    """Text after the last `####` up to the end of that line, stripped; None if absent/empty."""
    at = text.rfind(_HASHES)
    if at == -1:
        return None
    answer = text[at + len(_HASHES) :].split("\n", 1)[0].strip()
    return answer or None


def extract_answer(text: str) -> str | None:
    """The marked final answer (boxed first, then ####), not yet normalised; None if unmarked."""
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed
    return after_hashes(text)


def normalize_answer(answer: str) -> str:
    """Canonical string of an answer: exact fraction for numbers, else collapsed lowercase text."""
    s = answer.strip()
    s = s.replace("\\$", "").replace("$", "").replace("\\!", "").replace("\\%", "%")
    s = s.strip().rstrip(".").strip()
    s = _THOUSANDS_RE.sub("", s)
    m = _LATEX_FRAC_RE.fullmatch(s)
    if m and int(m.group(3)) != 0:
        sign = -1 if m.group(1) else 1
        return _canonical(sign * Fraction(int(m.group(2)), int(m.group(3))))
    m = _FRACTION_RE.fullmatch(s)
    if m and int(m.group(2)) != 0:
        return _canonical(Fraction(int(m.group(1)), int(m.group(2))))
    if _NUMBER_RE.fullmatch(s):
        return _canonical(Fraction(s))
    return " ".join(s.lower().split())


def _canonical(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"
