"""The code's layout rules, checked on the source: the subsystems' import directions, no import circles, and
each idea spelled in its own module.

- tuner/ is a stack of subsystems (docs/architecture.md); a module imports only from its own subsystem and those
  below it in ``MAY_IMPORT``: cli -> jobs / search -> report -> trial -> verdicts / inputs -> config -> stores -> core.
  Function-level imports count: a lazy import is still an arrow.
- No module of tuner/ imports, directly or through others, a module that imports it back.
- Status values appear as string literals only in tuner/records.py, trainer names only in tuner/config/trainers.py,
  MLflow tag names only in tuner/stores/tags.py (docstrings, which show usage, aside). A new status, trainer or tag
  is then one edit in one place.
- A subpackage's lazily exported names are declared for type checkers too (its ``if TYPE_CHECKING:`` imports),
  and importing tuner and every subpackage imports no heavy library (``tuner --help`` stays instant).
- bench/ has no import circle either, among its modules or among its kinds (its folders: common, headline, studies,
  horizon, gpu), and bench/common imports nothing else of bench; bench uses tuner's public names only: no
  ``tuner.<anything>._name`` module or name.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.config.trainers import ADAPTERS
from tuner.records import Status
from tuner.stores import tags

PACKAGE = Path(__file__).resolve().parents[3] / "tuner"
BENCH = PACKAGE.parent / "bench"

# What each subsystem may import besides itself. "core" is tuner's vocabulary (tuner/errors.py, tuner/records.py,
# tuner/__init__.py), which every subsystem shares; "cli" is tuner/cli.py.
MAY_IMPORT = {
    "cli": {"jobs", "search", "report", "trial", "verdicts", "inputs", "config", "stores", "core"},
    "jobs": {"config", "core"},
    "search": {"report", "trial", "verdicts", "inputs", "config", "stores", "core"},
    "report": {"verdicts", "inputs", "config", "stores", "core"},
    "trial": {"verdicts", "inputs", "config", "stores", "core"},
    "verdicts": {"config", "core"},
    "inputs": {"config", "stores", "core"},
    "config": {"core"},
    "stores": {"core"},
    "core": set(),
}

# Strings that equal a status or trainer name but mean something else, each with why.
NOT_A_NAME = {
    ("verdicts/guard.py", "reward"): "TRL's logged metric of the mean reward",
    ("verdicts/learning.py", "reward"): "the progress metric's name (higher is better), from the trainer entry",
    ("trial/_faults.py", "oom"): "a fault kind the test hook injects",
}


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path], root: str = "tuner") -> set[str]:
    """The modules of ``root`` (tuner, or bench) that ``path`` imports; ``from tuner.pkg import module`` is an arrow to
    the module alone (the package's ``__init__`` only hands names on), ``from tuner.pkg import name`` one to the
    package."""
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == root:
            submodules = {f"{node.module}.{a.name}" for a in node.names} & set(modules)
            deps |= submodules
            if node.module in modules and len(submodules) < len(node.names):
                deps.add(node.module)
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name in modules}
    return deps


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = _modules(package)
    return {name: _imports(path, modules, package.name) - {name} for name, path in modules.items()}


def subsystem(module: str) -> str:
    parts = module.split(".")
    if parts[1:] == ["cli"]:
        return "cli"
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in MAY_IMPORT):
        return parts[1]
    return "core"  # tuner, tuner.errors, tuner.records


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs against MAY_IMPORT, as "importer -> imported (from -> to)"."""
    return sorted(f"{a} -> {b} ({subsystem(a)} -> {subsystem(b)})" for a, deps in graph.items() for b in deps
                  if subsystem(b) != subsystem(a) and subsystem(b) not in MAY_IMPORT[subsystem(a)])


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


def test_the_direction_check_finds_an_import_up_the_stack(tmp_path):
    # A made-up package where a verdict imports the search and the config imports a store: both are refused;
    # the search importing a verdict, a module importing its own subsystem and everyone importing core are not.
    files = {
        "tuner/__init__.py": "", "tuner/errors.py": "",
        "tuner/verdicts/__init__.py": "", "tuner/verdicts/guard.py": "from tuner.search import driver\nimport tuner.errors\n",
        "tuner/search/__init__.py": "", "tuner/search/driver.py": "from tuner.verdicts.guard import Guard\n"
                                                                   "from tuner.search import other\n",
        "tuner/search/other.py": "",
        "tuner/config/__init__.py": "", "tuner/config/space.py": "def f():\n    from tuner.stores import cache\n",
        "tuner/stores/__init__.py": "", "tuner/stores/cache.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert wrong_way(_graph(tmp_path / "tuner")) == [
        "tuner.config.space -> tuner.stores.cache (config -> stores)",
        "tuner.verdicts.guard -> tuner.search.driver (verdicts -> search)",
    ]


def test_imports_run_down_the_stack():
    assert wrong_way(_graph()) == []


def test_every_subpackage_is_a_subsystem():
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")} - {"search_spaces"}
    assert packages == set(MAY_IMPORT) - {"cli", "core"}


def test_no_import_circles():
    assert _cycles(_graph()) == []


# -- bench/ ------------------------------------------------------------------------------------------------------------


def kind(module: str) -> str:
    """A bench module's kind: its folder under bench/ (bench.studies.slots: studies); "bench" for bench/__init__.py
    and bench/__main__.py."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "bench"


def kinds_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which kinds each kind imports (its own aside)."""
    out: dict[str, set[str]] = {}
    for a, deps in graph.items():
        out.setdefault(kind(a), set()).update(kind(b) for b in deps if kind(b) != kind(a))
    return out


def private_imports(package: Path = BENCH) -> list[str]:
    """Every import of a private tuner module or name in ``package`` (``from tuner.search._extend import x``,
    ``from tuner.inputs import _tiny_pretrained``, ``import tuner.trial._faults``), as "path:line name"."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tuner":
                names = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names if a.name.split(".")[0] == "tuner"}
            else:
                continue
            where = path.relative_to(package.parent)
            found += [f"{where}:{node.lineno} {name}" for name in sorted(names)
                      if any(part.startswith("_") for part in name.split(".")[1:])]
    return found


def test_the_bench_checks_find_a_circle_a_kind_circle_and_a_private_import(tmp_path):
    # A made-up bench: a study and the headline's report importing each other (a circle of modules, and of kinds),
    # common importing a study, and a study importing a private module of tuner and a private name of a public one.
    files = {
        "bench/__init__.py": "", "bench/common/__init__.py": "", "bench/common/results.py": "from bench.studies import slots\n",
        "bench/studies/__init__.py": "",
        "bench/studies/slots.py": "from bench.headline import report\nfrom tuner.search import _extend, prepare\n",
        "bench/studies/warm_start.py": "def f():\n    from tuner.inputs._tiny_pretrained import RECORD\n"
                                       "    from tuner.inputs import resolve_model\n",
        "bench/headline/__init__.py": "", "bench/headline/report.py": "from bench.studies import slots, warm_start\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = _graph(tmp_path / "bench")
    assert _cycles(graph) == [["bench.headline.report", "bench.studies.slots"]]
    assert kinds_graph(graph)["common"] == {"studies"}
    assert _cycles(kinds_graph(graph)) == [["headline", "studies"]]
    assert private_imports(tmp_path / "bench") == [
        "bench/studies/slots.py:2 tuner.search._extend",
        "bench/studies/warm_start.py:2 tuner.inputs._tiny_pretrained",
        "bench/studies/warm_start.py:2 tuner.inputs._tiny_pretrained.RECORD",
    ]


def test_bench_has_no_import_circle_among_its_modules_or_its_kinds():
    graph = _graph(BENCH)
    assert {"bench.headline.run", "bench.common.results", "bench.studies.warm_start"} <= set(graph)  # bench was read
    assert _cycles(graph) == []
    kinds = kinds_graph(graph)
    assert _cycles(kinds) == []
    assert kinds["common"] == set()  # every kind may import common: it imports nothing else of bench


def test_bench_imports_no_private_tuner_module_or_name():
    assert private_imports() == []


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


TAG_NAMES = {value for name, value in vars(tags).items() if name.endswith("_TAG")}


@pytest.mark.parametrize("home, names", [("records.py", {s.value for s in Status}),
                                         ("config/trainers.py", set(ADAPTERS)),
                                         ("stores/tags.py", TAG_NAMES)])
def test_names_are_spelled_only_in_their_home(home, names):
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        if where == home:
            continue
        stray += [f"{where}:{line} {value!r}" for line, value in _literals(path)
                  if value in names and (where, value) not in NOT_A_NAME]
    assert stray == []


def _lazy_and_declared(init: Path) -> tuple[dict[str, str], dict[str, str]]:
    """A subpackage's lazy exports (name -> module, its ``lazy_exports`` call) and the names its ``if TYPE_CHECKING``
    block imports for type checkers (name -> module, each ``from module import name as name``)."""
    tree = ast.parse(init.read_text())
    lazy, declared = {}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports":
            lazy = {k.value: v.value for k, v in zip(node.args[1].keys, node.args[1].values)}
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            declared |= {a.name: i.module for i in node.body if isinstance(i, ast.ImportFrom) for a in i.names
                         if a.asname == a.name}
    return lazy, declared


@pytest.mark.parametrize("init", sorted(p for p in PACKAGE.glob("*/__init__.py") if "lazy_exports" in p.read_text()),
                         ids=lambda p: p.parent.name)
def test_lazy_exports_are_declared_for_type_checkers(init):
    # Editors and mypy see a lazily exported name where it lives only through the TYPE_CHECKING import.
    lazy, declared = _lazy_and_declared(init)
    assert lazy and declared == lazy


def test_the_package_and_its_subpackages_import_no_heavy_library():
    # `tuner --help` answers at once: the subpackages' names are imported when first used, whatever a type checker
    # is shown (TYPE_CHECKING is False at run time).
    heavy = ["torch", "transformers", "trl", "peft", "datasets", "ray", "optuna", "mlflow", "pydantic", "matplotlib",
             "scipy"]
    code = ("import sys, tuner.cli\n"
            + "".join(f"import tuner.{p.parent.name}\n" for p in sorted(PACKAGE.glob("*/__init__.py")))
            + f"print(' '.join(m for m in {heavy!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
