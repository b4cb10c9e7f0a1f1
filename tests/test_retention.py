"""Retention on real migrated stores (SQLite and PostgreSQL): ``draftscope prune`` by run, by age and
by size, and the dashboard's automatic bound, delete whole runs oldest first, never a run being
written, and SQLite's file shrinks."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid

import orjson
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from draftscope import units
from draftscope.bundle.export import export_to_file
from draftscope.cli import bundle as bundle_cli
from draftscope.cli.app import app
from draftscope.store import db, models, queries, retention
from draftscope.store.ingest import BatchWriter
from draftscope.store.tables import of_run
from tests.fixtures.store import make_batch, run_record, sample_record, settle, step_record
from tests.fixtures.wait import until

runner = CliRunner()
DAY = 86400.0


def _run(engine: sa.Engine, *, status: str = "ended", steps: int = 300, days_old: float = 0.0) -> str:
    """A run of ``steps`` verify steps (plus samples, requests, health) stored through ingest,
    its batches received ``days_old`` days ago."""
    run_id = uuid.uuid4().hex
    writer = BatchWriter(engine)
    for lo in range(0, steps, 100):
        rids = [f"r{i}" for i in range(lo // 10, (lo + 100) // 10)]
        writer.write(orjson.dumps(make_batch(
            run_id, run=run_record(status=status),
            requests=[{"rid": r, "sampled": True, "traced_verify_ct": 10} for r in rids],
            steps=[step_record(f"r{i // 10}", i % 10, drafted_tokens=list(range(64))) for i in range(lo, lo + 100)],
            samples=[sample_record(i, rid=f"r{i // 10}") for i in range(lo, lo + 100)],
            health=[{"at": time.time(), "drops": {}, "errors": {}, "heartbeats": {}, "disabled_probes": []}])))
    if days_old:
        with engine.begin() as conn:
            B = models.IngestBatch.__table__
            conn.execute(B.update().where(B.c.run_id == run_id).values(received_at=B.c.received_at - days_old * DAY))
    return run_id


def _rows(engine: sa.Engine, run_id: str) -> dict[str, int]:
    with engine.connect() as conn:
        return {t.name: conn.execute(sa.select(sa.func.count()).select_from(t).where(of_run(t, run_id))).scalar_one()
                for t in retention.run_tables()} | {"runs": conn.execute(
                    sa.select(sa.func.count()).select_from(models.Run.__table__)
                    .where(models.Run.__table__.c.id == run_id)).scalar_one()}


def _gone(engine, run_id) -> bool:
    return not any(_rows(engine, run_id).values())


def test_every_table_of_a_run_is_pruned(store_url):
    tables = {t.name for t in retention.run_tables()}
    assert tables == {"requests", "verify_steps", "tensor_samples", "tracer_health", "findings",
                      "ingest_batches", "bundle_imports", "run_stats", "run_stat_bins"}


def test_prune_by_run_and_age_deletes_whole_runs_and_keeps_one_being_written(store_url):
    engine = db.make_engine(store_url)
    old, older, recent = _run(engine, days_old=8), _run(engine, days_old=30), _run(engine, days_old=1)
    running_old = _run(engine, status="running", days_old=8)  # its tracer is gone: prunable
    running = _run(engine, status="running")  # being written: never
    assert retention.prune(engine, run_ids=(running,)).kept_writing == [running]
    report = retention.prune(engine, older_than_s=7 * DAY)
    assert [r.id for r, _ in report.deleted] == [older, old, running_old]
    assert all(_gone(engine, r) for r in (old, older, running_old))
    assert all(_rows(engine, r)["verify_steps"] == 300 for r in (recent, running))
    assert retention.prune(engine, run_ids=(recent, "nope")).unknown == ["nope"]
    assert _gone(engine, recent) and not _gone(engine, running)
    engine.dispose()


def test_prune_to_a_size_keeps_the_bound_oldest_first(store_url):
    engine = db.make_engine(store_url)
    runs = [_run(engine, days_old=10 - i) for i in range(6)]  # runs[0] is the oldest
    with engine.connect() as conn:
        full = retention.store_bytes(conn)
    bound = full * 6 // 10
    dry = retention.prune(engine, max_bytes=bound, dry_run=True)
    assert dry.deleted and all(not _gone(engine, r) for r in runs)
    report = retention.prune(engine, max_bytes=bound)
    deleted = [r.id for r, _ in report.deleted]
    assert deleted == runs[:len(deleted)] and len(deleted) < len(runs)
    assert report.bytes_after <= bound < report.bytes_before
    assert all(_gone(engine, r) for r in deleted) and not any(_gone(engine, r) for r in runs[len(deleted):])
    engine.dispose()


def test_an_imported_bundle_goes_whole(store_url, tmp_path):
    source = db.make_engine(f"sqlite:///{tmp_path / 'source.db'}")
    db.upgrade(str(source.url))
    run_id = _run(source, steps=100)
    export_to_file(source, run_id, tmp_path / "run.zip")
    source.dispose()
    assert bundle_cli.import_bundles(store_url, [tmp_path / "run.zip"]) == 0
    engine = db.make_engine(store_url)
    assert _rows(engine, run_id)["bundle_imports"] == 1
    assert retention.prune(engine, run_ids=(run_id,), now=time.time() + 2 * retention.RECENT_S).deleted
    assert _gone(engine, run_id)
    engine.dispose()


def test_a_run_written_during_the_prune_is_kept(store_url):
    """The check happens inside the marking transaction: a batch that lands first saves the run."""
    engine = db.make_engine(store_url)
    run_id = _run(engine, days_old=9)
    BatchWriter(engine).write(orjson.dumps(make_batch(run_id, steps=[step_record("late", 0)])))
    assert not retention.delete_run(engine, run_id) and _rows(engine, run_id)["verify_steps"] == 301
    engine.dispose()


def test_a_run_marked_for_pruning_is_gone_to_every_reader(store_url, client, tmp_path):
    engine = db.make_engine(store_url)
    kept, marked = _run(engine, days_old=3), _run(engine, days_old=2)
    assert retention.mark_run(engine, marked)
    assert [r["id"] for r in client.get("/api/v1/runs").json()] == [kept]
    assert client.get(f"/api/v1/runs/{marked}").status_code == 404
    assert client.get(f"/runs/{marked}").status_code == 404
    assert client.get(f"/runs/{marked}/requests/r0").status_code == 404
    assert client.get(f"/runs/{marked}/bundle.zip").status_code == 404
    assert marked not in client.get("/").text and kept in client.get("/").text
    assert _rows(engine, marked)["verify_steps"] == 300  # hidden, not yet deleted
    engine.dispose()


def test_a_run_goes_in_chunks_and_no_reader_sees_half_of_it(store_url, monkeypatch):
    """Between any two of the delete's transactions the run is either listed whole or not at all,
    the other runs are untouched, and no row outlives its run."""
    monkeypatch.setattr(retention, "DELETE_CHUNK_ROWS", (40, 40, 40))
    engine = db.make_engine(store_url)
    doomed, kept = _run(engine, days_old=9), _run(engine, days_old=1)
    seen: list[tuple[bool, dict[str, int]]] = []
    step = retention._Pacer.step

    @contextlib.contextmanager
    def watched(pacer):
        with step(pacer) as locked:
            yield locked
        with engine.connect() as conn:
            listed = {r["id"] for r in queries.list_runs(conn)}
            assert queries.get_run(conn, doomed) is None
        seen.append((doomed in listed, _rows(engine, kept)))

    monkeypatch.setattr(retention._Pacer, "step", watched)
    assert retention.prune(engine, run_ids=(doomed,)).deleted
    assert len(seen) > 300 // 40 and not any(listed for listed, _ in seen)
    assert all(rows == _rows(engine, kept) for _, rows in seen)
    assert _gone(engine, doomed) and _rows(engine, kept)["verify_steps"] == 300
    engine.dispose()


def test_a_late_batch_for_a_marked_run_goes_with_it(store_url):
    """A batch that lands after the mark (it re-sends the run record) neither shows the run again
    nor leaves rows behind."""
    engine = db.make_engine(store_url)
    run_id = _run(engine, days_old=9)
    assert retention.mark_run(engine, run_id)
    BatchWriter(engine).write(orjson.dumps(make_batch(run_id, run=run_record(status="ended"),
                                                      steps=[step_record("late", 0)])))
    with engine.connect() as conn:  # the re-sent record keeps it marked: listed nowhere
        assert queries.get_run(conn, run_id) is None and run_id not in {r["id"] for r in queries.list_runs(conn)}
    retention.delete_marked(engine, run_id)
    assert _gone(engine, run_id)
    engine.dispose()


def test_a_prune_stopped_half_way_is_finished_by_the_next(store_url):
    engine = db.make_engine(store_url)
    half, kept = _run(engine, days_old=9), _run(engine, days_old=1)
    assert retention.mark_run(engine, half)
    with engine.begin() as conn:  # as if the process died after its first chunks
        steps = models.VerifyStep.__table__
        conn.execute(steps.delete().where(of_run(steps, half)))
    report = retention.prune(engine, older_than_s=30 * DAY)
    assert [r.id for r, _ in report.deleted] == [half]
    assert _gone(engine, half) and not _gone(engine, kept)
    engine.dispose()


def test_reclaim_gives_every_free_page_back_in_few_steps_and_empties_the_wal(tmp_path, caplog):
    """Each incremental_vacuum step frees many pages (sqlite3's execute() would free one), and the
    WAL is emptied at the end."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    runs = [_run(engine, steps=1000, days_old=20 - i) for i in range(3)]
    assert retention.prune(engine, run_ids=tuple(runs[:2])).deleted
    with engine.connect() as conn:
        free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
    size = os.path.getsize(tmp_path / "store.db")
    caplog.set_level(logging.DEBUG, logger="draftscope.store.retention")
    assert retention.reclaim(engine) == free > 100
    steps = [r for r in caplog.records if getattr(r, "step", ("",))[0] == "incremental_vacuum step"]
    assert 0 < len(steps) < free / 10
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA freelist_count").scalar_one() == 0
    assert os.path.getsize(tmp_path / "store.db") < size - free * 4096 * 0.9
    assert os.path.getsize(tmp_path / "store.db-wal") == 0
    engine.dispose()


def test_aggregates_of_other_runs_survive_reused_ids(store_url, client):
    """SQLite reuses the ids of deleted newest rows: the other runs' watermarks come down with them,
    so their later steps are still counted."""
    engine = db.make_engine(store_url)
    keep = _run(engine, status="running", steps=100)
    settle(client)
    newest = _run(engine, steps=200, days_old=2)  # holds the newest step ids
    health = {"at": time.time(), "drops": {}, "errors": {}, "heartbeats": {}, "disabled_probes": []}
    BatchWriter(engine).write(orjson.dumps(make_batch(keep, health=[health])))
    settle(client)  # keep's watermark is now past newest's steps
    assert retention.prune(engine, run_ids=(newest,)).deleted
    BatchWriter(engine).write(orjson.dumps(make_batch(keep, steps=[step_record("more", i) for i in range(5)])))
    settle(client)
    assert client.get(f"/api/v1/runs/{keep}").json()["summary"]["acceptance"]["verify_steps"] == 105
    engine.dispose()


def test_cli_prune_shrinks_the_sqlite_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    runs = [_run(engine, steps=1000, days_old=20 - 2 * i) for i in range(4)]
    engine.dispose()
    path = tmp_path / "store.db"
    runner.invoke(app, ["prune", "--max-size", "1GB", "--db", url])  # checkpoints the WAL
    before = os.path.getsize(path)
    result = runner.invoke(app, ["prune", "--older-than", "17d", "--db", url])
    assert result.exit_code == 0, result.output
    assert f"deleted run {runs[0]}" in result.output and f"deleted run {runs[1]}" in result.output
    assert "2 runs deleted" in result.output and "free pages given back" in result.output
    assert os.path.getsize(path) < before * 0.7
    assert runner.invoke(app, ["prune", "--run", "nope", "--db", url]).exit_code == 1
    assert runner.invoke(app, ["prune", "--older-than", "7 days", "--db", url]).exit_code == 2


def test_vacuum_switches_an_old_store_to_incremental(tmp_path):
    """A store made before schema 0004 (auto_vacuum off) is rewritten once by --vacuum."""
    path = tmp_path / "old.db"
    import sqlite3

    sqlite3.connect(path).execute("PRAGMA auto_vacuum=NONE").connection.close()  # the old default
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")  # fixes the mode, as an old store's first table did
    conn.close()
    url = f"sqlite:///{path}"
    db.upgrade(url)
    assert sqlite3.connect(path).execute("PRAGMA auto_vacuum").fetchone() == (0,)
    assert runner.invoke(app, ["prune", "--vacuum", "--db", url]).exit_code == 0
    assert sqlite3.connect(path).execute("PRAGMA auto_vacuum").fetchone() == (2,)


def test_the_dashboard_keeps_the_store_under_its_bound(store_url, make_client):
    engine = db.make_engine(store_url)
    runs = [_run(engine, days_old=d) for d in (40, 35, 20)]
    fresh = _run(engine, days_old=1)
    client = make_client(retain_days=30, retain_interval_s=0.05)
    until(lambda: all(_gone(engine, r) for r in runs[:2]), "the dashboard pruned the runs older than 30 days")
    assert client.app.state.retainer.errors == 0
    assert not _gone(engine, runs[2]) and not _gone(engine, fresh)
    assert client.get("/api/v1/runs").status_code == 200
    engine.dispose()


@pytest.mark.parametrize("value,expected", [("10GB", 10**10), ("2GiB", 2 * 2**30), ("500 MB", 5 * 10**8),
                                            ("123", 123)])
def test_sizes(value, expected):
    assert units.parse_size(value) == expected


def test_bad_sizes_and_ages_say_what_to_write():
    with pytest.raises(ValueError, match="e.g. 10GB"):
        units.parse_size("ten gigs")
    with pytest.raises(ValueError, match="e.g. 7d"):
        units.parse_age("7 days")
    assert units.parse_age("2w") == 14 * DAY



def test_prune_to_a_size_it_cannot_reach_fails_and_says_why(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    old, running = _run(engine, days_old=9), _run(engine, status="running")  # being written: never
    engine.dispose()
    dry = runner.invoke(app, ["prune", "--max-size", "1", "--dry-run", "--db", url])
    assert dry.exit_code == 1 and f"would delete run {old}" in dry.output
    assert "error: the store's live rows would still take" in dry.output and running in dry.output
    result = runner.invoke(app, ["prune", "--max-size", "1", "--db", url])
    assert result.exit_code == 1, result.output
    assert f"deleted run {old}" in result.output and f"kept run {running}: it is being written" in result.output
    assert "error: the store's live rows still take" in result.output and "over --max-size" in result.output
    assert f"being written ({running})" in result.output
    assert runner.invoke(app, ["prune", "--max-size", "1GB", "--db", url]).exit_code == 0  # within: done


def test_automatic_retention_logs_each_run_it_deletes(store_url, caplog):
    engine = db.make_engine(store_url)
    old, older, kept = _run(engine, days_old=40), _run(engine, days_old=50), _run(engine, days_old=1)
    retainer = retention.Retainer(engine, retention.Policy(max_age_s=30 * DAY))
    with caplog.at_level(logging.WARNING, "draftscope.store.retention"):
        report = retainer.run_once()
    assert [r.id for r, _ in report.deleted] == [older, old]
    lines = [r.getMessage() for r in caplog.records if r.name == "draftscope.store.retention"]
    for run, estimate in report.deleted:
        assert any(f"retention deleted run {run.id} (ended, last data" in line and f"~{estimate} bytes" in line
                   and estimate > 0 for line in lines), lines
    assert any(f"retention deleted 2 runs: live rows {report.bytes_before} -> {report.bytes_after} bytes" in line
               for line in lines), lines
    assert kept not in "".join(lines)
    engine.dispose()
