"""Alembic migrations against real SQLite and PostgreSQL: round trip, and no drift from the models."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlmodel import SQLModel

from draftscope.store import db, models  # noqa: F401  (models registers the tables)


def _tables(url: str) -> set[str]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _drift(url: str) -> list:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(context, SQLModel.metadata)
    finally:
        engine.dispose()


def test_round_trip_and_no_drift(db_url: str) -> None:
    expected = set(SQLModel.metadata.tables)
    assert db.current_revision(db_url) is None
    db.upgrade(db_url)
    assert db.current_revision(db_url) == db.head_revision()
    assert _tables(db_url) == expected
    assert _drift(db_url) == []
    db.downgrade(db_url, "base")
    assert db.current_revision(db_url) is None
    assert _tables(db_url) == set()
    db.upgrade(db_url)
    assert _tables(db_url) == expected
    assert _drift(db_url) == []


def test_schema_state_says_what_to_run(db_url: str) -> None:
    state = db.schema_state(db_url)
    assert not state.ok
    assert "draftscope db upgrade" in state.problem()
    db.upgrade(db_url)
    state = db.schema_state(db_url)
    assert state.ok and state.problem() == ""


def test_0006_lists_the_orphans_of_runs_folded_before_it(db_url: str) -> None:
    from draftscope.store import queries

    db.upgrade(db_url, "0005_tree_parents")
    engine = db.make_engine(db_url)
    try:
        with engine.begin() as conn:  # a 0005 store: the runs' rows and their folded steps.rid series
            conn.execute(sa.text("INSERT INTO runs (id, engine, engine_version, source, status, started_at) "
                                 "VALUES ('r', 'sglang', '0.5.23', 'tracer', 'running', 1.0)"))
            conn.execute(sa.text("INSERT INTO requests (run_id, rid) VALUES ('r', 'rowed')"))
            conn.execute(sa.text("INSERT INTO run_stat_bins (run_id, series, key, bucket, n, total, lo, hi) "
                                 "VALUES ('r', 'steps.rid', 'rowed', 0, 1, 2, 0, 0), "
                                 "('r', 'steps.rid', 'orphan', 0, 3, 6, 0, 2)"))
        db.upgrade(db_url)
        with engine.connect() as conn:
            orphans = queries.orphan_requests(conn, "r")
        assert [(o["rid"], o["sampled_steps"], o["last_step"]) for o in orphans] == [("orphan", 3, 2)]
    finally:
        engine.dispose()
