"""The tracer's layers (tracer/__init__.py): engine -> device, transport -> the plain modules, and no other
arrow between them. Read from the source: every import of a tracer module, at any depth of a file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRACER = Path(__file__).resolve().parents[2] / "tracer"
PLAIN = {"config", "health", "stats", "shared", "redact", "model_paths"}
MAY_IMPORT = {"engine": {"engine", "device", "transport", "plain"}, "device": {"device", "plain"},
              "transport": {"transport", "plain"}, "plain": {"plain"}}


def layer_of(module: str) -> str:
    """``draftscope_tracer.engine.plugin`` -> ``engine``; a plain module -> ``plain``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or parts[1] in MAY_IMPORT else "plain"


def tracer_imports(path: Path) -> list:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "draftscope_tracer" else [
                f"draftscope_tracer.{a.name}" for a in node.names]
            out += [n for n in names if n.startswith("draftscope_tracer.")]
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append(f"relative:{node.module}")
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("draftscope_tracer.")]
    return out


FILES = sorted(TRACER.rglob("*.py"))


def test_every_module_is_in_a_layer():
    loose = [f.name for f in TRACER.glob("*.py") if f.stem not in PLAIN | {"__init__"}]
    assert not loose, f"modules outside engine/, device/, transport/ and the plain modules: {loose}"
    assert {p.name for p in TRACER.iterdir() if p.is_dir() and p.name != "__pycache__"} == {"engine", "device",
                                                                                           "transport"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(TRACER)))
def test_imports_follow_the_layers(path):
    rel = path.relative_to(TRACER)
    mine = rel.parts[0] if len(rel.parts) > 1 else "plain"
    bad = [m for m in tracer_imports(path) if m.startswith("relative:") or layer_of(m) not in MAY_IMPORT[mine]]
    assert not bad, f"{rel} ({mine}) imports {bad}: see tracer/__init__.py for the arrows"


def test_the_check_sees_a_wrong_arrow(tmp_path):
    wrong = tmp_path / "x.py"
    wrong.write_text("def f():\n    from draftscope_tracer.engine.plugin import register\n")
    assert layer_of(tracer_imports(wrong)[0]) == "engine"
    assert "engine" not in MAY_IMPORT["device"]
