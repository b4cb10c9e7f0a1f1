"""On the real CPU SGLang server: the file sink, a SIGTERM stop and a scheduler crash end the trace
properly (three server starts).

- SIGTERM to the process group (how the test bed and systemd stop servers) and to SGLang's main process
  alone (``docker stop``, Kubernetes: SGLang drains and asks its schedulers to exit, and the tracer's
  atexit flush sends the run): the last line of DRAFTSCOPE_FILE holds the run with ``status: "ended"``,
  and ``draftscope import`` stores the run and its requests.
- ``last-layer-id`` (the scheduler dies of an exception at the first request): ``status: "crashed"``.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest

from draftscope.store import db as store_db
from testbed import scenarios
from testbed.models import ensure_models
from testbed.server import ServerStartError, start_server
from tests.fixtures.sglang_server import IDLE_SLEEP
from tests.fixtures.wait import ended_in_file

pytestmark = pytest.mark.sglang


def _batches(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("signal_to", ["group", "main"])
def test_sigterm_ends_the_run_and_the_file_imports(tmp_path, signal_to):
    models = ensure_models()
    trace = tmp_path / "trace.jsonl"
    env = {"DRAFTSCOPE_FILE": str(trace), "DRAFTSCOPE_SAMPLE_RATE": "1", "DRAFTSCOPE_FLUSH_INTERVAL_S": "30"}
    with start_server(models.target, models.draft, IDLE_SLEEP, tmp_path / "server.log", env=env) as server:
        outs = [server.generate(p, max_new_tokens=12) for p in ("The quick brown fox", "Hello world")]
        if signal_to == "group":
            t0 = time.monotonic()
            server.stop()
            # the tracer's handler waits 2 s at most: it must not hold up a stop (SGLang's kill follows within 1 s)
            assert time.monotonic() - t0 < 15
        else:  # SGLang's own shutdown: a drain checked every 5 s, then up to 15 s for the schedulers to exit
            assert server.terminate_main(timeout=120) is not None, "SGLang's main process did not exit"
    assert ended_in_file(trace) == "ended", (tmp_path / "server.log").read_text()[-3000:]
    batches = _batches(trace)
    final = [b["run"] for b in batches if b["run"]][-1]
    assert final["ended_at"] >= final["started_at"]
    # the flush interval is 30 s: the requests and steps got out only through the SIGTERM flush
    assert {o["meta_info"]["id"] for o in outs} <= {r["rid"] for b in batches for r in b["requests"]}
    assert sum(len(b["steps"]) for b in batches) > 0

    db = tmp_path / "store.db"
    store_db.upgrade(f"sqlite:///{db}")
    done = subprocess.run([sys.executable, "-m", "draftscope", "import", str(trace), "--db", f"sqlite:///{db}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    conn = sqlite3.connect(db)
    assert conn.execute("select status from runs").fetchall() == [("ended",)]
    rows = dict(conn.execute("select rid, traced_verify_ct from requests"))
    assert {o["meta_info"]["id"]: o["meta_info"]["spec_verify_ct"] for o in outs}.items() <= rows.items()


def test_scheduler_crash_marks_the_run_crashed(tmp_path):
    prepared = scenarios.prepare("last-layer-id", tmp_path / "scenarios")
    trace = tmp_path / "trace.jsonl"
    env = {"DRAFTSCOPE_FILE": str(trace), "DRAFTSCOPE_SAMPLE_RATE": "1"}
    # SGLang's own health check already sends a one-token request: the server may die while starting
    with pytest.raises((ServerStartError, RuntimeError, OSError)):
        with start_server(prepared.target_dir, prepared.draft_dir, [*prepared.server_args, *IDLE_SLEEP],
                          tmp_path / "server.log", env=env) as server:
            server.generate("The quick brown fox", max_new_tokens=8)
    assert ended_in_file(trace) == "crashed"
    final = [b["run"] for b in _batches(trace) if b["run"]][-1]
    assert final["ended_at"]
    health = [h for b in _batches(trace) for h in b["health"]][-1]
    assert health["errors"].get("scheduler") == 1
