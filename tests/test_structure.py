"""The package stays layered (docs/design.md, "Layers"): measured from its own imports, lazy
imports inside functions included (TYPE_CHECKING blocks left out), there is no import cycle,
no module imports an underscore name from another, no file is over 600 lines, at most 8
modules sit in the package root, no function takes more than 12 parameters, and every
module has its test file (tests/<path>/test_<module>.py). The layer order itself is the
import-linter contract in pyproject.toml (`make lint`)."""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(REPO, "jaxrl_frontier")


def modules() -> dict[str, str]:
    """dotted name -> path, packages by their own name."""
    out = {}
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    assert out, f"no modules under {PKG}"  # a moved test file must not pass on nothing
    return out


def imports(mods: dict[str, str]) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the package modules it imports, private names imported across modules)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        tree = ast.parse(open(path).read())

        def visit(node, in_type_checking=False):
            for child in ast.iter_child_nodes(node):
                tc = in_type_checking or (
                    isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
                )
                if isinstance(child, ast.ImportFrom) and not tc and child.level == 0:
                    base = child.module or ""
                    for alias in child.names:
                        target = f"{base}.{alias.name}"
                        target = target if target in mods else base
                        if target in mods and target != mod:
                            graph[mod].add(target)
                            if alias.name.startswith("_") and target == base:
                                private.append(f"{path}:{child.lineno} {alias.name}")
                elif isinstance(child, ast.Import) and not tc:
                    graph[mod] |= {a.name for a in child.names if a.name in mods} - {mod}
                visit(child, tc)

        visit(tree)
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_and_no_private_cross_import():
    graph, private = imports(modules())
    assert cycles(graph) == []
    assert private == []


def test_root_modules_file_lengths_and_signatures():
    mods = modules()
    root = [
        m for m, p in mods.items() if os.path.dirname(p) == PKG and not p.endswith("__init__.py")
    ]
    assert len(root) <= 8, root
    long = {p: n for p in mods.values() if (n := sum(1 for _ in open(p))) > 600}
    assert long == {}
    wide = []
    for path in mods.values():
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                n = len(names) - (names[:1] in (["self"], ["cls"]))
                if n > 12:
                    wide.append(f"{path}:{node.lineno} {node.name} ({n})")
    assert wide == []


@pytest.mark.parametrize("upward", ["from jaxrl_frontier.run import trainer"])
def test_a_lazy_upward_import_would_be_seen(upward, tmp_path):
    """The graph counts an import inside a function: the one a cycle hides behind."""
    mods = modules()
    probe = tmp_path / "probe.py"
    probe.write_text(f"def f():\n    {upward}\n")
    graph, _ = imports({**mods, "jaxrl_frontier.core.probe": str(probe)})
    assert "jaxrl_frontier.run.trainer" in graph["jaxrl_frontier.core.probe"]


def shape_problems(paths: dict[str, str]) -> list[str]:
    """What keeps the wiring plain (docs/design.md, "The wiring"): no function over 80
    lines; in run/ and rl/ no capability probe (`hasattr`, a `getattr` with a default) and no
    `isinstance` on a class of the package (a stage's class: dispatch belongs to declared
    capabilities and registries); the loop file at most 250 lines, with no branch on the
    mode. paths: {dotted module: file}."""
    found = []
    for mod, path in paths.items():
        source = open(path).read()
        tree = ast.parse(source)
        ours = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxrl_frontier")
            for alias in node.names
        }
        wiring = mod.startswith(("jaxrl_frontier.run", "jaxrl_frontier.rl"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := node.end_lineno - node.lineno + 1) > 80:
                    found.append(f"{path}:{node.lineno} {node.name}: {n} lines")
            if not (wiring and isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            name, args = node.func.id, node.args
            probe = name == "hasattr" or (name == "getattr" and len(args) == 3)
            classes = args[1:2] if name == "isinstance" else []
            classes = [c for a in classes for c in (a.elts if isinstance(a, ast.Tuple) else [a])]
            if probe or any(isinstance(c, ast.Name) and c.id in ours for c in classes):
                found.append(f"{path}:{node.lineno} {ast.unparse(node)}")
        if mod == "jaxrl_frontier.run.trainer":
            if (n := len(source.splitlines())) > 250:
                found.append(f"{path}: the loop file is {n} lines")
            for node in ast.walk(tree):
                if isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Constant) and side.value in ("rl", "sft")
                    for side in [node.left, *node.comparators]
                ):
                    found.append(f"{path}:{node.lineno} a branch on the mode")
    return found


def test_functions_are_short_and_the_wiring_declares_instead_of_probing():
    assert shape_problems(modules()) == []


def test_shape_problems_are_seen(tmp_path):
    """Each rule fires on a planted module (the check can fail)."""
    probe = tmp_path / "trainer.py"
    long_body = "\n".join(f"    x{i} = {i}" for i in range(81))
    probe.write_text(
        "from jaxrl_frontier.rl.produce.producer import RolloutProducer\n"
        f"def long():\n{long_body}\n"
        "def probe(part, c):\n"
        "    if hasattr(part, 'metrics') or getattr(part, 'x', None):\n"
        "        return isinstance(part, RolloutProducer) or c.mode == 'rl'\n"
        "    return isinstance(part, dict)\n" + "\n" * 170
    )
    found = shape_problems({"jaxrl_frontier.run.trainer": str(probe)})
    assert len(found) == 6, found  # long, hasattr, getattr, isinstance, 250 lines, the mode
    assert not any("isinstance(part, dict)" in f for f in found)


# Modules without logic of their own, so without a test file: records and constants only
# (every config section's `defaults.py` is checked through the schema, tests/run/config/test_schema.py).
NO_LOGIC = {
    "jaxrl_frontier/objectives/stats.py": "the TokenStats record and the tuple of its fields",
}


def test_every_module_has_its_test_file():
    """Tests mirror the package: jaxrl_frontier/<path>/<module>.py is tested in
    tests/<path>/test_<module>.py (packages' __init__ and the sections' defaults aside)."""
    missing, stale = [], [p for p in NO_LOGIC if not os.path.exists(os.path.join(REPO, p))]
    for path in modules().values():
        rel = os.path.relpath(path, REPO)
        base = os.path.basename(path)
        if base in ("__init__.py", "defaults.py") or rel in NO_LOGIC:
            continue
        folder = os.path.dirname(os.path.relpath(path, PKG))
        want = os.path.join("tests", folder, f"test_{base}")
        if not os.path.exists(os.path.join(REPO, want)):
            missing.append(f"{rel} -> {want}")
    assert not missing, f"modules without their test file: {missing}"
    assert not stale, f"NO_LOGIC names modules that are gone: {stale}"
