"""``draftscope.web.guard`` on the real app and store: the Host allow-list (DNS rebinding), cross-site
writes refused, ingest taking JSON only, and the security headers on every answer (pages, API,
errors, files). The same in a real browser: tests/browser/test_security.py."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from draftscope.settings import Settings
from draftscope.web.guard import CSP, HostAllowList, answered_names, host_name
from tests.fixtures.store import make_batch, run_record

BATCHES = "/api/v1/batches"


def _at(client: TestClient, base_url: str) -> TestClient:
    """``client``'s dashboard, reached at ``base_url`` (its Host header)."""
    return TestClient(client.app, base_url=base_url)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8177", "localhost:9", "LOCALHOST", "[::1]:8177"])
def test_loopback_names_are_answered_on_any_port(client, host) -> None:
    assert _at(client, f"http://{host}").get("/api/v1/runs").status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8177", "127.0.0.1.evil.example",
                                  "localhost.evil.example", "[::2]:8177", "10.0.0.5"])
def test_any_other_host_name_gets_400_naming_the_setting(client, host) -> None:
    for path in ("/", "/api/v1/runs", "/runs.csv", "/login", "/static/draftscope.js"):
        answer = _at(client, f"http://{host}").get(path)
        assert answer.status_code == 400, (host, path)
        assert "DRAFTSCOPE_ALLOWED_HOSTS" in answer.text and "--allowed-host" in answer.text
    refused = _at(client, f"http://{host}").post(BATCHES, json=make_batch("r", run=run_record()))
    assert refused.status_code == 400 and "DRAFTSCOPE_ALLOWED_HOSTS" in refused.json()["error"]


def test_healthz_answers_any_host_name(client) -> None:
    assert _at(client, "http://dashboard-a:8177").get("/healthz").status_code in (200, 503)


def test_configured_names_are_answered(make_client) -> None:
    client = make_client(allowed_hosts="dashboard, *.corp.example", public_url="https://dash.example.org/",
                         host="10.0.0.5")
    for host in ("dashboard:8177", "a.corp.example", "b.a.corp.example", "dash.example.org", "10.0.0.5:8177"):
        assert _at(client, f"http://{host}").get("/api/v1/runs").status_code == 200, host
    for host in ("corp.example", "evil.example", "dashboard.evil.example"):
        assert _at(client, f"http://{host}").get("/api/v1/runs").status_code == 400, host


def test_a_star_answers_every_host_name(make_client) -> None:
    client = make_client(allowed_hosts=["*"])
    assert _at(client, "http://anything.example").get("/api/v1/runs").status_code == 200


def test_host_names_are_parsed_as_a_browser_sends_them() -> None:
    assert [host_name(h) for h in ("A.Example:80", "[::1]:8177", "[::1]", "10.0.0.5", "")] == \
        ["a.example", "::1", "::1", "10.0.0.5", ""]
    hosts = HostAllowList(answered_names(Settings(allowed_hosts="[fd00::1], x.example")))
    assert hosts.allows("[fd00::1]:8177") and hosts.allows("x.example:1") and not hosts.allows("")


@pytest.mark.parametrize("headers", [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # another port of loopback, a sibling subdomain
    {"Origin": "http://evil.example"},  # an older browser: no Sec-Fetch-Site
    {"Origin": "http://127.0.0.1:9999"},
    {"Origin": "null"},  # a sandboxed frame or data: page
])
def test_a_browser_post_from_another_site_gets_403(make_client, headers) -> None:
    client = make_client()
    form = {"token": "x", "next": "/"}
    for path, kwargs in ((BATCHES, {"json": make_batch("xsite", run=run_record())}),
                         ("/import", {"files": {"bundle": ("b.zip", b"PK", "application/zip")}}),
                         ("/login", {"data": form}), ("/logout", {})):
        answer = client.post(path, headers=headers, follow_redirects=False, **kwargs)
        assert answer.status_code == 403, (path, headers)
        assert "cross-site" in answer.text
    assert client.get("/api/v1/runs/xsite").status_code == 404


@pytest.mark.parametrize("headers", [
    {},  # curl, the CLI, a tracer: no browser headers at all
    {"Sec-Fetch-Site": "same-origin"},
    {"Sec-Fetch-Site": "none"},  # typed in the address bar
    {"Origin": "http://127.0.0.1"},  # same origin, from a browser without Sec-Fetch-Site
])
def test_a_post_from_the_dashboard_itself_or_no_browser_goes_through(make_client, headers) -> None:
    client = make_client()
    answer = client.post(BATCHES, json=make_batch("same-site-run", run=run_record()), headers=headers)
    assert answer.status_code == 200, answer.text
    assert client.post("/logout", headers=headers, follow_redirects=False).status_code == 303


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", None])
def test_ingest_refuses_what_a_cross_site_form_can_send(make_client, content_type) -> None:
    client = make_client()
    body = b'{"schema_version": 1}'
    headers = {} if content_type is None else {"Content-Type": content_type}
    answer = client.post(BATCHES, content=body, headers=headers)
    assert answer.status_code == 415
    named = content_type.partition(";")[0] if content_type else "none"
    assert f"application/json only (this request's: {named})" in answer.json()["error"]


def test_ingest_takes_json_with_a_charset(make_client) -> None:
    import orjson

    client = make_client()
    body = orjson.dumps(make_batch("charset-run", run=run_record()))
    answer = client.post(BATCHES, content=body, headers={"Content-Type": "application/json; charset=utf-8"})
    assert answer.status_code == 200, answer.text


def test_every_answer_carries_the_security_headers(make_client) -> None:
    client = make_client(read_token="read-token-for-headers-1")
    bearer = {"Authorization": "Bearer read-token-for-headers-1"}
    answers = {
        "page": client.get("/", headers=bearer),
        "api": client.get("/api/v1/runs", headers=bearer),
        "refusal": client.get("/api/v1/runs"),
        "missing": client.get("/runs/nope", headers=bearer),
        "login": client.get("/login"),
        "file": client.get("/static/draftscope.js"),
        "wrong host": _at(client, "http://evil.example").get("/"),
        "cross-site": client.post("/logout", headers={"Sec-Fetch-Site": "cross-site"}),
    }
    for what, answer in answers.items():
        assert answer.headers["content-security-policy"] == CSP, what
        assert answer.headers["x-frame-options"] == "DENY", what
        assert answer.headers["x-content-type-options"] == "nosniff", what
        assert answer.headers["referrer-policy"] == "same-origin", what
        expected = None if what == "file" else "no-store"
        assert answer.headers.get("cache-control") == expected, what
    assert "frame-ancestors 'none'" in CSP and "script-src 'self';" in CSP
    assert "unsafe-inline" not in CSP and "unsafe-eval" not in CSP


def test_a_crash_answer_carries_the_headers_too(make_client, store_url) -> None:
    import sqlalchemy as sa

    from draftscope.store import db

    client = make_client()
    client = TestClient(client.app, base_url="http://127.0.0.1", raise_server_exceptions=False)
    engine = db.make_engine(store_url)
    try:  # a store broken under the dashboard: its reads fail
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE runs" + (" CASCADE" if conn.dialect.name == "postgresql" else "")))
    finally:
        engine.dispose()
    answer = client.get("/api/v1/runs/any")
    assert answer.status_code == 500
    assert answer.headers["content-security-policy"] == CSP and answer.headers["cache-control"] == "no-store"


def test_no_template_holds_inline_script_handler_or_style() -> None:
    """What the CSP would block (and the browser tests would catch on the pages they open), caught on
    every template: scripts are files, handlers live in static/draftscope.js, styles in the stylesheet."""
    import re

    from draftscope.resources import TEMPLATES_DIR

    inline = re.compile(r"<script(?![^>]*\b(src=|type=\"application/json\"))|\son[a-z]+\s*=|\shx-on[:-]|"
                        r"\sstyle\s*=|javascript:", re.I)
    found = {path.name: inline.findall(path.read_text()) for path in TEMPLATES_DIR.glob("*.html")}
    assert len(found) >= 10 and {name: hits for name, hits in found.items() if hits} == {}
