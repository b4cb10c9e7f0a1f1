"""The bundle upload form in a real browser: a bundle of the recorded aux-off run, exported from the
demo store, uploaded into an empty dashboard; the run opens with its diagnosis."""

from __future__ import annotations

import pytest

from testbed.server import start_dashboard
from tests.fixtures.demo_store import _cli

pytestmark = pytest.mark.browser


@pytest.fixture
def empty_dashboard(tmp_path):
    store = tmp_path / "empty.db"
    _cli("db", "upgrade", db=store)
    with start_dashboard(store, tmp_path / "serve.log") as url:
        yield url


def test_upload_a_bundle_and_see_the_run(page, demo_db, demo_runs, empty_dashboard, tmp_path):
    bundle = tmp_path / "aux-off.zip"
    _cli("export", demo_runs["aux-off"], "-o", str(bundle), db=demo_db)
    page.goto(empty_dashboard + "/import")
    page.set_input_files("input[name=bundle]", str(tmp_path / "aux-off.zip"))
    page.click("button:has-text('Import')")
    result = page.wait_for_selector("#import-result [role=status]")
    assert "Imported" in result.inner_text()
    assert page.locator("#upload-progress").get_attribute("value") in ("100", "100.0")
    page.click(f"#import-result a[href='/runs/{demo_runs['aux-off']}']")
    page.wait_for_selector("#diagnosis")
    assert "fc-bypassed" in page.locator("#diagnosis").inner_text()
    assert "Imported from" in page.inner_text("main") and "imported" in page.inner_text("h1")
    assert "mismatch" in page.locator("#spec-diff tr[data-key='input_prefill']").get_attribute("class")


def test_a_broken_bundle_is_refused_inline(page, empty_dashboard, tmp_path):
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    page.goto(empty_dashboard + "/import")
    page.set_input_files("input[name=bundle]", str(broken))
    page.click("button:has-text('Import')")
    alert = page.wait_for_selector("#import-result [role=alert]")
    assert "Not a readable zip archive" in alert.inner_text() and "Nothing was imported" in alert.inner_text()
    assert page.url.endswith("/import")  # shown in place, no navigation
