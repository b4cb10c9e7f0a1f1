"""A bundle imported where the models are not readable still gets the reporter's findings and
trained-vs-served table (from the manifest's feature spec); paths under home are shortened unless
kept.

Starts from the recorded top-level-ids run (``demo/``, real SGLang on the CPU test bed), relocated to
this checkout's test-bed models: its ``aux-ids-not-read`` finding is static, read from the draft's
directory.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from fastapi.testclient import TestClient

from draftscope.bundle.export import export_bundle
from draftscope.bundle.loader import store_bundle
from draftscope.bundle.reader import read_bundle
from draftscope.settings import Settings
from draftscope.store import db, importer, queries
from draftscope.store.analyze import refresh_run
from draftscope.store.ingest import BatchWriter
from draftscope.web.app import create_app
from testbed import scenarios

DEMO = Path(__file__).resolve().parent.parent / "demo"


@pytest.fixture
def recorded(tmp_path) -> tuple[sa.Engine, str, Path]:
    """(store, run id, models root) of the top-level-ids recording, with its model paths pointing
    at this checkout's test-bed models, analysed as the dashboard does on arrival."""
    draft = scenarios.prepare("top-level-ids").draft_dir
    root = draft.parent.parent
    text = (DEMO / "top-level-ids.jsonl").read_text()
    trace = tmp_path / "trace.jsonl"  # the demo's paths are relative to the models root ("./target")
    trace.write_text(text.replace('"./', f'"{root}/'))
    url = f"sqlite:///{tmp_path / 'source.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    importer.import_files(engine, [trace])
    with engine.connect() as conn:
        run_id = conn.execute(sa.text("SELECT id FROM runs")).scalar_one()
    refresh_run(engine, run_id)
    yield engine, run_id, root
    engine.dispose()


def _findings(engine: sa.Engine, run_id: str) -> list[tuple]:
    with engine.connect() as conn:
        return sorted((f["rule_id"], f["severity"], f["source"], f["message"], f["fix"])
                      for f in queries.run_findings(conn, run_id))


def test_findings_come_from_the_manifest_where_the_models_are_unreadable(recorded, store_url,
                                                                          monkeypatch) -> None:
    source, run_id, root = recorded
    monkeypatch.setenv("HOME", str(root))  # paths become ~/..., which the importing side cannot open
    out = io.BytesIO()
    manifest = export_bundle(source, run_id, out)
    assert manifest["paths"] == "shortened" and manifest["feature_spec"]["draft"]["path"].startswith("~/")
    engine = db.make_engine(store_url)
    try:
        store_bundle(BatchWriter(engine), read_bundle(io.BytesIO(out.getvalue())), "top-level-ids.zip")
        imported = _findings(engine, run_id)
    finally:
        engine.dispose()
    expected = [tuple(v.replace(str(root) + "/", "~/") if isinstance(v, str) else v for v in f)
                for f in _findings(source, run_id)]
    assert ("aux-ids-not-read", "error", "static") in [f[:3] for f in imported]
    assert imported == expected
    # The trained-vs-served table too: the same rows, trained values from the manifest.
    source_url = str(source.url)
    diffs = []
    for url in (source_url, store_url):
        with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
            diffs.append(client.get(f"/runs/{run_id}/spec.csv").text.replace(str(root) + "/", "~/"))
    assert "aux ids (checkpoint)" in diffs[1] and diffs[1] == diffs[0]


def test_keep_paths_keeps_them(recorded, monkeypatch) -> None:
    source, run_id, root = recorded
    monkeypatch.setenv("HOME", str(root))
    out = io.BytesIO()
    export_bundle(source, run_id, out, keep_paths=True)
    with zipfile.ZipFile(out) as zf:
        run = json.loads(zf.read("run.json"))
        assert run["draft_path"].startswith(str(root) + "/")
        assert json.loads(zf.read("manifest.json"))["paths"] == "kept"


def test_include_text_says_when_the_tokenizer_is_not_readable(tmp_path) -> None:
    from typer.testing import CliRunner

    from draftscope.cli.app import app

    trace = tmp_path / "trace.jsonl"
    text = (DEMO / "aux-off.jsonl").read_text()
    recorded = json.loads(text.splitlines()[0])["run"]["target_path"]
    trace.write_text(text.replace(recorded, "/nonexistent/target"))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db.upgrade(url)
    runner = CliRunner()
    assert runner.invoke(app, ["import", str(trace), "--db", url]).exit_code == 0
    run_id = json.loads(text.splitlines()[0])["run_id"]
    out = tmp_path / "b.zip"
    result = runner.invoke(app, ["export", run_id, "--include-text", "--db", url, "-o", str(out)])
    assert result.exit_code == 1 and "/nonexistent/target/tokenizer.json is not readable" in result.output
    assert not out.exists()


def test_progress_bars_for_large_runs_on_a_terminal(monkeypatch) -> None:
    from draftscope.cli import bundle as bundle_cli

    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    with bundle_cli._progress("exporting", bundle_cli.SHOW_PROGRESS_FROM) as advance:
        advance(bundle_cli.SHOW_PROGRESS_FROM)
    with bundle_cli._progress("exporting", bundle_cli.SHOW_PROGRESS_FROM - 1) as small:
        assert small is None
