"""The tracer records the same whether SGLang replays its draft CUDA graphs or runs the draft eagerly.

Real CPU SGLang servers (test bed): one eager (`--disable-cuda-graph`, as every other test), one with
`DRAFTSCOPE_TESTBED_GRAPHS=emulate`, where `EAGLEWorkerV2` takes its graph branches
(`cuda_graph_runner.execute`, `cuda_graph_runner_for_draft_extend.execute`) through the stand-in
runners of `testbed/graph_emulation.py`, so `draft_runner.forward` is not called for draft decode or
draft extend. The same greedy prompts, one at a time, must give the same records.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest

from testbed.graph_emulation import BANNER
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS

pytestmark = [pytest.mark.sglang, pytest.mark.scenario("healthy")]  # with the other users of healthy

EMULATE = {"DRAFTSCOPE_TESTBED_GRAPHS": "emulate"}
STEPS = ("select rid, step_index, seq_pos, drafted_tokens, accept_len, accept_flags, bonus_token, draft_topk, "
         "target_topk from verify_steps where rid like ?")
SAMPLES = ("select rid, point, phase, step_index, shape, dtype, rows, width, nan_count, inf_count, l2_mean, l2_max, "
           "mean, std, absmax from tensor_samples where rid like ?")


def _stored(server, prefix: str, n: int) -> sqlite3.Connection:
    """The server's trace store once its ``n`` requests with ids ``prefix*`` are in it."""
    conn = sqlite3.connect(server.trace_db_url.removeprefix("sqlite:///"))
    deadline = time.monotonic() + 60
    while conn.execute("select count(*) from requests where rid like ?", (prefix + "%",)).fetchone()[0] < n:
        assert time.monotonic() < deadline, f"{n} requests {prefix}* not stored within 60 s"
        time.sleep(0.3)
    return conn


def _run(server, mode: str):
    prefix = f"graph-{mode}-"
    outs = [server.generate(p, DEMO_NEW_TOKENS, rid=f"{prefix}{i}") for i, p in enumerate(DEMO_PROMPTS)]
    conn = _stored(server, prefix, len(outs))
    steps = sorted((r[0].removeprefix(prefix), *r[1:]) for r in conn.execute(STEPS, (prefix + "%",)))
    samples = sorted(((r[0].removeprefix(prefix), *r[1:]) for r in conn.execute(SAMPLES, (prefix + "%",))),
                     key=lambda r: r[:10])  # request index, point, phase, step, shape, ...: the exact columns
    return outs, steps, samples


@pytest.fixture(scope="module")
def eager(sglang_server):
    return _run(sglang_server("healthy"), "eager")


@pytest.fixture(scope="module")
def emulated(sglang_server):
    server = sglang_server("healthy", env=EMULATE)
    out = _run(server, "emulated")
    return (*out, open(server.log_path).read())


def _topk(cell):
    return json.loads(cell) if cell else None


def test_the_emulated_server_takes_sglangs_graph_branches(emulated, eager):
    log_text = emulated[3]
    assert BANNER in log_text
    assert "first emulated draft decode graph replay" in log_text
    assert "first emulated draft extend graph replay" in log_text
    outs, eager_outs = emulated[0], eager[0]
    assert [o["text"] for o in outs] == [o["text"] for o in eager_outs]
    assert [o["meta_info"]["spec_verify_ct"] for o in outs] == [o["meta_info"]["spec_verify_ct"] for o in eager_outs]


def test_steps_and_draft_topk_equal_eager(emulated, eager):
    got, want = emulated[1], eager[1]
    assert len(got) == len(want) > len(DEMO_PROMPTS)
    for g, w in zip(got, want):
        assert g[:7] == w[:7]  # request, step, position, drafted tokens, accept length and flags, bonus
        gd, wd = _topk(g[7]), _topk(w[7])
        assert len(gd) == len(wd) == 3, g[:2]  # the draft's top-k at every position of every step, both modes
        assert [[e[0] for e in pos] for pos in gd] == [[e[0] for e in pos] for pos in wd]
        assert [e[1] for pos in gd for e in pos] == pytest.approx([e[1] for pos in wd for e in pos], abs=2e-6)
        assert [pos[0][0] for pos in gd] == json.loads(g[3])  # the draft's argmax is what it drafted
        assert _topk(g[8]) == _topk(w[8])


def _beats(server) -> dict:
    conn = sqlite3.connect(server.trace_db_url.removeprefix("sqlite:///"))
    row = conn.execute("select heartbeats from tracer_health order by at desc limit 1").fetchone()
    return json.loads(row[0]) if row else {}


def test_graph_replays_hand_their_draft_logits_to_the_tracer(emulated, eager, sglang_server):
    """With the draft-extend graph taken, the draft's position-1 top-k is read from the replay's own logits
    (no ``lm_head`` recompute); eagerly, it is recomputed. The top-k equal (test above) across both paths."""
    deadline = time.monotonic() + 30
    while not _beats(sglang_server("healthy", env=EMULATE)).get("draft_extend_logits"):
        assert time.monotonic() < deadline, _beats(sglang_server("healthy", env=EMULATE))
        time.sleep(0.3)
    assert "draft_extend_logits" not in _beats(sglang_server("healthy"))


def test_samples_equal_eager(emulated, eager):
    got, want = emulated[2], eager[2]
    points = {(r[1], r[2]) for r in got}
    assert {("target.aux[0]", "verify"), ("draft.fc.out", "draft_extend"), ("draft.input", "draft_decode"),
            ("draft.logits", "draft_extend"), ("draft.logits", "prefill")} <= points
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[:10] == w[:10]
        assert g[10:] == pytest.approx(w[10:], rel=1e-5, abs=1e-6), g[:4]


def test_batched_requests_in_graph_mode_record_the_draft_at_every_position(emulated, sglang_server):
    """Several requests at once: the stand-in graphs run batches of more than one request."""
    server = sglang_server("healthy", env=EMULATE)
    prefix = "graph-batch-"
    threads = [threading.Thread(target=server.generate, args=(p, DEMO_NEW_TOKENS), kwargs={"rid": f"{prefix}{i}"})
               for i, p in enumerate(DEMO_PROMPTS[:4])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conn = _stored(server, prefix, len(threads))
    steps = conn.execute(STEPS, (prefix + "%",)).fetchall()
    assert len(steps) > len(threads)
    for s in steps:
        assert [pos[0][0] for pos in _topk(s[7])] == json.loads(s[3]), s[:2]
