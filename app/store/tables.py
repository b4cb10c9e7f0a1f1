"""The store's tables as SQLAlchemy Core tables, named once for the queries and writers that use them."""

from __future__ import annotations

import sqlalchemy as sa

from draftscope.store import models

RUNS = models.Run.__table__
REQUESTS = models.Request.__table__
STEPS = models.VerifyStep.__table__
SAMPLES = models.TensorSample.__table__
HEALTH = models.TracerHealth.__table__
FINDINGS = models.Finding.__table__
BATCHES = models.IngestBatch.__table__
IMPORTS = models.BundleImport.__table__
STATS = models.RunStats.__table__
BINS = models.RunStatBin.__table__
SESSIONS = models.LoginSession.__table__
RUN_FIELDS = [c for c in RUNS.c if c.name != "key"]  # a run as pages, API and bundles show it (the key is internal)


def run_key(run_id: str) -> sa.ScalarSelect:
    """The integer key of the run ``run_id``, as a scalar subquery (the database reads it once)."""
    return sa.select(RUNS.c.key).where(RUNS.c.id == run_id).scalar_subquery()


def key_of(conn: sa.Connection, run_id: str) -> int | None:
    """The integer key of the run ``run_id`` (None: no such run)."""
    return conn.execute(sa.select(RUNS.c.key).where(RUNS.c.id == run_id)).scalar()


def of_run(table: sa.Table, run_id: str, key: int | None = None) -> sa.ColumnElement[bool]:
    """``table``'s rows of the run ``run_id``: by its key where the table holds ``run_key``. ``key``: the key's
    value, read by the caller (``key_of``) for a query that reads many rows: PostgreSQL plans by a value, where a
    subquery's key is unknown at planning (beside one large run, taken to match most rows: a whole-table scan)."""
    if "run_key" in table.c:
        return table.c.run_key == (run_key(run_id) if key is None else key)
    return table.c.run_id == run_id
