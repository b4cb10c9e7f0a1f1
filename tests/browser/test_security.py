"""The dashboard's web defences in a real browser, on the default setup (loopback, no tokens):

- every page carries the security headers and runs under its Content-Security-Policy with no
  violation (the ``page`` fixture fails on any, reported from the ``securitypolicyviolation`` event);
- a page of another site (``other-site.test``, or another port of loopback) that submits a
  cross-site "simple" POST, a text/plain batch to ingest or a multipart bundle to ``/import``, is
  refused, and nothing is stored;
- a DNS-rebinding name (``rebound.test``, resolving to loopback) gets 400, not the dashboard.
"""

from __future__ import annotations

import html
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from testbed.server import start_dashboard
from tests.browser.conftest import OTHER_SITE, REBOUND, REPORT_CSP_VIOLATIONS
from tests.fixtures.demo_store import _cli
from tests.fixtures.wait import until

pytestmark = pytest.mark.browser

SECURITY_HEADERS = {"x-frame-options": "DENY", "x-content-type-options": "nosniff",
                    "referrer-policy": "same-origin"}


def _step_detail_from_a_click(page) -> bool:
    """Hover and click the timeline's first bar; True once its step's detail is shown. Plotly answers
    a click from the hover it last computed, which a busy machine may not have computed yet."""
    bar = page.locator("#plot-timeline .bars path").first
    bar.hover(force=True)
    bar.click(force=True)
    try:
        page.wait_for_selector("#step-detail table.topk", timeout=5_000)
    except PlaywrightTimeoutError:
        return False
    return True


def _assert_security_headers(response, path: str) -> None:
    headers = response.headers
    csp = headers.get("content-security-policy", "")
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, (path, csp)
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, (path, csp)
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, (path, name, headers.get(name))
    assert headers.get("cache-control") == "no-store", path


def test_every_page_runs_under_its_csp_with_no_violation(page, demo_dashboard, demo_runs):
    run, other = demo_runs["healthy"], demo_runs["aux-off"]
    rid = json.load(urllib.request.urlopen(f"{demo_dashboard}/api/v1/runs/{run}"))["requests"][0]["rid"]
    pages = {  # path -> a selector that shows its scripts ran
        "/": "tr[data-run]",
        f"/runs/{run}": "#plot-per-position .main-svg",
        f"/runs/{run}/requests/{rid}": "#plot-timeline .main-svg",
        f"/compare?a={other}&b={run}": "#plot-cmp-per-position .main-svg",
        "/import": "#import-form",
        "/docs": "#swagger-ui .opblock",  # Swagger UI drew the API from /openapi.json
        "/login": "form[action='/login']",
    }
    for path, drawn in pages.items():
        response = page.goto(demo_dashboard + path)
        assert response.status == 200, path
        _assert_security_headers(response, path)
        page.wait_for_selector(drawn)
    # Interactions that add styles and fetch fragments: a plot's hover label, a step's detail.
    page.goto(f"{demo_dashboard}/runs/{run}/requests/{rid}")
    page.wait_for_selector("#plot-timeline .main-svg")
    until(lambda: _step_detail_from_a_click(page), "a bar's click loading its step's detail", timeout_s=120)
    for path in ("/runs/no-such-run", "/static/draftscope.js", "/healthz"):  # errors and files too
        answer = page.request.get(demo_dashboard + path)
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"], path
        assert answer.headers["x-content-type-options"] == "nosniff", path


class _OtherSite(BaseHTTPRequestHandler):
    """Serves ``pages[path]`` as HTML: the other web site the user happens to open."""

    pages: dict[str, str] = {}

    def do_GET(self) -> None:
        body = self.pages.get(self.path, "").encode()
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def other_site() -> Iterator[tuple[int, dict[str, str]]]:
    """(port, pages) of another site's web server on loopback (a port the OS picked)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtherSite)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], _OtherSite.pages
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def empty_dashboard(tmp_path_factory) -> Iterator[str]:
    """A real ``draftscope serve`` with the default settings on an empty store."""
    folder = tmp_path_factory.mktemp("empty-dashboard")
    _cli("db", "upgrade", db=folder / "empty.db")
    with start_dashboard(folder / "empty.db", folder / "serve.log") as url:
        yield url


def _stored(dashboard: str, run_id: str) -> bool:
    try:
        urllib.request.urlopen(f"{dashboard}/api/v1/runs/{run_id}").close()
        return True
    except urllib.error.HTTPError as exc:
        assert exc.code == 404, exc
        return False


def _text_plain_batch_form(dashboard: str, run_id: str) -> str:
    """A form whose text/plain body (``name=value``) is a valid wire batch, its run's ``host`` the
    ``=`` between them: what a cross-site page can send to ingest without a preflight."""
    batch = {"schema_version": 1, "batch_id": uuid.uuid4().hex, "run_id": run_id, "sent_at": time.time(),
             "run": {"engine": "sglang", "engine_version": "0.5.23", "source": "tracer",
                     "status": "running", "started_at": time.time()}}
    name = json.dumps(batch)[:-2] + ', "host": "'
    return (f'<form method="post" action="{dashboard}/api/v1/batches" enctype="text/plain">'
            f'<input type="hidden" name="{html.escape(name)}" value="&quot;}}}}">'
            '<button id="go">send</button></form>')


@pytest.mark.parametrize("site", [OTHER_SITE, "127.0.0.1"], ids=["other-site", "other-port"])
def test_a_cross_site_simple_post_is_refused(browser, empty_dashboard, other_site, demo_db, demo_runs,
                                             tmp_path, site):
    port, pages = other_site
    run_id = f"cross-site-{uuid.uuid4().hex[:8]}"
    pages["/ingest.html"] = _text_plain_batch_form(empty_dashboard, run_id)
    pages["/import.html"] = (f'<form method="post" action="{empty_dashboard}/import" '
                             'enctype="multipart/form-data"><input type="file" name="bundle">'
                             '<button id="go">send</button></form>')
    bundle = tmp_path / "aux-off.zip"
    _cli("export", demo_runs["aux-off"], "-o", str(bundle), db=demo_db)
    context = browser.new_context()
    context.add_init_script(REPORT_CSP_VIOLATIONS)
    page = context.new_page()
    try:
        page.goto(f"http://{site}:{port}/ingest.html")
        with page.expect_response(f"{empty_dashboard}/api/v1/batches") as ingest:
            page.click("#go")
        assert ingest.value.status == 403, ingest.value.text()
        assert "cross-site" in ingest.value.text()

        page.goto(f"http://{site}:{port}/import.html")
        page.set_input_files("input[name=bundle]", str(bundle))  # what the other site's script can do
        with page.expect_response(f"{empty_dashboard}/import") as upload:
            page.click("#go")
        assert upload.value.status == 403 and "cross-site" in upload.value.text()
    finally:
        context.close()
    assert not _stored(empty_dashboard, run_id) and not _stored(empty_dashboard, demo_runs["aux-off"])
    # The same bundle from the dashboard's own import page is taken: tests/browser/test_import.py.


def test_a_rebound_host_name_is_refused(browser, demo_dashboard):
    port = demo_dashboard.rsplit(":", 1)[1]
    context = browser.new_context()
    page = context.new_page()
    try:
        for path in ("/", "/api/v1/runs"):
            response = page.goto(f"http://{REBOUND}:{port}{path}")
            assert response.status == 400, path
            assert "DRAFTSCOPE_ALLOWED_HOSTS" in page.inner_text("body")
        assert page.goto(f"http://127.0.0.1:{port}/").status == 200
    finally:
        context.close()
