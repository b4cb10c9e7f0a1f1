"""`draftscope doctor --fix` proven on the real CPU SGLang 0.5.23 server: for every fixable
test-bed scenario, doctor -> fix -> serve the fixed copy with the printed flags -> the accept
length is the healthy draft's (the session's healthy server: ``healthy_demo``) and doctor finds
nothing in the copy.

Greedy decoding of the demo prompts: a fixed draft that SGLang feeds exactly as the healthy one
proposes the same tokens, so the accept lengths agree to well within the 5% allowed.
"""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from draftscope.cli.app import app as cli
from testbed import scenarios
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS
from testbed.server import start_server

pytestmark = [pytest.mark.sglang, pytest.mark.scenario("healthy")]

FIXABLE = ["aux-off", "algo-eagle", "weights-dropped", "d2t-absolute", "top-level-ids", "short-context"]
NO_TRACER = {"DRAFTSCOPE_DISABLE": "1", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}


def accept_length(answers: list[dict]) -> float:
    """Completion tokens per verify step over the demo prompts (SGLang's own counters)."""
    metas = [a["meta_info"] for a in answers]
    return sum(m["completion_tokens"] for m in metas) / sum(m["spec_verify_ct"] for m in metas)


def served_accept_length(target, draft, args: list[str], log) -> float:
    with start_server(target, draft, args, log, env=NO_TRACER) as server:
        return accept_length(server.generate_many(DEMO_PROMPTS, DEMO_NEW_TOKENS))  # as healthy_demo


@pytest.fixture(scope="module")
def healthy(healthy_demo) -> float:
    return accept_length(healthy_demo)


@pytest.mark.parametrize("name", FIXABLE)
def test_fix_restores_the_healthy_accept_length(name, healthy, tmp_path):
    s = scenarios.prepare(name)
    out = CliRunner().invoke(cli, ["doctor", str(s.draft_dir), "--target", str(s.target_dir),
                                   "--server-args", shlex.join(s.server_args), "--fix",
                                   str(tmp_path / "fixed"), "--json"])
    data = json.loads(out.output)
    assert out.exit_code == 1 and data["errors"], out.output
    fix = data["fix"]
    assert fix["changes"] and fix["not_fixed"] == [], fix
    assert fix["after"]["findings"] == [], fix  # doctor is clean on the fixed copy
    flags = shlex.split(fix["server_flags"])
    assert flags[-2:] == ["--speculative-draft-model-path", str(tmp_path / "fixed")]
    fixed = served_accept_length(s.target_dir, tmp_path / "fixed", flags[:-2], tmp_path / "server.log")
    print(f"{name}: healthy accept length {healthy:.3f}, after doctor --fix {fixed:.3f}")
    assert abs(fixed - healthy) <= 0.05 * healthy, (name, healthy, fixed, fix["changes"])
