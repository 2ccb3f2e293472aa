r"""Mutation testing of a module: does some test fail when the code is wrong?

    python scripts/mutants.py jaxrl_frontier/objectives/advantages.py \
        tests/objectives/test_advantages.py tests/objectives/test_advantage_terms.py \
        --workers 2 --out artifacts/mutants_advantages.json

Each mutant changes one operator or constant inside a function body of the module
(`OPERATORS`: + - * / ** swapped, a comparison turned, `and` / `or` swapped, a unary minus or
`not` dropped, an integer or float constant c -> c + 1, True / False swapped,
`jnp.maximum` / `jnp.minimum` and `jnp.sum` / `jnp.mean` swapped), is written into a
scratch copy of the repository, and the given tests run on it in a fresh process (pytest
-x: the first failure kills it), after they passed once on the unmutated copy. A mutant no test fails survived. Docstrings, error messages
and code outside functions are not mutated. The JSON lists every mutant with its line, the
change and its outcome; the summary line gives killed / survived / timed out.

Why not mutmut: mutmut 3 runs the tests once and then forks a child per mutant from that
process, whose jitted functions are already compiled from the unmutated code, so a JAX
function's mutant would run the cached original and survive.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BINARY = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.Pow: ast.Mult,
}
COMPARE = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}  # fmt: skip
BOOL = {ast.And: ast.Or, ast.Or: ast.And}
CALLS = {"maximum": "minimum", "minimum": "maximum", "sum": "mean", "mean": "sum"}
OPERATORS = ("binary", "compare", "bool", "unary", "constant", "call")


def _in_functions(tree: ast.Module):
    """The nodes inside function bodies, docstrings and raise statements left out."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.update(map(id, ast.walk(body[0])))
        if isinstance(node, (ast.Raise, ast.JoinedStr)):
            skip.update(map(id, ast.walk(node)))
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for node in ast.walk(fn):
                if id(node) not in skip and node is not fn:
                    yield node


def sites(source: str) -> list[tuple[str, int, str]]:
    """Every (operator kind, node index, description) of one-change mutants of `source`;
    the index is the node's place in `ast.walk` order (the same on a fresh parse)."""
    tree = ast.parse(source)
    index = {id(n): i for i, n in enumerate(ast.walk(tree))}
    found = set()
    for node in _in_functions(tree):
        i, line = index[id(node)], getattr(node, "lineno", 0)
        if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
            new = BINARY[type(node.op)].__name__
            found.add(("binary", i, f"line {line}: {type(node.op).__name__} -> {new}"))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARE:
            old, new = type(node.ops[0]).__name__, COMPARE[type(node.ops[0])].__name__
            found.add(("compare", i, f"line {line}: {old} -> {new}"))
        elif isinstance(node, ast.BoolOp):
            found.add(("bool", i, f"line {line}: {type(node.op).__name__} swapped"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
            found.add(("unary", i, f"line {line}: {type(node.op).__name__} dropped"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            found.add(("constant", i, f"line {line}: {node.value!r} changed"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CALLS
        ):
            found.add(("call", i, f"line {line}: {node.func.attr} -> {CALLS[node.func.attr]}"))
    return sorted(found, key=lambda s: (int(s[2].split()[1].rstrip(":")), s[1]))


def mutate(source: str, kind: str, index: int) -> str:
    """`source` with the one change (kind, index) of `sites`."""
    tree = ast.parse(source)
    node = list(ast.walk(tree))[index]
    if kind == "binary":
        node.op = BINARY[type(node.op)]()
    elif kind == "compare":
        node.ops = [COMPARE[type(node.ops[0])]()]
    elif kind == "bool":
        node.op = BOOL[type(node.op)]()
    elif kind == "unary":  # -x -> +x; not x -> not not x (x's truth)
        if isinstance(node.op, ast.USub):
            node.op = ast.UAdd()
        else:
            node.operand = ast.UnaryOp(op=ast.Not(), operand=node.operand)
    elif kind == "constant":
        v = node.value
        node.value = (not v) if isinstance(v, bool) else v + 1
    elif kind == "call":
        node.func.attr = CALLS[node.func.attr]
    return ast.unparse(ast.fix_missing_locations(tree))


def run_mutant(scratch: Path, module: str, source: str, site, tests, timeout: float) -> dict:
    kind, index, what = site
    (scratch / module).write_text(mutate(source, kind, index))
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    env = dict(os.environ, PYTHONPATH=str(scratch))  # the scratch copy, not an editable install
    try:
        proc = subprocess.run(
            cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout
        )
        outcome = "survived" if proc.returncode == 0 else "killed"
        failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")][:1]
    except subprocess.TimeoutExpired:
        outcome, failed = "timeout", []
    return dict(kind=kind, what=what, outcome=outcome, seconds=time.perf_counter() - t0,
                caught_by=failed[0][7:] if failed else None)  # fmt: skip


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("module", help="the file to mutate, relative to the repository root")
    p.add_argument("tests", nargs="+", help="the test files or node ids to run per mutant")
    p.add_argument("--workers", type=int, default=2, help="mutants run at a time")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    p.add_argument("--kinds", default=",".join(OPERATORS), help=f"from {OPERATORS}")
    p.add_argument("--lines", default="", help="only mutants on these lines (e.g. 59,87-92)")
    p.add_argument("--out", default="", help="JSON of every mutant and its outcome")
    args = p.parse_args(argv)
    source = (ROOT / args.module).read_text()
    kinds = set(args.kinds.split(","))
    todo = [s for s in sites(source) if s[0] in kinds]
    if args.lines:
        keep = set()
        for part in args.lines.split(","):
            lo, _, hi = part.partition("-")
            keep.update(range(int(lo), int(hi or lo) + 1))
        todo = [s for s in todo if int(s[2].split()[1].rstrip(":")) in keep]
    print(f"[mutants] {args.module}: {len(todo)} mutants", file=sys.stderr)
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "runs", "artifacts", "__pycache__", "*.egg-info"
    )
    with tempfile.TemporaryDirectory() as tmp:
        scratches = []
        for w in range(args.workers):  # one copy per worker: each holds one mutant at a time
            shutil.copytree(ROOT, Path(tmp) / f"w{w}", ignore=ignore)
            scratches.append(Path(tmp) / f"w{w}")
        baseline = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args.tests],
            cwd=scratches[0], env=dict(os.environ, PYTHONPATH=str(scratches[0])),
            capture_output=True, text=True,
        )  # fmt: skip
        if baseline.returncode:  # every mutant would count as killed
            sys.exit(f"[mutants] the tests fail on the unmutated code:\n{baseline.stdout[-2000:]}")
        free = list(scratches)
        results = []
        env_note = os.environ.get("XLA_FLAGS", "")
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            futures = {}
            for site in todo:
                if not free:
                    done = next(concurrent.futures.as_completed(futures))
                    free.append(futures.pop(done))
                    results.append(done.result())
                    print(f"[mutants] {len(results)}/{len(todo)} {results[-1]}", file=sys.stderr)
                scratch = free.pop()
                fut = pool.submit(
                    run_mutant, scratch, args.module, source, site, args.tests, args.timeout
                )
                futures[fut] = scratch
            for done in concurrent.futures.as_completed(futures):
                results.append(done.result())
                print(f"[mutants] {len(results)}/{len(todo)} {results[-1]}", file=sys.stderr)
    counts = {k: sum(r["outcome"] == k for r in results) for k in ("killed", "survived", "timeout")}
    summary = dict(module=args.module, tests=args.tests, mutants=len(results), **counts,
                   xla_flags=env_note, results=sorted(results, key=lambda r: r["what"]))  # fmt: skip
    print(f"[mutants] {args.module}: {json.dumps(counts)}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()
