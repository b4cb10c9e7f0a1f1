"""The distribution as users get it: `python -m build` gives an sdist and a wheel that pass
`twine check`; the wheel, installed (not editable) into a fresh venv with `[dashboard]`, migrates a
store from its packaged migrations and serves pages and static files; the base install alone, in a
fresh venv with what an SGLang environment has (torch, numpy, safetensors, orjson), runs
`draftscope --help` and `draftscope doctor` with no dashboard dependency, and the dashboard's
commands say in one line what to install.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import shlex
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from testbed.server import start_dashboard
from tests.test_doctor import SCENARIOS

REPO = Path(__file__).resolve().parent.parent
TOOLS_PINS = Path(__file__).with_name("package-tools.txt")
INSTALL_LINE = "pip install 'draftscope[dashboard]'"
pytestmark = pytest.mark.package


def _venv(path: Path, *pip_args: str) -> Path:
    """A fresh venv at ``path`` with ``pip install PIP_ARGS`` (no bytecode compiled at install: most
    of torch's install time, and Python compiles what it imports); returns its bin/ folder."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--no-input", "--no-compile",
                    "--disable-pip-version-check", *pip_args], check=True)
    return path / "bin"


def _pin(name: str) -> str:
    """``name==version`` from testbed/requirements.txt (the pins the test bed's SGLang runs on)."""
    for line in (REPO / "testbed" / "requirements.txt").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.strip()
    raise AssertionError(f"testbed/requirements.txt pins no {name}")


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """sdist and wheel built by `python -m build` (tools from a venv cached by their pins' hash)."""
    digest = hashlib.sha256(TOOLS_PINS.read_bytes()).hexdigest()[:12]
    tools = REPO / ".cache" / f"package-tools-{digest}"
    if not (tools / "bin" / "twine").exists():
        shutil.rmtree(tools, ignore_errors=True)
        _venv(tools, "-r", str(TOOLS_PINS))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([str(tools / "bin" / "python"), "-m", "build", "-o", str(out), str(REPO)],
                   check=True, capture_output=True)
    check = subprocess.run([str(tools / "bin" / "twine"), "check", "--strict", *map(str, out.iterdir())],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    return out


@pytest.fixture(scope="module")
def wheel(dist) -> Path:
    return next(dist.glob("draftscope-*.whl"))


def test_wheel_carries_every_module_templates_static_and_migrations(wheel) -> None:
    """Every module of every room (a sub-package missing from pyproject.toml's list would be left out)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, package in (("app", "draftscope"), ("tracer", "draftscope_tracer"),
                            ("templates", "draftscope/templates"), ("static", "draftscope/static"),
                            ("migrations/versions", "draftscope/migrations/versions")):
        sources = {p.relative_to(REPO / folder).as_posix() for p in (REPO / folder).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts}
        assert sources and {f"{package}/{n}" for n in sources} <= names, f"{folder}/ not all in {wheel.name}"
    assert "draftscope/migrations/script.py.mako" in names
    top = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}"
                                      ".dist-info/top_level.txt").decode().split()
    assert sorted(top) == ["draftscope", "draftscope_tracer"]  # never the CPU stand-ins (sgl_kernel)


@pytest.fixture(scope="module")
def dashboard_bin(wheel, tmp_path_factory) -> Path:
    return _venv(tmp_path_factory.mktemp("dashboard") / "venv", f"{wheel}[dashboard]")


def test_installed_wheel_migrates_imports_and_serves(dashboard_bin, tmp_path) -> None:
    run = lambda *a: subprocess.run([str(dashboard_bin / "draftscope"), *a], cwd=tmp_path,  # noqa: E731
                                    capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    location = subprocess.run([str(dashboard_bin / "python"), "-c", "import draftscope; print(draftscope.__file__)"],
                              cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "site-packages" in location, location  # the wheel, not the source tree
    url_db = f"sqlite:///{tmp_path / 'store.db'}"
    upgraded = run("db", "upgrade", "--db", url_db)
    assert upgraded.returncode == 0 and "(head)" in upgraded.stdout, upgraded.stderr
    trace = REPO / "demo" / "healthy.jsonl"
    assert run("import", str(trace), "--db", url_db).returncode == 0
    run_id = json.loads(trace.read_text().splitlines()[0])["run_id"]

    with start_dashboard(url_db, tmp_path / "serve.log", command=[str(dashboard_bin / "draftscope")],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""}) as url:
        pages = {path: urllib.request.urlopen(url + path, timeout=10).read()
                 for path in ("/", f"/runs/{run_id}", "/api/v1/runs")}
        assert run_id.encode() in pages["/"] and b'id="diagnosis"' in pages[f"/runs/{run_id}"]
        assert [r["id"] for r in json.loads(pages["/api/v1/runs"])] == [run_id]
        for asset in (p for p in (REPO / "static").rglob("*") if p.is_file()):
            path = asset.relative_to(REPO / "static").as_posix()
            with urllib.request.urlopen(f"{url}/static/{path}", timeout=10) as resp:
                assert resp.read() == asset.read_bytes(), path


@pytest.fixture(scope="module")
def base_bin(wheel, tmp_path_factory) -> Path:
    """The base install in an SGLang-like environment: torch, numpy, safetensors, orjson, no extra."""
    torch = f"torch=={pytest.importorskip('torch').__version__.split('+')[0]}"
    return _venv(tmp_path_factory.mktemp("base") / "venv", str(wheel), torch,
                 *(_pin(n) for n in ("numpy", "safetensors", "orjson")))


def _base(base_bin: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(base_bin / "draftscope"), *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ""}, cwd=base_bin)


def test_base_install_has_no_dashboard_dependency(base_bin) -> None:
    probe = "import importlib.util as u; print([m for m in ('typer', 'rich', 'fastapi', 'pydantic') if u.find_spec(m)])"
    assert subprocess.run([str(base_bin / "python"), "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
    # both engines' plugins (their entry points' modules) are in the wheel and import without their engine
    subprocess.run([str(base_bin / "python"), "-c", "import draftscope_tracer.engine.sglang.plugin, "
                    "draftscope_tracer.engine.vllm.plugin"], check=True)


def test_base_help_and_dashboard_commands_say_what_to_install(base_bin) -> None:
    shown = _base(base_bin, "--help")
    assert shown.returncode == 0 and "doctor" in shown.stdout and INSTALL_LINE in shown.stdout
    for command in (["serve"], ["db", "upgrade"], ["import", "x.jsonl"], ["stats", "."]):
        result = _base(base_bin, *command)
        assert result.returncode == 2 and result.stdout == "", result
        assert result.stderr.count("\n") == 1 and INSTALL_LINE in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["healthy", *SCENARIOS])
def test_base_doctor_on_testbed_scenarios(base_bin, name) -> None:
    scenarios = pytest.importorskip("testbed.scenarios")
    prepared = scenarios.prepare(name)
    result = _base(base_bin, "doctor", prepared.draft_dir, "--target", prepared.target_dir,
                   "--server-args", shlex.join(prepared.server_args), "--json")
    assert "Traceback" not in result.stderr
    rules = [f["rule_id"] for f in json.loads(result.stdout)["findings"] if f["severity"] == "error"]
    assert (result.returncode, rules) == ((0, []) if name == "healthy" else (1, [SCENARIOS[name]]))
