"""Sweep files (sweeps/spec.py): the grid, zip, product and seed helpers, run names and
group keys, sweep names, and the errors of a bad sweep file (also through the CLI)."""

import os
import subprocess
import sys

import pytest

from jaxrl_frontier.core.errors import SweepError
from jaxrl_frontier.sweeps import grid, load_sweep, product, run_name, seeds, zip_
from jaxrl_frontier.sweeps.spec import group_key, sweep_name, varying_keys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_sweep(tmp_path, body: str, name: str = "sweep.py") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def test_grid_zip_product_seeds():
    assert grid(a=[1, 2], b=["x", "y"]) == [
        dict(a=1, b="x"),
        dict(a=1, b="y"),
        dict(a=2, b="x"),
        dict(a=2, b="y"),
    ]
    assert grid(a=[1, 2], b=5) == [dict(a=1, b=5), dict(a=2, b=5)]
    assert zip_(a=[1, 2], b=[3, 4]) == [dict(a=1, b=3), dict(a=2, b=4)]
    assert seeds(3, start=1) == [dict(seed=1), dict(seed=2), dict(seed=3)]
    assert product(zip_(a=[1, 2], b=[3, 4]), seeds(2)) == [
        dict(a=1, b=3, seed=0),
        dict(a=1, b=3, seed=1),
        dict(a=2, b=4, seed=0),
        dict(a=2, b=4, seed=1),
    ]
    with pytest.raises(SweepError, match="differ in length"):
        zip_(a=[1, 2], b=[3, 4, 5])
    with pytest.raises(SweepError, match=r"\['a'\] set by two factors"):
        product(grid(a=[1]), grid(a=[2]))


def test_run_names_are_stable_safe_and_distinct():
    o = {"config": "configs/dr_grpo_arith.py:runlocal", "optimizer.lr": 0.0003, "seed": 1}
    assert run_name(o) == "config=dr_grpo_arith-runlocal__optimizer.lr=0.0003__seed=1"
    assert run_name(dict(reversed(list(o.items())))) == run_name(o)  # key order is irrelevant
    assert run_name({"task.kwargs.prompt_template": "{a} / {b}="}) == (
        "task.kwargs.prompt_template=-a-b-="
    )
    runs = [dict(a=1, b=2, seed=0), dict(a=1, b=3, seed=0)]
    assert varying_keys(runs) == {"b"}
    names = [run_name(r, varying_keys(runs)) for r in runs]
    assert names[0].startswith("b=2--") and names[1].startswith("b=3--")
    # a shared value hidden from the name still changes it (its hash): no stale skip
    assert run_name(dict(a=9, b=2, seed=0), {"b"}) != names[0]
    long = run_name({"k": "x" * 500})
    assert len(long) <= 160 and long != run_name({"k": "x" * 499})


@pytest.mark.parametrize(
    "body, message",
    [
        ("X = 1\n", "defines no get_sweep"),
        ("def get_sweep():\n    return []\n", "non-empty list of dicts"),
        ("def get_sweep():\n    return [{'a': [1, 2]}]\n", r"run 0: a=\[1, 2\] is a list"),
        ("def get_sweep():\n    return [{'a b': 1}]\n", "key 'a b' is not a config key"),
        ("def get_sweep():\n    return [{'a': 1}, {'a': 1}]\n", "runs 0 and 1 are the same"),
        ("import nowhere_module\n", "ModuleNotFoundError"),
        (
            "from jaxrl_frontier.sweeps import zip_\ndef get_sweep():\n"
            "    return zip_(a=[1], b=[1, 2], c=[1, 2, 3])\n",
            "differ in length",
        ),
    ],
)
def test_bad_sweep_files_name_the_file_and_the_problem(tmp_path, body, message):
    path = write_sweep(tmp_path, body)
    with pytest.raises(SweepError, match=message) as err:
        load_sweep(path)
    assert path in str(err.value)


def test_cli_reports_a_bad_sweep_file_in_one_line(tmp_path):
    path = write_sweep(tmp_path, "def get_sweep():\n    return [{'a': None}]\n")
    cmd = [sys.executable, os.path.join(REPO, "scripts", "sweep.py"), "run", path]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"sweep error: sweep file {path}: run 0: a=None is a NoneType;"
        " values must be bool, int, float or str"
    )


def test_group_key_drops_the_seed_and_sweep_name_the_stage():
    a = {"optimizer.lr": 0.001, "seed": 0}
    b = {"optimizer.lr": 0.001, "seed": 7}
    assert group_key(a) == group_key(b) == "optimizer.lr=0.001"
    assert group_key({"optimizer.lr": 0.002, "seed": 0}) != group_key(a)
    assert sweep_name("sweeps/claim_a.py") == "claim_a"
    assert sweep_name("sweeps/claim_e.py:sft") == "claim_e_sft"
    with pytest.raises(SweepError, match="n must be >= 1, got 0"):
        seeds(0)


def test_a_staged_sweep_file_gives_the_stage_its_runs(tmp_path):
    path = write_sweep(
        tmp_path,
        "def get_sweep(stage='a'):\n    return [{'x': 1}] if stage == 'a' else [{'x': 2}]\n",
    )
    assert load_sweep(path) == [{"x": 1}]
    assert load_sweep(f"{path}:b") == [{"x": 2}]
    with pytest.raises(SweepError, match="no such file"):
        load_sweep(str(tmp_path / "missing.py"))
