"""The code's layout rules, checked on the source: no import circles, and each idea spelled in its own module.

- No module of tuner/ imports, directly or through others, a module that imports it back (function-level
  imports count: a lazy import is still an arrow).
- Status values appear as string literals only in tuner/records.py, trainer names only in tuner/trainers.py
  (docstrings, which show usage, aside). A new status or trainer is then one edit in one place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tuner.records import Status
from tuner.trainers import ADAPTERS

PACKAGE = Path(__file__).resolve().parent.parent / "tuner"

# Strings that equal a status or trainer name but mean something else, each with why.
NOT_A_NAME = {
    ("guard.py", "reward"): "TRL's logged metric of the mean reward",
    ("learning.py", "reward"): "the progress metric's name (higher is better), from the trainer entry",
    ("trial/faults.py", "oom"): "a fault kind the test hook injects",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tuner"):
            if node.module in modules and node.module != "tuner":
                deps.add(node.module)
            deps |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name in modules}
    return deps


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


@pytest.mark.parametrize("home, names", [("records.py", {s.value for s in Status}), ("trainers.py", set(ADAPTERS))])
def test_names_are_spelled_only_in_their_home(home, names):
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        if where == home:
            continue
        stray += [f"{where}:{line} {value!r}" for line, value in _literals(path)
                  if value in names and (where, value) not in NOT_A_NAME]
    assert stray == []
