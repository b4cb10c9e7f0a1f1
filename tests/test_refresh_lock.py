"""Two dashboard processes on one PostgreSQL store refresh a run one at a time: its findings are
computed by one of them and stored once (``analyze._run_lock``)."""

from __future__ import annotations

import threading
import uuid

import orjson
import pytest
import sqlalchemy as sa

from draftscope.store import db, models
from draftscope.store.analyze import RUN_LOCK_CLASS, refresh_run
from draftscope.store.ingest import BatchWriter
from tests.fixtures.store import make_batch, run_record, sample_record

pytestmark = pytest.mark.postgres
AUX_OFF = {"algorithm": "EAGLE3",
           "target": {"hidden_size": 128, "num_layers": 8, "capture_aux_hidden_states": False},
           "draft": {"embed_width": 128, "fc_in_features": 384, "hidden_size": 128}}


@pytest.fixture
def pg_run(postgres_server):
    from tests.fixtures.store import create_database

    url = create_database(postgres_server, f"t_{uuid.uuid4().hex[:12]}")
    db.upgrade(url)
    engine = db.make_engine(url)
    run_id = uuid.uuid4().hex
    narrow = sample_record(0, width=128, phase="draft_extend", shape=[4, 128])
    BatchWriter(engine).write(orjson.dumps(make_batch(run_id, run=run_record(facts=AUX_OFF), samples=[narrow])))
    yield engine, run_id
    engine.dispose()


def _findings(engine, run_id) -> list[str]:
    table = models.Finding.__table__
    with engine.connect() as conn:
        return sorted(conn.execute(sa.select(table.c.rule_id).where(table.c.run_id == run_id)).scalars())


def test_a_run_being_refreshed_elsewhere_is_left_to_that_process(pg_run):
    engine, run_id = pg_run
    with engine.connect() as other, other.begin():  # another dashboard process, mid-refresh
        other.execute(sa.select(sa.func.pg_advisory_xact_lock(RUN_LOCK_CLASS, sa.func.hashtext(run_id))))
        assert refresh_run(engine, run_id) is None
        assert _findings(engine, run_id) == []
    found = refresh_run(engine, run_id)
    assert "fc-bypassed" in [f.rule_id for f in found]
    assert _findings(engine, run_id) == sorted(f.rule_id for f in found)


def test_concurrent_refreshes_store_the_findings_once(pg_run):
    engine, run_id = pg_run
    start = threading.Barrier(6)

    def refresh():
        start.wait()
        refresh_run(engine, run_id)

    for _ in range(5):
        threads = [threading.Thread(target=refresh) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    rules = _findings(engine, run_id)
    assert "fc-bypassed" in rules and len(rules) == len(set(rules))
