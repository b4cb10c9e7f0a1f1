"""The time and position acceptance signatures hold up as statistics (issue 32): they compare
requests, like with like, beyond request-to-request variation. Each trace goes through the real
ingest, aggregates and rules (a migrated SQLite store, bench/signature_false_alarms.Store).

Traces are synthetic but shaped like the CPU test bed's: three drafts per verify step, a prompt's
acceptance a per-prompt rate with step-to-step noise, sequence positions from the prompt's length.
"""

from __future__ import annotations

import random

import pytest

from bench.signature_false_alarms import Store, Trace, retimed
from draftscope.findings import significance
from tests.fixtures.store import run_record

DRIFT, DECAY = "acceptance-drift-over-time", "acceptance-decays-with-position"
T0 = 1_790_000_000.0


def trace(plan, *, seed=0, limit=2048, keys=True, knee=None, after=1.0):
    """``plan``: [(prompt, prompt_len, acceptance rate, scale)] in arrival order, 12 verify steps
    each; ``scale`` multiplies the rate (a drift). ``knee``: past that sequence position the rate is
    multiplied by ``after`` (a decay)."""
    rng, t, out = random.Random(seed), T0, Trace(run_record(started_at=T0, facts={
        "spec_topk": 1, "algorithm": "EAGLE3",
        "draft": {"checkpoint_max_position_embeddings": limit, "max_position_embeddings": limit}}))
    for i, (prompt, prompt_len, rate, scale) in enumerate(plan):
        rid, pos = f"req-{i}", prompt_len
        out.requests.append({"rid": rid, "sampled": True, "prompt_len": prompt_len, "started_at": t,
                             **({"prompt_key": f"{abs(hash(prompt)) % 16**16:016x}"} if keys else {})})
        for step in range(12):
            p = rate * scale * (after if knee is not None and pos >= knee else 1.0)
            flags = []
            for _ in range(3):  # a draft position counts only after every earlier one was accepted
                flags.append((not flags or flags[-1]) and rng.random() < p)
            accepted = sum(flags)
            out.steps.append({"rid": rid, "step_index": step, "at": t, "seq_pos": pos,
                              "drafted_tokens": [5, 6, 7], "accept_len": accepted + 1, "accept_flags": flags})
            pos, t = pos + accepted + 1, t + 0.05
        out.requests[-1].update(finished_at=t, spec_verify_ct=12, output_len=pos - prompt_len)
        t += 0.1
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return Store(tmp_path_factory.mktemp("signatures"))


def signatures(store, t):
    return {f.rule_id: f for f in store.findings(t) if f.rule_id in (DRIFT, DECAY)}


PROSE = [(f"prose {i}", 8 + i, 0.7, 1.0) for i in range(12)]  # the draft's own kind: accepted often
CODE = [(f"code {i}", 30 + i, 0.15, 1.0) for i in range(12)]  # another kind: rarely


def test_prompts_that_change_kind_along_the_run_are_no_drift(store):
    """The issue's run: prose first, code last, acceptance following the prompt order (~70% -> 15%)."""
    assert signatures(store, trace(PROSE + CODE)) == {}


def test_the_same_prompts_falling_late_are_a_drift(store):
    """The same twelve prompts early and late; late, each is accepted at a third of its rate."""
    plan = PROSE + PROSE + [(p, n, r, 0.3) for p, n, r, _ in PROSE]
    found = signatures(store, trace(plan))
    drift = found[DRIFT]
    assert drift.severity == "warning" and "for the same 12 prompts sent in both" in drift.message
    assert drift.evidence["same_prompts"] and drift.evidence["p_value"] <= 0.01
    assert DECAY not in found


def test_without_prompt_keys_a_fall_is_said_not_warned(store):
    plan = PROSE + PROSE + [(p, n, r, 0.3) for p, n, r, _ in PROSE]
    drift = signatures(store, trace(plan, keys=False))[DRIFT]
    assert drift.severity == "info" and "recorded no prompt keys" in drift.message


def test_a_short_gap_free_slice_is_no_drift(store):
    """A healthy run of the same prompts with a lost-record gap: only the stretch after it is judged,
    too few requests to say anything; the control without the gap says nothing either."""
    plan = [(p, n, r, 1.0) for p, n, r, _ in PROSE + PROSE[:6]] + [(p, n, 0.45, 1.0) for p, n, _, _ in PROSE[:6]]
    t = trace(plan, seed=3)
    rids = [r["rid"] for r in t.requests]
    assert signatures(store, retimed(t, rids, gap_after=18)) == {}
    assert signatures(store, retimed(t, rids)) == {}


def test_healthy_short_prompts_beside_long_ones_are_no_decay(store):
    """The issue's '28% before position 32, 3% beyond it; max_position_embeddings 2048': long prompts
    of another kind sit past position 32 and are accepted less, on a healthy 2048-position draft."""
    assert signatures(store, trace(PROSE + CODE + PROSE + CODE, limit=2048)) == {}


def test_acceptance_falling_within_the_same_requests_is_a_decay(store):
    """Every request runs from position 300 to ~350; past 320 the draft fails (trained on 320 tokens
    while its config says 2048, SpecForge #271's case)."""
    plan = [(f"prose {i}", 300, 0.8, 1.0) for i in range(12)]
    decay = signatures(store, trace(plan, limit=2048, knee=320, after=0.1))[DECAY]
    assert decay.severity == "warning" and decay.evidence["within_requests"]
    assert 304 <= decay.evidence["knee_seq_pos"] <= 336
    assert "in the same 12 requests" in decay.message and "well inside the checkpoint's" in decay.message


def test_a_fall_at_position_32_of_a_2048_position_draft_is_not_its_window(store):
    """The same fall at position 32, far inside the checkpoint's window and any training length: said
    (info), not warned, and not blamed on the context window."""
    plan = [(f"prose {i}", 10, 0.8, 1.0) for i in range(12)]
    decay = signatures(store, trace(plan, limit=2048, knee=32, after=0.1))[DECAY]
    assert decay.severity == "info" and "this is not the draft's context window" in decay.message


def test_long_prompts_past_the_checkpoint_window_are_a_decay(store):
    """The short-context scenario: the checkpoint says 64 positions, long prompts start past it."""
    short = [(f"prose {i}", 8, 0.7, 1.0) for i in range(10)]
    long = [(f"prose {i} joined", 150, 0.7, 1.0) for i in range(10)]
    decay = signatures(store, trace(short + long, limit=64, knee=64, after=0.1))[DECAY]
    assert decay.severity == "warning" and not decay.evidence["within_requests"]
    assert "other, longer prompts" in decay.message and "max_position_embeddings is 64" in decay.message


def test_the_tests_are_deterministic_and_over_requests():
    early, late = [(12, 20, "a")] * 8, [(12, 5, "a")] * 8
    assert significance.fall_p(early, late) == significance.fall_p(early, late) < 0.01
    # one request of 96 steps is one unit: as alone as one request of 12, however many steps it has
    assert significance.fall_p([(96, 160, "a")], [(96, 40, "a")]) >= 0.5
