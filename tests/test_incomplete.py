"""Incomplete requests are visible: a sampled request missing some of its verify steps is marked, and
steps whose request row never arrived are listed and have a page (not a 404)."""

from __future__ import annotations

import uuid

from draftscope.store import db, queries
from tests.fixtures.store import make_batch, run_record, settle, step_record


def _store(client) -> str:
    run_id = uuid.uuid4().hex
    batch = make_batch(
        run_id, run=run_record(tracer_config={"step_stride": 2}),
        requests=[{"rid": "whole", "sampled": True, "traced_verify_ct": 3, "spec_verify_ct": 3},
                  {"rid": "partial", "sampled": True, "traced_verify_ct": 6, "spec_verify_ct": 6},
                  {"rid": "unsampled", "sampled": False, "traced_verify_ct": 5, "spec_verify_ct": 5}],
        # stride 2: steps 0 and 2 of "whole", steps 0, 2, 4 of "partial" (4 lost), "orphan" has no row
        steps=[step_record("whole", 0), step_record("whole", 2), step_record("partial", 0),
               step_record("partial", 2), step_record("orphan", 0), step_record("orphan", 1)])
    response = client.post("/api/v1/batches", json=batch)
    assert response.status_code == 200, response.text
    settle(client)  # orphans and missing steps come from the run's aggregates
    return run_id


def test_incomplete_requests_and_orphans(client, store_url):
    run_id = _store(client)
    engine = db.make_engine(store_url)
    with engine.connect() as conn:
        incomplete = queries.incomplete_requests(conn, run_id)
        view = queries.run_view(conn, run_id)
    engine.dispose()
    assert incomplete == [
        {"rid": "partial", "row_missing": False, "sampled_steps": 2, "expected_steps": 3, "missing_steps": 1},
        {"rid": "orphan", "row_missing": True, "sampled_steps": 2, "expected_steps": None, "missing_steps": None}]
    by_rid = {r["rid"]: r for r in view["requests"]}
    assert by_rid["whole"]["missing_steps"] == 0 and by_rid["unsampled"]["expected_steps"] is None
    assert [o["rid"] for o in view["orphan_requests"]] == ["orphan"] and view["last_batch_at"] > 0


def test_request_pages_of_partial_and_orphan_requests(client):
    run_id = _store(client)
    page = client.get(f"/runs/{run_id}/requests/orphan")
    assert page.status_code == 200 and "No request record is stored for this id" in page.text
    assert page.text.count('hx-target="#step-detail"') == 2  # its two steps, listed
    api = client.get(f"/api/v1/runs/{run_id}/requests/orphan").json()
    assert api["request"]["row_missing"] is True and len(api["steps"]) == 2
    page = client.get(f"/runs/{run_id}/requests/partial")
    assert "incomplete trace" in page.text and "1 of the 3 verify steps" in page.text
    assert "incomplete trace" not in client.get(f"/runs/{run_id}/requests/whole").text
    assert client.get(f"/runs/{run_id}/requests/nowhere").status_code == 404


def test_run_page_lists_orphans_and_marks_missing_steps(client):
    run_id = _store(client)
    page = client.get(f"/runs/{run_id}").text
    assert 'id="orphans"' in page and f'href="/runs/{run_id}/requests/orphan"' in page
    assert "1 of 3 missing" in page


def test_a_run_with_gaps_says_so_on_every_page_and_stalled_agrees(client, store_url):
    """The tracer's health names two requests it lost (one of which arrived after all); the run page
    lists the other, the runs list and both JSON twins carry the counts, and a running run silent
    for longer than the live window reads "stalled" on the run page as on the runs list."""
    import time

    from draftscope.store import models

    run_id, t0 = uuid.uuid4().hex, float(int(time.time()) - 1000)
    health = {"at": time.time(), "drops": {"sink_error": 40, "summary_ring_full": 2}, "errors": {},
              "heartbeats": {}, "disabled_probes": [], "records_lost": 40, "requests_lost": 3,
              "lost_rids": ["gone-1", "back-1"], "gaps": [[t0 + 100, t0 + 160]]}
    batch = make_batch(run_id, run=run_record(), health=[health],
                       requests=[{"rid": "back-1", "sampled": False}, {"rid": "kept", "sampled": False}])
    assert client.post("/api/v1/batches", json=batch).status_code == 200
    engine = db.make_engine(store_url)
    with engine.begin() as conn:  # the tracer went silent ten minutes ago
        B = models.IngestBatch.__table__
        conn.execute(B.update().where(B.c.run_id == run_id).values(received_at=B.c.received_at - 600))
    engine.dispose()
    settle(client)
    page = client.get(f"/runs/{run_id}").text
    assert 'id="missing-requests"' in page and "<code>gone-1</code>" in page and "<code>back-1</code>" not in page
    assert "and 1 more the tracer did not name" in page and 'id="gaps"' in page
    assert 'class="badge status stalled"' in page
    listed = client.get("/").text
    assert f'data-run="{run_id}"' in listed and 'class="badge status stalled"' in listed and "3 missing" in listed
    api = client.get(f"/api/v1/runs/{run_id}").json()
    assert api["run"]["state"] == "stalled"
    assert api["gaps"] == {"dropped": 42, "records_lost": 40, "requests_lost": 3, "missing": ["gone-1"],
                           "unnamed": 1, "windows": [[t0 + 100, t0 + 160]]}
    row = next(r for r in client.get("/api/v1/runs").json() if r["id"] == run_id)
    assert (row["state"], row["dropped"], row["requests_lost"]) == ("stalled", 42, 3)
    assert "dropped,requests_lost" in client.get("/runs.csv").text.splitlines()[0]


def test_an_orphan_whose_request_row_arrives_later_is_one_no_more(client, store_url):
    run_id = _store(client)
    late = make_batch(run_id, requests=[{"rid": "orphan", "sampled": True, "traced_verify_ct": 2,
                                         "spec_verify_ct": 2}], steps=[step_record("new", 0)])
    assert client.post("/api/v1/batches", json=late).status_code == 200
    settle(client)
    engine = db.make_engine(store_url)
    with engine.connect() as conn:
        assert [o["rid"] for o in queries.orphan_requests(conn, run_id)] == ["new"]
    engine.dispose()
