"""One name per package: the repository's folders are imported by their package names only.

pyproject maps tracer/ -> ``draftscope_tracer``, app/ -> ``draftscope`` and migrations/ ->
``draftscope.migrations``; with the checkout on ``sys.path`` the folder names import too, and a module
imported under both names is two modules (two registries, two configs). So no code imports a folder name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDER_NAMES = {"tracer": "draftscope_tracer", "app": "draftscope", "migrations": "draftscope.migrations"}
SCANNED = ("app", "bench", "docker", "migrations", "scripts", "testbed", "tests", "tracer")


def _is_python(path: Path) -> bool:
    if path.suffix:
        return path.suffix == ".py"
    first_line = path.read_bytes().split(b"\n", 1)[0]
    return first_line.startswith(b"#!") and b"python" in first_line


def python_files() -> list[Path]:
    """Every Python file under ``SCANNED``, scripts without a ``.py`` suffix included (by their shebang)."""
    return [path for top in SCANNED for path in sorted((REPO / top).rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts and _is_python(path)]


def folder_imports(source: str, folders=FOLDER_NAMES) -> list[str]:
    """``line: module`` for each absolute import of one of ``folders`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        else:
            continue
        found += [f"{node.lineno}: {name}" for name in names if name.split(".")[0] in folders]
    return found


def test_the_scan_sees_python_files_of_every_kind() -> None:
    names = {p.relative_to(REPO).as_posix() for p in python_files()}
    assert {"tracer/transport/wire.py", "bench/gpu_hooks.py", "testbed/gpu/hooks_path.py", "scripts/record-demo"} <= names


@pytest.mark.parametrize("source, found", [
    ("from tracer.health import Health", ["1: tracer.health"]),
    ("import app.db", ["1: app.db"]),
    ("x = 1\nfrom tracer import summarize", ["2: tracer"]),
    ("def f():\n    import migrations.env", ["2: migrations.env"]),
    ("from draftscope_tracer import wire\nfrom . import tracer\nimport tracer_overhead", []),
])
def test_folder_imports_are_found(source, found) -> None:
    assert folder_imports(source) == found


def test_no_code_imports_a_folder_by_its_name() -> None:
    bad = [f"{path.relative_to(REPO)}:{hit}" for path in python_files() for hit in folder_imports(path.read_text())]
    assert not bad, f"import these as {FOLDER_NAMES}: {bad}"


def test_only_the_tests_import_the_tests() -> None:
    """Benchmarks, scripts and the test bed take what they share with the tests from testbed/ (its PostgreSQL
    and front door), never from tests/, which is not theirs to depend on."""
    bad = [f"{path.relative_to(REPO)}:{hit}" for path in python_files() if path.relative_to(REPO).parts[0] != "tests"
           for hit in folder_imports(path.read_text(), {"tests"})]
    assert not bad, f"import these from testbed/: {bad}"
    assert folder_imports("def main():\n    from tests.fixtures.store import postgres_cluster", {"tests"}) == [
        "2: tests.fixtures.store"]
