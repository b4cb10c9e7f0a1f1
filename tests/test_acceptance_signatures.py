"""Acceptance signatures on the real CPU SGLang 0.5.23 server: each fires on the scenario that
causes it (served traffic included) and stays silent on healthy (tests/test_scenario_findings.py
serves healthy and asserts no warning or error at all).

Traffic: the demo prompts (short: positions under 40); long prompts (~200 tokens, past anything
the tiny draft was trained on); the demo prompts sampled at a high temperature (traffic unlike
the draft's training data, which was greedy).
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from draftscope.cli.app import app as cli
from draftscope.store import db, models
from draftscope.store.analyze import refresh_run
from draftscope.store.stats import observation as run_observation
from testbed import scenarios
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS
from tests.test_scenario_findings import wait_for_run

pytestmark = pytest.mark.sglang

LONG_PROMPTS = [" ".join(DEMO_PROMPTS[i:] + DEMO_PROMPTS[:i]) * 5 for i in range(4)]
OVERRIDE = {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
# SGLang leaves a head missing from the checkpoint as it was allocated (``torch.empty``): zeros at one
# start, leftover values at another (seen: denormals that draft other tokens), so what is drafted, and
# by chance accepted, changes from start to start. Under MALLOC_PERTURB_=255 glibc fills every
# allocation with zeros (the byte's complement): the same head at every start.
ZEROED_ALLOCATIONS = {"MALLOC_PERTURB_": "255"}


def serve(server, *phases) -> tuple[list, object]:
    """Send each phase ((prompts, new tokens, sampling)) side by side, the phases one after the
    other; (findings, observation) of the run."""
    before = wait_for_run(server.trace_db_url, 0, False, run_counts=(0, 1))[1]
    for prompts, new_tokens, sampling in phases:
        server.generate_many(prompts, new_tokens, **sampling)
    run_id = wait_for_run(server.trace_db_url, before + sum(len(p[0]) for p in phases), False)[0]
    engine = db.make_engine(server.trace_db_url)
    try:
        findings = refresh_run(engine, run_id)
        with engine.connect() as conn:
            facts = conn.execute(sa.select(models.Run.facts).where(models.Run.id == run_id)).scalar()
            obs = run_observation(conn, run_id, facts)
    finally:
        engine.dispose()
    return findings, obs


def report(findings, obs) -> str:
    return (f"{[(f.rule_id, f.severity, f.source) for f in findings]}\nby position "
            f"{obs.accept_by_position}\nby seq bin {obs.accept_by_seq_bin}\nby time bin "
            f"{obs.accept_by_time_bin}")


@pytest.mark.side  # a server of its own (40 s in CI): the main run is the longer one
def test_zero_acceptance_with_finite_logits_lm_head_removed(sglang_server):
    # two prompts: ~190 drafts, all rejected (20 are enough to judge), and draft.logits samples; every
    # allocation of this server is filled (MALLOC_PERTURB_), which makes each request slow
    findings, obs = serve(sglang_server("lm-head-removed", env=ZEROED_ALLOCATIONS),
                          (DEMO_PROMPTS[:2], DEMO_NEW_TOKENS, {}))
    rules = [(f.rule_id, f.source) for f in findings]
    assert rules[0] == ("draft-weights-not-loaded", "static"), report(findings, obs)
    assert ("acceptance-zero-finite-logits", "runtime") in rules, report(findings, obs)
    assert obs.accepted_drafts == 0 and obs.draft_logits_samples and not obs.draft_logits_nonfinite


@pytest.mark.side  # a server of its own, the main run's slowest test (93 s in CI): the main run is the longer one
def test_decay_with_position_short_context_served_long(sglang_server):
    s = scenarios.prepare("short-context")
    out = CliRunner().invoke(cli, ["doctor", str(s.draft_dir), "--target", str(s.target_dir), "--json",
                                   "--server-env", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"])
    assert [f["rule_id"] for f in json.loads(out.output)["findings"]] == ["draft-context-overridden"]
    # eight requests a side at least: the rule compares requests (MIN_REQUESTS), not steps
    findings, obs = serve(sglang_server("short-context", env=OVERRIDE),
                          (DEMO_PROMPTS * 2, DEMO_NEW_TOKENS, {}), (LONG_PROMPTS * 2, 48, {}))
    by_rule = {f.rule_id: f for f in findings}
    decay = by_rule.get("acceptance-decays-with-position")
    assert decay is not None, report(findings, obs)
    assert decay.evidence["knee_seq_pos"] > 40  # where the long prompts start
    assert "max_position_embeddings is 64 (SGLang overwrote it with 2048)" in decay.message
    assert {"position-beyond-draft-max", "draft-context-overridden"} <= set(by_rule)
    assert "acceptance-position1-collapse" not in by_rule and "acceptance-drift-over-time" not in by_rule


@pytest.mark.side  # a server of its own (60-130 s in CI): the main run is the longer one
def test_drift_over_time_when_traffic_changes(sglang_server):
    # the same six prompts in both thirds (the tracer's prompt keys tell them), sampled hot in the last:
    # the hot half is sent once the greedy half is answered
    hot = (DEMO_PROMPTS * 3, DEMO_NEW_TOKENS, {"temperature": 1.5, "top_k": 1000})
    findings, obs = serve(sglang_server("healthy", env={"DRAFTSCOPE_TEST_TRAFFIC": "drift"}),
                          (DEMO_PROMPTS * 3, DEMO_NEW_TOKENS, {}), hot)
    rules = [f.rule_id for f in findings]
    assert rules == ["acceptance-drift-over-time"], report(findings, obs)
    assert findings[0].severity == "warning" and findings[0].evidence["same_prompts"]
