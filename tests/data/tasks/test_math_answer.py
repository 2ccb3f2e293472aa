"""data/tasks/math_answer.py: answers extracted from boxes and #### lines, normalised."""

import pytest

from jaxrl_frontier.data.tasks.math_answer import extract_answer, normalize_answer


@pytest.mark.parametrize(
    "text, answer",
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{x^{2}+1}", "x^{2}+1"),
        ("work\n#### 1,000\nbye", "1,000"),
        ("\\boxed{7} and \\boxed{8", "7"),  # truncated last box: the earlier balanced one
        ("no answer here", None),
        ("####   ", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("1,000", "1000"),
        ("3.0", "3"),
        ("$12", "12"),
        ("0.50", "1/2"),
        ("\\frac{1}{2}", "1/2"),
        ("-\\frac{3}{4}", "-3/4"),
        ("6/8", "3/4"),
        ("42.", "42"),
        ("  Seven  Apples ", "seven apples"),
        ("1/0", "1/0"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm
