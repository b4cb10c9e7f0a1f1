"""Every repository path and dotted module a reader is pointed to exists: in README.md, docs/*.md, the templates
and every string (messages, docstrings, help) of app/ and tracer/; every link between the Markdown pages lands.
A file that moves leaves no stale pointer behind. Read from the files: nothing imported, nothing started."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Import packages onto their folders (pyproject.toml, [tool.setuptools.package-dir]), longest first.
PACKAGES = {"draftscope.migrations": "migrations", "draftscope.templates": "templates",
            "draftscope.static": "static", "draftscope_tracer": "tracer", "draftscope": "app"}
TOP = ("app", "tracer", "migrations", "templates", "static", "testbed", "tests", "bench", "scripts", "docs",
       "docker", "demo", "draftscope_tracer", "draftscope")
# A path starts a token (not inside a URL, a longer path or a file name); patterns (demo/*.jsonl) are left out.
PATH = re.compile(rf"(?<![\w./~-])(?:{'|'.join(TOP)})/[^\s`'\"(),;:]*")
MODULE = re.compile(r"(?<![\w./~-])draftscope(?:_tracer)?(?:\.[A-Za-z_]\w*)+")
FILE_SUFFIXES = {"js", "css", "db", "json", "jsonl", "zip", "md", "log", "toml", "txt", "yml", "yaml", "csv"}
LINK = re.compile(r"\]\(([^)\s]+)\)")
SECTION = re.compile(r'((?:docs/[\w-]+|README)\.md)[,:]? "([^"]+)"')  # docs/tracer.md, "What a tracer may send"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@functools.cache
def texts() -> tuple:
    """(where, text) for README, docs, templates, and each string constant of app/ and tracer/."""
    out = [(str(p.relative_to(ROOT)), p.read_text()) for p in [*PAGES, *sorted((ROOT / "templates").rglob("*.html"))]]
    for path in sorted([*(ROOT / "app").rglob("*.py"), *(ROOT / "tracer").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        loggers = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") ==
                   "getLogger" for a in n.args}  # "draftscope.tracer" names a logger, not a module
        out += [(f"{path.relative_to(ROOT)}:{n.lineno}", n.value) for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in loggers]
    return tuple(out)


def named(pattern: re.Pattern) -> list:
    """(name, where) of every match, trailing full stops cut, patterns, placeholders and file names left out."""
    found = {(m.group(0).rstrip("."), where) for where, text in texts() for m in pattern.finditer(text)}
    return sorted((n, w) for n, w in found if not set(n) & set("*{}<>[]$") and (
        pattern is not MODULE or n.rpartition(".")[2] not in FILE_SUFFIXES))  # draftscope.js is a file


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: "Data flow: computed on arrival" -> data-flow-computed-on-arrival."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> list:
    """The titles of a Markdown page's headings (lines in code blocks left out)."""
    titles, code = [], False
    for line in page.read_text().splitlines():
        code ^= line.startswith("```")
        if line.startswith("#") and not code:
            titles.append(line.lstrip("#").strip())
    return titles


def lands(path: Path, anchor: str = "") -> bool:
    """The file exists and, given an anchor, is Markdown with a heading of that anchor."""
    if not path.exists() or not anchor:
        return path.exists()
    return anchor in {slug(title) for title in headings(path)}


def path_exists(name: str) -> bool:
    """``draftscope_tracer/transport/wire.py`` is tracer/transport/wire.py; ``docs/x.md#part`` needs its heading."""
    name, _, anchor = name.partition("#")
    head, _, rest = name.partition("/")
    return lands(ROOT / PACKAGES.get(head, head) / rest, anchor)


def defines(module: Path, name: str) -> bool:
    """Whether a module binds ``name`` at its top level (def, class, assignment or import)."""
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
    return False


def module_exists(dotted: str) -> bool:
    """``draftscope_tracer.engine.sglang.plugin`` is a module or package; the last part may be a name its module
    defines (``draftscope.store.wire_schema.FastBatch``)."""
    package = next(p for p in PACKAGES if dotted == p or dotted.startswith(p + "."))
    folder, parts = ROOT / PACKAGES[package], dotted[len(package) + 1:].split(".") if dotted != package else []
    for i, part in enumerate(parts):
        rest = parts[i + 1:]
        if (folder / part / "__init__.py").exists():
            folder = folder / part
        elif (folder / f"{part}.py").exists():
            return not rest or len(rest) == 1 and defines(folder / f"{part}.py", rest[0])
        else:
            return not rest and defines(folder / "__init__.py", part)
    return True


def test_named_repository_paths_exist():
    missing = [f"{where}: {name}" for name, where in named(PATH) if not path_exists(name)]
    assert not missing, "paths named that are not in the repository:\n" + "\n".join(missing)


def test_named_modules_exist():
    missing = [f"{where}: {name}" for name, where in named(MODULE) if not module_exists(name)]
    assert not missing, "modules named that are not in the packages:\n" + "\n".join(missing)


def test_named_sections_exist():
    """A section named by its title (``docs/dashboard.md, "Retention"``) is a heading of that page, whole or
    before its parenthesis ("On vLLM 0.32" for "On vLLM 0.32 (`--engine vllm`)")."""
    named = sorted({(m.group(1), m.group(2), where) for where, text in texts() for m in SECTION.finditer(text)})
    missing = [f"{where}: {page}, {title!r}" for page, title, where in named if title not in {
        t for heading in headings(ROOT / page) for t in (heading, re.sub(r" \(.*\)$", "", heading))}]
    assert named and not missing, "sections named that are not headings there:\n" + "\n".join(missing)


def test_markdown_links_land():
    """``[text](target)`` in README.md and docs/*.md: a file beside the page, with its heading for ``#x``."""
    links = [(page, m.group(1)) for page in PAGES for m in LINK.finditer(page.read_text())
             if not m.group(1).startswith(("http://", "https://", "mailto:"))]
    missing = []
    for page, target in links:
        file, _, anchor = target.partition("#")
        if not lands(page.parent / file if file else page, anchor):
            missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert len(links) > 20 and not missing, "links to nothing:\n" + "\n".join(missing)


def test_the_checks_see_the_names_and_catch_stale_ones():
    assert {"tracer/transport/wire.py", "docs/dashboard.md#who-can-read-it"} <= {n for n, _ in named(PATH)}
    assert {"draftscope_tracer.engine.sglang.plugin", "draftscope.migrations"} <= {n for n, _ in named(MODULE)}
    assert [m.group(0) for m in PATH.finditer("see draftscope_tracer/wire.py; /data/models, x/app/y")] == [
        "draftscope_tracer/wire.py"]
    assert path_exists("draftscope_tracer/transport/wire.py") and not path_exists("draftscope_tracer/wire.py")
    assert path_exists("docs/dashboard.md#who-can-read-it") and not path_exists("docs/dashboard.md#no-such-part")
    assert module_exists("draftscope_tracer.transport.wire") and not module_exists("draftscope_tracer.wire")
    assert module_exists("draftscope.store.wire_schema.FastBatch") and not module_exists("draftscope.store.wire_schema.Nope")
    assert "Hot path" in headings(ROOT / "docs" / "tracer.md") and "CUDA" not in headings(ROOT / "docs" / "tracer.md")
