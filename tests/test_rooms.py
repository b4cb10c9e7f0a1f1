"""draftscope's rooms (app/__init__.py): plain modules < spec < findings < store < bundle < web < cli, each room
importing only the rooms below it; so no circle and no arrow back up. Read from the source: every import of a
draftscope module, at any depth of a file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[1] / "app"
PLAIN = {"settings", "units", "redact", "resources"}
DATA = {"migrations": "store", "templates": "web", "static": "web"}  # folders mapped into the package (pyproject.toml)
ORDER = ["plain", "spec", "findings", "store", "bundle", "web", "cli"]  # bottom up
MAY_IMPORT = {room: set(ORDER[:i + 1]) for i, room in enumerate(ORDER)}


def room_of(module: str) -> str:
    """``draftscope.store.ingest`` -> ``store``; a plain module -> ``plain``; the package itself -> ``cli``
    (``python -m draftscope`` is the console script)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "cli"
    if parts[1] in DATA:
        return DATA[parts[1]]
    return parts[1] if parts[1] in MAY_IMPORT else "plain" if parts[1] in PLAIN else f"unknown:{parts[1]}"


def draftscope_imports(path: Path) -> list:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "draftscope" else [f"draftscope.{a.name}" for a in node.names]
            out += [n for n in names if n.startswith("draftscope.")]
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append(f"relative:{node.module}")
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("draftscope.")]
    return out


def module_of(path: Path) -> str:
    parts = path.relative_to(APP).with_suffix("").parts
    return ".".join(("draftscope", *parts[:-1], *([] if parts[-1] == "__init__" else parts[-1:])))


FILES = sorted(APP.rglob("*.py"))


def test_every_module_is_in_a_room():
    loose = [f.name for f in APP.glob("*.py") if f.stem not in PLAIN | {"__init__", "__main__"}]
    assert not loose, f"modules outside the rooms and the plain modules ({sorted(PLAIN)}): {loose}"
    rooms = {p.name for p in APP.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(ORDER) - {"plain"}
    assert all((APP / room / "__init__.py").read_text().startswith('"""') for room in rooms)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(APP)))
def test_imports_follow_the_rooms(path):
    mine = room_of(module_of(path))
    bad = [m for m in draftscope_imports(path) if m.startswith("relative:") or room_of(m) not in MAY_IMPORT[mine]]
    assert not bad, f"{path.relative_to(APP)} ({mine}) imports {bad}: see app/__init__.py for the arrows"


def find_circle(graph: dict) -> list:
    """A cycle of ``graph`` (module -> the modules it imports) as a list of modules, or [] when there is none."""
    state: dict = {}

    def visit(m: str, trail: list) -> list:
        state[m] = "open"
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return trail[trail.index(n):] + [n]
            found = visit(n, trail + [n]) if n not in state else []
            if found:
                return found
        state[m] = "done"
        return []

    for m in sorted(graph):
        found = visit(m, [m]) if m not in state else []
        if found:
            return found
    return []


def test_no_circle_between_modules():
    """Not even inside a room: the graph of module imports has no cycle. An import of a package counts as one of
    its ``__init__``; the names a package's ``__init__`` re-exports from its own modules are no arrow out of it."""
    graph = {module_of(p): {m for m in draftscope_imports(p) if not m.startswith("relative:")} for p in FILES}
    known = set(graph)

    def target(name: str) -> str:  # ``from draftscope.spec import SpecError`` -> draftscope.spec
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        return name

    graph = {m: {n for n in map(target, deps) if n != m and not n.startswith(m + ".")} for m, deps in graph.items()}
    assert len(graph) == len(FILES) and sum(map(len, graph.values())) > 100
    assert not find_circle(graph), f"import circle: {' -> '.join(find_circle(graph))}"


def test_the_check_sees_a_wrong_arrow(tmp_path):
    wrong = tmp_path / "x.py"
    wrong.write_text("def f():\n    from draftscope.web.pages import PageError\n    from draftscope import queries\n")
    assert [room_of(m) for m in draftscope_imports(wrong)] == ["web", "unknown:queries"]
    assert "web" not in MAY_IMPORT["bundle"] and "unknown:queries" not in MAY_IMPORT["cli"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
