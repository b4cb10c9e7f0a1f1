"""`draftscope doctor --fix` proven on the real CPU SGLang 0.5.23 server: for every fixable
test-bed scenario, doctor -> fix -> serve the fixed copy with the printed flags -> the accept
length is the healthy draft's (the session's healthy server: ``healthy_demo``) and doctor finds
nothing in the copy.

Greedy decoding of the demo prompts: a fixed draft that SGLang feeds exactly as the healthy one
proposes the same tokens, so the accept lengths agree to well within the 5% allowed. A fixed copy
whose every file SGLang reads is byte for byte the healthy draft's, served with the same effective
flags, is the healthy server's case already: its accept length is ``healthy_demo``'s, without a start.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftscope.cli.app import app as cli
from draftscope.findings.fix import FLAGS_FILE
from testbed import scenarios
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS
from testbed.server import EAGLE3_ARGS, start_server
from tests.fixtures.sglang_server import IDLE_SLEEP

pytestmark = [pytest.mark.sglang, pytest.mark.scenario("healthy")]

FIXABLE = ["aux-off", "algo-eagle", "weights-dropped", "d2t-absolute", "top-level-ids", "short-context"]
NO_TRACER = {"DRAFTSCOPE_DISABLE": "1", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}


def accept_length(answers: list[dict]) -> float:
    """Completion tokens per verify step over the demo prompts (SGLang's own counters)."""
    metas = [a["meta_info"] for a in answers]
    return sum(m["completion_tokens"] for m in metas) / sum(m["spec_verify_ct"] for m in metas)


def served_accept_length(target, draft, args: list[str], log) -> float:
    with start_server(target, draft, [*args, *IDLE_SLEEP], log, env=NO_TRACER) as server:
        return accept_length(server.generate_many(DEMO_PROMPTS, DEMO_NEW_TOKENS))  # as healthy_demo


def effective_flags(args: list[str]) -> dict:
    """The test bed's EAGLE-3 flags, then ``args`` (a later flag overrides), as {flag: value or True}."""
    flags, words = {}, [*EAGLE3_ARGS, *args]
    for i, word in enumerate(words):
        if word.startswith("--"):
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
            flags[word] = value
    return flags


def served_as(target, draft, args: list[str]) -> tuple:
    """What SGLang is given: the target, the bytes of every file in the draft folder (less doctor --fix's
    own note of the flags, which SGLang never opens) and the effective flags."""
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(draft).iterdir())
             if p.is_file() and p.name != FLAGS_FILE}
    return Path(target).resolve(), files, effective_flags(args)


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
    h = scenarios.prepare("healthy")
    if served_as(s.target_dir, tmp_path / "fixed", flags[:-2]) == served_as(h.target_dir, h.draft_dir, h.server_args):
        fixed, how = healthy, "the healthy draft's bytes and flags: healthy_demo's server"
    else:
        fixed, how = served_accept_length(s.target_dir, tmp_path / "fixed", flags[:-2], tmp_path / "server.log"), "served"
    print(f"{name}: healthy accept length {healthy:.3f}, after doctor --fix {fixed:.3f} ({how})")
    assert abs(fixed - healthy) <= 0.05 * healthy, (name, healthy, fixed, fix["changes"])
