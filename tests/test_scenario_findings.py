"""The traced test-bed servers show at runtime the root cause `draftscope doctor` finds statically.

For each scenario of `testbed.scenarios`: `draftscope doctor` names the root cause from the
checkpoint alone; the same scenario served by the real SGLang 0.5.23 engine on the CPU, traced into
a SQLite store by the `sglang_server` fixture, is then diagnosed from what the tracer recorded:

- the runtime rules on the tracer's observation (attach-time facts, sample widths, weights check,
  acceptance) must name the same root cause, or its documented runtime twin (`docs/findings.md`):
  once with the draft checkpoint read from disk (as `refresh_run` does when it can), and once from
  the trace alone (a dashboard that cannot read the checkpoint, e.g. the `docker compose` demo);
- `refresh_run` (runtime plus static rules, as the dashboard runs it when batches arrive) must put
  it first, and so must the run page of a dashboard opened on the tracer's store.

Scenarios that crash the server at a request are still diagnosed: the attach-time facts reach the
store before any request is served.
"""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from draftscope.cli.app import app as cli
from draftscope.findings import runtime_findings
from draftscope.settings import Settings
from draftscope.spec import read_draft, read_target
from draftscope.store import db, models
from draftscope.store.analyze import refresh_run
from draftscope.store.stats import observation as run_observation
from draftscope.web.app import create_app
from testbed import scenarios
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS
from tests.fixtures.store import settle

pytestmark = pytest.mark.sglang


EXPECTED = scenarios.FINDINGS
# Scenarios whose runtime root cause needs the draft checkpoint: from the trace alone it is missed.
FLUSH_TIMEOUT_S = 60.0


def test_the_table_covers_every_scenario():
    assert set(EXPECTED) | set(scenarios.ELSEWHERE) == set(scenarios.SCENARIOS)
    assert not set(EXPECTED) & set(scenarios.ELSEWHERE)


def doctor_findings(prepared) -> list[dict]:
    args = shlex.join(prepared.server_args)
    result = CliRunner().invoke(cli, ["doctor", str(prepared.draft_dir), "--target",
                                      str(prepared.target_dir), "--server-args", args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.output)["findings"]


def serve_demo(server, crashes: bool) -> int:
    """Send the demo prompts side by side; returns how many were answered. A crashing scenario may
    fail any."""
    answers = server.generate_many(DEMO_PROMPTS, DEMO_NEW_TOKENS, return_failures=crashes)
    return sum(not isinstance(a, Exception) for a in answers)


def wait_for_run(url: str, finished: int, crashes: bool, run_counts: tuple[int, ...] = (1,)) -> tuple:
    """(run id or None, finished requests) once the tracer's store holds one of `run_counts` runs and at least
    `finished` finished requests, and (for a crashing scenario) the run is marked crashed/ended;
    bounded by FLUSH_TIMEOUT_S."""
    engine = db.make_engine(url)
    deadline = time.monotonic() + FLUSH_TIMEOUT_S
    state = None
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                runs = conn.execute(sa.text("SELECT id, status FROM runs")).all()
                done = conn.execute(sa.text("SELECT count(*) FROM requests "
                                            "WHERE finished_at IS NOT NULL")).scalar_one()
            state = (runs, done)
            if len(runs) in run_counts and done >= finished and \
                    (not crashes or runs[0][1] in ("crashed", "ended")):
                return (runs[0][0] if runs else None), done
            assert len(runs) <= 1, f"one server, one scheduler: expected one run, got {runs}"
            time.sleep(0.5)
    finally:
        engine.dispose()
    pytest.fail(f"the tracer's store {url} did not show the run within {FLUSH_TIMEOUT_S:.0f} s "
                f"(runs, finished requests: {state}; wanted {finished} finished)")


def first_finding_on_run_page(url: str, run_id: str) -> tuple[str, str] | None:
    with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
        settle(client)
        page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200, page.text[:500]
    found = re.search(r'<(?:div|details) class="finding (\w+)[^"]*">\s*(?:<summary>)?'
                      r'<span class="badge \w+">\w+</span> <code>([\w-]+)</code>', page.text)
    return (found.group(1), found.group(2)) if found else None


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.scenario(n)) for n in EXPECTED])
def test_runtime_diagnosis_matches_doctor(name, sglang_server):
    static_cause, runtime_cause, crashes = EXPECTED[name]
    prepared = scenarios.prepare(name)

    doctor = doctor_findings(prepared)
    doctor_errors = [f["rule_id"] for f in doctor if f["severity"] in ("error", "warning")]
    assert doctor_errors == ([static_cause] if static_cause else []), doctor

    server = sglang_server(name)
    assert server.trace_db_url, "the fixture traces every server unless told otherwise"
    finished_before = wait_for_run(server.trace_db_url, 0, False, run_counts=(0, 1))[1]
    answered = serve_demo(server, crashes)
    run_id = wait_for_run(server.trace_db_url, finished_before + answered, crashes)[0]

    engine = db.make_engine(server.trace_db_url)
    try:
        analyzed = refresh_run(engine, run_id)
        with engine.connect() as conn:
            facts = conn.execute(sa.select(models.Run.facts).where(models.Run.id == run_id)).scalar()
            observation = run_observation(conn, run_id, facts)
    finally:
        engine.dispose()
    spec = read_draft(prepared.draft_dir, target_layers=read_target(prepared.target_dir).num_layers)
    runtime = runtime_findings(spec, observation)
    trace_alone = runtime_findings(None, observation)
    facts = observation.facts
    assert facts and facts.get("draft") and facts.get("target"), f"no attach-time facts: {facts}"
    report = (f"doctor: {[f['rule_id'] for f in doctor]}\n"
              f"runtime: {[(f.rule_id, f.severity) for f in runtime]}\n"
              f"runtime from the trace alone: {[(f.rule_id, f.severity) for f in trace_alone]}\n"
              f"refresh_run: {[(f.rule_id, f.severity, f.source) for f in analyzed]}\n"
              f"draft.input widths: {observation.draft_input_widths}, verify steps "
              f"{observation.verify_steps}, accepted {observation.accepted_drafts}/"
              f"{observation.proposed_drafts}\nlayers_to_capture: "
              f"{facts['target'].get('layers_to_capture')}, weights: {facts['draft'].get('weights')}")
    serious = [f for f in analyzed if f.severity in ("error", "warning")]
    page_first = first_finding_on_run_page(server.trace_db_url, run_id)

    if static_cause is None:
        assert not [f for f in runtime + trace_alone if f.severity in ("error", "warning")], report
        assert not serious, report
        assert page_first is None or page_first[0] == "info", report
        assert observation.verify_steps and observation.accepted_drafts, report
        return
    assert runtime and runtime[0].rule_id == runtime_cause, report
    assert trace_alone and trace_alone[0].rule_id == runtime_cause, report
    assert analyzed[0].rule_id == static_cause, report
    assert page_first == ("error", static_cause), report
