"""The runs list (``/``), its ``.json`` twin and ``GET /api/v1/runs`` come a page at a time: following the
next link from the first page lists every run once, in the order of the whole list, under any sort
(ties and missing values included), even when runs arrive between pages; a cursor that is not one, or
one of another sort, is a 400 that says what to do."""

from __future__ import annotations

import re
import time
import uuid
from html import unescape

import orjson
import pytest

from draftscope.store import db, queries
from draftscope.store.ingest import BatchWriter, parse_batch
from tests.fixtures.store import make_batch, run_record

T0 = time.time() - 3600
RUNS = 23


def _store_runs(store_url: str, n: int, start: float = T0) -> list[str]:
    """``n`` runs, three to a start time (ties), every other one ended (``ended_at`` set or missing),
    every fifth with an error finding; returns their ids."""
    engine = db.make_engine(store_url)
    writer, ids = BatchWriter(engine), []
    with writer.transaction() as conn:
        for i in range(n):
            run_id = f"{uuid.uuid4().hex[:6]}-{i:03d}"
            ended = {"status": "ended", "ended_at": start + 100 + i % 4} if i % 2 else {}
            findings = [{"rule_id": "aux-width-mismatch", "severity": "error", "message": "m"}] if i % 5 == 0 else []
            writer.store(conn, parse_batch(orjson.dumps(make_batch(
                run_id, run=run_record(started_at=start + i // 3, **ended), findings=findings))))
            ids.append(run_id)
    engine.dispose()
    return ids


def _walk(client, url: str) -> list[list[str]]:
    """The run ids of every page from ``url`` on, following the ``Link: <...>; rel="next"`` header."""
    pages = []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.text
        pages.append([r["id"] for r in response.json()])
        link = response.headers.get("link")
        url = re.fullmatch(r'<(.+)>; rel="next"', link).group(1) if link else None
    return pages


def _whole(store_url: str, **options) -> list[str]:
    engine = db.make_engine(store_url)
    with engine.connect() as conn:
        ids = [r["id"] for r in queries.list_runs(conn, limit=10**6, **options)]
    engine.dispose()
    return ids


@pytest.mark.parametrize("sort,desc", [("started_at", True), ("ended_at", False), ("ended_at", True),
                                       ("worst_severity", True), ("id", False)])
def test_following_next_lists_every_run_once_in_order(client, store_url, sort, desc):
    _store_runs(store_url, RUNS)
    pages = _walk(client, f"/runs.json?sort={sort}&desc={int(desc)}&limit=4")
    assert [len(p) for p in pages] == [4] * (RUNS // 4) + [RUNS % 4]
    assert sum(pages, []) == _whole(store_url, sort=sort, desc=desc)


def test_the_api_pages_and_keeps_its_filters(client, store_url):
    ids = _store_runs(store_url, RUNS)
    pages = _walk(client, "/api/v1/runs?engine=sglang&limit=10")
    assert [len(p) for p in pages] == [10, 10, 3] and sorted(sum(pages, [])) == sorted(ids)
    assert len(client.get("/api/v1/runs").json()) == RUNS  # under the default page size: one page
    assert "link" not in client.get("/api/v1/runs").headers
    errors = _walk(client, "/runs.json?severity=error&limit=2")
    assert sorted(sum(errors, [])) == sorted(ids[::5])
    assert sorted(sum(_walk(client, "/runs.json?severity=none&limit=7"), [])) == \
        sorted(set(ids) - set(ids[::5]))


def test_a_run_that_arrives_between_pages_shifts_nothing(client, store_url):
    ids = _store_runs(store_url, RUNS)
    first = client.get("/api/v1/runs?limit=5")
    newer = _store_runs(store_url, 1, start=time.time())
    rest = _walk(client, re.fullmatch(r'<(.+)>; rel="next"', first.headers["link"]).group(1))
    seen = [r["id"] for r in first.json()] + sum(rest, [])
    assert sorted(seen) == sorted(ids) and newer[0] not in seen  # newest first: it is on page one now


def test_the_runs_page_links_its_next_and_first_pages(client, store_url):
    _store_runs(store_url, RUNS)
    html = client.get("/?limit=10").text
    assert "10 of 23 runs" in html and "first page" not in html
    nexts = [unescape(u) for u in re.findall(r'href="([^"]+)" rel="next"', html)]
    assert len(nexts) == 1 and "limit=10" in nexts[0] and "cursor=" in nexts[0]
    second = client.get(nexts[0])
    assert second.status_code == 200 and "first page" in second.text
    shown = lambda page: set(re.findall(r'<tr data-run="([^"]+)"', page))
    assert len(shown(second.text)) == 10 and not shown(second.text) & shown(html)
    fragment = client.get(nexts[0], headers={"HX-Request": "true"}).text
    assert fragment.lstrip().startswith('<div id="runs"') and 'id="runs-pager"' in fragment


@pytest.mark.parametrize("path", ["/", "/runs.json", "/api/v1/runs"])
def test_a_cursor_that_is_not_one_is_a_clear_400(client, store_url, path):
    _store_runs(store_url, 6)
    bad = client.get(f"{path}?cursor=not-a-cursor")
    assert bad.status_code == 400 and "is not a runs-list cursor" in bad.text
    link = client.get("/runs.json?limit=2").headers["link"]
    cursor = re.search(r"cursor=([^&>]+)", link).group(1)
    other = client.get(f"{path}?cursor={cursor}&sort=id" if path != "/api/v1/runs" else f"{path}?cursor={cursor}")
    if path == "/api/v1/runs":  # the API's one sort is the list's default: the cursor is good there
        assert other.status_code == 200 and len(other.json()) == 4
    else:
        assert other.status_code == 400 and "leave cursor out" in other.text
    assert client.get(f"{path}?limit=0").status_code in (400, 422)
