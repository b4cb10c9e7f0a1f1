"""Sink failures are visible: the first at WARNING with its real error, a summary every minute while
they last, a line on recovery; a full disk (a real 2 MB tmpfs) is reported as such, not masked by the
ROLLBACK after the failed COMMIT, and the run still gets its final status once there is room."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import time
import urllib.request
import uuid
from contextlib import closing, contextmanager

from draftscope.store import db as store_db
from draftscope_tracer.health import Health
from draftscope_tracer.transport.http_sink import HttpSink
from draftscope_tracer.transport.outage import Outage
from draftscope_tracer.transport.sqlite_sink import SqliteSink
from draftscope_tracer.transport.writer import Writer
from testbed.server import DRAFTSCOPE, free_port, wait_for_port
from tests.fixtures.disk import fill
from tests.fixtures.store import step_record
from tests.fixtures.wait import until

RUN = {"engine": "sglang", "engine_version": "0.5.23", "source": "tracer", "status": "running",
       "started_at": time.time()}


def _steps(path, rid: str) -> int:
    with closing(sqlite3.connect(path, timeout=30)) as conn:
        return conn.execute("select count(*) from verify_steps where rid = ?", (rid,)).fetchone()[0]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "draftscope.tracer" and r.levelno >= logging.WARNING]


def test_outage_says_first_error_then_a_summary_a_minute_then_recovery(caplog):
    now = [0.0]
    outage = Outage("the test sink", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "draftscope.tracer"):
        for t in range(0, 150, 5):  # 150 s of failures, one every 5 s
            now[0] = float(t)
            outage.failed("OSError: boom", records_dropped=2)
        now[0] = 151.0
        outage.ok()
        outage.ok()  # no outage: silent
    lines = _warnings(caplog)
    assert lines[0].startswith("draftscope: the test sink failed: OSError: boom; SGLang is unaffected")
    assert [line.split(" still failing after ")[1].split(" s:")[0] for line in lines[1:-1]] == ["60", "120"]
    assert "30 failures, 60 records dropped" in lines[-1] and "works again after 151 s" in lines[-1]
    assert len(lines) == 4


def test_full_disk_is_reported_as_full_and_the_run_is_not_left_running(tiny_disk, caplog):
    path = tiny_disk / "store.db"
    store_db.upgrade(f"sqlite:///{path}")
    run_id = uuid.uuid4().hex
    health = Health()
    sink = SqliteSink(str(path))
    with caplog.at_level(logging.INFO, "draftscope.tracer"):
        writer = Writer(sink, health, lambda: dict(RUN), run_id=run_id, flush_interval_s=0.05,
                        max_batch_items=64)
        writer.submit(lambda: {"steps": [step_record("a", 0)]})
        until(lambda: _steps(path, "a"), "the run and a first step are stored")
        filler = fill(tiny_disk)
        for i in range(1, 400):  # large enough records that the store must grow
            writer.submit(lambda i=i: {"steps": [step_record("a", i, drafted_tokens=list(range(500)))]})
        until(lambda: health.drops.get("sink_error"), "a write failed on the full disk")
        os.remove(filler)
        writer.submit(lambda: {"steps": [step_record("b", 0)]})
        writer.close(5.0, "ended")
    lines = _warnings(caplog)
    assert lines[0].startswith(f"draftscope: the SQLite sink ({path}) failed: OperationalError: database or disk "
                               "is full"), lines
    assert not any("no transaction is active" in line for line in lines)
    assert any("works again after" in line for line in lines), lines
    assert health.drops["sink_error"] > 0
    conn = sqlite3.connect(path)
    assert conn.execute("select status from runs where id = ?", (run_id,)).fetchone() == ("ended",)
    assert conn.execute("select count(*) from verify_steps where rid = 'b'").fetchone() == (1,)
    drops = json.loads(conn.execute("select drops from tracer_health order by at desc limit 1").fetchone()[0])
    assert drops["sink_error"] > 0  # delivered after recovery: the store shows what was lost


def test_a_disk_full_to_the_end_says_the_status_was_lost(tiny_disk, caplog):
    """The disk stays full to the end: the final batch fails, the status alone is tried and its
    failure said (the dashboard shows such a run as silent since its last batch)."""
    path = tiny_disk / "store.db"
    store_db.upgrade(f"sqlite:///{path}")
    run_id = uuid.uuid4().hex
    writer = Writer(SqliteSink(str(path)), Health(), lambda: dict(RUN), run_id=run_id, flush_interval_s=0.05)
    writer.submit(lambda: {"steps": [step_record("a", 0)]})
    until(lambda: _steps(path, "a"), "the run and a first step are stored")
    fill(tiny_disk)
    with caplog.at_level(logging.WARNING, "draftscope.tracer"):
        for i in range(1, 300):
            writer.submit(lambda i=i: {"steps": [step_record("a", i, drafted_tokens=list(range(500)))]})
        writer.close(5.0, "ended")
    assert _warnings(caplog)[-1] == ("draftscope: the run's final status (ended) could not be stored either: "
                                     "OperationalError: database or disk is full")


def _requests(prefix: str, t0: float, accept_len: int, big: bool = False, count: int = 10) -> dict:
    """``count`` finished requests of ten verify steps each, one step a second from ``t0``, every step
    accepting ``accept_len - 1`` of its 3 drafts (``big``: 2000 drafted tokens, a store that must grow)."""
    steps = [step_record(f"{prefix}{r}", i, at=t0 + 10 * r + i, seq_pos=100 + i, accept_len=accept_len,
                         accept_flags=[p < accept_len - 1 for p in range(3)],
                         **({"drafted_tokens": list(range(2000))} if big else {}))
             for r in range(count) for i in range(10)]
    requests = [{"rid": f"{prefix}{r}", "sampled": True, "spec_verify_ct": 10, "traced_verify_ct": 10,
                 "finished_at": t0 + 10 * r + 10} for r in range(count)]
    return {"requests": requests, "steps": steps}


def test_a_full_disk_leaves_a_run_that_names_its_lost_requests_and_judges_no_drift_across_it(tiny_disk):
    """Requests stored, then a full disk swallows ten whole requests, then room again with lower
    acceptance on the stored side: the run names the ten, the runs list and the API flag the gap,
    and the acceptance over time is not compared across it (the same rows without the gap would
    raise acceptance-drift-over-time)."""
    from dataclasses import replace

    from draftscope.findings import runtime_findings
    from draftscope.store import queries
    from draftscope.store.analyze import refresh_run
    from draftscope.store.stats import observation

    path = tiny_disk / "store.db"
    url = f"sqlite:///{path}"
    store_db.upgrade(url)
    run_id, health, t0 = uuid.uuid4().hex, Health(), 1_000_000.0
    writer = Writer(SqliteSink(str(path)), health, lambda: dict(RUN), run_id=run_id, flush_interval_s=0.05)
    # twelve requests a side: enough for the drift rule to compare thirds of the run's requests
    writer.submit(lambda: _requests("before-", t0 - 30, accept_len=4, count=12))
    until(lambda: _steps(path, "before-11") == 10, "the requests before the full disk are stored")
    filler = fill(tiny_disk)
    writer.submit(lambda: _requests("lost-", t0 + 100, accept_len=4, big=True))
    until(lambda: health.requests_lost, "the full disk swallowed a batch")
    os.remove(filler)
    writer.submit(lambda: _requests("after-", t0 + 200, accept_len=1, count=12))
    writer.close(5.0, "ended")

    engine = store_db.make_engine(url)
    findings = refresh_run(engine, run_id)
    with engine.connect() as conn:
        gaps = queries.run_gaps(conn, run_id)
        listed = next(r for r in queries.list_runs(conn) if r["id"] == run_id)
        obs = observation(conn, run_id, {})
    engine.dispose()
    assert gaps["requests_lost"] == 10 and gaps["missing"] == [f"lost-{r}" for r in range(10)]
    assert gaps["records_lost"] >= 110 and gaps["windows"] == [[t0 + 100, t0 + 200]]
    assert listed["requests_lost"] == 10 and listed["dropped"] >= 110
    assert "acceptance-drift-over-time" not in {f.rule_id for f in findings}
    across = runtime_findings(None, replace(obs, gaps=[], records_lost=0, requests_lost=0))
    assert "acceptance-drift-over-time" in {f.rule_id for f in across}  # what the gap would have said


@contextmanager
def _dashboard(store: str, port: int, log):
    """``draftscope serve`` on ``port`` (the same port again after an outage), stopped on exit."""
    process = subprocess.Popen([*DRAFTSCOPE, "serve", "--db", store, "--port", str(port)], stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)


def _stored(path, prefix: str) -> set[str]:
    with closing(sqlite3.connect(path, timeout=30)) as conn:
        return {r for (r,) in conn.execute("select rid from requests where rid like ?", (prefix + "%",))}


def test_a_dashboard_outage_names_every_request_it_swallowed(tmp_path):
    """The dashboard is down while ten requests finish and the tracer's buffer (two batches) overflows:
    each of the ten is stored after all or named on the run page, in the API and on the runs list."""
    from draftscope.store import queries

    path = tmp_path / "store.db"
    store = f"sqlite:///{path}"
    store_db.upgrade(store)
    port, run_id, health, t0 = free_port(), uuid.uuid4().hex, Health(), time.time() - 1000
    sink = HttpSink(f"http://127.0.0.1:{port}", health.drop, max_buffered_batches=2, backoff_s=0.05, timeout_s=1.0)
    writer = Writer(sink, health, lambda: dict(RUN), run_id=run_id, flush_interval_s=0.05)
    with open(tmp_path / "serve.log", "w") as log:
        with _dashboard(store, port, log):
            writer.submit(lambda: _requests("before-", t0, accept_len=3))
            until(lambda: len(_stored(path, "before-")) == 10, "the requests before the outage are stored")
        for r in range(10):  # one batch each, one flush apart
            writer.submit(lambda r=r: {"requests": [{"rid": f"lost-{r}", "sampled": False, "finished_at": t0 + 100 + r}]})
            until(lambda r=r: writer.depth() == 0 and not writer._pending_n, f"lost-{r} went to the sink")
        until(lambda: health.requests_lost, "the full buffer evicted a batch")
        with _dashboard(store, port, log) as url:
            writer.submit(lambda: _requests("after-", t0 + 200, accept_len=3))
            writer.close(10.0, "ended")
            page = urllib.request.urlopen(f"{url}/runs/{run_id}").read().decode()
            listed = urllib.request.urlopen(f"{url}/").read().decode()
    engine = store_db.make_engine(store)
    with engine.connect() as conn:
        gaps = queries.run_gaps(conn, run_id)
    engine.dispose()
    lost = {f"lost-{r}" for r in range(10)}
    assert gaps["missing"] and set(gaps["missing"]) | _stored(path, "lost-") == lost
    assert not set(gaps["missing"]) & _stored(path, "lost-") and gaps["requests_lost"] == len(gaps["missing"])
    assert len(_stored(path, "after-")) == 10
    assert all(f"<code>{rid}</code>" in page for rid in gaps["missing"])
    assert f"{gaps['requests_lost']} missing" in listed
