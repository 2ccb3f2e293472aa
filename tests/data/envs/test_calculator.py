"""data/envs/calculator.py: the safe evaluator's values and refusals, episodes, problems and
a custom tool syntax."""

from fractions import Fraction

import pytest

from jaxrl_frontier.data.envs import calculator as calc
from jaxrl_frontier.data.envs import make_env


@pytest.mark.parametrize(
    "expr, value",
    [
        ("3*(4+5)", 27),
        ("7/2", Fraction(7, 2)),
        ("-2**3 + 10 // 3 % 2", -7),
        ("2**-2", Fraction(1, 4)),
        ("1.5 * 4", 6),
        ("+(1)", 1),
    ],
)
def test_evaluator_values(expr, value):
    assert calc.evaluate(expr) == value


@pytest.mark.parametrize(
    "expr, reason",
    [
        ("__import__('os').system('true')", "Call"),
        ("().__class__", "Attribute"),
        ("x + 1", "Name"),
        ("'a' * 3", "not a number"),
        ("True + 1", "not a number"),
        ("[1, 2]", "List"),
        ("lambda: 1", "Lambda"),
        ("9**9**9", "exponent"),
        ("10**15 * 10", "too large"),
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("1 +", "syntax"),
        ("1" * 300, "longer than"),
        ("1 << 3", "operator not allowed"),
        ("1j", "not a number"),
    ],
)
def test_evaluator_refuses(expr, reason):
    with pytest.raises(calc.CalcError, match=reason):
        calc.evaluate(expr)


def test_calculator_episode():
    env = make_env("calculator")
    obs = env.reset(3)
    p = env.problem
    assert p["question"] in obs and "<calc>" in obs
    assert calc.evaluate(p["expression"]) == p["answer"]
    o, r, done, info = env.step(f"let me compute <calc>{p['expression']}</calc>")
    assert o == f"<result>{p['answer']}</result>\n" and r == 0.0 and not done
    o, r, done, info = env.step("<calc>1/0</calc>")
    assert o == "<result>error: division by zero</result>\n" and not done
    o, r, done, info = env.step("hmm")
    assert info["invalid"] and not done and "<answer>" in o
    o, r, done, info = env.step(f"<calc>1+1</calc> so <answer>{p['answer']}</answer>")
    assert done and r == 1.0 and info["success"]
    env.reset(3)
    _, r, done, info = env.step(f"<answer>{p['answer'] + 1}</answer>")
    assert done and r == 0.0 and not info["success"]
    env.reset(3)
    _, r, _, _ = env.step(f"<answer>{p['answer']}.0</answer>")
    assert r == 1.0
    assert calc.parse_answer("1,000") == 1000 and calc.parse_answer("3/4") == Fraction(3, 4)
    assert calc.parse_answer("abc") is None and calc.format_number(Fraction(1, 3)) == "0.333333"


def test_calculator_problems_are_seeded_and_whole():
    assert calc.make_problem(5) == calc.make_problem(5)
    questions = {calc.make_problem(s)["question"] for s in range(50)}
    assert len(questions) == 50
    for s in range(200):
        p = calc.make_problem(s, max_number=20)
        assert isinstance(p["answer"], int) and p["answer"] >= 0


def test_calculator_custom_syntax():
    env = make_env(
        "calculator",
        syntax={"call_open": "[", "call_close": "]", "result_open": "=", "result_close": ";"},
    )
    env.reset(0)
    assert env.step("[2*21]")[0] == "=42;\n"
