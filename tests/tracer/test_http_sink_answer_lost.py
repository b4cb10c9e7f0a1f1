"""A batch the dashboard stored but whose answer was lost on the way back is delivered, not dropped.

A real ``draftscope serve`` behind a TCP relay that, for the first request, hands the dashboard the
whole batch and the tracer only half of the answer (the connection cut mid-body, as when a dashboard
or a proxy dies after the commit). The sink sends the batch again, the dashboard answers
``duplicate``, and the tracer counts it delivered: no drop, no request named missing.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import uuid
from contextlib import closing, contextmanager

from draftscope.store import db as store_db
from draftscope_tracer.health import Health
from draftscope_tracer.transport.http_sink import HttpSink
from draftscope_tracer.transport.writer import Writer
from testbed.server import DRAFTSCOPE, free_port, wait_for_port


def _read_http(sock: socket.socket) -> bytes:
    """One whole HTTP message (headers and a Content-Length body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class CuttingRelay:
    """Relays HTTP requests to ``upstream``; the first answer reaches the client cut mid-body."""

    def __init__(self, upstream: int):
        self.upstream = upstream
        self.answers: list[bytes] = []  # the dashboard's answers, whole, in order
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with client, socket.create_connection(("127.0.0.1", self.upstream)) as up:
                request = _read_http(client)
                up.sendall(request.replace(b"Connection: keep-alive", b"Connection: close"))
                answer = _read_http(up)
                self.answers.append(answer)
                client.sendall(answer[:len(answer) - 10] if len(self.answers) == 1 else answer)

    def close(self) -> None:
        self.server.close()


@contextmanager
def _dashboard(store: str):
    port = free_port()
    process = subprocess.Popen([*DRAFTSCOPE, "serve", "--db", store, "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, process)
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)


def test_a_stored_batch_whose_answer_was_lost_counts_delivered(tmp_path) -> None:
    path = tmp_path / "store.db"
    store = f"sqlite:///{path}"
    store_db.upgrade(store)
    run = {"engine": "sglang", "engine_version": "0.5.23", "source": "tracer", "status": "running",
           "started_at": time.time()}
    health, run_id = Health(), uuid.uuid4().hex
    with _dashboard(store) as port:
        relay = CuttingRelay(port)
        try:
            sink = HttpSink(f"http://127.0.0.1:{relay.port}", health.drop, backoff_s=0.05, timeout_s=10.0)
            writer = Writer(sink, health, lambda: dict(run), run_id=run_id, flush_interval_s=3600)
            writer.submit(lambda: {"requests": [{"rid": "r-0", "sampled": False, "finished_at": time.time()}]})
            writer.close(30.0, "ended")
        finally:
            relay.close()
    statuses = [b'"status":"stored"' in a and "stored" or b'"status":"duplicate"' in a and "duplicate"
                for a in relay.answers]
    assert statuses[:2] == ["stored", "duplicate"], relay.answers
    assert health.snapshot(0)["drops"] == {}, "a batch the dashboard holds was counted dropped"
    assert sink.recovered == 1 and sink.delivered == len(relay.answers) - 1
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT rid FROM requests").fetchall() == [("r-0",)]
        assert conn.execute("SELECT status FROM runs").fetchall() == [("ended",)]
