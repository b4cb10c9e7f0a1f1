"""Keep the store bounded: delete whole runs, oldest first, never one that is still being written.

No write transaction of retention holds the store for long, so a live run's ingest keeps going:

- A run is first marked (``runs.status`` set to ``PRUNING``, one short transaction that also checks
  it is not being written); from then on every page, the API and bundle export treat it as gone.
  Its rows then go in chunks, each table children first, each chunk its own short transaction; the
  run row goes last with whatever is left of it (rows a late batch added), so no reader ever sees
  half a run and no row outlives its run. A prune that stopped half way finishes a marked run first.
- SQLite gives freed pages back in small ``incremental_vacuum`` steps, each its own transaction.
- Each chunk and step is sized to hold the write lock about ``STEP_TARGET_S``; after it, a PASSIVE
  checkpoint copies the WAL back (it waits for no one and blocks no writer, so the WAL stays small
  and a writer's commit has little to checkpoint), and retention pauses at least as long as it held
  the lock, so a writer waiting in its busy handler gets the lock at its next try. One TRUNCATE
  checkpoint at the end empties the WAL file, given up after ``TRUNCATE_BUSY_MS`` if anyone is busy.

The size of a store is the bytes its live rows take: on SQLite the pages in use
(``page_count - freelist_count``), on PostgreSQL the tuples' bytes (``pg_column_size``; indexes not
counted). A SQLite store made before incremental auto-vacuum (schema 0004) reuses freed pages but
only shrinks after one full ``vacuum``.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator
import sqlalchemy as sa
from sqlmodel import SQLModel

from draftscope.store.db import failure_reason
from draftscope.store.tables import BATCHES, RUNS, SAMPLES, STATS, STEPS, key_of, of_run

log = logging.getLogger(__name__)
WRITING_WINDOW_S = 3600.0  # a running run with data this recent may still be written (a tracer's outage)
RECENT_S = 60.0  # any run with a batch this recent is being written (an import, a late final batch)
PRUNING = "pruning"  # runs.status of a run being deleted: pages, the API and export treat it as gone
STEP_TARGET_S = 0.05  # each delete chunk or vacuum step is sized to hold the write lock about this long
PAUSE_MIN_S = 0.01  # and is followed by a pause at least this long, and at least as long as it held it
DELETE_CHUNK_ROWS = (200, 2000, 50_000)  # rows per delete transaction: fewest, first, most
VACUUM_STEP_PAGES = (16, 256, 8192)  # pages per incremental_vacuum step: fewest, first, most (4 KiB each)
TRUNCATE_BUSY_MS = 200  # the final TRUNCATE checkpoint waits at most this for readers and writers
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
    per_batch = (sa.select(BATCHES.c.run_id, sa.func.max(BATCHES.c.received_at).label("last"),
                           sa.func.sum(BATCHES.c.request_rows + BATCHES.c.step_rows
                                       + BATCHES.c.sample_rows + BATCHES.c.health_rows
                                       + BATCHES.c.finding_rows).label("rows"))
                 .group_by(BATCHES.c.run_id).subquery())
    query = (sa.select(RUNS.c.id, RUNS.c.status, RUNS.c.started_at, RUNS.c.ended_at,
                       per_batch.c.last, per_batch.c.rows)
             .select_from(RUNS.outerjoin(per_batch, per_batch.c.run_id == RUNS.c.id)))
    if run_id is not None:
        query = query.where(RUNS.c.id == run_id)
    runs = []
    for r in conn.execute(query):
        last = r.last or r.ended_at or r.started_at
        writing = r.status != PRUNING and ((r.last is not None and r.last > now - RECENT_S) or
                                           (r.status == "running" and last > now - WRITING_WINDOW_S))
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
            if any(fk.column.table is RUNS for fk in t.foreign_keys)]


class _Pacer:
    """Sizes retention's write transactions and lets other writers in between them (module docstring).

    ``size`` is the next step's rows or pages: scaled after each step towards holding the write lock
    ``STEP_TARGET_S``, within (fewest, most). On SQLite each step is followed by a PASSIVE checkpoint
    and a pause until at least ``max(held, PAUSE_MIN_S)`` has passed since it committed (PostgreSQL
    has no single write lock to hand over: no pause)."""

    def __init__(self, engine: sa.Engine, sizes: tuple[int, int, int], kind: str):
        self.kind = kind
        self.fewest, self.size, self.most = sizes
        self._raw = engine.raw_connection() if engine.dialect.name == "sqlite" else None
        self._partial = False

    def partial(self) -> None:
        """The step now running did less than ``size`` (a table's last chunk): do not grow on it."""
        self._partial = True

    @contextmanager
    def step(self) -> Iterator[Callable[[], None]]:
        """Time one write transaction (the caller's, inside this block: it calls what this yields
        once it holds the write lock, else the block's start counts); then checkpoint, resize, pause."""
        start = [time.perf_counter()]
        yield lambda: start.__setitem__(0, time.perf_counter())
        held = time.perf_counter() - start[0]
        log.debug("draftscope: retention %s of %d took %.3f s", self.kind, self.size, held,
                  extra={"step": (self.kind, held)})
        resume = time.perf_counter() + max(held, PAUSE_MIN_S)
        scale = min(max(STEP_TARGET_S / max(held, 1e-4), 0.5), 2.0)  # halve or double at most
        if scale < 1 or not self._partial:  # a short last chunk says nothing about a full one
            self.size = int(min(max(self.size * scale, self.fewest), self.most))
        self._partial = False
        if self._raw is not None:
            self.checkpoint("PASSIVE")
            time.sleep(max(resume - time.perf_counter(), 0.0))

    def checkpoint(self, mode: str, busy_ms: int | None = None) -> None:
        """SQLite: ``wal_checkpoint(mode)``, waiting at most ``busy_ms`` for others when given."""
        if self._raw is None:
            return
        cur = self._raw.cursor()
        start = time.perf_counter()
        if busy_ms is not None:
            cur.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
        try:
            cur.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
        finally:
            if busy_ms is not None:
                cur.execute("PRAGMA busy_timeout=30000")
        seconds = time.perf_counter() - start
        log.debug("draftscope: retention checkpoint %s took %.3f s", mode, seconds,
                  extra={"step": (f"checkpoint {mode}", seconds)})

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None


def _write(engine: sa.Engine) -> sa.Connection:
    return engine.connect().execution_options(draftscope_write=True)


def _lower_watermarks(conn: sa.Connection) -> None:
    """Lower the aggregates' id watermarks past ids SQLite may reuse once the highest rows are gone."""
    for column, table in ((STATS.c.step_id_max, STEPS),
                          (STATS.c.sample_id_max, SAMPLES)):
        top = sa.select(sa.func.coalesce(sa.func.max(table.c.id), 0)).scalar_subquery()
        conn.execute(STATS.update().where(column > top).values({column: top}))


def mark_run(engine: sa.Engine, run_id: str, now: float | None = None) -> bool:
    """Mark the run ``PRUNING`` (from then on it is gone to every reader); False (nothing marked)
    when it is being written or not stored. One short transaction."""
    with _write(engine) as conn, conn.begin():
        runs = stored_runs(conn, time.time() if now is None else now, run_id)
        if not runs or runs[0].writing:
            return False
        conn.execute(RUNS.update().where(RUNS.c.id == run_id).values(status=PRUNING))
    return True


def delete_run(engine: sa.Engine, run_id: str, now: float | None = None) -> bool:
    """Delete the run and every row of it (module docstring): mark it, then its rows in chunks, each
    its own short transaction, then the run row; False (nothing deleted) when it is being written or
    not stored."""
    if not mark_run(engine, run_id, now):
        return False
    delete_marked(engine, run_id)
    return True


def delete_marked(engine: sa.Engine, run_id: str) -> None:
    """The rows of a run marked ``PRUNING``, in chunks, children first; the run row last."""
    pacer = _Pacer(engine, DELETE_CHUNK_ROWS, "delete chunk")
    with engine.connect() as conn:
        run = key_of(conn, run_id)  # a value PostgreSQL plans the chunks by (see of_run)
    try:
        for table in run_tables():
            key = list(table.primary_key.columns)
            while True:
                with pacer.step() as locked, _write(engine) as conn, conn.begin():
                    locked()
                    rows = pacer.size
                    where = of_run(table, run_id, run)
                    if len(key) == 1:  # else a run's few aggregate rows: at once
                        where = key[0].in_(sa.select(key[0]).where(where).limit(rows))
                    deleted = conn.execute(table.delete().where(where)).rowcount
                    if deleted < rows:
                        pacer.partial()
                    # a late batch may have re-written the run record: it stays hidden
                    conn.execute(RUNS.update().where(RUNS.c.id == run_id, RUNS.c.status != PRUNING)
                                 .values(status=PRUNING))
                    _lower_watermarks(conn)
                if len(key) != 1 or deleted < rows:
                    break
        with pacer.step() as locked, _write(engine) as conn, conn.begin():
            locked()
            for table in run_tables():  # what a late batch added since its table was done
                conn.execute(table.delete().where(of_run(table, run_id, run)))
            conn.execute(RUNS.delete().where(RUNS.c.id == run_id))
            _lower_watermarks(conn)
    finally:
        pacer.close()


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
    chosen = [r for r in runs if r.status == PRUNING]  # a prune stopped half way: finish it
    chosen += [by_id[i] for i in dict.fromkeys(run_ids) if i in by_id]
    if older_than_s is not None:
        chosen += [r for r in runs if r.last_at < now - older_than_s]
    left = size - sum(estimate[r.id] for r in chosen if not r.writing)
    if max_bytes is not None:
        for r in runs:
            if left <= max_bytes:
                break
            if r.writing and r.id not in report.kept_writing:
                report.kept_writing.append(r.id)  # over the bound, but it cannot go
            elif r not in chosen and not r.writing:
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


def reclaim(engine: sa.Engine) -> int:
    """SQLite: give free pages back to the file system in short ``incremental_vacuum`` steps (module
    docstring; a store without incremental auto-vacuum keeps them for reuse). Returns the pages
    freed; 0 on PostgreSQL, whose autovacuum makes deleted rows' space reusable."""
    if engine.dialect.name != "sqlite":
        return 0
    freed = 0
    pacer = _Pacer(engine, VACUUM_STEP_PAGES, "incremental_vacuum step")
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if cur.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
            return 0
        while True:
            before = cur.execute("PRAGMA freelist_count").fetchone()[0]
            if not before:
                break
            with pacer.step():  # its own transaction (the connection is in autocommit); execute()
                # would free one page only: sqlite3 steps a statement without columns once
                cur.executescript(f"PRAGMA incremental_vacuum({pacer.size});")
                if before < pacer.size:
                    pacer.partial()
            after = cur.execute("PRAGMA freelist_count").fetchone()[0]
            freed += before - after
            if after >= before:
                break
        pacer.checkpoint("TRUNCATE", busy_ms=TRUNCATE_BUSY_MS)  # empties the WAL file unless busy
    finally:
        raw.close()
        pacer.close()
    return freed


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
    """A thread of the dashboard process that applies a ``Policy`` every ``interval_s`` (first at start).

    Each run it deletes is logged at WARNING (its id, last data, records and estimated bytes; then the
    store's live bytes before and after), so the default log shows what the dashboard deleted on its
    own. A pass that fails is counted and logged and ``problem()`` says so until one succeeds."""

    def __init__(self, engine: sa.Engine, policy: Policy, interval_s: float = 600.0):
        self.engine, self.policy, self.interval_s = engine, policy, interval_s
        self.passes = self.errors = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="draftscope-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def problem(self) -> str | None:
        return None if self.last_error is None else f"The last retention pass failed ({self.last_error})."

    def run_once(self) -> PruneReport:
        report = prune(self.engine, older_than_s=self.policy.max_age_s, max_bytes=self.policy.max_bytes)
        for run, estimate in report.deleted:
            log.warning("draftscope: retention deleted run %s (%s, last data %s UTC, %d records, ~%d bytes)",
                        run.id, run.status, time.strftime("%Y-%m-%d %H:%M", time.gmtime(run.last_at)),
                        run.rows, estimate)
        if report.deleted:
            freed = reclaim(self.engine)
            log.warning("draftscope: retention deleted %d run%s: live rows %d -> %d bytes (bound: %s); "
                        "%d free pages given back", len(report.deleted), "s" if len(report.deleted) != 1 else "",
                        report.bytes_before, report.bytes_after, self._bound(), freed)
        if self.policy.max_bytes is not None and report.bytes_after > self.policy.max_bytes:
            log.warning("draftscope: the store's live rows take %d bytes, over DRAFTSCOPE_RETAIN_MAX_BYTES "
                        "(%d): the runs left are being written (%s)", report.bytes_after,
                        self.policy.max_bytes, ", ".join(report.kept_writing) or "none left to delete")
        return report

    def _bound(self) -> str:
        parts = []
        if self.policy.max_age_s is not None:
            parts.append(f"runs last written more than {self.policy.max_age_s / 86400:g} days ago")
        if self.policy.max_bytes is not None:
            parts.append(f"at most {self.policy.max_bytes} bytes")
        return ", ".join(parts)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
                self.last_error = None
            except Exception as exc:  # a store briefly unreachable: the next pass retries
                self.errors += 1
                self.last_error = failure_reason(exc)
                log.exception("draftscope: retention pass failed")
            self.passes += 1
            self._stop.wait(self.interval_s)
