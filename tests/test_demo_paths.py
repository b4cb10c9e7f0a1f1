"""No recording machine's path in the demo or in what it exports (issue 32, item 6): the tracer
records model paths relative to ``DRAFTSCOPE_MODELS_ROOT`` (``./target``), scripts/demo-paths rewrote
the demo traces that way, and a dashboard reads the checkpoints of such paths under its own root."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from fastapi.testclient import TestClient

from draftscope.settings import Settings
from draftscope.spec.block import MODELS_ROOT, model_dir, static_spec
from draftscope.web.app import create_app
from draftscope_tracer.config import TracerConfig
from draftscope_tracer.model_paths import relative_to_root
from tests.fixtures.demo_store import DEMO, REPO

# An absolute path: "/" then a folder, not inside a URL (https://host/x) or a relative path (./x, a/b).
ABSOLUTE = re.compile(r"(?<![\w.:/~-])/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]")


def strings(value):
    """Every string of a JSON value, mapping keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def absolute_paths(texts) -> list[str]:
    return sorted({m.string[m.start():m.start() + 80] for t in texts for m in ABSOLUTE.finditer(t)})


def test_no_machine_path_in_the_demo_traces():
    found = {}
    for trace in sorted(DEMO.glob("*.jsonl")):
        hits = absolute_paths(s for line in trace.read_text().splitlines() for s in strings(json.loads(line)))
        if hits:
            found[trace.name] = hits[:3]
    assert len(list(DEMO.glob("*.jsonl"))) >= 8 and not found, found
    drafts = {json.loads(t.open().readline())["run"]["draft_path"] for t in DEMO.glob("*.jsonl")}
    assert "./kimi-models/kimi-aux-off" in drafts and "./draft" in drafts


def test_no_machine_path_in_an_exported_demo_bundle(demo_db, demo_runs):
    with TestClient(create_app(Settings(database_url=f"sqlite:///{demo_db}")), base_url="http://127.0.0.1") as c:
        found = {}
        for name, run_id in sorted(demo_runs.items()):
            page = c.get(f"/runs/{run_id}/bundle.zip")
            assert page.status_code == 200, (name, page.status_code)
            with zipfile.ZipFile(io.BytesIO(page.content)) as bundle:
                texts = [bundle.read(n).decode("utf-8", "replace") for n in bundle.namelist()]
            hits = absolute_paths(texts)
            if hits:
                found[name] = hits[:3]
    assert not found, found


def test_the_rewrite_is_deterministic_and_rerunnable(tmp_path):
    script = REPO / "scripts" / "demo-paths"
    assert subprocess.run([sys.executable, str(script), "--check"], capture_output=True).returncode == 0
    trace = tmp_path / "t.jsonl"
    line = {"run": {"draft_path": "/home/u/wt/.cache/testbed-models/0123456789abcdef/scenarios/x-v1",
                    "facts": {"error": "no /tmp/gpu-testbed-work/kimi-models/target: gone"},
                    "host": "vm", "url": "https://github.com/a/b"}, "sent_at": 1796046889.1804712}
    trace.write_text(json.dumps(line, separators=(",", ":")) + "\n")
    assert subprocess.run([sys.executable, str(script), "--check", str(trace)], capture_output=True).returncode == 1
    subprocess.run([sys.executable, str(script), str(trace)], check=True, capture_output=True)
    once = trace.read_bytes()
    subprocess.run([sys.executable, str(script), str(trace)], check=True, capture_output=True)
    assert trace.read_bytes() == once
    run = json.loads(once)["run"]
    assert run["draft_path"] == "./scenarios/x-v1" and run["facts"]["error"] == "no ./kimi-models/target: gone"
    assert run["url"] == "https://github.com/a/b" and json.loads(once)["sent_at"] == 1796046889.1804712


def test_the_tracer_records_paths_relative_to_its_models_root(tmp_path):
    root = str(tmp_path / "models")
    run = {"draft_path": f"{root}/drafts/v2", "target_path": root, "facts": {f"{root}/x": [f"load {root}/t/ failed"]},
           "other": f"{root}2/elsewhere", "tracer_config": TracerConfig(file="t.jsonl", models_root=root).public()}
    out = relative_to_root(run, root)
    assert out["draft_path"] == "./drafts/v2" and out["target_path"] == "."
    assert out["facts"] == {"./x": ["load ./t/ failed"]} and out["other"] == f"{root}2/elsewhere"
    assert out["tracer_config"]["models_root"] is True and root not in json.dumps(out["tracer_config"])
    assert relative_to_root(run, None) == run


def test_a_dashboard_reads_relative_paths_under_its_own_models_root(tmp_path, monkeypatch):
    """The demo's aux-off run names ./scenarios/<folder> and ./target: with DRAFTSCOPE_MODELS_ROOT set to a
    folder holding them, the dashboard reads the checkpoint (doctor's spec block); without, it reads nothing."""
    from testbed import scenarios

    run = json.loads((DEMO / "aux-off.jsonl").open().readline())["run"]
    monkeypatch.delenv(MODELS_ROOT, raising=False)
    assert model_dir(run["draft_path"]) is None and static_spec(run) == (None, None)
    prepared = scenarios.prepare("aux-off")
    root = tmp_path / "models"
    shutil.copytree(prepared.target_dir, root / "target")
    shutil.copytree(prepared.draft_dir, root / run["draft_path"])
    monkeypatch.setenv(MODELS_ROOT, str(root))
    assert model_dir(run["draft_path"]) == str(root / run["draft_path"])
    rows, _ = static_spec(run)
    assert rows and any(r.key == "layers" for r in rows)


@pytest.fixture(autouse=True)
def _fresh_spec_cache():
    from draftscope.spec import block as spec_block

    spec_block._read.cache_clear()
