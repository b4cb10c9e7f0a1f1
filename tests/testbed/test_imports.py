"""The test bed's imports point one way: no circle between its modules (imports inside functions
included) and no arrow up to bench/, which builds on the test bed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FILES = sorted((REPO / "testbed").rglob("*.py"))


def module_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(p) for p in FILES}


def imports(source: str) -> set[str]:
    """Every absolute module ``source`` imports, at any depth (``from pkg import mod`` names ``pkg.mod``
    where that is a test-bed module)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES
            found |= subs or {node.module}
    return found


GRAPH = {module_of(p): {m for m in imports(p.read_text()) if m in MODULES} for p in FILES}


def a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of ``graph`` as the modules along it (first repeated last), or [] when there is none."""
    done, path = set(), []

    def visit(node: str) -> list[str]:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return []
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if found := visit(nxt):
                return found
        path.pop()
        done.add(node)
        return []

    for start in sorted(graph):
        if found := visit(start):
            return found
    return []


def test_no_circle_between_test_bed_modules() -> None:
    assert a_cycle(GRAPH) == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_arrow_up_to_bench(path: Path) -> None:
    assert not {m for m in imports(path.read_text()) if m.split(".")[0] == "bench"}


def test_the_checks_see_a_circle_and_an_arrow_up() -> None:
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert a_cycle({"a": {"b"}, "b": set()}) == []
    assert imports("def f():\n    from testbed.gpu import runner, throughput\n    import bench.x\n") == {
        "testbed.gpu.runner", "testbed.gpu.throughput", "bench.x"}
