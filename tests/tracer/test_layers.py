"""The tracer's layers (tracer/__init__.py): engine/sglang, engine/vllm -> the engine core (engine/) -> device,
transport -> the plain modules, and no other arrow between them (none between the two engines). Read from the
source: every import of a tracer module, at any depth of a file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRACER = Path(__file__).resolve().parents[2] / "tracer"
PLAIN = {"config", "health", "stats", "shared", "redact", "model_paths"}
ENGINES = {"engine.sglang", "engine.vllm"}  # one folder per engine, each built on the engine core
MAY_IMPORT = {**{e: {e, "engine", "device", "transport", "plain"} for e in ENGINES},
              "engine": {"engine", "transport", "plain"}, "device": {"device", "plain"},
              "transport": {"transport", "plain"}, "plain": {"plain"}}


def layer_of(module: str) -> str:
    """``draftscope_tracer.engine.sglang.plugin`` -> ``engine.sglang``, ``draftscope_tracer.engine.core`` ->
    ``engine``; a plain module -> ``plain``."""
    parts = module.split(".")
    if len(parts) >= 3 and ".".join(parts[1:3]) in ENGINES:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 2 or parts[1] in MAY_IMPORT else "plain"


def layer_of_file(rel: Path) -> str:
    """``engine/vllm/step.py`` -> ``engine.vllm``; ``engine/core.py`` -> ``engine``; ``config.py`` -> ``plain``."""
    folders = rel.parts[:-1]
    return ".".join(folders) if folders else "plain"


def tracer_imports(path: Path) -> list:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from <package> import <module>``: the module's name (a room inside a package counts)
            names = [node.module] if node.module not in ("draftscope_tracer", "draftscope_tracer.engine") else [
                f"{node.module}.{a.name}" for a in node.names]
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
    assert _folders(TRACER) == {"engine", "device", "transport"}
    assert _folders(TRACER / "engine") == {"sglang", "vllm"}
    assert all(not _folders(TRACER / d) for d in ("device", "transport", "engine/sglang", "engine/vllm"))


def _folders(path: Path) -> set:
    return {p.name for p in path.iterdir() if p.is_dir() and p.name != "__pycache__"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(TRACER)))
def test_imports_follow_the_layers(path):
    rel = path.relative_to(TRACER)
    mine = layer_of_file(rel)
    bad = [m for m in tracer_imports(path) if m.startswith("relative:") or layer_of(m) not in MAY_IMPORT[mine]]
    assert not bad, f"{rel} ({mine}) imports {bad}: see tracer/__init__.py for the arrows"


def test_the_check_sees_a_wrong_arrow(tmp_path):
    wrong = tmp_path / "x.py"
    wrong.write_text("def f():\n    from draftscope_tracer.engine.sglang.plugin import register\n"
                     "    from draftscope_tracer.engine import core\n    import draftscope_tracer.engine.vllm.step\n"
                     "    from draftscope_tracer.engine.sglang import facts\n"
                     "    from draftscope_tracer.engine import vllm\n")
    assert [layer_of(m) for m in tracer_imports(wrong)] == ["engine.sglang", "engine", "engine.vllm", "engine.sglang",
                                                             "engine.vllm"]
    assert "engine" not in MAY_IMPORT["device"] and "engine.sglang" not in MAY_IMPORT["engine.vllm"]
    assert not ENGINES & MAY_IMPORT["engine"]  # the core knows no engine
    assert layer_of_file(Path("engine/vllm/step.py")) == "engine.vllm" and layer_of_file(Path("redact.py")) == "plain"
