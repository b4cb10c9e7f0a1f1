"""A dashboard exposed with a read token, in a real browser: a run's address leads to the login page,
a wrong token is refused there, the right one leads back to the run, and from there links and htmx
work on the login cookie (HttpOnly, SameSite=Strict, not the token) until logging out, which revokes
it: the same cookie put back reads nothing."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest

from testbed.server import start_dashboard

pytestmark = pytest.mark.browser

READ_TOKEN = "read-6d1e9a0c55f3a1b7"


@pytest.fixture(scope="module")
def guarded_dashboard(demo_db, tmp_path_factory) -> Iterator[str]:
    """A real ``draftscope serve`` on every address (as a team exposes it), with a read token."""
    log = tmp_path_factory.mktemp("guarded-dashboard") / "serve.log"
    env = {**os.environ, "DRAFTSCOPE_READ_TOKEN": READ_TOKEN, "DRAFTSCOPE_INGEST_TOKEN": "ingest-1b2c8e77d0a4c9"}
    env.pop("DRAFTSCOPE_ALLOW_ANONYMOUS_READS", None)
    with start_dashboard(demo_db, log, args=["--host", "0.0.0.0"], env=env) as url:
        yield url


def _log_in(page, token: str) -> None:
    page.fill("input[name=token]", token)
    page.click("form button[type=submit]")
    page.wait_for_load_state()


def test_a_run_page_needs_the_read_token_then_links_work(page, guarded_dashboard, demo_runs):
    run = f"{guarded_dashboard}/runs/{demo_runs['aux-off']}"
    page.goto(run)
    assert re.search(r"/login\?next=", page.url) and page.locator("header nav").count() == 0

    _log_in(page, "not-the-token")
    assert page.get_by_role("alert").inner_text() == "That is not this dashboard's read token."
    assert "/login" in page.url and page.context.cookies() == []

    _log_in(page, READ_TOKEN)
    assert page.url == run
    assert "fc-bypassed" in page.locator("#diagnosis .rootcause").inner_text()
    cookie, = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and READ_TOKEN not in cookie["value"]

    page.click("header nav a:has-text('Runs')")  # a link, then htmx (XHR) on the same cookie
    page.wait_for_selector(f"tr[data-run='{demo_runs['healthy']}']")
    total = page.locator("tr[data-run]").count()
    page.select_option("select[name=severity]", "error")
    page.wait_for_function(f"() => document.querySelectorAll('tr[data-run]').length < {total}")
    page.locator(f"tr[data-run='{demo_runs['aux-off']}'] a").first.click()
    page.wait_for_selector("#spec-diff")
    assert page.url.startswith(run)

    page.click("form.logout button")
    page.wait_for_url(re.compile(r"/login$"))
    assert page.context.cookies() == []
    page.goto(run)
    assert "/login?next=" in page.url
    page.context.add_cookies([cookie])  # kept from before logout (a copied or stolen cookie)
    page.goto(run)
    assert "/login?next=" in page.url
