"""Tree drafting (``--speculative-eagle-topk 4``, 8 draft tokens) traced on the real CPU SGLang 0.5.23 server:
every verify step records its 7 drafted nodes with their parents, the draft's top-k that proposed each node,
the target's top-k at its parent, and the accepted path; the request page draws the tree.

The checks hold the record against itself and against SGLang, not against the tracer's own arithmetic: each
node's drafted token must be among the draft top-k recorded for it (a node mapped to the wrong draft step
or branch fails that at once), an accepted node must be the target's top-1 at its parent (greedy decoding),
and the accepted nodes of each step must number SGLang's ``accept_len - 1`` and totals equal ``meta_info``.
"""

from __future__ import annotations

import json
import re
from contextlib import closing
import sqlite3

import pytest
from fastapi.testclient import TestClient

from draftscope.settings import Settings
from draftscope.web.app import create_app
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS
from tests.fixtures.store import settle
from tests.fixtures.wait import until

pytestmark = [pytest.mark.sglang, pytest.mark.scenario("tree")]

NODES, TOPK, DEPTH = 7, 4, 3  # drafted nodes per step, children per node at most, draft steps


@pytest.fixture(scope="module")
def tree_trace(sglang_server):
    server = sglang_server("tree")
    answers = {f"tree-{i}": server.generate(p, DEMO_NEW_TOKENS, rid=f"tree-{i}")
               for i, p in enumerate(DEMO_PROMPTS[:3])}
    path = server.trace_db_url.removeprefix("sqlite:///")

    # the server is shared (scenario "tree"): other tests' requests may be in its store; these are ours
    mine = f"rid IN ({', '.join('?' * len(answers))})"

    def stored():
        with closing(sqlite3.connect(path, timeout=30)) as c:
            return c.execute(f"SELECT count(*) FROM requests WHERE finished_at IS NOT NULL AND {mine}",
                             list(answers)).fetchone()[0] == len(answers)
    until(stored, "the tree server's 3 requests stored")
    with closing(sqlite3.connect(path, timeout=30)) as c:
        c.row_factory = sqlite3.Row
        steps = [dict(r) for r in c.execute(f"SELECT * FROM verify_steps WHERE {mine} ORDER BY rid, step_index",
                                            list(answers))]
        requests = {r["rid"]: dict(r) for r in c.execute(f"SELECT * FROM requests WHERE {mine}", list(answers))}
        run_id = c.execute("SELECT id FROM runs").fetchone()[0]
        every = [(json.loads(r[0]), r[1]) for r in c.execute("SELECT tree_parents, accept_len FROM verify_steps "
                                                              "WHERE tree_parents IS NOT NULL")]
    for s in steps:
        for k in ("drafted_tokens", "accept_flags", "tree_parents", "draft_topk", "target_topk"):
            s[k] = json.loads(s[k]) if s[k] is not None else None
    return {"answers": answers, "steps": steps, "requests": requests, "url": server.trace_db_url, "run": run_id,
            "run_steps": every}


def test_every_step_records_its_tree_of_nodes(tree_trace):
    steps = tree_trace["steps"]
    assert {s["rid"] for s in steps} == set(tree_trace["answers"])
    for s in steps:
        parents = s["tree_parents"]
        assert len(s["drafted_tokens"]) == len(parents) == len(s["accept_flags"]) == NODES, s
        assert all(0 <= p < n for n, p in enumerate(parents, start=1)), parents  # a parent precedes its child
        assert max(parents.count(p) for p in set(parents)) <= TOPK, parents
    assert any(p > 0 for s in steps for p in s["tree_parents"]), "no node below depth 1 in any step"


def test_each_nodes_draft_top_k_is_the_distribution_that_proposed_it(tree_trace):
    for s in tree_trace["steps"]:
        for n, (token, topk) in enumerate(zip(s["drafted_tokens"], s["draft_topk"]), start=1):
            assert token in [t for t, _ in topk][:TOPK], (s["rid"], s["step_index"], n, token, topk)


def test_the_accepted_path_is_the_targets_choice_down_the_tree(tree_trace):
    steps = tree_trace["steps"]
    for s in steps:
        flags, parents = s["accept_flags"], s["tree_parents"]
        assert sum(flags) == s["accept_len"] - 1, s
        for n, flag in enumerate(flags, start=1):
            parent = parents[n - 1]
            checked = parent == 0 or flags[parent - 1]
            target_top1 = s["target_topk"][n - 1][0][0]
            assert flag == (checked and s["drafted_tokens"][n - 1] == target_top1), (s["step_index"], n, s)
    assert max(s["accept_len"] for s in steps) >= 3, "no step accepted two nodes: the path is not exercised"


def test_traced_totals_equal_sglang_meta_info(tree_trace):
    for rid, answer in tree_trace["answers"].items():
        r, meta = tree_trace["requests"][rid], answer["meta_info"]
        assert r["traced_verify_ct"] == r["spec_verify_ct"] == meta["spec_verify_ct"], r
        assert r["traced_accepted_drafts"] == r["spec_accepted_drafts"], r
        mine = [s for s in tree_trace["steps"] if s["rid"] == rid]
        assert len(mine) == meta["spec_verify_ct"] and sum(s["accept_len"] - 1 for s in mine) == r["spec_accepted_drafts"]


def test_the_request_page_draws_the_tree_and_the_run_counts_acceptance_by_depth(tree_trace):
    step = max(tree_trace["steps"], key=lambda s: s["accept_len"])
    run, rid = tree_trace["run"], step["rid"]
    with TestClient(create_app(Settings(database_url=tree_trace["url"])), base_url="http://127.0.0.1") as client:
        settle(client)
        page = client.get(f"/runs/{run}/requests/{rid}/steps/{step['step_index']}")
        summary = client.get(f"/runs/{run}.json").json()
    assert page.status_code == 200, page.text[:300]
    tree = page.text[page.text.index('id="step-tree"'):page.text.index("</figure>")]
    nodes = re.findall(r'<li class="([\w-]+)"><span class="node"', tree)
    assert len(nodes) == NODES, tree
    assert nodes.count("accepted") == step["accept_len"] - 1
    # the list nests as the parents say: a node's <ul> opens inside its parent's <li>
    assert tree.count("<ul>") == 2 + len({p for p in step["tree_parents"] if p > 0}), tree
    # per draft position = per depth, over every step of the run with its shape read (all, here): proposed by the steps whose tree reaches it,
    # accepted when the path does
    per_position = summary["summary"]["acceptance"]["per_position"]
    reach = [(_depth(parents), accept_len) for parents, accept_len in tree_trace["run_steps"]]
    assert len(per_position) == max(r for r, _ in reach) <= DEPTH
    for d, p in enumerate(per_position, start=1):
        assert p["proposed"] == sum(r >= d for r, _ in reach), (d, per_position)
        assert p["accepted"] == sum(a - 1 >= d for _, a in reach), (d, per_position)


def _depth(parents: list[int]) -> int:
    depth = [0]
    for p in parents:
        depth.append(depth[p] + 1)
    return max(depth)
