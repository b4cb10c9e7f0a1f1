"""``/metrics`` parsed with prometheus-client's own parser; ``/docs`` works without a network."""

from __future__ import annotations

import re
import time
import uuid

from prometheus_client.parser import text_string_to_metric_families

from draftscope.web import metrics
from tests.fixtures.store import make_batch, run_record, settle, step_record


def _samples(text: str) -> dict[tuple, float]:
    """{(sample name, sorted label items): value} of a scrape."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _post(client, run_id: str, engine: str = "sglang", **records) -> None:
    response = client.post("/api/v1/batches", json=make_batch(run_id, run=run_record(
        started_at=records.pop("started_at", time.time()), engine=engine), **records))
    assert response.status_code == 200, response.text


def test_metrics_per_run_and_ingest(client) -> None:
    run_id = uuid.uuid4().hex
    flags = [[True, True, False], [True, False, False], [False, False, False]]
    steps = [step_record("r0", i, accept_len=1 + sum(f), accept_flags=f) for i, f in enumerate(flags)]
    health = {"at": time.time(), "drops": {"queue_full": 7, "Bad Label!": 1}, "errors": {}, "heartbeats": {},
              "disabled_probes": []}
    findings = [{"rule_id": "fc-bypassed", "severity": "error", "message": "m"},
                {"rule_id": "hooks-starved", "severity": "warning", "message": "m"}]
    _post(client, run_id, steps=steps, health=[health], findings=findings,
          requests=[{"rid": "r0", "output_len": 9, "spec_verify_ct": 3}])
    settle(client)
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    got = _samples(response.text)
    run = (("engine", "sglang"), ("run_id", run_id))
    assert got[("draftscope_verify_steps_total", run)] == 3
    assert got[("draftscope_drafts_proposed_total", run)] == 9
    assert got[("draftscope_drafts_accepted_total", run)] == 3
    for position, (proposed, accepted) in enumerate([(3, 2), (3, 1), (3, 0)], start=1):
        labels = tuple(sorted({"run_id": run_id, "engine": "sglang", "position": str(position)}.items()))
        assert got[("draftscope_position_proposed_total", labels)] == proposed
        assert got[("draftscope_position_accepted_total", labels)] == accepted
    assert got[("draftscope_accept_length", (("definition", "traced"), *run))] == 2.0
    assert got[("draftscope_accept_length", (("definition", "sglang"), *run))] == 3.0
    assert got[("draftscope_findings", (*run, ("severity", "error")))] == 1
    assert got[("draftscope_findings", (*run, ("severity", "info")))] == 0
    assert got[("draftscope_tracer_drops_total", (run[0], ("reason", "queue_full"), run[1]))] == 7
    assert not [k for k in got if k[0] == "draftscope_tracer_drops_total" and
                ("reason", "Bad Label!") in k[1]]
    assert got[("draftscope_ingest_rows_total", (("table", "verify_steps"),))] == 3
    assert got[("draftscope_ingest_rows_total", (("table", "tracer_health"),))] == 1
    assert got[("draftscope_ingest_batches_total", ())] == 1
    assert got[("draftscope_run_live", run)] == 1 and got[("draftscope_runs", (("state", "live"),))] == 1


def test_every_run_series_names_its_engine(client) -> None:
    runs = {"sglang": uuid.uuid4().hex, "vllm": uuid.uuid4().hex}
    for engine, run_id in runs.items():
        _post(client, run_id, engine=engine, steps=[step_record("r0", 0)],
              findings=[{"rule_id": "fc-bypassed", "severity": "error", "message": "m"}])
    settle(client)
    got = _samples(client.get("/metrics").text)
    per_run = [dict(k[1]) for k in got if "run_id" in dict(k[1])]
    assert per_run and all(labels["engine"] == ("vllm" if labels["run_id"] == runs["vllm"] else "sglang")
                           for labels in per_run), per_run
    run = (("engine", "vllm"), ("run_id", runs["vllm"]))
    assert got[("draftscope_verify_steps_total", run)] == 1
    assert got[("draftscope_findings", (*run, ("severity", "error")))] == 1


def test_metrics_label_cardinality_is_bounded(client) -> None:
    now = time.time()
    ids = [uuid.uuid4().hex for _ in range(metrics.METRICS_RUNS + 3)]
    long_flags = [True] * (metrics.MAX_POSITIONS + 4)
    for i, run_id in enumerate(ids):  # ids[-1] started last
        _post(client, run_id, started_at=now - 1000 + i,
              steps=[step_record("r0", 0, accept_flags=long_flags, accept_len=len(long_flags) + 1)])
    settle(client)
    got = _samples(client.get("/metrics").text)
    listed = {dict(k[1])["run_id"] for k in got if k[0] == "draftscope_verify_steps_total"}
    assert listed == set(ids[3:])
    positions = {dict(k[1])["position"] for k in got if k[0] == "draftscope_position_accepted_total"}
    assert positions == {str(p) for p in range(1, metrics.MAX_POSITIONS + 1)}


def test_api_docs_are_served_from_static(client) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    urls = re.findall(r'(?:src|href)="([^"]+)"', page.text) + re.findall(r"url: '([^']+)'", page.text)
    assert urls and all(u.startswith("/") for u in urls), urls
    for url in urls:
        assert client.get(url).status_code == 200, url
    assert client.get("/redoc").status_code == 404
    assert client.get("/openapi.json").json()["info"]["title"] == "draftscope"
