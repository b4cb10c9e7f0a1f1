"""The read token: with one set, every route the app declares needs it except the few named open
here (so a route added without ``access.READ`` fails this test), through a Bearer header, HTTP Basic
or the login page's cookie; pages send a browser to the login page, the rest answer 401. Reads stay
read-only (the store is opened read-only); the ingest token stays separate.
"""

from __future__ import annotations

import base64
import re
from urllib.parse import quote

import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient

from draftscope.access import COOKIE, cookie_value
from draftscope.settings import Settings
from draftscope.web import create_app
from tests.fixtures.store import make_batch, run_record
from tests.test_get_read_only import _fill, _get_paths, read_only_url

READ = "read-9f2c41"
INGEST = "ingest-77ad03"
# Routes anyone may call: liveness, the login page, and ingest (guarded by the ingest token).
OPEN = {("GET", "/healthz"), ("GET", "/login"), ("POST", "/login"), ("POST", "/logout"),
        ("POST", "/api/v1/batches")}
PAGE = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def guarded(make_client, store_url):
    """(client on a read-only store with a read token, the GET paths to read, run id)."""
    a, b = _fill(make_client(read_token=READ))  # ingest open here: _fill sends no token
    settings = Settings(database_url=read_only_url(store_url), read_token=READ, ingest_token=INGEST)
    with TestClient(create_app(settings)) as client:
        yield client, _get_paths(client.app, a, b), a


def test_every_route_is_open_on_purpose_or_needs_the_read_token(guarded) -> None:
    client, paths, _ = guarded
    declared = {(m, r.path) for r in iter_route_contexts(client.app.routes)
                if not r.path.startswith("/static") for m in (r.methods or ()) if m != "HEAD"}
    assert OPEN <= declared
    guarded_posts = [path for m, path in declared - OPEN if m != "GET"]
    assert guarded_posts == ["/import"], "a new write route: decide whether it is open (OPEN) or guarded"
    assert client.post("/import").status_code == 401
    for path in paths:
        if ("GET", path) in OPEN:
            assert client.get(path).status_code == 200, path
            continue
        refused = client.get(path)
        assert refused.status_code == 401, f"GET {path} without the read token: {refused.status_code}"
        assert "DRAFTSCOPE_READ_TOKEN" in refused.text and refused.headers["www-authenticate"].startswith("Bearer")
        assert client.get(path, headers=_bearer(INGEST)).status_code == 401, f"{path}: the ingest token reads"
        assert client.get(path, headers=_bearer("wrong")).status_code == 401, path
        browser = client.get(path, headers=PAGE, follow_redirects=False)
        assert browser.status_code == 303 and browser.headers["location"].startswith("/login?next="), path
        for headers in (_bearer(READ), _basic("anyone", READ)):
            answer = client.get(path, headers=headers)
            assert answer.status_code == 200, f"GET {path}: {answer.status_code} {answer.text[:300]}"


def test_api_csv_and_metrics_refusals_say_what_to_send(guarded) -> None:
    client, _, run_id = guarded
    api = client.get(f"/api/v1/runs/{run_id}")
    assert api.status_code == 401 and "Authorization: Bearer" in api.json()["error"]
    csv = client.get("/runs.csv")
    assert csv.status_code == 401 and csv.headers["content-type"].startswith("application/json")
    metrics = client.get("/metrics")
    assert metrics.status_code == 401 and metrics.headers["content-type"].startswith("text/plain")
    assert "DRAFTSCOPE_READ_TOKEN" in metrics.text
    htmx = client.get(f"/runs/{run_id}/requests", headers={"HX-Request": "true"})
    assert htmx.status_code == 401 and htmx.headers["hx-redirect"] == \
        f"/login?next={quote(f'/runs/{run_id}/requests', safe='')}"


def test_login_sets_an_httponly_strict_cookie_that_is_not_the_token(guarded) -> None:
    client, _, run_id = guarded
    back = f"/runs/{run_id}?tab=requests"
    wrong = client.post("/login", data={"token": "nope", "next": back}, follow_redirects=False)
    assert wrong.status_code == 200 and "not this dashboard&#39;s read token" in wrong.text
    assert COOKIE not in wrong.cookies
    right = client.post("/login", data={"token": READ, "next": back}, follow_redirects=False)
    assert right.status_code == 303 and right.headers["location"] == back
    cookie = right.headers["set-cookie"]
    assert re.search(r"HttpOnly", cookie, re.I) and re.search(r"SameSite=strict", cookie, re.I)
    assert READ not in cookie and f"{COOKIE}={cookie_value(READ)}" in cookie
    assert client.get(f"/runs/{run_id}").status_code == 200  # the client keeps the cookie
    assert client.get("/metrics").status_code == 200
    out = client.post("/logout", follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert client.get(f"/runs/{run_id}").status_code == 401


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/\\evil.example"])
def test_login_goes_back_only_to_this_dashboard(guarded, target) -> None:
    client, _, _ = guarded
    form = client.get(f"/login?next={quote(target, safe='')}")
    assert form.status_code == 200 and 'name="next" value="/"' in form.text
    right = client.post("/login", data={"token": READ, "next": target}, follow_redirects=False)
    assert right.headers["location"] == "/"


def test_ingest_keeps_its_own_token(make_client) -> None:
    client = make_client(ingest_token=INGEST, read_token=READ)
    batch = make_batch("run-ingest", run=run_record())
    assert client.post("/api/v1/batches", json=batch, headers=_bearer(READ)).status_code == 401
    assert client.post("/api/v1/batches", json=batch, headers=_bearer(INGEST)).status_code == 200


def test_without_a_read_token_reads_are_open(make_client) -> None:
    client = make_client()
    assert client.get("/api/v1/runs").status_code == 200
    assert client.get("/login", headers=PAGE).status_code == 200
    assert "Log out" not in client.get("/").text


def test_the_read_token_must_differ_from_the_ingest_token() -> None:
    with pytest.raises(ValueError, match="must differ from DRAFTSCOPE_INGEST_TOKEN"):
        Settings(read_token="same", ingest_token="same")
