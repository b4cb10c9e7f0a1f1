"""The CPU bed's scenarios on the real vLLM 0.32 server, and `draftscope doctor --engine vllm` held to them.

Each scenario of `testbed.scenarios.VLLM_FINDINGS` is the checkpoint the SGLang bed serves
(`testbed.scenarios.prepare`). For each: doctor predicts from the checkpoint alone what vLLM will capture,
feed and refuse; the real server (the shared `vllm_runs` fixture: one server per scenario and session,
traced, asked the demo prompts) then shows what it did, and the two must agree. The run is diagnosed as
the dashboard does (`refresh_run`: static and runtime rules), with the checkpoint read from disk and from
the trace alone. Where vLLM and SGLang 0.5.23 do different things with the same checkpoint, the finding
says which engine does what.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from draftscope.cli.app import app as cli
from draftscope.findings import runtime_findings
from draftscope.spec import read_draft, read_target
from draftscope.store import db, models
from draftscope.store.analyze import refresh_run
from draftscope.store.stats import observation as run_observation
from testbed import scenarios
from tests.test_vllm_server import read, widths

pytestmark = pytest.mark.vllm

EXPECTED = scenarios.VLLM_FINDINGS
# scenario -> (the finding that says where the engines part, what its message must say)
ENGINES_DIFFER = {
    "healthy": ("aux-convention-ambiguous", ["vLLM 0.32 feeds hidden_states[0, 3, 6]: off by one",
                                             "SGLang 0.5.23 reads the same ids one layer deeper"]),
    "weights-dropped": ("draft-weights-not-loaded", ["vLLM 0.32 refuses to start",
                                                     "SGLang 0.5.23 would skip them"]),
    "d2t-absolute": ("d2t-not-offsets", ["the server crashes at the first draft of the first request",
                                         "SGLang 0.5.23 crashes only once an id >= vocab is drafted"]),
    "top-level-ids": ("aux-ids-not-read", ["vLLM 0.32 reads it there", "SGLang 0.5.23 reads it only from "
                                           "eagle_config"]),
    "last-layer-id": ("aux-convention-ambiguous", ["vLLM 0.32 feeds hidden_states[0, 3, 7]",
                                                   "never captures id [7]'s hidden_states[8]"]),
}


def doctor(prepared) -> dict:
    result = CliRunner().invoke(cli, ["doctor", str(prepared.draft_dir), "--target", str(prepared.target_dir),
                                      "--engine", "vllm", "--json"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.output)


def serious(findings) -> list[str]:
    return [f.rule_id if hasattr(f, "rule_id") else f["rule_id"] for f in findings
            if (f.severity if hasattr(f, "severity") else f["severity"]) in ("error", "warning")]


def test_the_table_names_scenarios_of_the_bed():
    assert set(EXPECTED) <= set(scenarios.SCENARIOS) and set(ENGINES_DIFFER) <= set(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_doctor_predicts_what_vllm_did(name, vllm_runs):
    """The prediction from the checkpoint against the trace of the same checkpoint served: the aux layers
    vLLM captured, whether fc ran, the width the draft received, the map's reach, a refusal and its
    message; then the diagnosis of the run names the expected root cause first."""
    static_cause, runtime_cause, outcome = EXPECTED[name]
    prepared = scenarios.prepare(name)
    predicted = doctor(prepared)
    summary = predicted["summary"]
    assert summary["engine"] == "vllm" and serious(predicted["findings"]) == ([static_cause] if static_cause else [])

    served = vllm_runs(name, fails=outcome != "served")
    assert served.outcome == outcome
    [(run_id, status, facts)] = read(served.store_url, "SELECT id, status, facts FROM runs")
    if outcome == "refused":
        assert status == "crashed" and facts["start_error"]["type"] == "ValueError", facts
        said = summary["load_error"].removeprefix("ValueError: ").split(" (checkpoint key")[0]
        assert said in facts["start_error"]["message"], (said, facts["start_error"])
    else:
        target, draft = facts["target"], facts["draft"]
        assert summary["load_error"] is None
        assert summary["layers_to_capture"] == target["layers_to_capture"], (summary, target)
        assert summary["fc_runs"] == draft["fc_runs"] and summary["aux_count"] == len(target["layers_to_capture"] or [])
        hot = draft["hot_token_id"]
        mapped = [f for f in predicted["findings"] if f["rule_id"] == "d2t-not-offsets"]
        assert bool(mapped) == (hot["in_target_vocab"] is False) == (outcome == "died"), (mapped, hot)
        assert not mapped or mapped[0]["evidence"]["target_id_max"] == hot["max_id"]
        if outcome == "served":
            assert widths(served.store_url)[("draft.input", "prefill")] == {summary["draft_input_width"]}
            assert status == "ended"
        else:  # the engine core died serving: the run says so, with vLLM's error among the tracer's
            errors = [e for (e,) in read(served.store_url, "SELECT errors FROM tracer_health ORDER BY at")]
            assert status == "crashed" and errors and errors[-1].get("engine") == 1, (status, errors)

    engine = db.make_engine(served.store_url)
    try:
        analyzed = refresh_run(engine, run_id)
        with engine.connect() as conn:
            obs = run_observation(conn, run_id, conn.execute(
                sa.select(models.Run.facts).where(models.Run.id == run_id)).scalar())
    finally:
        engine.dispose()
    spec = read_draft(prepared.draft_dir, target_layers=read_target(prepared.target_dir).num_layers)
    report = f"refresh_run: {[(f.rule_id, f.severity, f.source) for f in analyzed]}"
    for found in (runtime_findings(spec, obs), runtime_findings(None, obs)):  # the checkpoint read; the trace alone
        assert serious(found)[:1] == ([runtime_cause] if runtime_cause else []), found
    assert serious(analyzed)[:1] == ([static_cause] if static_cause else []), report
    if name in ENGINES_DIFFER:
        rule, says = ENGINES_DIFFER[name]
        [finding] = [f for f in analyzed if f.rule_id == rule]
        assert all(s in finding.message for s in says), finding.message
