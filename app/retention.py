"""Keep the store bounded: delete whole runs, oldest first, never one that is still being written.

A run goes in one transaction with every row that references it (each table with a foreign key to
``runs``, bundle imports and aggregates included), so no half run is ever left. The size of a store
is the bytes its live rows take: on SQLite the pages in use (``page_count - freelist_count``), on
PostgreSQL the tuples' bytes (``pg_column_size``; indexes not counted). SQLite gives freed pages
back in small ``incremental_vacuum`` steps, each its own short write transaction, so ingest waits
for one step at most, with a WAL checkpoint every few steps so the WAL does not grow by what moves; a store made before incremental auto-vacuum (schema 0004) reuses freed pages
but only shrinks after one full ``vacuum``.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from dataclasses import dataclass, field
import sqlalchemy as sa
from sqlmodel import SQLModel

from draftscope import models

log = logging.getLogger(__name__)
_RUNS = models.Run.__table__
_BATCHES = models.IngestBatch.__table__
_STATS = models.RunStats.__table__
WRITING_WINDOW_S = 3600.0  # a running run with data this recent may still be written (a tracer's outage)
RECENT_S = 60.0  # any run with a batch this recent is being written (an import, a late final batch)
VACUUM_STEP_PAGES = 2048  # pages per incremental_vacuum step (8 MiB at 4 KiB pages)
CHECKPOINT_EVERY = 16  # steps between WAL checkpoints, so the WAL stays within ~128 MiB
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str | int) -> int:
    """Bytes from ``10GB``, ``500MiB``, ``2000000`` (decimal and binary units); ValueError otherwise."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size: use bytes or a unit, e.g. 10GB, 500MB, 2GiB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_age(text: str) -> float:
    """Seconds from ``7d``, ``12h``, ``30m``, ``90s``, ``2w``; ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not m:
        raise ValueError(f"{text!r} is not an age: use a number and s, m, h, d or w, e.g. 7d, 12h")
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]


@dataclass(frozen=True)
class StoredRun:
    """A run as retention sees it: when it last got data, whether it may still be written, its rows."""

    id: str
    status: str
    started_at: float
    last_at: float  # newest batch received, else ended_at, else started_at
    rows: int  # records received in its batches
    writing: bool


@dataclass
class PruneReport:
    """What a prune did (or, dry, would do): runs deleted oldest first with their estimated bytes."""

    deleted: list[tuple[StoredRun, int]] = field(default_factory=list)
    kept_writing: list[str] = field(default_factory=list)  # asked for or over a bound, but being written
    unknown: list[str] = field(default_factory=list)  # asked for by id, not stored
    bytes_before: int = 0
    bytes_after: int = 0


def stored_runs(conn: sa.Connection, now: float, run_id: str | None = None) -> list[StoredRun]:
    """Every run (or the one ``run_id``), least recently written first."""
    per_batch = (sa.select(_BATCHES.c.run_id, sa.func.max(_BATCHES.c.received_at).label("last"),
                           sa.func.sum(_BATCHES.c.request_rows + _BATCHES.c.step_rows
                                       + _BATCHES.c.sample_rows + _BATCHES.c.health_rows
                                       + _BATCHES.c.finding_rows).label("rows"))
                 .group_by(_BATCHES.c.run_id).subquery())
    query = (sa.select(_RUNS.c.id, _RUNS.c.status, _RUNS.c.started_at, _RUNS.c.ended_at,
                       per_batch.c.last, per_batch.c.rows)
             .select_from(_RUNS.outerjoin(per_batch, per_batch.c.run_id == _RUNS.c.id)))
    if run_id is not None:
        query = query.where(_RUNS.c.id == run_id)
    runs = []
    for r in conn.execute(query):
        last = r.last or r.ended_at or r.started_at
        writing = (r.last is not None and r.last > now - RECENT_S) or \
            (r.status == "running" and last > now - WRITING_WINDOW_S)
        runs.append(StoredRun(r.id, r.status, r.started_at, last, int(r.rows or 0), writing))
    return sorted(runs, key=lambda run: (run.last_at, run.id))


def store_bytes(conn: sa.Connection) -> int:
    """Bytes the store's live rows take (module docstring)."""
    if conn.dialect.name == "sqlite":
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
        return (pages - free) * conn.exec_driver_sql("PRAGMA page_size").scalar_one()
    return sum(conn.execute(sa.select(sa.func.coalesce(sa.func.sum(
        sa.func.pg_column_size(sa.literal_column(f"{t.name}.*"))), 0)).select_from(t)).scalar_one()
        for t in SQLModel.metadata.sorted_tables)


def run_tables() -> list[sa.Table]:
    """Every table whose rows belong to a run (a foreign key to ``runs``), children first."""
    return [t for t in reversed(SQLModel.metadata.sorted_tables)
            if any(fk.column.table is _RUNS for fk in t.foreign_keys)]


def delete_run(engine: sa.Engine, run_id: str, now: float | None = None) -> bool:
    """Delete the run and every row of it in one write transaction; False (nothing deleted) when it
    is being written or not stored. Lowers the aggregates' id watermarks past ids SQLite may reuse."""
    with engine.connect().execution_options(draftscope_write=True) as conn, conn.begin():
        runs = stored_runs(conn, time.time() if now is None else now, run_id)
        if not runs or runs[0].writing:
            return False
        for table in run_tables():
            conn.execute(table.delete().where(table.c.run_id == run_id))
        conn.execute(_RUNS.delete().where(_RUNS.c.id == run_id))
        for column, table in ((_STATS.c.step_id_max, models.VerifyStep.__table__),
                              (_STATS.c.sample_id_max, models.TensorSample.__table__)):
            top = sa.select(sa.func.coalesce(sa.func.max(table.c.id), 0)).scalar_subquery()
            conn.execute(_STATS.update().where(column > top).values({column: top}))
    return True


def prune(engine: sa.Engine, *, older_than_s: float | None = None, max_bytes: int | None = None,
          run_ids: tuple[str, ...] = (), dry_run: bool = False, now: float | None = None) -> PruneReport:
    """Delete the runs named, those last written more than ``older_than_s`` ago, then the least
    recently written until the store is under ``max_bytes``; never a run being written. ``dry_run``:
    only say which (sizes estimated from the runs' share of the store's rows)."""
    now = time.time() if now is None else now
    report = PruneReport()
    with engine.connect() as conn:
        report.bytes_before = report.bytes_after = store_bytes(conn)
    gone: set[str] = set()
    for _ in range(8):  # the size bound is re-measured after each pass (its estimate can be short)
        with engine.connect() as conn:
            runs = [r for r in stored_runs(conn, now) if r.id not in gone]
            size = report.bytes_after
        victims = _select(runs, size, report, older_than_s, max_bytes, run_ids, now)
        if not victims:
            break
        for run, estimate in victims:
            gone.add(run.id)
            if dry_run:
                report.deleted.append((run, estimate))
            elif delete_run(engine, run.id, now):
                report.deleted.append((run, estimate))
                _checkpoint(engine)
                log.info("draftscope: pruned run %s (last data %s, ~%d bytes)", run.id,
                         time.strftime("%Y-%m-%d %H:%M", time.gmtime(run.last_at)), estimate)
            else:
                report.kept_writing.append(run.id)
        if dry_run:
            report.bytes_after = size - sum(e for _, e in report.deleted)
            break
        with engine.connect() as conn:
            report.bytes_after = store_bytes(conn)
        if max_bytes is None or report.bytes_after <= max_bytes:
            break
    return report


def _select(runs: list[StoredRun], size: int, report: PruneReport, older_than_s: float | None,
            max_bytes: int | None, run_ids: tuple[str, ...], now: float) -> list[tuple[StoredRun, int]]:
    total_rows = sum(r.rows for r in runs) or 1
    estimate = {r.id: size * r.rows // total_rows for r in runs}
    by_id = {r.id: r for r in runs}
    report.unknown = [i for i in run_ids if i not in by_id and i not in report.unknown
                      and i not in {run.id for run, _ in report.deleted}]
    chosen = [by_id[i] for i in dict.fromkeys(run_ids) if i in by_id]
    if older_than_s is not None:
        chosen += [r for r in runs if r.last_at < now - older_than_s]
    left = size - sum(estimate[r.id] for r in chosen if not r.writing)
    if max_bytes is not None:
        for r in runs:
            if left <= max_bytes:
                break
            if r not in chosen and not r.writing:
                chosen.append(r)
                left -= max(estimate[r.id], 1)
    victims = []
    for r in dict.fromkeys(chosen):
        if r.writing:
            if r.id not in report.kept_writing:
                report.kept_writing.append(r.id)
        else:
            victims.append((r, estimate[r.id]))
    return victims


def reclaim(engine: sa.Engine, step_pages: int = VACUUM_STEP_PAGES) -> int:
    """SQLite: give free pages back to the file system, ``step_pages`` per short write transaction
    (a store without incremental auto-vacuum keeps them for reuse). Returns the pages freed; 0 on
    PostgreSQL, whose autovacuum makes deleted rows' space reusable."""
    if engine.dialect.name != "sqlite":
        return 0
    freed = 0
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if cur.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
            return 0
        for step in itertools.count(1):
            before = cur.execute("PRAGMA freelist_count").fetchone()[0]
            if not before:
                break
            cur.execute(f"PRAGMA incremental_vacuum({int(step_pages)})").fetchall()
            after = cur.execute("PRAGMA freelist_count").fetchone()[0]
            freed += before - after
            if after >= before:
                break
            if step % CHECKPOINT_EVERY == 0:  # else moved pages pile up in the WAL: disk it may not have
                cur.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        cur.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # the file shrinks here
    finally:
        raw.close()
    return freed


def _checkpoint(engine: sa.Engine) -> None:
    """SQLite: copy the WAL back and empty it, so a prune's deletes do not pile up in it."""
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").all()


def vacuum(engine: sa.Engine) -> None:
    """A full ``VACUUM``: rewrites a SQLite store (once, for a store made before incremental
    auto-vacuum: it switches it on; blocks writers while it runs); ``VACUUM ANALYZE`` on PostgreSQL."""
    raw = engine.raw_connection()
    try:
        if engine.dialect.name == "sqlite":
            raw.cursor().execute("VACUUM")
            raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        else:
            raw.driver_connection.autocommit = True
            raw.cursor().execute("VACUUM ANALYZE")
    finally:
        raw.close()


@dataclass(frozen=True)
class Policy:
    """The automatic bound: runs last written more than ``max_age_s`` ago go, then the least recently
    written while the store is over ``max_bytes``."""

    max_age_s: float | None = None
    max_bytes: int | None = None

    def __bool__(self) -> bool:
        return self.max_age_s is not None or self.max_bytes is not None


class Retainer:
    """A thread of the dashboard process that applies a ``Policy`` every ``interval_s`` (first at start)."""

    def __init__(self, engine: sa.Engine, policy: Policy, interval_s: float = 600.0):
        self.engine, self.policy, self.interval_s = engine, policy, interval_s
        self.passes = self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="draftscope-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def run_once(self) -> PruneReport:
        report = prune(self.engine, older_than_s=self.policy.max_age_s, max_bytes=self.policy.max_bytes)
        if report.deleted:
            reclaim(self.engine)
        return report

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a store briefly unreachable: the next pass retries
                self.errors += 1
                log.exception("draftscope: retention pass failed")
            self.passes += 1
            self._stop.wait(self.interval_s)
