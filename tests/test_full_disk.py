"""A dashboard served on a SQLite store whose disk is full (a real 2 MB tmpfs, filled): the summary it
cannot write is said on the run page, the runs list and ``/healthz``, the pages fall back to the stored
steps instead of claiming a healthy run with nothing in it, and no background thread dies; once space
is back, everything recovers by itself."""

from __future__ import annotations

import os
import uuid

import orjson
from fastapi.testclient import TestClient

from draftscope.settings import Settings
from draftscope.store import db
from draftscope.store.ingest import BatchWriter
from draftscope.web.app import create_app
from tests.fixtures.disk import fill
from tests.fixtures.store import make_batch, run_record, sample_record, settle, step_record
from tests.fixtures.wait import until

REQUESTS, STEPS = 8, 12  # verify steps per request, all sampled


def _stored_run(url: str) -> tuple[str, object]:
    """A run stored as a tracer's sink leaves it: requests, their steps and samples, no aggregates
    (no dashboard was running). The writer's engine stays open with its WAL unmerged, as the
    tracer's connection is when its sink fills the disk."""
    engine = db.make_engine(url, autocheckpoint=False)
    run_id = uuid.uuid4().hex
    rids = [f"req-{i}" for i in range(REQUESTS)]
    BatchWriter(engine).write(orjson.dumps(make_batch(
        run_id, run=run_record(status="ended"),
        requests=[{"rid": r, "sampled": True, "traced_verify_ct": STEPS, "spec_verify_ct": STEPS,
                   "output_len": 3 * STEPS} for r in rids],
        steps=[step_record(r, i) for r in rids for i in range(STEPS)],
        samples=[sample_record(i, rid=r) for r in rids for i in range(STEPS)])))
    return run_id, engine


def test_a_full_disk_is_said_on_every_page_and_healthz_and_recovers(tiny_disk):
    url = f"sqlite:///{tiny_disk / 'store.db'}"
    db.upgrade(url)
    run_id, tracer_engine = _stored_run(url)
    with tracer_engine.connect() as conn:  # holds the WAL and its index open, unmerged
        conn.exec_driver_sql("select count(*) from runs").scalar()
        conn.rollback()  # no read transaction left open: checkpoints wait for none
        filler = fill(tiny_disk)
        with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
            state = client.app.state
            until(lambda: state.refresher.run_problem(run_id), "the refresh of the run failed")
            until(lambda: state.checkpointer.errors, "a WAL checkpoint failed")
            failure = state.refresher.run_problem(run_id)
            assert "database or disk is full" in failure.reason, failure

            page = client.get(f"/runs/{run_id}")
            assert page.status_code == 200
            html = page.text
            assert 'id="summary-stale"' in html and "database or disk is full" in html
            assert "built from 0 of its 1 stored batches" in html
            assert "No check failed" not in html and "Not diagnosed" in html
            assert f"{REQUESTS * STEPS}</div><div class=\"l\">verify steps stored" in html
            assert "0</div><div class=\"l\">verify steps sampled" not in html
            assert "missing</span>" not in html  # the requests table counts the stored steps themselves
            rows = client.get(f"/runs/{run_id}/requests.csv").text.splitlines()[1:]
            assert len(rows) == REQUESTS and all(r.split(",")[4] == str(STEPS) for r in rows), rows

            twin = client.get(f"/runs/{run_id}.json").json()["summary_state"]
            assert twin["stale"] and twin["refresh_failed"]["reason"] == failure.reason
            runs_list = client.get("/").text
            assert 'id="refresh-failed"' in runs_list and "database or disk is full" in runs_list

            health = client.get("/healthz")
            assert health.status_code == 200 and health.json()["status"] == "degraded"
            problems = " ".join(health.json()["problems"])
            assert "database or disk is full" in problems and "WAL checkpoints fail" in problems
            assert run_id not in health.text
            assert state.checkpointer.alive() and state.refresher.alive()
            errors = state.checkpointer.errors
            until(lambda: state.checkpointer.errors > errors, "the checkpoint thread keeps trying")

            os.remove(filler)
            settle(client)  # the failed run is retried at once when asked
            assert state.refresher.run_problem(run_id) is None
            until(lambda: client.get("/healthz").json()["status"] == "ok", "healthz is ok again")
            html = client.get(f"/runs/{run_id}").text
            assert 'id="summary-stale"' not in html and "verify steps sampled" in html
            assert 'id="refresh-failed"' not in client.get("/").text
    tracer_engine.dispose()
