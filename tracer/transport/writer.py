"""Bounded job queues drained by one background thread; the :class:`Writer` that turns jobs into
batches for a sink (flush on size or interval).

``submit`` never blocks: it appends to a bounded deque (a full one drops the job and counts it). Only
the first job queued while the thread sleeps wakes it (a doorbell); the jobs after it ride along
until the thread has taken what is queued and gone back to sleep, so the scheduler does not hand the
GIL over per job. Idle, the thread sleeps until the next health record is due: no polling. In the
tracer the scheduler's queue is a ``relay.Relay`` (pickles jobs to the recorder process) and the
recorder's is a :class:`Writer` (runs them: callables that return records by table).
"""

from __future__ import annotations

import collections
import logging
import math
import os
import queue
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Protocol

from draftscope_tracer.transport import wire
from draftscope_tracer.health import Health
from draftscope_tracer.transport.outage import Outage

log = logging.getLogger("draftscope.tracer")

Records = Dict[str, List[dict]]  # wire batch keys -> records
Job = Callable[[], Optional[Records]]


def known_records(jobs) -> Records:
    """What dropping ``jobs`` loses, as far as is known without running them (``records.Call.known``:
    the finish records of requests); a job without ``known`` loses records of its time only."""
    out: Records = {}
    for job in jobs:
        for key, recs in getattr(job, "known", dict)().items():
            out.setdefault(key, []).extend(recs)
    return out


class Sink(Protocol):
    def send(self, batch: Dict[str, Any]) -> None: ...  # raises on failure

    def close(self) -> None: ...


class JobQueue:
    """The producer side: a bounded deque, the doorbell that wakes the thread ``_loop``, and closing
    (drain, then stop the thread). ``wakeups`` counts the thread's passes (each ``_sleep`` it returns
    from): idle, one per health record."""

    def __init__(self, health: Health, max_queue_items: int, thread_name: str):
        self.health, self.max_queue_items = health, max_queue_items
        self._jobs: collections.deque = collections.deque()
        self._closed = False
        self._final_status = "ended"
        self._stop = threading.Event()
        # a token per wake-up asked for; SimpleQueue.put is reentrant (C), so a signal handler's close may ring
        self._bell: queue.SimpleQueue = queue.SimpleQueue()
        self._rung = False  # a token is on its way: jobs queued meanwhile need not ring
        self.wakeups = 0
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)

    def _loop(self) -> None:
        raise NotImplementedError

    def submit(self, job: Job) -> bool:
        """Queue ``job``; False (and a counted drop) when closed, forked or full. Never blocks."""
        if self._closed:
            self.health.drop("shutdown", batch=known_records([job]))
            return False
        if os.getpid() != self._pid:
            self.health.drop("forked", batch=known_records([job]))
            return False
        if len(self._jobs) >= self.max_queue_items:
            self.health.drop("queue_full", batch=known_records([job]))
            return False
        self._jobs.append(job)  # atomic under the GIL
        if not self._rung:  # the first job since the thread went to sleep wakes it
            self._rung = True
            self._bell.put(None)
        return True

    def _sleep(self, until: float) -> None:
        """Return when a job is queued, close is asked or the monotonic clock reaches ``until``; no
        wake-up in between. Counts the pass it starts in ``wakeups``."""
        while True:  # tokens of rings that came while the thread was awake: spent
            try:
                self._bell.get_nowait()
            except queue.Empty:
                break
        self._rung = False  # before looking at the deque: a job queued after this rings
        while not (self._jobs or self._stop.is_set()):
            left = until - time.monotonic()
            if left <= 0:
                break
            try:
                self._bell.get(timeout=None if left == math.inf else left)
                break
            except queue.Empty:  # a timed wait may end a hair early: wait out the rest
                continue
        self.wakeups += 1

    def depth(self) -> int:
        return len(self._jobs)

    def _stopping(self, status: str) -> bool:
        """The first close: the final ``status`` kept, the thread told to stop. False when there is nothing
        to finish (closed before, in a forked child, or the thread gone)."""
        if self._closed:
            return False
        self._closed, self._final_status = True, status
        if os.getpid() != self._pid or not self._thread.is_alive():
            return False
        self._stop.set()
        self._bell.put(None)
        return True

    def close(self, timeout_s: float = 10.0, status: str = "ended") -> None:
        """Drain what is queued, send the final run (``status``) and health records, stop the thread;
        waits at most ``timeout_s``. Idempotent. Takes no lock, so a signal handler may call it."""
        if not self._stopping(status):
            return
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("draftscope: %s did not finish within %.1f s; unsent records are lost",
                        self._thread.name, timeout_s)


class Writer(JobQueue):
    """Owns the sink; the only thread that writes. ``snapshot(queue_depth)`` gives the health records
    (default: ``health``'s own counters).

    A batch goes out when ``max_batch_items`` records have built up, or ``flush_interval_s`` after its
    first record (rows that keep arriving join it until then). A health record every
    ``health_interval_s`` joins the batch being built, or goes out at once when it is alone: the run
    stays live on the dashboard and a sink that buffers retries, while nothing else happens."""

    def __init__(self, sink: Sink, health: Health, run: Callable[[], dict], *, run_id: str,
                 max_queue_items: int = 4096, max_batch_items: int = 256,
                 flush_interval_s: float = 1.0, health_interval_s: float = 10.0,
                 snapshot: Optional[Callable[[int], dict]] = None):
        super().__init__(health, max_queue_items, "draftscope-writer")
        self.sink, self._run, self.run_id = sink, run, run_id
        self._snapshot = snapshot or health.snapshot
        self.max_batch_items = max_batch_items
        self.flush_interval_s = flush_interval_s
        self.health_interval_s = health_interval_s
        self._pending: Records = {k: [] for k in wire.RECORD_TABLES}
        self._pending_n = 0
        self._flush_at = math.inf  # flush_interval_s after the first pending record
        self._run_sent = False
        self.outage = Outage(getattr(sink, "name", "the sink"))
        if hasattr(sink, "snapshot"):  # a sink that evicts batches tells the store in a later one
            sink.snapshot = lambda: self._snapshot(self.depth())
        self._thread.start()

    def _loop(self) -> None:
        next_health = time.monotonic()  # the run and a first health record go out at once
        while True:
            self._sleep(min(next_health, self._flush_at))
            stopping = self._stop.is_set()
            self._drain()
            if stopping:
                self._add({"health": [self._snapshot(0)]})
                self._flush(final=True)
                try:
                    self.sink.close()
                except Exception as exc:
                    self.health.failed("sink", exc)
                return
            now = time.monotonic()
            if now >= next_health:
                alone = not self._pending_n
                self._add({"health": [self._snapshot(self.depth())]})
                next_health = now + self.health_interval_s
                if alone:
                    self._flush()
            if now >= self._flush_at:
                self._flush()

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
            self.health.failed(f"{probe}.build", exc, say=True)
            self.health.drop("build_error", batch=known_records([job]))
            return
        if records:
            self._add(records)

    def _add(self, records: Records) -> None:
        for key, recs in records.items():
            self._pending[key].extend(recs)
            self._pending_n += len(recs)
        if self._pending_n and self._flush_at == math.inf:
            self._flush_at = time.monotonic() + self.flush_interval_s

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
        self._flush_at = math.inf
        try:
            self.sink.send(batch)
            self._run_sent = True
        except Exception as exc:
            self.health.failed("sink", exc)
            self.health.drop("sink_error", max(n, 1), batch)
            self.outage.failed(f"{type(exc).__name__}: {exc}", n)
            if final:
                self._send_status(run)
            return
        self.outage.ok()

    def _send_status(self, run: dict) -> None:
        """The final batch failed: send the run's status alone, a write small enough to pass where the
        store can still be reached (a full disk keeps room for it), so the run is not left ``running``."""
        try:
            self.sink.send({"schema_version": wire.SCHEMA_VERSION, "batch_id": uuid.uuid4().hex,
                            "run_id": self.run_id, "sent_at": time.time(), "run": run,
                            **{k: [] for k in wire.RECORD_TABLES}})
        except Exception as exc:
            log.warning("draftscope: the run's final status (%s) could not be stored either: %s: %s",
                        run.get("status"), type(exc).__name__, exc)
