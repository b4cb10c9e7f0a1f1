"""The read token: with one set, every route the app declares needs it except the few named open
here (so a route added without ``access.READ`` fails this test), through a Bearer header, HTTP Basic
or the login page's cookie; pages send a browser to the login page, the rest answer 401. Reads stay
read-only (the store is opened read-only); the ingest token stays separate. The cookie names a
session in the store (SQLite and PostgreSQL): logout revokes it on every dashboard of the store, it
expires, and wrong tokens at the login page are slowed per client.
"""

from __future__ import annotations

import base64
import re
import time
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient

from draftscope.settings import Settings
from draftscope.web import sessions
from draftscope.web.access import COOKIE
from draftscope.web.app import create_app
from draftscope.web.login_throttle import FREE_TRIES, LoginThrottle
from tests.fixtures.store import make_batch, run_record
from tests.test_get_read_only import _fill, _get_paths, read_only_url

READ = "read-9f2c41e07b5d3a88"
INGEST = "ingest-77ad03c41f9e20b1"
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
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
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


def test_login_sets_an_httponly_strict_cookie_that_logout_revokes(make_client) -> None:
    client = make_client(read_token=READ, ingest_token=INGEST)
    run_id, _ = _fill_with(client, INGEST)
    back = f"/runs/{run_id}?tab=requests"
    wrong = client.post("/login", data={"token": "nope", "next": back}, follow_redirects=False)
    assert wrong.status_code == 200 and "not this dashboard&#39;s read token" in wrong.text
    assert COOKIE not in wrong.cookies
    right = client.post("/login", data={"token": READ, "next": back}, follow_redirects=False)
    assert right.status_code == 303 and right.headers["location"] == back
    cookie = right.headers["set-cookie"]
    assert re.search(r"HttpOnly", cookie, re.I) and re.search(r"SameSite=strict", cookie, re.I)
    assert not re.search(r"Secure", cookie, re.I)  # plain HTTP: a Secure cookie would not come back
    value = right.cookies[COOKIE]
    assert READ not in cookie and len(value) > 40
    assert client.get(f"/runs/{run_id}").status_code == 200  # the client keeps the cookie
    assert client.get("/metrics").status_code == 200
    out = client.post("/logout", follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert client.get(f"/runs/{run_id}").status_code == 401
    # The cookie itself, kept from before logout (copied, or stolen), reads nothing either.
    assert _browser(client, value).get(f"/runs/{run_id}").status_code == 401


def _fill_with(client: TestClient, ingest_token: str) -> tuple[str, str]:
    client.headers["Authorization"] = f"Bearer {ingest_token}"
    try:
        return _fill(client)
    finally:
        del client.headers["Authorization"]


def _browser(client: TestClient, cookie: str) -> TestClient:
    """Another client of ``client``'s dashboard that sends the login cookie ``cookie``."""
    return TestClient(client.app, base_url="http://127.0.0.1", cookies={COOKIE: cookie})


def _log_in(client: TestClient) -> str:
    right = client.post("/login", data={"token": READ}, follow_redirects=False)
    assert right.status_code == 303
    return right.cookies[COOKIE]


def test_a_session_is_one_for_every_dashboard_of_the_store(make_client) -> None:
    """Two dashboard processes on one store (the fleet): a login on one reads on the other, and a
    logout on either ends it on both."""
    one, two = make_client(read_token=READ), make_client(read_token=READ)
    cookie = _log_in(one)
    assert _browser(two, cookie).get("/api/v1/runs").status_code == 200
    assert _browser(two, cookie).post("/logout", follow_redirects=False).status_code == 303
    assert _browser(one, cookie).get("/api/v1/runs").status_code == 401


def test_a_session_ends_when_it_expires_or_the_read_token_changes(make_client, store_url) -> None:
    from draftscope.store import db

    client = make_client(read_token=READ)
    cookie = _log_in(client)
    session_id, _, mac = cookie.partition(".")
    engine = db.make_engine(store_url)
    try:
        assert sessions.is_valid(engine, cookie, READ)
        assert not sessions.is_valid(engine, cookie, READ, now=time.time() + sessions.MAX_AGE_S + 1)
        assert not sessions.is_valid(engine, cookie, READ.upper())  # a new read token
        assert not sessions.is_valid(engine, f"{session_id}.{'0' * len(mac)}", READ)  # forged
        assert not sessions.is_valid(engine, session_id, READ)
        with engine.connect() as conn:  # the store keeps a digest of the session id, never the id
            stored = conn.execute(sa.text("SELECT id FROM login_sessions")).scalars().all()
        assert len(stored) == 1 and session_id not in stored[0]
        sessions.start(engine, READ, now=time.time() + sessions.MAX_AGE_S + 1)  # deletes expired ones
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM login_sessions")).scalar_one() == 1
    finally:
        engine.dispose()
    assert _browser(client, cookie).get("/api/v1/runs").status_code == 401


def test_the_cookie_is_secure_over_https(make_client) -> None:
    client = make_client(read_token=READ)
    https = TestClient(client.app, base_url="https://127.0.0.1")
    right = https.post("/login", data={"token": READ}, follow_redirects=False)
    assert right.status_code == 303 and re.search(r";\s*Secure", right.headers["set-cookie"], re.I)


def test_wrong_logins_are_slowed_per_client(make_client) -> None:
    client = make_client(read_token=READ)
    now = [1000.0]
    client.app.state.login_throttle = LoginThrottle(clock=lambda: now[0])  # time moves when told
    for _ in range(FREE_TRIES - 1):
        assert client.post("/login", data={"token": "guess"}).status_code == 200
    waits = []
    for _ in range(3):  # the fifth wrong try and each one after its wait: twice as long each time
        wrong = client.post("/login", data={"token": "guess"})
        assert wrong.status_code == 429 and "Too many wrong tokens" in wrong.text
        waits.append(int(wrong.headers["retry-after"]))
        # Within the wait even the right token is not checked: guessing cannot go on at full speed.
        during = client.post("/login", data={"token": READ}, follow_redirects=False)
        assert during.status_code == 429 and COOKIE not in during.cookies
        now[0] += waits[-1]
    assert waits == [1, 2, 4]
    # Another client is not held back; after the wait the right token logs in and clears the count.
    other = TestClient(client.app, base_url="http://127.0.0.1", client=("10.1.2.3", 50000))
    assert other.post("/login", data={"token": READ}, follow_redirects=False).status_code == 303
    assert client.post("/login", data={"token": READ}, follow_redirects=False).status_code == 303
    assert client.post("/login", data={"token": "guess"}).status_code == 200


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/\\evil.example"])
def test_login_goes_back_only_to_this_dashboard(make_client, target) -> None:
    client = make_client(read_token=READ)
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
        Settings(read_token="same-token-for-both", ingest_token="same-token-for-both")


@pytest.mark.parametrize("tokens", [{"read_token": "short"}, {"ingest_token": "fifteen-chars!!"},
                                    {"read_token": "auto"}])
def test_a_token_shorter_than_16_characters_is_refused(tokens, store_url) -> None:
    with pytest.raises(ValueError, match="at least 16.*'auto'"):
        create_app(Settings(database_url=store_url, **tokens))
