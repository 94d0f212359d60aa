"""The test tiers by folder (tests/conftest.py; CONTRIBUTING.md, "Test tiers"): every test file lies in exactly one of
tests/unit/, tests/training/ and tests/e2e/, in its tier's folder for the subsystem it tests (a subpackage of tuner, or
one of the agreed folders for what is no one subpackage), and no two test files share a name (pytest imports each by
its file name); a test file put anywhere else fails collection, and each test gets its tier's mark."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from helpers import REPO, TESTS

TIERS = ("unit", "training", "e2e")
# A tier's folders for what is no one subpackage: the docs, the bench, the command line as a whole, the layout rules.
EXTRA = {"docs", "bench", "cli", "layout"}


def subsystems(package: Path) -> set[str]:
    return {p.parent.name for p in package.glob("*/__init__.py")} - {"search_spaces"}  # search_spaces: data only


def misplaced(tests: Path, folders: set[str]) -> list[str]:
    """What is wrong with where the test files under ``tests`` lie, one line each: nothing when all is well."""
    wrong, seen = [], {}
    for path in sorted(tests.rglob("test_*.py")):
        where = path.relative_to(tests)
        if where.parts[0] not in TIERS:
            wrong.append(f"{where}: in no tier's folder")
        elif len(where.parts) != 3 or where.parts[1] not in folders:
            wrong.append(f"{where}: not in a folder of its tier named for a subsystem")
        if path.name in seen:
            wrong.append(f"{where}: the same name as {seen[path.name]}")
        seen[path.name] = where
    for tier in TIERS:
        for folder in sorted(p for p in (tests / tier).glob("*") if p.is_dir() and p.name != "__pycache__"):
            if folder.name not in folders:
                wrong.append(f"{folder.relative_to(tests)}/: no subsystem of that name")
    return wrong


def long_files(conftest: Path) -> list[str]:
    """tests/conftest.py's LONG_FILES, read without importing it."""
    (value,) = [node.value for node in ast.parse(conftest.read_text()).body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "LONG_FILES" for t in node.targets)]
    return ast.literal_eval(value)


def test_every_test_file_is_in_one_tier_in_its_subsystems_folder():
    folders = subsystems(REPO / "tuner") | EXTRA
    assert {"config", "search", "trial", "verdicts"} <= folders  # the subpackages were found
    assert misplaced(TESTS, folders) == []
    for tier in TIERS:
        assert list((TESTS / tier).rglob("test_*.py")), f"tests/{tier}/ holds no test"


def test_the_check_finds_a_file_outside_the_tiers_a_folder_of_no_subsystem_and_a_name_twice(tmp_path):
    for name in ("unit/search/test_a.py", "e2e/search/test_b.py", "test_top.py", "search/test_c.py",
                 "training/serach/test_d.py", "unit/search/deeper/test_e.py", "e2e/trial/test_a.py",
                 "data/test_f.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("def test_x():\n    pass\n")
    (tmp_path / "unit" / "nosuch").mkdir()
    assert misplaced(tmp_path, {"search", "trial"}) == [
        "data/test_f.py: in no tier's folder",
        "search/test_c.py: in no tier's folder",
        "test_top.py: in no tier's folder",
        "training/serach/test_d.py: not in a folder of its tier named for a subsystem",
        "unit/search/deeper/test_e.py: not in a folder of its tier named for a subsystem",
        "unit/search/test_a.py: the same name as e2e/trial/test_a.py",
        "unit/nosuch/: no subsystem of that name",
        "training/serach/: no subsystem of that name",
    ]


def test_every_long_file_conftest_orders_first_is_a_test_file_of_a_tier():
    paths = long_files(TESTS / "conftest.py")
    assert paths and len(set(paths)) == len(paths)
    for path in paths:
        assert (REPO / path).is_file(), path
        assert Path(path).parts[:2] in {("tests", tier) for tier in TIERS}, path


def test_a_test_file_outside_the_tiers_fails_collection_and_each_test_gets_its_tiers_mark(tmp_path):
    """The real tests/conftest.py in a made-up tree: a stray test file fails collection, naming itself and the
    tiers' folders; without it, ``-m unit`` selects the unit tier's tests alone."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    for path in long_files(TESTS / "conftest.py"):  # conftest checks that each exists
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    for name in ("unit/config/test_one.py", "training/trial/test_two.py", "e2e/search/test_three.py",
                 "search/test_stray.py"):
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text("def test_it():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    unit\n    training\n    e2e\n")

    def collect(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               "-p", "no:randomly", *args, "tests"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)

    stray = collect()
    assert stray.returncode != 0, stray.stdout
    assert ("tests/search/test_stray.py: a test file must be in one of tests/unit/, tests/training/ or tests/e2e/"
            in stray.stdout), stray.stdout
    (tests / "search" / "test_stray.py").unlink()
    for mark, expected in (("unit", "tests/unit/config/test_one.py::test_it"),
                           ("training", "tests/training/trial/test_two.py::test_it"),
                           ("e2e", "tests/e2e/search/test_three.py::test_it")):
        done = collect("-m", mark)
        assert done.returncode == 0, done.stdout + done.stderr
        assert [line for line in done.stdout.splitlines() if "::" in line] == [expected], done.stdout
