"""One background thread between the hooks and a sink: bounded queue, batches, flush on size or interval.

Hooks ``submit`` jobs (callables run on the writer thread that return record lists, typically after
waiting on a device event). ``submit`` never blocks and never wakes the writer: it appends to a bounded
deque (a full one drops the job and counts it), and the writer takes everything queued every
``POLL_S``. Waking the writer per job would hand it the GIL several times per scheduler iteration.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Protocol

from . import wire
from .health import Health

log = logging.getLogger("draftscope.tracer")

Records = Dict[str, List[dict]]  # wire batch keys -> records
Job = Callable[[], Optional[Records]]
POLL_S = 0.05  # how often the writer takes the queued jobs (and looks for a close request)


class Sink(Protocol):
    def send(self, batch: Dict[str, Any]) -> None: ...  # raises on failure

    def close(self) -> None: ...


class Writer:
    """Owns the sink; the only thread that writes."""

    def __init__(self, sink: Sink, health: Health, run: Callable[[], dict], *, run_id: str,
                 max_queue_items: int = 4096, max_batch_items: int = 256,
                 flush_interval_s: float = 1.0, health_interval_s: float = 10.0):
        self.sink, self.health, self._run = sink, health, run
        self.run_id = run_id
        self.max_batch_items = max_batch_items
        self.flush_interval_s = flush_interval_s
        self.health_interval_s = health_interval_s
        self.max_queue_items = max_queue_items
        self._jobs: collections.deque = collections.deque()
        self._pending: Records = {k: [] for k in wire.RECORD_TABLES}
        self._pending_n = 0
        self._run_sent = False
        self._closed = False
        self._final_status = "ended"
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name="draftscope-writer", daemon=True)
        self._thread.start()

    # -- producer side (hook threads) -------------------------------------------------------------
    def submit(self, job: Job) -> bool:
        """Queue ``job``; False (and a counted drop) when closed, forked or full. Never blocks."""
        if self._closed:
            self.health.drop("shutdown")
            return False
        if os.getpid() != self._pid:
            self.health.drop("forked")
            return False
        if len(self._jobs) >= self.max_queue_items:
            self.health.drop("queue_full")
            return False
        self._jobs.append(job)  # atomic under the GIL; the writer polls
        return True

    def depth(self) -> int:
        return len(self._jobs)

    def close(self, timeout_s: float = 10.0, status: str = "ended") -> None:
        """Drain what is queued, send the final run (``status``) and health records, stop the thread;
        waits at most ``timeout_s``. Idempotent. Takes no lock, so a signal handler may call it."""
        if self._closed:
            return
        self._closed = True
        self._final_status = status
        if os.getpid() != self._pid or not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("draftscope: writer did not finish within %.1f s; unsent records are lost", timeout_s)

    # -- writer thread ----------------------------------------------------------------------------
    def _loop(self) -> None:
        next_flush = time.monotonic() + self.flush_interval_s
        next_health = time.monotonic()  # the first health snapshot goes out with the first flush
        while True:
            stopping = self._stop.wait(POLL_S)
            self._drain()
            if stopping:
                self._add({"health": [self.health.snapshot(0)]})
                self._flush(final=True)
                try:
                    self.sink.close()
                except Exception as exc:
                    self.health.failed("sink", exc)
                return
            now = time.monotonic()
            if now >= next_health:
                self._add({"health": [self.health.snapshot(self.depth())]})
                next_health = now + self.health_interval_s
            if now >= next_flush:
                self._flush()
                next_flush = time.monotonic() + self.flush_interval_s

    def _drain(self) -> None:
        """Run every queued job, flushing whenever a full batch has built up."""
        jobs = self._jobs
        while jobs:
            self._run_job(jobs.popleft())
            if self._pending_n >= self.max_batch_items:
                self._flush()

    def _run_job(self, job: Job) -> None:
        probe = getattr(job, "probe", "job")
        try:
            records = job()
        except Exception as exc:  # a job never stops the writer
            self.health.failed(f"{probe}.build", exc)
            self.health.drop("build_error")
            return
        if records:
            self._add(records)

    def _add(self, records: Records) -> None:
        for key, recs in records.items():
            self._pending[key].extend(recs)
            self._pending_n += len(recs)

    def _flush(self, final: bool = False) -> None:
        if not self._pending_n and self._run_sent and not final:
            return
        run = None
        if not self._run_sent or final:
            run = self._run()
            if final:
                run = {**run, "status": self._final_status, "ended_at": time.time()}
        batch = {"schema_version": wire.SCHEMA_VERSION, "batch_id": uuid.uuid4().hex,
                 "run_id": self.run_id, "sent_at": time.time(), "run": run, **self._pending}
        n = self._pending_n
        self._pending = {k: [] for k in wire.RECORD_TABLES}
        self._pending_n = 0
        try:
            self.sink.send(batch)
            self._run_sent = True
        except Exception as exc:
            self.health.failed("sink", exc)
            self.health.drop("sink_error", max(n, 1))
            log.debug("draftscope: sink failed: %s", exc)
