"""Every demo page says what it means: no placeholder left in what a reader sees (issue 32, item 3).

The demo store (``draftscope import demo/*.jsonl``) through the real app (TestClient): the runs list,
the compare form and every pair of demo runs, the import form, each run page and each of its request
pages. Visible text is the HTML less scripts, styles, recorded values (<pre>, <code>) and tags, plus the hover
titles and labels; it
must hold no ``[]``, ``None``, ``nan`` or ``undefined``. Then the aux-off runs tell one
story: nothing is marked right for an aux layer that was not captured, and the fix names the one
condition the run has.
"""

from __future__ import annotations

import html
import re
import sqlite3
from itertools import combinations
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from draftscope.settings import Settings
from draftscope.web.app import create_app

# Python's and JavaScript's empty values as text ("NaN / Inf" is a column's name, not a value)
PLACEHOLDER = re.compile(r"\[\s*\]|\b(?:None|nan|undefined)\b|\bNaN\b(?! / Inf)")
# not prose: scripts, styles, and recorded values shown as they are (<pre> JSON blocks, <code> server
# argument values, e.g. a config object's repr "max_context_size=None"): their [] and None are data
HIDDEN = re.compile(r"<(script|style|template|pre|code)\b.*?</\1\s*>", re.S | re.I)
SAID = re.compile(r"""\b(?:title|aria-label|alt|placeholder)\s*=\s*("[^"]*"|'[^']*')""", re.I)


def visible(page: str) -> str:
    """What a reader sees or hovers: the text between tags and the hover titles and labels."""
    page = HIDDEN.sub(" ", page)
    said = [m.group(1)[1:-1] for m in SAID.finditer(page)]
    text = re.sub(r"<[^>]+>", " ", page)
    return html.unescape(" ".join([text, *said]))


@pytest.fixture(scope="module")
def client(demo_db):
    with TestClient(create_app(Settings(database_url=f"sqlite:///{demo_db}")), base_url="http://127.0.0.1") as c:
        yield c


def pages(demo_db, demo_runs) -> list[str]:
    paths = ["/", "/compare", "/import"]
    paths += [f"/compare?a={a}&b={b}" for a, b in combinations(sorted(demo_runs.values()), 2)]
    with sqlite3.connect(demo_db) as db:
        for run_id in sorted(demo_runs.values()):
            paths += [f"/runs/{run_id}", f"/runs/{run_id}/requests"]
            paths += [f"/runs/{run_id}/requests/{quote(rid, safe='')}" for (rid,) in db.execute(
                "SELECT rid FROM requests WHERE run_id = ? ORDER BY rid", (run_id,))]
    return paths


def test_no_placeholder_text_on_any_demo_page(client, demo_db, demo_runs):
    found, paths = {}, pages(demo_db, demo_runs)
    for path in paths:
        page = client.get(path)
        assert page.status_code == 200, (path, page.status_code)
        text = visible(page.text)
        hits = sorted({text[max(0, m.start() - 60):m.end() + 60].strip() for m in PLACEHOLDER.finditer(text)})
        if hits:
            found[path] = hits[:3]
    assert len(paths) > 60 and not found, found


@pytest.mark.parametrize("run", ["aux-off", "kimi-aux-off"])
def test_aux_off_run_page_tells_one_story(client, demo_runs, run):
    text = " ".join(visible(client.get(f"/runs/{demo_runs[run]}").text).split())
    assert "none captured" in text
    # nothing marked right for a layer that was not captured, no aux layer listed as such
    assert "mismatch Width of each aux layer" in text and "✓ Width of each aux layer" not in text
    assert "no aux layer captured" in text and not re.search(r"aux\[0\]: \d+", text)
    assert "hidden_states[]" not in text
    fix = client.get(f"/runs/{demo_runs[run]}.json").json()
    bypassed = next(f for f in fix["findings"] if f["rule_id"] == "fc-bypassed")
    assert bypassed["fix"].startswith("set use_aux_hidden_state: true in eagle_config (this draft's config says false)")


def test_the_tree_run_draws_its_tree_node_by_node(client, demo_db, demo_runs):
    """demo/tree.jsonl: --speculative-eagle-topk 4 on the CPU bed; a request page draws the drafted tree
    of its steps, node by node, the accepted path marked."""
    with sqlite3.connect(demo_db) as db:
        (rid,) = db.execute("SELECT rid FROM requests WHERE run_id = ? ORDER BY rid LIMIT 1",
                            (demo_runs["tree"],)).fetchone()
    verdicts = []
    for step in range(6):  # the first request verified 6 steps
        page = client.get(f"/runs/{demo_runs['tree']}/requests/{quote(rid, safe='')}/steps/{step}").text
        start = page.index('id="step-tree"')
        tree = page[start:page.index("</figure>", start)]
        verdicts.append(re.findall(r'<li class="([a-z-]+)"><span class="node"', tree))
    assert all(len(v) == 7 for v in verdicts) and any("accepted" in v for v in verdicts), verdicts
