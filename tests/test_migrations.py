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


def test_0009_keys_the_steps_and_samples_of_stored_runs_and_back(db_url: str) -> None:
    """Every step and sample keeps its id and its run through 0009 and back; new ids go on after the old
    ones (PostgreSQL: the old sequence), and a deleted run's rows go with it."""
    db.upgrade(db_url, "0008_prompt_key")
    engine = db.make_engine(db_url)
    steps = "SELECT s.id, r.id, s.rid, s.step_index, s.accept_len FROM verify_steps s JOIN runs r ON r.{} ORDER BY s.id"
    samples = "SELECT s.id, r.id, s.point, s.step_index FROM tensor_samples s JOIN runs r ON r.{} ORDER BY s.id"
    try:
        with engine.begin() as conn:  # a 0008 store: two runs' steps and samples
            for run in ("a", "b"):
                conn.execute(sa.text("INSERT INTO runs (id, engine, engine_version, source, status, started_at) "
                                     "VALUES (:r, 'sglang', '0.5.23', 'tracer', 'running', 1.0)"), {"r": run})
                for i in range(3):
                    conn.execute(sa.text("INSERT INTO verify_steps (run_id, rid, step_index, at, drafted_tokens, "
                                         "accept_len, accept_flags) VALUES (:r, 'q', :i, 1.0, '[7]', :i, '[true]')"),
                                 {"r": run, "i": i})
                    conn.execute(sa.text("INSERT INTO tensor_samples (run_id, point, phase, at, rid, step_index, "
                                         "shape, dtype, width, rows) VALUES (:r, 'draft.input', 'decode', 1.0, 'q', "
                                         ":i, '[1, 8]', 'bf16', 8, 1)"), {"r": run, "i": i})
            before = (conn.execute(sa.text(steps.format("id = s.run_id"))).all(),
                      conn.execute(sa.text(samples.format("id = s.run_id"))).all())
        db.upgrade(db_url)
        with engine.begin() as conn:
            assert (conn.execute(sa.text(steps.format("key = s.run_key"))).all(),
                    conn.execute(sa.text(samples.format("key = s.run_key"))).all()) == before
            conn.execute(sa.text("INSERT INTO verify_steps (run_key, rid, step_index, at, drafted_tokens, accept_len, "
                                 "accept_flags) SELECT key, 'q', 3, 1.0, '[7]', 1, '[true]' FROM runs WHERE id = 'b'"))
            assert conn.execute(sa.text("SELECT max(id) FROM verify_steps")).scalar() == 7  # ids go on
            conn.execute(sa.text("DELETE FROM runs WHERE id = 'b'"))
            assert conn.execute(sa.text("SELECT count(*) FROM tensor_samples")).scalar() == 3  # cascades
        db.downgrade(db_url, "0008_prompt_key")
        with engine.begin() as conn:
            assert (conn.execute(sa.text(steps.format("id = s.run_id"))).all(),
                    conn.execute(sa.text(samples.format("id = s.run_id"))).all()) == \
                tuple([row for row in rows if row[1] == "a"] for rows in before)
            conn.execute(sa.text("INSERT INTO verify_steps (run_id, rid, step_index, at, drafted_tokens, accept_len, "
                                 "accept_flags) VALUES ('a', 'q', 3, 1.0, '[7]', 1, '[true]')"))
            assert conn.execute(sa.text("SELECT max(id) FROM verify_steps")).scalar() > 3  # SQLite: 4, PostgreSQL: 8
    finally:
        engine.dispose()
