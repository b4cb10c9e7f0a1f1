"""`draftscope import` and `serve --demo`: recorded trace files go through the ingest path."""

from __future__ import annotations

import json
import uuid

import sqlalchemy as sa
from typer.testing import CliRunner

from draftscope.cli.app import app
from draftscope.store import db, importer
from tests.fixtures.store import make_batch, run_record, sample_record, step_record

runner = CliRunner()


def _write_trace(path, run_id: str) -> list[dict]:
    batches = [make_batch(run_id, run=run_record()),
               make_batch(run_id, steps=[step_record()], samples=[sample_record(0)])]
    path.write_text("".join(json.dumps(b) + "\n" for b in batches))
    return batches


def _count(url: str, table: str) -> int:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one()
    finally:
        engine.dispose()


def test_import_stores_each_batch_once(store_url, tmp_path) -> None:
    trace = tmp_path / "run.jsonl"
    _write_trace(trace, uuid.uuid4().hex)
    first = runner.invoke(app, ["import", str(trace), "--db", store_url])
    again = runner.invoke(app, ["import", str(trace), "--db", store_url])
    assert first.exit_code == 0 and "imported 2 batches (0 already stored)" in first.output
    assert again.exit_code == 0 and "imported 0 batches (2 already stored)" in again.output
    assert (_count(store_url, "runs"), _count(store_url, "verify_steps")) == (1, 1)


def test_a_bad_line_is_named_and_the_rest_is_kept(store_url, tmp_path) -> None:
    trace = tmp_path / "run.jsonl"
    _write_trace(trace, uuid.uuid4().hex)
    with trace.open("a") as f:
        f.write('{"schema_version": 1, "batch_id": "x"\n')
    result = runner.invoke(app, ["import", str(trace), "--db", store_url])
    assert result.exit_code == 1
    assert f"{trace}:3: Request body is not valid JSON" in result.output
    assert _count(store_url, "runs") == 1


def test_import_refuses_a_database_that_is_not_migrated(tmp_path) -> None:
    trace = tmp_path / "run.jsonl"
    _write_trace(trace, uuid.uuid4().hex)
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    result = runner.invoke(app, ["import", str(trace), "--db", url])
    assert result.exit_code == 2 and "draftscope db upgrade" in result.output


def test_demo_traces_seed_only_an_empty_store(store_url, tmp_path) -> None:
    folder = tmp_path / "demo"
    folder.mkdir()
    _write_trace(folder / "a.jsonl", uuid.uuid4().hex)
    engine = db.make_engine(store_url)
    try:
        assert importer.store_is_empty(engine)
        report = importer.import_files(engine, importer.trace_files(folder))
        assert (report.stored, report.errors) == (2, [])
        assert not importer.store_is_empty(engine)
    finally:
        engine.dispose()
