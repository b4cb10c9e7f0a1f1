"""A GET never writes: every GET route of the dashboard answers from a store opened read-only.

The store is filled through the ingest API and folded by the refresher; then a second dashboard
opens it read-only (SQLite ``mode=ro``, PostgreSQL ``default_transaction_read_only``) and every
GET route the app declares is requested, so a route added later is covered without editing this.
"""

from __future__ import annotations

import re
import time
import uuid
from urllib.parse import quote

import sqlalchemy as sa
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient

from draftscope.settings import Settings
from draftscope.web.app import create_app
from tests.fixtures.store import make_batch, run_record, sample_record, settle, step_record

RID = "req-0"
FINDING = {"rule_id": "hooks-starved", "severity": "warning", "message": "<b>m</b>", "source": "tracer",
           "rid": RID}
QUERY = {"/compare": "a={a}&b={b}", "/compare.json": "a={a}&b={b}"}  # routes that need query parameters


def read_only_url(url: str) -> str:
    sa_url = sa.make_url(url)
    if sa_url.get_backend_name() == "sqlite":
        return f"sqlite:///file:{sa_url.database}?mode=ro&uri=true"
    return sa_url.update_query_dict({"options": "-c default_transaction_read_only=on"}) \
        .render_as_string(hide_password=False)


def _fill(client: TestClient) -> tuple[str, str]:
    runs = []
    for i in range(2):  # the second run carries no findings: the dashboard diagnoses it
        run_id = uuid.uuid4().hex
        steps = [step_record(RID, i) for i in range(5)]
        samples = [sample_record(i, point=p) for i, p in enumerate(
            ["draft.input", "target.aux[0]", "draft.fc.out", "draft.logits.topk"])]
        request = {"rid": RID, "sampled": True, "prompt_len": 10, "output_len": 12, "started_at": time.time(),
                   "finish_reason": "stop", "spec_verify_ct": 5, "spec_accepted_drafts": 6,
                   "spec_proposed_drafts": 15, "traced_verify_ct": 5, "traced_accepted_drafts": 5,
                   "traced_proposed_drafts": 15}
        health = {"at": time.time(), "drops": {"queue_full": 2}, "errors": {}, "heartbeats": {"verify": 5},
                  "disabled_probes": []}
        assert client.post("/api/v1/batches", json=make_batch(
            run_id, run=run_record(), requests=[request], steps=steps, samples=samples,
            health=[health], findings=[FINDING] if i == 0 else [])).status_code == 200
        runs.append(run_id)
    settle(client)
    return runs[0], runs[1]


def _get_paths(app, a: str, b: str) -> list[str]:
    values = {"run_id": a, "rid": quote(RID), "rest": quote(RID), "a": a, "b": b}
    paths = []
    for route in iter_route_contexts(app.routes):  # routers included: their routes, prefixed
        if "GET" not in (route.methods or set()) or route.path.startswith("/static"):
            continue
        path = route.path
        names = re.findall(r"{(\w+)(?::\w+)?}", path)
        missing = [n for n in names if n not in values]
        assert not missing, f"{path}: add a value for {missing} to _get_paths"
        for name in names:
            path = re.sub(r"{%s(?::\w+)?}" % name, values[name], path)
        if route.path in QUERY:
            path += "?" + QUERY[route.path].format(a=a, b=b)
        paths.append(path)
    return paths


def test_every_get_route_answers_from_a_read_only_store(make_client, store_url) -> None:
    a, b = _fill(make_client())
    with TestClient(create_app(Settings(database_url=read_only_url(store_url))),
                    base_url="http://127.0.0.1") as client:
        paths = _get_paths(client.app, a, b)
        assert {"/", f"/runs/{a}", "/api/v1/runs", f"/api/v1/runs/{a}"} <= set(paths)
        for path in paths:
            response = client.get(path)
            assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text[:300]}"
            htmx = client.get(path, headers={"HX-Request": "true"})
            assert htmx.status_code == 200, f"GET {path} (htmx): {htmx.status_code} {htmx.text[:300]}"
        assert client.app.state.refresher.drain() and client.app.state.refresher.errors == 0


def test_the_read_only_store_refuses_writes(store_url) -> None:
    from draftscope.store import db

    engine = db.make_engine(read_only_url(store_url))
    try:
        with engine.connect() as conn:
            try:
                conn.execute(sa.text("CREATE TABLE ro_probe (x INTEGER)"))
                conn.commit()
            except sa.exc.DBAPIError as exc:
                assert "read" in str(exc).lower()
            else:
                raise AssertionError("a write into the read-only store succeeded")
    finally:
        engine.dispose()
