"""Playwright driving Debian's chromium (``/usr/bin/chromium``, or ``DRAFTSCOPE_CHROMIUM``) against a
real dashboard; every test leaves a screenshot under ``artifacts/screenshots/``, and fails on a
console error or a Content-Security-Policy violation. ``page.wait_for_function`` takes an arrow
function (``"() => ..."``): a bare expression is eval'd in the page, which its CSP refuses."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("DRAFTSCOPE_CHROMIUM", "/usr/bin/chromium")
OTHER_SITE = "other-site.test"  # another web site's name, resolved to loopback (test_security.py)
REBOUND = "rebound.test"  # a DNS-rebinding name: an attacker's name that now resolves to loopback
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
# Flags for a closed network and a root user (see the machine notes): no sandbox, no background
# connections, no first-run work; and the two names above resolved to loopback.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--host-resolver-rules=MAP {OTHER_SITE} 127.0.0.1, MAP {REBOUND} 127.0.0.1"]
# Every violation of the page's Content-Security-Policy, reported as a console error (the init
# script runs before the page's own, outside its CSP).
REPORT_CSP_VIOLATIONS = """document.addEventListener("securitypolicyviolation", (e) => console.error(
    "CSP violation: " + e.violatedDirective + " blocked " + (e.blockedURI || "inline") + " at " +
    e.sourceFile + ":" + e.lineNumber));"""


@pytest.fixture(scope="session")
def browser() -> Iterator:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no chromium at {CHROMIUM}: scripts/test installs Debian's chromium "
                    "(apt-get install chromium), or set DRAFTSCOPE_CHROMIUM")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, request) -> Iterator:
    """A fresh 1400 × 900 page; its screenshot is saved as ``<test name>.png`` at teardown, and
    console errors (CSP violations among them) fail the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.add_init_script(REPORT_CSP_VIOLATIONS)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert not errors, f"the page logged errors: {errors}"


@pytest.fixture(scope="session")
def demo_pages(demo_runs, demo_db) -> dict[str, str]:
    """Every page of the demo store by name: the runs list, the compare form and two comparisons (the
    Kimi pair; aux-off beside healthy), the import form, each run's page and its first request's page."""
    import sqlite3
    from urllib.parse import quote
    pages = {"runs": "/", "compare-form": "/compare", "import": "/import",
             "compare-kimi": f"/compare?a={demo_runs['kimi-healthy']}&b={demo_runs['kimi-aux-off']}",
             "compare-aux-off": f"/compare?a={demo_runs['aux-off']}&b={demo_runs['healthy']}"}
    with sqlite3.connect(demo_db) as db:
        for name, run_id in sorted(demo_runs.items()):
            pages[f"run:{name}"] = f"/runs/{run_id}"
            first = db.execute("SELECT rid FROM requests WHERE run_id = ? ORDER BY started_at, rid LIMIT 1",
                               (run_id,)).fetchone()
            if first:  # a run that crashed at its first request has none
                pages[f"request:{name}"] = f"/runs/{run_id}/requests/{quote(first[0], safe='')}"
    return pages


def wait_for_charts(page) -> None:
    """Until every chart of the page is drawn and takes clicks: draftscope.js names the drawing an
    image once plotly.js has finished the plot."""
    page.wait_for_function("() => [...document.querySelectorAll('div.plot[data-figure]')]"
                           ".every((d) => d.querySelector('svg.main-svg[role=img]'))")
