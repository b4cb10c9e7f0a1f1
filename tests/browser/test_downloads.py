"""Every download is named by its run (and request) id, as the browser saves it: the CSV twins, the
bundles, and the JSON twins' names for Save As (they still open in the browser)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def _saved_as(page, link_text: str) -> str:
    with page.expect_download() as download:
        page.locator(f"a:text-is('{link_text}')").click()
    return download.value.suggested_filename


def _json_name(page, url: str) -> str:
    disposition = page.request.get(url).headers["content-disposition"]
    assert disposition.startswith("inline;"), disposition  # shown in the browser, named when saved
    return disposition.split('filename="', 1)[1].rstrip('"')


def test_run_downloads_carry_the_run_id(page, demo_dashboard, demo_runs):
    run_id = demo_runs["healthy"]
    page.goto(f"{demo_dashboard}/runs/{run_id}")
    assert _saved_as(page, "Spec diff CSV") == f"run-{run_id}-spec.csv"
    assert _saved_as(page, "Findings CSV") == f"run-{run_id}-findings.csv"
    assert _saved_as(page, "Requests CSV") == f"run-{run_id}-requests.csv"
    assert _saved_as(page, "Export bundle") == f"run-{run_id}-bundle.zip"
    assert _json_name(page, f"{demo_dashboard}/runs/{run_id}.json") == f"run-{run_id}.json"


def test_request_downloads_carry_the_run_and_request_ids(page, demo_dashboard, demo_runs, demo_pages):
    run_id = demo_runs["healthy"]
    page.goto(demo_dashboard + demo_pages["request:healthy"])
    rid = page.url.rsplit("/", 1)[1]
    name = f"run-{run_id}-request-{rid}"
    assert _saved_as(page, "Steps CSV") == f"{name}-steps.csv"
    assert _saved_as(page, "Samples CSV") == f"{name}-samples.csv"
    assert _saved_as(page, "Export this request") == f"{name}-bundle.zip"
    assert _json_name(page, page.url + ".json") == f"{name}.json"


def test_compare_json_carries_both_run_ids(page, demo_dashboard, demo_runs):
    a, b = demo_runs["aux-off"], demo_runs["healthy"]
    assert _json_name(page, f"{demo_dashboard}/compare.json?a={a}&b={b}") == f"compare-run-{a}-run-{b}.json"
