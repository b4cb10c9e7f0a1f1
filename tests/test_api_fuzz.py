"""The dashboard's OpenAPI document fuzzed: no route answers 5xx, whatever a client sends.

Schemathesis turns each operation of ``app.openapi()`` (the ingest body is the wire schema,
``wire_schema.batch_json_schema``) into Hypothesis strategies; valid and invalid cases alike go to the
real app on a real migrated store (SQLite, and PostgreSQL), without tokens and with both tokens set.
Hypothesis is derandomized and bounded, so a run is the same every time and takes about a minute.
Then every run the fuzzed batches got stored is rendered on every page, JSON, CSV and bundle route:
what ingest accepts, a reader can open.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from draftscope.store import wire_schema
from tests.fixtures.store import (answered, make_batch, render_every_stored_run, run_record, sample_record, settle,
                                  step_record)

INGEST_TOKEN = "fuzz-ingest-token-0123456789"
READ_TOKEN = "fuzz-read-token-0123456789ab"
EXAMPLES = {GenerationMode.POSITIVE: 30, GenerationMode.NEGATIVE: 15}
INGEST = ("POST", "/api/v1/batches")


def _ints(value: Any) -> Any:
    """``value`` with whole floats as ints: JSON Schema's integers include ``5.0``, the wire's do not."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def _send(client, case, headers: dict[str, str], whole_ints: bool = False) -> Any:
    """Send a Schemathesis case through the dashboard's TestClient (one app, one lifespan)."""
    if whole_ints:
        case.body = _ints(case.body)
    kwargs = case.as_transport_kwargs(base_url=str(client.base_url))
    kwargs = {k: v for k, v in kwargs.items() if k in ("method", "url", "headers", "params", "cookies",
                                                       "json", "data", "files")}
    kwargs["headers"] = {**(kwargs.get("headers") or {}), **headers}
    prepared = requests.Request(**kwargs).prepare()
    return client.request(prepared.method, prepared.url, headers=dict(prepared.headers),
                          content=prepared.body, follow_redirects=False)


def _fuzz(client, auth: Callable[[str, str], dict[str, str]], *, document: Any = None,
          examples: dict[GenerationMode, int] = EXAMPLES, whole_ints: bool = False,
          **fixed: Any) -> dict[tuple, list[int]]:
    """Every operation of ``document`` (the app's), valid and invalid cases; returns the statuses seen
    per (method, path). Fails on the first 5xx with the request that got it. ``fixed``: path
    parameters to use (only the operations that have one are fuzzed); ``whole_ints``: as ``_ints``."""
    document = _times_until_now(document or client.app.openapi())
    schema = schemathesis.openapi.from_dict(document)
    seen: dict[tuple, list[int]] = {}
    for result in schema.get_all_operations():
        op = result.ok()
        key = (op.method.upper(), op.path)
        params = {k: v for k, v in fixed.items() if "{" + k in op.path}
        if fixed and not params:
            continue
        for mode, count in examples.items():
            @settings(max_examples=count, derandomize=True, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode, path_parameters=params or None))
            def check(case) -> None:
                response = _send(client, case, auth(*key), whole_ints)
                seen.setdefault(key, []).append(response.status_code)
                assert answered(case.path, response), (f"{case.method} {case.formatted_path} "
                                                   f"query={case.query} body={case.body!r:.2000}: "
                                                   f"{response.status_code} {response.text[:2000]}")

            try:
                check()
            except Unsatisfiable:  # no parameter or body to get wrong (GET /metrics, say)
                assert mode is GenerationMode.NEGATIVE, key
    return seen


def _batches_with_a_run(client) -> dict[str, Any]:
    """The ingest operation alone, its body required to carry a run record: batches that get stored."""
    document = client.app.openapi()
    body = document["paths"]["/api/v1/batches"]["post"]["requestBody"]["content"]["application/json"]
    body["schema"] = {**body["schema"], "required": [*body["schema"]["required"], "run"]}
    body["schema"]["properties"]["run"] = body["schema"]["properties"]["run"]["anyOf"][0]
    return {**document, "paths": {"/api/v1/batches": document["paths"]["/api/v1/batches"]}}


def _times_until_now(document: Any) -> Any:
    """The OpenAPI document with the schema's latest time (2100) lowered to now, so that valid cases
    are stored (a time past it is ingest's own check, and invalid cases still try it)."""
    if isinstance(document, dict):
        return {k: (time.time() if k == "maximum" and v == wire_schema.LATEST else _times_until_now(v))
                for k, v in document.items()}
    if isinstance(document, list):
        return [_times_until_now(v) for v in document]
    return document


def _seed(client, headers: dict[str, str]) -> str:
    """A realistic run, so that run-scoped routes are fuzzed on stored records too."""
    run_id = uuid.uuid4().hex
    batch = make_batch(run_id, run=run_record(), requests=[{"rid": "req-0", "sampled": True, "prompt_len": 9}],
                       steps=[step_record("req-0", i) for i in range(3)],
                       samples=[sample_record(i) for i in range(3)],
                       findings=[{"rule_id": "aux-width-mismatch", "severity": "error", "message": "m"}])
    response = client.post("/api/v1/batches", json=batch, headers=headers)
    assert response.status_code == 200, response.text
    return run_id


def test_no_route_answers_5xx_and_every_accepted_batch_renders(make_client, store_url) -> None:
    _fuzz_every_route(make_client, store_url, tokens=False)


# the tokens are checked before the store is reached: once, on SQLite, is enough
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_no_route_answers_5xx_with_tokens_set(make_client, store_url) -> None:
    _fuzz_every_route(make_client, store_url, tokens=True)


def _fuzz_every_route(make_client, store_url: str, tokens: bool) -> None:
    """Fuzz every operation (and the seeded run's), then render every run the fuzzed batches stored."""
    client = make_client(**({"ingest_token": INGEST_TOKEN, "read_token": READ_TOKEN} if tokens else {}))

    def auth(method: str, path: str) -> dict[str, str]:
        if not tokens:
            return {}
        token = INGEST_TOKEN if (method, path) == INGEST else READ_TOKEN
        return {"Authorization": f"Bearer {token}"}

    run_id = _seed(client, auth(*INGEST))
    seen = _fuzz(client, auth)
    seen_run = _fuzz(client, auth, examples={GenerationMode.POSITIVE: 60, GenerationMode.NEGATIVE: 15},
                     run_id=run_id, rid="req-0", rest="req-0")
    stored = _fuzz(client, auth, document=_batches_with_a_run(client),
                   examples={GenerationMode.POSITIVE: 60}, whole_ints=True)[INGEST]
    settle(client)
    assert render_every_stored_run(client, store_url, auth("GET", "/")) >= 1
    assert any(400 <= s < 500 for s in seen[INGEST]), sorted(set(seen[INGEST]))
    assert 200 in seen[("GET", "/")] and 200 in seen[("GET", "/api/v1/runs")], "the fuzzer never got in"
    assert stored.count(200) >= 10, sorted(stored)
    assert any(s == 200 for s in seen_run[("GET", "/runs/{run_id}")]), "the seeded run was never shown"
