"""Write wire batches straight into a SQLite store built by the dashboard's migrations (stdlib only)."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import time
from typing import Any, Dict

from draftscope_tracer.transport import wire

RUN_COLUMNS = ["id", *(c for c in wire.RunRecord.__annotations__)]
# The store's upsert keys (see the app's models): a later record overwrites non-null fields.
UPSERT_KEYS = {"requests": ("run_id", "rid"), "verify_steps": ("run_key", "rid", "step_index")}
NEXT_RUN_KEY = "(SELECT COALESCE(MAX(key), 0) + 1 FROM runs)"  # a new run's key (the app's models.NextRunKey)


class StoreNotReady(RuntimeError):
    """The SQLite file is missing or its schema was not built by ``draftscope db upgrade``."""


def _encode(column: str, value: Any) -> Any:
    if value is not None and column in wire.JSON_COLUMNS:
        return wire.to_json(value).decode()
    return value


class SqliteSink:
    """One connection, used only by the writer thread; one transaction per batch."""

    def __init__(self, path: str):
        self.path = path
        self.name = f"the SQLite sink ({path})"
        if not os.path.isfile(path):
            raise StoreNotReady(f"DRAFTSCOPE_DB={path} does not exist; "
                                f"run `draftscope db upgrade --db sqlite:///{os.path.abspath(path)}`")
        self._conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA busy_timeout=30000")
        self._conn.execute("PRAGMA foreign_keys=ON")
        tables = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = ({"alembic_version", "runs", "ingest_batches"} | set(wire.TABLE_COLUMNS)) - tables
        if missing:
            self._conn.close()
            raise StoreNotReady(f"DRAFTSCOPE_DB={path} is not a migrated draftscope store (missing "
                                f"{', '.join(sorted(missing))}); run "
                                f"`draftscope db upgrade --db sqlite:///{os.path.abspath(path)}`")
        behind = [f"{table}.{c}" for table, columns in wire.TABLE_COLUMNS.items()
                  for c in sorted(set(columns) - {r[1] for r in self._conn.execute(f"PRAGMA table_info({table})")})]
        if behind:
            self._conn.close()
            raise StoreNotReady(f"DRAFTSCOPE_DB={path} was migrated by an older draftscope (it lacks "
                                f"{', '.join(behind)}); run "
                                f"`draftscope db upgrade --db sqlite:///{os.path.abspath(path)}`")

    def send(self, batch: Dict[str, Any]) -> None:
        conn, run_id = self._conn, batch["run_id"]
        counts = {key: len(batch.get(key) or ()) for key in wire.RECORD_TABLES}
        conn.execute("BEGIN IMMEDIATE")
        try:
            if batch.get("run"):
                self._upsert_run(run_id, batch["run"])
            found = conn.execute("SELECT key FROM runs WHERE id = ?", (run_id,)).fetchone()
            runs = {"run_id": run_id, "run_key": found[0] if found else None}  # what a table names its run by
            for key, table in wire.RECORD_TABLES.items():
                if counts[key]:
                    run = runs[wire.TABLE_COLUMNS[table][0]]
                    conn.executemany(_insert_sql(table), _rows(table, run, batch[key]))
            conn.execute(
                "INSERT OR IGNORE INTO ingest_batches (batch_id, run_id, sent_at, received_at, request_rows,"
                " step_rows, sample_rows, health_rows, finding_rows) VALUES (?,?,?,?,?,?,?,?,?)",
                (batch["batch_id"], run_id, batch.get("sent_at"), time.time(),
                 *(counts[k] for k in ("requests", "steps", "samples", "health", "findings"))))
            conn.execute("COMMIT")
        except BaseException:
            # A failed COMMIT (e.g. "database or disk is full") may already have ended the transaction:
            # a ROLLBACK then raises "no transaction is active", which must not mask the real error.
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise

    def close(self) -> None:
        self._conn.close()

    def _upsert_run(self, run_id: str, run: Dict[str, Any]) -> None:
        old = self._conn.execute("SELECT facts FROM runs WHERE id = ?", (run_id,)).fetchone()
        if old and old[0] and run.get("facts") is not None:  # facts merge key by key
            run = {**run, "facts": {**json.loads(old[0]), **run["facts"]}}
        values = {"id": run_id, **{c: run.get(c) for c in RUN_COLUMNS if c != "id"}}
        cols = [c for c in RUN_COLUMNS if c == "id" or values[c] is not None]
        updates = ", ".join(_KEEP.get(c, f"{c} = excluded.{c}") for c in cols if c != "id")
        self._conn.execute(
            f"INSERT INTO runs ({', '.join(cols)}, key) VALUES ({', '.join('?' * len(cols))}, {NEXT_RUN_KEY}) "
            f"ON CONFLICT(id) DO UPDATE SET {updates}",
            [_encode(c, values[c]) for c in cols])


# as the dashboard's ingest keeps them: a run being pruned keeps that status; a crashed one (one process of a
# multi-process server saw it die) is not marked running or ended again by another process's later batch
_KEPT = "runs.status = 'crashed' AND excluded.status IN ('running', 'ended')"
_KEEP = {"status": f"status = CASE WHEN runs.status = 'pruning' OR ({_KEPT}) THEN runs.status ELSE excluded.status END",
        "ended_at": f"ended_at = CASE WHEN {_KEPT} THEN runs.ended_at ELSE excluded.ended_at END"}


@functools.lru_cache(maxsize=None)
def _insert_sql(table: str) -> str:
    cols = wire.TABLE_COLUMNS[table]
    sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    keys = UPSERT_KEYS.get(table)
    if keys:
        sets = ", ".join(f"{c} = COALESCE(excluded.{c}, {table}.{c})" for c in cols if c not in keys)
        sql += f" ON CONFLICT({', '.join(keys)}) DO UPDATE SET {sets}"
    return sql


def _rows(table: str, run: Any, records: list) -> list:
    """Positional rows of ``records`` for ``table``'s columns (the run's id or key first); JSON columns as JSON text."""
    fields = wire.TABLE_COLUMNS[table][1:]
    json_at = [i for i, c in enumerate(fields, 1) if c in wire.JSON_COLUMNS]
    to_json = wire.to_json
    rows = []
    for r in records:
        row = [run, *map(r.get, fields)]
        for i in json_at:
            if row[i] is not None:
                row[i] = to_json(row[i]).decode()
        rows.append(row)
    return rows
