"""The dashboard diagnoses a traced run when new batches arrive (not when a page is read), and keeps
findings a bundle carried."""

from __future__ import annotations

import json
import uuid

import pytest
import sqlalchemy as sa

from draftscope.store import db as store_db
from draftscope.store.ingest import BatchWriter
from draftscope_tracer.transport.sqlite_sink import SqliteSink
from tests.fixtures.store import make_batch, run_record, sample_record, settle

AUX_OFF_FACTS = {"algorithm": "EAGLE3",
                 "target": {"hidden_size": 128, "num_layers": 8, "capture_aux_hidden_states": False,
                            "layers_to_capture": None},
                 "draft": {"embed_width": 128, "fc_in_features": 384, "hidden_size": 128}}


def _rules(client, run_id: str) -> list[str]:
    return [f["rule_id"] for f in client.get(f"/api/v1/runs/{run_id}").json()["findings"]]


def test_a_traced_run_is_diagnosed_and_rediagnosed_on_new_batches(client) -> None:
    run_id = uuid.uuid4().hex
    healthy = sample_record(0, width=384, phase="draft_extend", shape=[4, 384])
    assert client.post("/api/v1/batches", json=make_batch(
        run_id, run=run_record(facts={**AUX_OFF_FACTS, "target": {**AUX_OFF_FACTS["target"],
                                                                   "capture_aux_hidden_states": True}}),
        samples=[healthy])).status_code == 200
    settle(client)
    assert "fc-bypassed" not in _rules(client, run_id)

    narrow = sample_record(1, width=128, phase="draft_extend", shape=[4, 128])
    assert client.post("/api/v1/batches", json=make_batch(
        run_id, run=run_record(facts=AUX_OFF_FACTS), samples=[narrow])).status_code == 200
    settle(client)
    assert "fc-bypassed" in _rules(client, run_id)
    assert "fc-bypassed" in client.get(f"/runs/{run_id}").text


def test_findings_that_came_with_the_batches_are_kept(client) -> None:
    run_id = uuid.uuid4().hex
    carried = {"rule_id": "hooks-starved", "severity": "warning", "message": "carried", "source": "runtime"}
    narrow = sample_record(0, width=128, phase="draft_extend", shape=[4, 128])
    assert client.post("/api/v1/batches", json=make_batch(
        run_id, run=run_record(facts=AUX_OFF_FACTS), samples=[narrow],
        findings=[carried])).status_code == 200
    settle(client)
    assert _rules(client, run_id) == ["hooks-starved"]


def test_the_root_cause_leads_its_severity_whatever_its_rule_id(client) -> None:
    """Findings of one severity keep the diagnosis' order (the cause, then its symptoms), not the
    alphabet: here the symptom's rule id sorts first."""
    run_id = uuid.uuid4().hex
    cause = {"rule_id": "draft-weights-not-loaded", "severity": "error", "message": "cause", "source": "static"}
    symptom = {"rule_id": "acceptance-zero-finite-logits", "severity": "error", "message": "symptom",
               "source": "runtime"}
    note = {"rule_id": "aux-norm-drift", "severity": "warning", "message": "note", "source": "runtime"}
    assert client.post("/api/v1/batches", json=make_batch(
        run_id, run=run_record(), findings=[cause, note, symptom])).status_code == 200
    settle(client)
    assert _rules(client, run_id) == ["draft-weights-not-loaded", "acceptance-zero-finite-logits", "aux-norm-drift"]
    page = client.get(f"/runs/{run_id}").text
    assert page.index("<code>draft-weights-not-loaded</code>") < page.index("<code>acceptance-zero-finite-logits</code>")


def test_batches_stored_without_this_dashboard_are_diagnosed(client, store_url) -> None:
    """No call to this dashboard: on SQLite the tracer's SQLite sink writes the file, on PostgreSQL another
    dashboard of the fleet stores the batch (its own engine); this dashboard's poll finds it either way."""
    run_id = uuid.uuid4().hex
    batch = make_batch(run_id, run=run_record(facts=AUX_OFF_FACTS),
                       samples=[sample_record(0, width=128, phase="draft_extend", shape=[4, 128])])
    if store_url.startswith("sqlite"):
        sink = SqliteSink(sa.make_url(store_url).database)
        try:
            sink.send(batch)
        finally:
            sink.close()
    else:
        other = store_db.make_engine(store_url)  # as a second dashboard process makes its own
        try:
            assert BatchWriter(other).write(json.dumps(batch).encode()).status == "stored"
        finally:
            other.dispose()
    settle(client)
    assert "fc-bypassed" in _rules(client, run_id)
    listed = {r["id"]: r for r in client.get("/api/v1/runs").json()}
    assert listed[run_id]["worst_rule_id"] == "fc-bypassed" and listed[run_id]["samples_count"] == 1


def test_a_busy_run_is_refreshed_at_most_once_per_debounce() -> None:
    """Driven by a clock the test sets (the refresher's thread is not started), from 5 s: a clock
    that started recently (a machine just booted) must not hold back a run never refreshed."""
    from draftscope.store.refresh import RunRefresher

    now = [5.0]
    engine = sa.create_engine("sqlite://")
    try:
        refresher = RunRefresher(engine, debounce_s=60, clock=lambda: now[0])
        schedule = refresher.schedule
        refresher.notify("run-a")
        assert schedule.due() and schedule.take(force=False) == ["run-a"]  # never refreshed: at once
        refresher.notify("run-a")
        now[0] += 59.9
        refresher.notify("run-b")
        assert schedule.take(force=False) == ["run-b"]  # run-a waits out its debounce
        assert not schedule.due() and schedule.wait_s(refresher.poll_s) == pytest.approx(0.1)
        now[0] += 0.1
        assert schedule.due() and schedule.take(force=False) == ["run-a"]  # its debounce has passed
        refresher.notify("run-a")
        assert schedule.take(force=True) == ["run-a"]  # drain() forces it
        assert schedule.take(force=True) == [] and not schedule.due()
    finally:
        engine.dispose()


def test_a_failing_run_is_retried_after_a_pause_that_doubles_and_said_until_it_succeeds() -> None:
    """The failure records and the schedule together, on a clock the test sets: 2 s, 4 s, ... up to 60 s."""
    from draftscope.store.refresh_failures import RefreshFailures
    from draftscope.store.refresh_schedule import RunSchedule

    now = [0.0]
    schedule, failures = RunSchedule(debounce_s=0, clock=lambda: now[0]), RefreshFailures(poll_s=1)
    pauses = [failures.failed("run-a", OSError("disk full")) for _ in range(7)]
    assert pauses == [2, 4, 8, 16, 32, 60, 60]
    assert failures.of_run("run-a").attempts == 7 and "disk full" in failures.of_run("run-a").reason
    assert "The summaries of 1 run could not be written" in failures.problem()
    schedule.retry_after("run-a", pauses[-1])
    assert not schedule.due() and schedule.wait_s(poll_s=100) == 60
    now[0] += 60
    assert schedule.take(force=False) == ["run-a"]
    failures.refreshed("run-a")
    schedule.refreshed("run-a")
    assert failures.of_run("run-a") is None and failures.problem() is None
