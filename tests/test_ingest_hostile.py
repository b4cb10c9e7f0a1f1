"""Hostile batches against a real migrated store (SQLite and PostgreSQL): each class of value the
issue names is refused with a 4xx naming the field, stores nothing, and the runs list still renders;
rows an older draftscope stored render on every page; a batch cannot hide, delete or rewrite a run."""

from __future__ import annotations

import json
import time
import uuid
from urllib.parse import quote

import pytest
import sqlalchemy as sa

from draftscope.store import db, models
from tests.fixtures.store import make_batch, run_record, sample_record, settle, step_record
from tests.test_ingest import counts, fetch

URL = "/api/v1/batches"
NOW = time.time()


def _post(client, batch: dict | bytes):
    body = batch if isinstance(batch, bytes) else json.dumps(batch).encode()
    return client.post(URL, content=body, headers={"content-type": "application/json"})


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _raw(run_id: str, field: str, text: str) -> bytes:
    """A batch whose run record's ``field`` is raw JSON ``text`` (``NaN``, a big int: what ``json.dumps``
    would not write)."""
    batch = make_batch(run_id, run=run_record(**{field: "@RAW@"}))
    return json.dumps(batch).replace('"@RAW@"', text).encode()


RID = "hostile-run"
HOSTILE = [  # (what, batch, field named in the answer, words in it)
    ("NaN start", _raw(RID, "started_at", "NaN"), "run.started_at", []),
    ("infinite start", _raw(RID, "started_at", "Infinity"), "run.started_at", []),
    ("start past float", _raw(RID, "started_at", "1e400"), "run.started_at", []),
    ("far-future start", make_batch(RID, run=run_record(started_at=NOW + 3 * 86400)), "run.started_at",
     ["more than a day ahead"]),
    ("start before 2000", make_batch(RID, run=run_record(started_at=1.0)), "run.started_at", []),
    ("step in the far future", make_batch(RID, run=run_record(), steps=[step_record(at=NOW + 1e9)]),
     "steps[0].at", []),
    ("2^64 pid", _raw(RID, "pid", str(2**64)), "run.pid", []),
    ("2^64 token id", make_batch(RID, run=run_record(), steps=[step_record(drafted_tokens=[2**64])]),
     "steps[0].drafted_tokens[0]", []),
    ("2^64 in facts", make_batch(RID, run=run_record(facts={"big": 2**64})), "run.facts.big", ["64 bits"]),
    ("int4 overflow", make_batch(RID, run=run_record(), requests=[{"rid": "a", "prompt_len": 2**31}]),
     "requests[0].prompt_len", []),
    ("int4 underflow", make_batch(RID, run=run_record(), samples=[sample_record(width=-2**31 - 1)]),
     "samples[0].width", []),
    ("NUL in host", make_batch(RID, run=run_record(host="gpu\x001")), "run.host", []),
    ("NUL in a finding", make_batch(RID, run=run_record(), findings=[
        {"rule_id": "r", "severity": "info", "message": "a\x00b"}]), "findings[0].message", []),
    ("NUL in facts", make_batch(RID, run=run_record(facts={"k": ["x\x00"]})), "run.facts.k[0]", ["NUL"]),
    ("NUL in a facts key", make_batch(RID, run=run_record(facts={"k\x00": 1})), "run.facts", []),
    ("NUL in a rid", make_batch(RID, run=run_record(), requests=[{"rid": "a\x00"}]), "requests[0].rid", []),
    ("nested 40 deep", make_batch(RID, run=run_record(facts=_nested(40))), "run.facts.a.a", ["32 levels"]),
    ("nested 100000 deep", _raw(RID, "facts", '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"), "run.facts",
     ["too deep"]),
    ("not JSON, nested 100000 deep", b'{"run": ' + b"[" * 100_000, "", ["not valid JSON"]),
    ("run id with /", make_batch("a/b", run=run_record()), "run_id", []),
    ("run id with CR/LF", make_batch("a\r\nb", run=run_record()), "run_id", []),
    ("run id with trailing LF", make_batch("ab\n", run=run_record()), "run_id", []),
    ("batch id with /", {**make_batch(RID, run=run_record()), "batch_id": "../x"}, "batch_id", []),
    ("unknown engine", make_batch(RID, run=run_record(engine="tgi")), "run.engine", []),
    ("unknown severity", make_batch(RID, run=run_record(), findings=[
        {"rule_id": "r", "severity": "fatal", "message": "m"}]), "findings[0].severity", []),
    ("status pruning", make_batch(RID, run=run_record(status="pruning")), "run.status", []),
    ("source bundle", make_batch(RID, run=run_record(source="bundle")), "run.source", ["draftscope import"]),
]


@pytest.mark.parametrize("what, batch, field, words", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_batch_is_refused_naming_the_field_and_the_list_renders(client, store_url, what, batch,
                                                                          field, words) -> None:
    response = _post(client, batch)
    assert response.status_code in (400, 422), (what, response.status_code, response.text)
    error = response.json()["error"]
    assert field in error and "Nothing was stored" in error, error
    for word in words:
        assert word in error, error
    assert set(counts(store_url).values()) == {0}
    assert client.get("/").status_code == 200 and client.get("/api/v1/runs").status_code == 200


def test_a_tracer_batch_with_every_field_at_its_bound_is_stored_and_renders(client) -> None:
    run_id = "A-z0_9.last-" + "x" * 116  # 128 characters of the safe alphabet
    batch = make_batch(run_id, run=run_record(pid=2**31 - 1, facts=_nested(31)),  # 32 levels
                       findings=[{"rule_id": "r", "severity": "info", "message": "m", "evidence": {"n": 2**63 - 1}}],
                       requests=[{"rid": "chatcmpl-é/?# x", "prompt_len": 2**31 - 1, "started_at": NOW}],
                       steps=[step_record("chatcmpl-é/?# x", 2**31 - 1, seq_pos=0, drafted_tokens=[2**63 - 1])],
                       samples=[sample_record(0, l2_mean=float("inf"), width=-2**31)])
    response = _post(client, batch)
    assert response.status_code == 200, response.text
    settle(client)
    rid = quote("chatcmpl-é/?# x", safe="")
    for path in ("/", "/runs.json", f"/runs/{run_id}", f"/runs/{run_id}.json", f"/runs/{run_id}/requests.csv",
                 f"/runs/{run_id}/requests", f"/runs/{run_id}/requests/{rid}", f"/api/v1/runs/{run_id}/requests/{rid}",
                 f"/runs/{run_id}/bundle.zip"):
        assert client.get(path).status_code == 200, path


@pytest.mark.parametrize("path", ["/runs/{run}/requests?offset=" + str(2**64), "/runs/{run}/requests?offset=-1",
                                  "/api/v1/runs?limit=" + str(2**64), "/runs.json?limit=" + str(2**63),
                                  "/runs/{run}%00", "/api/v1/runs/{run}%00", "/?q=%00"])
def test_query_parameters_past_any_bound_answer_below_500(client, path) -> None:
    run = uuid.uuid4().hex
    assert _post(client, make_batch(run, run=run_record())).status_code == 200
    response = client.get(path.format(run=run))
    assert response.status_code < 500, response.text


LEGACY = [  # rows an older draftscope stored: (run id, engine, started_at)
    ("legacy-inf", "sglang", float("inf")), ("legacy-far", "sglang", 1e300), ("legacy-neg", "sglang", -1e300),
    ("legacy-crlf\r\nx", "sglang", NOW), ("legacy-engine", "tgi", NOW),
]


def test_rows_an_older_version_stored_render_everywhere(client, store_url) -> None:
    """A non-finite or far-off start time, a run id with CR/LF, an unknown engine: written straight into
    the store (as older versions' ingest let them in), every page still answers, and the bundle export
    of the unknown engine says why it cannot (409)."""
    engine = db.make_engine(store_url)
    with engine.begin() as conn:
        for run_id, eng, started in LEGACY:  # (the store assigns each its key)
            conn.execute(sa.insert(models.Run.__table__).values(id=run_id, engine=eng, engine_version="1",
                                                                source="tracer", status="ended", started_at=started))
        conn.execute(sa.text("INSERT INTO requests (run_id, rid, started_at) VALUES ('legacy-engine', 'r', :t)"),
                     {"t": float("inf")})
    engine.dispose()
    for path in ("/", "/runs.json", "/runs.csv", "/api/v1/runs", "/metrics", "/compare?run=legacy-inf&run=legacy-engine"):
        assert client.get(path).status_code == 200, path
    for run_id, _, _ in LEGACY:
        run = quote(run_id, safe="")
        for suffix in ("", ".json", "/requests", "/requests.csv", "/findings.csv", "/spec.csv"):
            assert client.get(f"/runs/{run}{suffix}").status_code == 200, run_id + suffix
        assert client.get(f"/api/v1/runs/{run}").status_code == 200, run_id
    assert "inf (not a time)" in client.get("/runs/legacy-inf").text
    export = client.get("/runs/legacy-engine/bundle.zip")
    assert export.status_code == 409 and "tgi" in export.text and "cannot hold" in export.text
    crlf = client.get("/runs/" + quote("legacy-crlf\r\nx", safe="") + "/bundle.zip")
    assert crlf.status_code == 200 and "\r" not in crlf.headers["content-disposition"]


# --- writers own only what they write ---------------------------------------------------------------

@pytest.fixture
def victim(client) -> str:
    run_id = uuid.uuid4().hex
    batch = make_batch(run_id, run=run_record(started_at=NOW - 60), requests=[{"rid": "v", "prompt_len": 4}])
    assert _post(client, batch).status_code == 200
    return run_id


def _run(store_url: str, run_id: str) -> tuple:
    (row,) = fetch(store_url, f"SELECT status, engine, target_path, started_at, host, pid, facts FROM runs "
                              f"WHERE id = '{run_id}'")
    return row


@pytest.mark.parametrize("field, value", [("engine", "vllm"), ("engine_version", "9.9"),
                                          ("target_path", "/evil/model"), ("draft_path", "/evil/draft"),
                                          ("algorithm", "MEDUSA")])
def test_a_batch_cannot_rewrite_a_runs_identity(client, store_url, victim, field, value) -> None:
    before, stored = _run(store_url, victim), counts(store_url)
    response = _post(client, make_batch(victim, run=run_record(**{field: value}),
                                        requests=[{"rid": "evil", "prompt_len": 1}]))
    assert response.status_code == 409 and f"run.{field}" in response.json()["error"], response.text
    assert _run(store_url, victim) == before and counts(store_url) == stored


def test_a_batch_cannot_hide_or_delete_a_run(client, store_url, victim) -> None:
    """``pruning`` (the status prune and retention set before deleting) cannot come from ingest; a status
    that goes back (ended -> running) is ignored; the run stays listed and the next prune keeps it."""
    from draftscope.store import retention

    assert _post(client, make_batch(victim, run=run_record(status="pruning"))).status_code == 422
    assert _post(client, make_batch(victim, run=run_record(status="ended", ended_at=NOW))).status_code == 200
    assert _post(client, make_batch(victim, run=run_record(status="running"))).status_code == 200
    assert _run(store_url, victim)[0] == "ended"
    assert victim in [r["id"] for r in client.get("/api/v1/runs").json()]
    assert client.get(f"/runs/{victim}").status_code == 200
    other = uuid.uuid4().hex
    assert _post(client, make_batch(other, run=run_record(status="ended", ended_at=NOW))).status_code == 200
    engine = db.make_engine(store_url)
    try:
        report = retention.prune(engine, run_ids=(other,), now=time.time() + 7 * 86400)
    finally:
        engine.dispose()
    assert report.deleted and [r for (r,) in fetch(store_url, "SELECT id FROM runs")] == [victim]


def test_a_later_batch_keeps_the_first_process_fields_and_facts(client, store_url, victim) -> None:
    """Each process of a multi-process server sends its own start time, host and pid: the first stays;
    facts gain new keys, a key already stored keeps its value; the status advances."""
    first = _run(store_url, victim)
    later = run_record(status="crashed", ended_at=NOW, started_at=NOW, host="other", pid=7,
                       facts={"spec_topk": 99, "tp_size": 2})
    assert _post(client, make_batch(victim, run=later)).status_code == 200
    status, _, _, started, host, pid, facts = _run(store_url, victim)
    assert (status, started, host, pid) == ("crashed", first[3], first[4], first[5])
    facts = json.loads(facts) if isinstance(facts, str) else facts
    assert facts == {"sglang_version": "0.5.23", "spec_topk": 1, "tp_size": 2}
