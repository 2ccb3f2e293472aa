"""data/tasks/expression.py: the safe countdown parser's values, numbers and refusals."""

from fractions import Fraction

import pytest

from jaxrl_frontier.data.tasks.expression import ExpressionError, parse_expression


@pytest.mark.parametrize(
    "text, value, numbers",
    [
        ("1+2*3", 7, (1, 2, 3)),
        ("(1+2)*3", 9, (1, 2, 3)),
        ("7/2*2", 7, (7, 2, 2)),
        ("10-4-3", 3, (10, 4, 3)),
        ("100/(5-3)/2", 25, (100, 5, 3, 2)),
        (" ( 25 - 5 ) / 4 ", 5, (25, 5, 4)),
        ("1/3", Fraction(1, 3), (1, 3)),
    ],
)
def test_parser_values(text, value, numbers):
    parsed = parse_expression(text)
    assert parsed.value == value and parsed.numbers == numbers


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",  # names and calls
        "abs(3)",
        "(3).real",  # attributes
        "2**3",  # exponent
        "2^3",
        "7//2",
        "7%2",
        "1.5*2",
        "-3+5",  # unary sign
        "3+",
        "(3+4",
        "3 4",
        "",
        "２+３",  # fullwidth digits
        "3＋4",
        "3\u200b+4",  # zero-width space
        "(" * 40 + "1" + ")" * 40,  # too deep
        "1+" * 200 + "1",  # too long
    ],
)
def test_parser_refuses(text):
    with pytest.raises(ExpressionError):
        parse_expression(text)


def test_parser_division_by_zero_is_wellformed_but_valueless():
    assert parse_expression("5/(3-3)").value is None
