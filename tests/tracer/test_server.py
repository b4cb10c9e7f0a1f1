"""The tracer inside the real CPU SGLang server (test bed): traces land in the store, totals equal
SGLang's own counters, and a broken tracer or an unreachable dashboard never changes the answers.

Three server starts in all (each ~30 s of CPU): no tracer (the reference answers), tracer -> a real
``draftscope serve``, tracer with injected probe faults and its dashboard down.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from draftscope.store import db as store_db
from testbed.models import ensure_models
from testbed.server import free_port, start_dashboard, start_server
from tests.fixtures.sglang_server import IDLE_SLEEP, recorders
from tests.fixtures.wait import ended, until

pytestmark = pytest.mark.sglang

PROMPTS = ["The quick brown fox", "Once upon a time there was", "Hello world, this is", "A B C D"]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def models():
    return ensure_models()


def _answers(models, log, env, after_first=None, store=None):
    """The answers to PROMPTS and the log of the server, once stopped and (with ``store``, the
    tracer's SQLite store) once the tracer's final flush has ended the run there;
    ``after_first(server)`` runs after the first answer."""
    with start_server(models.target, models.draft, IDLE_SLEEP, log, env=env) as server:
        outs = [server.generate(PROMPTS[0], max_new_tokens=NEW_TOKENS)]
        if after_first is not None:
            after_first(server)
        outs += [server.generate(p, max_new_tokens=NEW_TOKENS) for p in PROMPTS[1:]]
    if store is not None:
        ended(store)
    return outs, open(log).read()


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory):
    outs, _ = _answers(models, tmp_path_factory.mktemp("ref") / "server.log", {})
    return outs


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """A real ``draftscope serve`` on a migrated SQLite store; yields (url, db path)."""
    folder = tmp_path_factory.mktemp("store")
    path = folder / "store.db"
    store_db.upgrade(f"sqlite:///{path}")
    with start_dashboard(path, folder / "dashboard.log") as url:
        yield url, path


@pytest.fixture(scope="module")
def traced(models, dashboard, tmp_path_factory):
    url, path = dashboard
    env = {"DRAFTSCOPE_URL": url, "DRAFTSCOPE_SAMPLE_RATE": "1", "DRAFTSCOPE_FLUSH_INTERVAL_S": "0.2"}
    outs, log_text = _answers(models, tmp_path_factory.mktemp("traced") / "server.log", env, store=path)
    return outs, log_text, sqlite3.connect(path)


def test_traces_land_in_the_store_with_facts(traced):
    _, _, conn = traced
    (facts,), = conn.execute("select facts from runs").fetchall()
    facts = json.loads(facts)
    assert facts["algorithm"] == "EAGLE3" and facts["spec_num_draft_tokens"] == 4
    assert facts["target"]["capture_aux_hidden_states"] is True
    assert facts["draft"]["fc_in_features"] == 3 * facts["target"]["hidden_size"]
    w = facts["draft"]["weights"]
    assert w["checked"] > 0 and w["matched"] == w["checked"] and not w["nonfinite"]
    assert facts["draft"]["hot_token_id"]["equals_d2t_plus_arange"] is True
    points = {(p, ph): width for p, ph, width in
              conn.execute("select point, phase, max(width) from tensor_samples group by point, phase")}
    H = facts["target"]["hidden_size"]
    assert points[("draft.input", "prefill")] == 3 * H and points[("draft.input", "draft_extend")] == 3 * H
    assert points[("draft.input", "draft_decode")] == H
    assert {("target.aux[2]", "verify"), ("draft.fc.out", "prefill"), ("draft.logits", "draft_extend")} <= set(points)
    health = conn.execute("select errors, drops, heartbeats from tracer_health order by at desc").fetchone()
    assert json.loads(health[0]) == {} and json.loads(health[1]) == {}
    assert json.loads(health[2])["verify"] > 0


def test_every_hook_accounted_for_and_every_step_stored(traced):
    _, log_text, conn = traced
    (facts,), = conn.execute("select facts from runs").fetchall()
    assert json.loads(facts)["tracing"] == {
        "worker_class": "EAGLEWorkerV2", "draft_worker_class": "EagleDraftWorker", "algorithm": "EAGLE3",
        "covered": True, "hooks_not_applied": [], "hooks_not_reached": [],
        "expected_to_fire": ["prefill", "draft", "verify", "draft_extend", "finish"]}
    assert "never fired" not in log_text and "traces nothing" not in log_text
    # a sampled request stores one verify step per step the tracer counted (what missing_steps reads)
    rows = conn.execute("select r.traced_verify_ct, (select count(*) from verify_steps s where s.rid = r.rid) "
                        "from requests r where r.sampled").fetchall()
    assert rows and all(counted == stored for counted, stored in rows), rows


def test_per_request_totals_equal_sglang_counters(traced):
    outs, _, conn = traced
    rows = {r[0]: r[1:] for r in conn.execute(
        "select rid, spec_verify_ct, traced_verify_ct, spec_accepted_drafts, traced_accepted_drafts, "
        "spec_proposed_drafts, traced_proposed_drafts from requests")}
    for out in outs:
        m = out["meta_info"]
        assert rows[m["id"]] == (m["spec_verify_ct"], m["spec_verify_ct"], m["spec_num_correct_drafts"],
                                 m["spec_num_correct_drafts"], m["spec_num_proposed_drafts"],
                                 m["spec_num_proposed_drafts"])


def test_steps_are_consistent_with_acceptance(traced):
    _, _, conn = traced
    steps = conn.execute("select rid, step_index, drafted_tokens, accept_len, accept_flags, draft_topk, "
                         "target_topk from verify_steps").fetchall()
    assert steps
    per_rid = {}
    for rid, idx, drafted, a, flags, dtopk, ttopk in steps:
        drafted, flags, ttopk = json.loads(drafted), json.loads(flags), json.loads(ttopk)
        assert len(drafted) == len(flags) == len(ttopk) == 3 and 1 <= a <= 4
        assert flags == [p <= a - 1 for p in (1, 2, 3)]
        # a greedy target accepts exactly the drafts equal to its own argmax
        for p in range(a - 1):
            assert ttopk[p][0][0] == drafted[p]
        if dtopk:  # the draft's argmax is what it drafted
            assert [pos[0][0] for pos in json.loads(dtopk)] == drafted
        per_rid.setdefault(rid, []).append(idx)
    for rid, idxs in per_rid.items():
        assert sorted(idxs) == list(range(len(idxs)))
    assert conn.execute("select count(*) from verify_steps where draft_topk is not null").fetchone()[0] > 0


def test_answers_unchanged_with_tracer(reference, traced):
    assert [o["text"] for o in traced[0]] == [o["text"] for o in reference]


def _kill_recorder(server) -> None:
    """SIGKILL the tracer's recorder process (started by the scheduler), once it has found the dashboard down."""
    until(lambda: "HTTP sink (" in open(server.log_path).read(), "the tracer's log says the dashboard is down", 30)
    procs = recorders(server.pid)
    assert len(procs) == 1, procs
    procs[0].kill()


def test_faulty_tracer_and_dashboard_down_change_nothing(models, reference, tmp_path_factory):
    """Probes that raise, a dashboard that is not there, and the recorder process killed mid-run."""
    env = {"DRAFTSCOPE_URL": f"http://127.0.0.1:{free_port()}", "DRAFTSCOPE_SAMPLE_RATE": "1",
           "DRAFTSCOPE_FAULT": "verify,draft,draft_extend,finish"}
    outs, log_text = _answers(models, tmp_path_factory.mktemp("faulty") / "server.log", env, _kill_recorder)
    assert [o["text"] for o in outs] == [o["text"] for o in reference]
    assert [o["meta_info"]["spec_verify_ct"] for o in outs] == [o["meta_info"]["spec_verify_ct"] for o in reference]
    assert "disabled" in log_text and "HTTP sink (" in log_text and "recorder process lost" in log_text


def _ordered(conn, sql: str) -> list:
    """Rows of ``sql`` (first column a rid) with the rid replaced by the request's position in time."""
    order = {rid: i for i, (rid,) in enumerate(conn.execute("select rid from requests order by started_at"))}
    return sorted((order[r[0]], *r[1:]) for r in conn.execute(sql))


def test_device_summariser_records_what_host_reduction_records(models, traced, tmp_path):
    """``DRAFTSCOPE_REDUCE=device`` sends every launch through the Summarizer (the path CUDA tensors take);
    its records equal the default CPU path's (rows copied in the hook, reduced in the recorder process)."""
    path = tmp_path / "device.db"
    store_db.upgrade(f"sqlite:///{path}")
    env = {"DRAFTSCOPE_DB": str(path), "DRAFTSCOPE_SAMPLE_RATE": "1", "DRAFTSCOPE_FLUSH_INTERVAL_S": "0.2",
           "DRAFTSCOPE_REDUCE": "device"}
    outs, _ = _answers(models, tmp_path / "server.log", env, store=path)
    assert [o["text"] for o in outs] == [o["text"] for o in traced[0]]
    device, host = sqlite3.connect(path), traced[2]
    samples = ("select rid, point, phase, step_index, shape, dtype, rows, width, nan_count, inf_count, l2_mean, "
               "l2_max, mean, std, absmax from tensor_samples")
    got, want = _ordered(device, samples), _ordered(host, samples)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g[:10] == w[:10]
        assert g[10:] == pytest.approx(w[10:], rel=1e-4, abs=1e-5), g[:4]
    steps = "select rid, step_index, drafted_tokens, accept_len, draft_topk, target_topk from verify_steps"
    got, want = _ordered(device, steps), _ordered(host, steps)
    assert len(got) == len(want) > 0
    ids = lambda topk: [[e[0] for e in pos] for pos in json.loads(topk)] if topk else None  # noqa: E731
    probs = lambda topk: [e[1] for pos in json.loads(topk) for e in pos] if topk else []  # noqa: E731
    for g, w in zip(got, want):
        assert g[:4] == w[:4] and ids(g[4]) == ids(w[4]) and ids(g[5]) == ids(w[5])
        assert probs(g[4]) + probs(g[5]) == pytest.approx(probs(w[4]) + probs(w[5]), rel=1e-4, abs=2e-6)  # both rounded to 1e-6
