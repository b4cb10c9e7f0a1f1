"""POST /api/v1/batches against a real migrated store (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import sqlalchemy as sa

from draftscope.store import db, models
from tests.fixtures.store import make_batch, run_record, sample_record, step_record

URL = "/api/v1/batches"
NOW = time.time()
TABLES = ("runs", "requests", "verify_steps", "tensor_samples", "tracer_health", "findings",
          "ingest_batches")


def counts(url: str) -> dict[str, int]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return {t: conn.execute(sa.text(f"SELECT COUNT(*) FROM {t}")).scalar_one() for t in TABLES}
    finally:
        engine.dispose()


def fetch(url: str, sql: str) -> list[tuple]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql))]
    finally:
        engine.dispose()


def as_json(value):
    """A JSON column read through plain SQL: text on SQLite, decoded already on PostgreSQL."""
    return json.loads(value) if isinstance(value, str) else value


@pytest.fixture
def run_id(client) -> str:
    """A run already stored through the API."""
    rid = uuid.uuid4().hex
    assert client.post(URL, json=make_batch(rid, run=run_record())).status_code == 200
    return rid


def full_batch(run_id: str) -> dict:
    return make_batch(
        run_id, run=run_record(),
        requests=[{"rid": "req-0", "sampled": True, "prompt_len": 12}],
        steps=[step_record("req-0", 0), step_record("req-0", 1)],
        samples=[sample_record(i) for i in range(3)],
        health=[{"at": NOW, "drops": {"queue_full": 0}, "errors": {}, "heartbeats": {"verify": 2},
                 "disabled_probes": [], "queue_depth": 0}],
        findings=[{"rule_id": "aux-width-mismatch", "severity": "error", "message": "7168 != 21504",
                   "fix": "enable aux capture", "evidence": {"got": 7168, "want": 21504}}],
    )


def test_happy_path_stores_every_record(client, store_url) -> None:
    rid = uuid.uuid4().hex
    response = client.post(URL, json=full_batch(rid))
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "stored"
    assert counts(store_url) == {"runs": 1, "requests": 1, "verify_steps": 2, "tensor_samples": 3,
                                 "tracer_health": 1, "findings": 1, "ingest_batches": 1}
    samples = models.TensorSample.__table__
    engine = db.make_engine(store_url)
    with engine.connect() as conn:  # typed read: a JSON array, not a JSON string holding one
        shape = conn.execute(sa.select(samples.c.shape).where(samples.c.step_index == 1)).scalar_one()
    engine.dispose()
    assert shape == [1, 12288]
    runs = client.get("/api/v1/runs").json()
    assert [(r["id"], r["samples_count"], r["steps_count"]) for r in runs] == [(rid, 3, 2)]


def test_same_batch_twice_is_stored_once(client, store_url) -> None:
    batch = full_batch(uuid.uuid4().hex)
    assert client.post(URL, json=batch).json()["status"] == "stored"
    before = counts(store_url)
    second = client.post(URL, json=batch)
    assert second.status_code == 200 and second.json()["status"] == "duplicate"
    assert counts(store_url) == before


def test_run_upsert_merges_facts_and_keeps_unsent_fields(client, store_url, run_id) -> None:
    update = run_record(status="ended", ended_at=NOW + 99, facts={"tp_size": 2}, host=None)
    assert client.post(URL, json=make_batch(run_id, run=update)).status_code == 200
    (status, ended, host, facts), = fetch(store_url, "SELECT status, ended_at, host, facts FROM runs")
    assert (status, ended, host) == ("ended", NOW + 99, "gpu-1")
    assert as_json(facts) == {"sglang_version": "0.5.23", "spec_topk": 1, "tp_size": 2}


def test_a_crashed_run_is_not_ended_again_by_another_process(client, store_url, run_id) -> None:
    """vLLM's engine core marks the run crashed; its worker process, stopped after it, ends its part
    ``ended``: the run stays crashed, at the crash's time (a later ``running`` batch is no revival either)."""
    for status, ended_at in (("crashed", NOW + 50), ("ended", NOW + 60), ("running", None)):
        batch = make_batch(run_id, run=run_record(status=status, ended_at=ended_at))
        assert client.post(URL, json=batch).status_code == 200
    assert fetch(store_url, "SELECT status, ended_at FROM runs") == [("crashed", NOW + 50)]


def test_request_upsert_overwrites_only_non_null(client, store_url, run_id) -> None:
    first = make_batch(run_id, requests=[{"rid": "a", "prompt_len": 5, "output_len": 1}])
    later = make_batch(run_id, requests=[{"rid": "a", "output_len": 9, "spec_verify_ct": 4},
                                         {"rid": "a", "finish_reason": "stop"}])
    assert client.post(URL, json=first).status_code == 200
    assert client.post(URL, json=later).status_code == 200
    assert fetch(store_url, "SELECT rid, prompt_len, output_len, spec_verify_ct, finish_reason "
                            "FROM requests") == [("a", 5, 9, 4, "stop")]


def test_batch_with_one_invalid_record_writes_nothing(client, store_url) -> None:
    batch = full_batch(uuid.uuid4().hex)
    batch["samples"].append(sample_record(7, width="12288"))
    response = client.post(URL, json=batch)
    assert response.status_code == 422
    assert "samples[3].width" in response.json()["error"]
    assert set(counts(store_url).values()) == {0}


def test_conflicting_step_rolls_back_the_whole_batch(client, store_url, run_id) -> None:
    assert client.post(URL, json=make_batch(run_id, steps=[step_record("r", 0)])).status_code == 200
    before = counts(store_url)
    clash = make_batch(run_id, samples=[sample_record(1)], steps=[step_record("r", 1), step_record("r", 0)])
    response = client.post(URL, json=clash)
    assert response.status_code == 409 and "step_index" in response.json()["error"]
    assert counts(store_url) == before


@pytest.mark.parametrize("body, status, words", [
    (b'{"schema_version": 1, "batch_id": ', 400, ["not valid JSON", "line 1 column"]),
    (json.dumps({"schema_version": 7, "batch_id": "b", "run_id": "r", "sent_at": NOW}).encode(),
     422, ["schema_version 7", "accepts schema_version 1"]),
    (json.dumps({"schema_version": 1, "batch_id": "b", "run_id": "r", "sent_at": NOW,
                 "samples": [sample_record(0, colour="red")]}).encode(),
     422, ["samples[0].colour", "Extra inputs"]),
    (json.dumps({"schema_version": 1, "batch_id": "b", "run_id": "r", "sent_at": NOW,
                 "steps": [{"rid": "x"}]}).encode(), 422, ["steps[0].step_index", "Field required"]),
    (json.dumps({"schema_version": 1, "batch_id": "b", "run_id": "no-such-run",
                 "sent_at": NOW}).encode(), 404, ["'no-such-run'", "Send the run record first"]),
])
def test_bad_input_is_rejected_with_a_clear_message(client, store_url, run_id, body, status, words) -> None:
    before = counts(store_url)
    response = client.post(URL, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    for word in words:
        assert word in response.json()["error"]
    assert counts(store_url) == before


def test_oversized_body_is_413(make_client, store_url) -> None:
    client = make_client(max_batch_bytes=2000)
    batch = make_batch(uuid.uuid4().hex, run=run_record(), samples=[sample_record(i) for i in range(20)])
    response = client.post(URL, json=batch)
    assert response.status_code == 413
    assert "2000 bytes" in response.json()["error"]
    assert set(counts(store_url).values()) == {0}


def test_token_is_required_when_set(make_client, store_url) -> None:
    client = make_client(ingest_token="s3cret-ingest-token-0123")
    batch = make_batch(uuid.uuid4().hex, run=run_record())
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-ingest-token-0123"}):
        response = client.post(URL, json=batch, headers=headers)
        assert response.status_code == 401 and "Bearer" in response.json()["error"]
    assert counts(store_url)["runs"] == 0
    assert client.post(URL, json=batch, headers={"Authorization": "Bearer s3cret-ingest-token-0123"}).status_code == 200
    assert counts(store_url)["runs"] == 1


def test_nan_statistics_are_accepted(client, store_url, run_id) -> None:
    body = json.dumps(make_batch(run_id, samples=[sample_record(0, l2_mean=float("nan"), nan_count=12288)]))
    assert "NaN" in body
    response = client.post(URL, content=body.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert fetch(store_url, "SELECT nan_count FROM tensor_samples") == [(12288,)]
