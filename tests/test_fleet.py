"""Two ``draftscope serve`` processes on one PostgreSQL store, as compose's ``fleet`` profile runs
them: a batch posted to both at once is stored once, and a dashboard killed (SIGKILL) while it
stores a batch loses nothing: its transaction never commits and the tracer's sink resends the
batch to the other process, which stores it once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import orjson
import psutil
import pytest
import sqlalchemy as sa

from draftscope.store import db, models
from draftscope.store.tables import of_run
from draftscope_tracer.transport.http_sink import HttpSink
from testbed.server import free_port, wait_for_port
from tests.fixtures.front_door import front_door
from tests.fixtures.store import create_database, make_batch, run_record, sample_record, step_record
from tests.fixtures.wait import until

pytestmark = pytest.mark.postgres


@pytest.fixture
def fleet(postgres_server, tmp_path, monkeypatch):
    """A migrated PostgreSQL database, two dashboard processes on it and the fleet's HAProxy front door
    (tests/fixtures/front_door.py) in front of them, its CA trusted by the tracer's sink
    (SSL_CERT_FILE): (url, [port, port, proxy's HTTPS port], [process, process, proxy])."""
    url = create_database(postgres_server, f"t_{uuid.uuid4().hex[:12]}")
    db.upgrade(url)
    exe = Path(sys.executable).parent / "draftscope"
    ports = [free_port(), free_port()]
    procs = [subprocess.Popen([str(exe), "serve", "--port", str(p)], start_new_session=True,
                              env={**os.environ, "DRAFTSCOPE_DATABASE_URL": url},
                              stdout=(tmp_path / f"dash-{p}.log").open("wb"), stderr=subprocess.STDOUT)
             for p in ports]
    try:
        for p, proc in zip(ports, procs):
            wait_for_port(p, proc)
        with front_door(ports, tmp_path / "proxy") as door:
            monkeypatch.setenv("SSL_CERT_FILE", str(door.ca_file))
            yield url, [*ports, door.https_port], [*procs, door.process]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)


def _stored(url: str, run_id: str) -> tuple[int, int, int]:
    """(batches, requests, verify steps) of ``run_id``."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return tuple(conn.execute(sa.select(sa.func.count()).select_from(m.__table__)
                                      .where(of_run(m.__table__, run_id))).scalar_one()
                         for m in (models.IngestBatch, models.Request, models.VerifyStep))
    finally:
        engine.dispose()


def _big_batch(run_id: str, requests: int, steps: int) -> dict:
    return make_batch(run_id, run=run_record(),
                      requests=[{"rid": f"r{i}", "sampled": True, "traced_verify_ct": steps} for i in range(requests)],
                      steps=[step_record(f"r{i}", s) for i in range(requests) for s in range(steps)],
                      samples=[sample_record(i) for i in range(steps)])


def test_one_batch_posted_to_both_processes_at_once_is_stored_once(fleet):
    url, ports, _ = fleet
    run_id = uuid.uuid4().hex
    batch, drops = _big_batch(run_id, 50, 40), []
    sinks = [HttpSink(f"http://127.0.0.1:{p}", lambda *a: drops.append(a)) for p in ports[:2]]
    threads = [threading.Thread(target=s.send, args=(batch,)) for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in sinks:
        s.close()
    assert drops == [] and _stored(url, run_id) == (1, 50, 2000)


def test_a_dashboard_killed_while_storing_a_batch_loses_nothing(fleet):
    url, ports, procs = fleet
    run_id = uuid.uuid4().hex
    batch, drops = _big_batch(run_id, 400, 100), []
    body = orjson.dumps(batch)
    engine = db.make_engine(url)

    def storing() -> int | None:  # the client port of the PostgreSQL connection storing the batch
        with engine.connect() as conn:
            return conn.execute(sa.text(
                "SELECT client_port FROM pg_stat_activity WHERE state <> 'idle' AND "
                "query ILIKE 'COPY verify_steps%'")).scalar()

    # The batch's verify steps wait on a lock held here, so the dashboard is caught in the middle of
    # the batch (its claim and requests written, nothing committed) however fast it stores.
    hold = engine.connect()
    hold.execute(sa.text("LOCK TABLE verify_steps IN SHARE MODE"))
    # through the proxy, as in the fleet: the resend goes to the dashboard still up
    sink = HttpSink(f"https://localhost:{ports[2]}", lambda *a: drops.append(a), timeout_s=60, backoff_s=0.1)
    sender = threading.Thread(target=sink.send, args=(batch,))
    sender.start()
    port = until(storing, "a dashboard storing the batch", timeout_s=120, every_s=0.02)
    [victim] = [p for p in procs[:2] if port in {c.laddr.port for c in psutil.Process(p.pid).net_connections()}]
    os.killpg(victim.pid, signal.SIGKILL)
    hold.rollback()
    hold.close()
    sender.join()
    assert _stored(url, run_id)[0] == 0, "a killed dashboard's transaction never commits"
    until(lambda: not storing(), "PostgreSQL rolling the killed dashboard's transaction back")
    engine.dispose()
    sink.close(deadline_s=120)  # resends what it kept
    assert drops == [] and len(body) > 1_000_000
    assert _stored(url, run_id) == (1, 400, 40_000)
