"""The runs page and the health endpoint, rendered from a real store."""

from __future__ import annotations

import uuid

from tests.fixtures.store import make_batch, run_record


def test_runs_page_lists_runs_with_escaped_content(client) -> None:
    run_id = uuid.uuid4().hex
    evil = "/models/<script>alert(1)</script>"
    assert client.post("/api/v1/batches", json=make_batch(run_id, run=run_record(target_path=evil))).status_code == 200
    page = client.get("/")
    assert page.status_code == 200
    assert run_id[:8] in page.text and "EAGLE3" in page.text
    assert "<script>alert(1)</script>" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    assert "/static/htmx-2.0.4.min.js" in page.text


def test_htmx_request_gets_only_the_table(client) -> None:
    client.post("/api/v1/batches", json=make_batch(uuid.uuid4().hex, run=run_record()))
    fragment = client.get("/", headers={"HX-Request": "true"}).text
    assert '<table class="runs">' in fragment and "<html" not in fragment


def test_empty_store_says_how_to_get_runs(client) -> None:
    assert "No runs yet" in client.get("/").text


def test_vendored_htmx_is_served(client) -> None:
    response = client.get("/static/htmx-2.0.4.min.js")
    assert response.status_code == 200 and "htmx" in response.text[:200]


def test_healthz_reports_the_revision(client) -> None:
    body = client.get("/healthz").json()
    assert body["status"] == "ok" and body["db_revision"] == body["head_revision"]


def test_runs_filter_by_engine(client) -> None:
    """``?engine=`` on the runs list, its JSON twin and ``/api/v1/runs``; an unknown engine is a 400."""
    runs = {"sglang": uuid.uuid4().hex, "vllm": uuid.uuid4().hex}
    for engine, run_id in runs.items():
        record = run_record(engine=engine, engine_version="0.32.0" if engine == "vllm" else "0.5.23")
        assert client.post("/api/v1/batches", json=make_batch(run_id, run=record)).status_code == 200
    for url in ("/runs.json", "/api/v1/runs"):
        assert {r["id"] for r in client.get(url).json()} == set(runs.values())
        for engine, run_id in runs.items():
            listed = client.get(url, params={"engine": engine}).json()
            assert [(r["id"], r["engine"]) for r in listed] == [(run_id, engine)], url
        assert client.get(url, params={"engine": "trt"}).status_code == 400, url
    csv = client.get("/runs.csv", params={"engine": "vllm"}).text
    assert runs["vllm"] in csv and runs["sglang"] not in csv
    page = client.get("/", params={"engine": "vllm"}).text
    assert runs["vllm"][:8] in page and runs["sglang"][:8] not in page
    assert '<option value="vllm" selected>' in page and "vllm 0.32.0" in page
