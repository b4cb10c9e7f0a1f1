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


def of_run(table: sa.Table, run_id: str) -> sa.ColumnElement[bool]:
    """``table``'s rows of the run ``run_id``: by its key where the table holds ``run_key``."""
    if "run_key" in table.c:
        return table.c.run_key == run_key(run_id)
    return table.c.run_id == run_id
