"""A server SGLang refuses to start still leaves a run: `crashed`, with the exception and the static
findings that explain it (real CPU SGLang 0.5.23, test-bed scenario `short-context`)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session
from typer.testing import CliRunner

from draftscope.cli.app import app as cli
from draftscope.settings import Settings
from draftscope.store import db, models
from draftscope.store.analyze import refresh_run
from draftscope.web.app import create_app
from testbed.scenarios import prepare
from testbed.server import ServerStartError, start_server

REFUSAL = "Target model's context_length (2048) is greater than the derived context_length (64)"


def test_doctor_predicts_the_refusal_and_its_override():
    s = prepare("short-context")
    out = CliRunner().invoke(cli, ["doctor", str(s.draft_dir), "--target", str(s.target_dir), "--json"])
    (f,) = json.loads(out.output)["findings"]
    assert out.exit_code == 1 and f["rule_id"] == "startup-refused" and REFUSAL in f["message"]
    out = CliRunner().invoke(cli, ["doctor", str(s.draft_dir), "--target", str(s.target_dir), "--json",
                                   "--server-env", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"])
    (f,) = json.loads(out.output)["findings"]
    assert out.exit_code == 0 and f["rule_id"] == "draft-context-overridden"


@pytest.mark.sglang
@pytest.mark.side  # a server of its own (26 s in CI): the main run is the longer one
def test_refused_start_is_a_crashed_run_with_the_reason(tmp_path):
    s = prepare("short-context")
    store = tmp_path / "trace.db"
    url = f"sqlite:///{store}"
    db.upgrade(url)
    env = {"DRAFTSCOPE_DB": str(store), "DRAFTSCOPE_SAMPLE_RATE": "1",
           "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
    with pytest.raises(ServerStartError, match="derived context_length"):
        with start_server(s.target_dir, s.draft_dir, list(s.server_args), tmp_path / "server.log", env=env):
            pass
    engine = db.make_engine(url)
    try:
        with Session(engine) as session:
            (run,) = session.query(models.Run).all()
            run_id = run.id
            assert run.status == "crashed" and run.draft_path == str(s.draft_dir)
            assert REFUSAL in run.facts["start_error"]["message"]
        findings = refresh_run(engine, run_id)
    finally:
        engine.dispose()
    assert [(f.rule_id, f.source) for f in findings] == [("startup-refused", "static"),
                                                         ("server-start-failed", "runtime")]
    with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
        page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and "startup-refused" in page.text and "server-start-failed" in page.text
