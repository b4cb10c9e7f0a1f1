"""Keeps every run's aggregates and findings current from a thread of the dashboard process.

Runs are refreshed (``analyze.refresh_run``) when their batches change: the ingest API calls
``notify`` after a batch commits, and a poll of ``ingest_batches`` (an indexed range on
``received_at``) finds batches that writers outside this process stored, such as the tracer's
SQLite sink or ``draftscope import``. A run is refreshed at most once per ``debounce_s``, so a
busy run is not re-analysed on every batch; its last batch is still refreshed, ``debounce_s`` later.

A refresh that fails (a full disk, a store briefly unreachable) is never hidden: the thread logs it,
counts it, keeps going and retries the run after a growing pause (``RETRY_S``); until a retry
succeeds ``problem()`` and ``run_problem(run_id)`` say what failed since when, for the pages'
banner and ``/healthz``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from draftscope import models
from draftscope.db import failure_reason
from draftscope.analyze import refresh_run
from draftscope.stats import batch_counts

log = logging.getLogger(__name__)
_BATCHES = models.IngestBatch.__table__
_STATS = models.RunStats.__table__
POLL_WINDOW_S = 60.0  # batches received this recently are re-checked (writers' clocks and commit order)
RETRY_S = (2.0, 60.0)  # a failed run is retried after 2 s, doubling up to 60 s while it keeps failing


@dataclass
class Failure:
    """A run's refresh failing since ``since`` (epoch seconds): ``attempts`` in a row, the last ``reason``."""

    since: float
    reason: str
    attempts: int = 1


class RunRefresher:
    """One thread; ``notify`` never blocks; ``drain`` waits until every known change is folded."""

    def __init__(self, engine: sa.Engine, *, poll_s: float = 1.0, debounce_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.engine, self.poll_s, self.debounce_s, self.clock = engine, poll_s, debounce_s, clock
        self._cond = threading.Condition()
        self._dirty: set[str] = set()
        self._last: dict[str, float] = {}  # run -> ``clock()`` at its last refresh
        self._asked = self._done = 0  # drain tickets
        self._stopping = False
        self.errors = 0
        self.failures: dict[str, Failure] = {}  # runs whose last refresh failed (guarded by ``_cond``)
        self.poll_failure: Failure | None = None  # the poll of ingest_batches, while it fails
        self._not_before: dict[str, float] = {}  # run -> ``clock()`` before which it is not retried
        self._since: float | None = None  # polls look at batches received after this; None: every run
        self._thread = threading.Thread(target=self._run, name="draftscope-refresh", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=timeout_s)

    def notify(self, run_id: str) -> None:
        """A batch of ``run_id`` has committed."""
        with self._cond:
            self._dirty.add(run_id)
            self._cond.notify_all()

    def drain(self, timeout_s: float = 60.0) -> bool:
        """Poll now and refresh every changed run, debounce or not; False on timeout."""
        with self._cond:
            self._asked += 1
            ticket = self._asked
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._done >= ticket or self._stopping, timeout_s) \
                and self._done >= ticket

    def problem(self) -> str | None:
        """What is failing, for the pages' banner and ``/healthz``; None while every refresh succeeds."""
        with self._cond:
            poll, failures = self.poll_failure, list(self.failures.values())
        parts = []
        if poll is not None:
            parts.append(f"New batches could not be looked for since {_when(poll.since)} ({poll.reason}).")
        if failures:
            first = min(failures, key=lambda f: f.since)
            n = len(failures)
            parts.append(f"The summaries of {n} run{'s' if n != 1 else ''} could not be written since "
                         f"{_when(first.since)} ({failures[-1].reason}); their pages show the summary "
                         "built before, marked stale. Retrying.")
        return " ".join(parts) or None

    def run_problem(self, run_id: str) -> Failure | None:
        """The failure of the run's last refresh, or None."""
        with self._cond:
            return self.failures.get(run_id)

    def _run(self) -> None:
        while True:
            try:
                if not self._pass():
                    return
            except Exception:  # never dies silently: counted, logged, the next pass runs
                self.errors += 1
                log.exception("draftscope: the refresh thread's pass failed")
                with self._cond:
                    self._cond.wait(self.poll_s)

    def _pass(self) -> bool:
        """One wait, poll and refresh; False when stopping."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or self._asked > self._done or
                                self._due(), timeout=self._wait_s())
            if self._stopping:
                return False
            ticket = self._asked
        try:
            started = time.time()
            self._poll(self._since)
            self._since = started - POLL_WINDOW_S
            self._polled(None)
        except Exception as exc:  # a store briefly unreachable: the next poll retries
            self.errors += 1
            self._polled(exc)
        for run_id in self._take(force=ticket > self._done):
            try:
                refresh_run(self.engine, run_id)
            except Exception as exc:
                self.errors += 1
                self._failed(run_id, exc)
            else:
                self._refreshed(run_id)
        with self._cond:
            self._done = max(self._done, ticket)
            self._cond.notify_all()
        return True

    def _polled(self, exc: Exception | None) -> None:
        with self._cond:
            was, self.poll_failure = self.poll_failure, None
            if exc is not None:
                self.poll_failure = Failure(was.since if was else time.time(), failure_reason(exc),
                                            was.attempts + 1 if was else 1)
        if exc is not None and was is None:
            log.exception("draftscope: polling ingest_batches failed; retrying every %.0f s", self.poll_s)
        elif exc is not None and _worth_saying(self.poll_failure.attempts):
            log.warning("draftscope: polling ingest_batches failed again (%d in a row): %s",
                        self.poll_failure.attempts, self.poll_failure.reason)
        elif was is not None:
            log.warning("draftscope: polling ingest_batches works again after %d failures", was.attempts)

    def _failed(self, run_id: str, exc: Exception) -> None:
        """Keep the run dirty, to be retried after a pause that doubles while it keeps failing."""
        with self._cond:
            was = self.failures.get(run_id)
            failure = Failure(was.since if was else time.time(), failure_reason(exc),
                              was.attempts + 1 if was else 1)
            self.failures[run_id] = failure
            pause = min(RETRY_S[0] * 2 ** (failure.attempts - 1), RETRY_S[1])
            self._not_before[run_id] = self.clock() + pause
            self._dirty.add(run_id)
        if was is None:
            log.exception("draftscope: refreshing run %s failed; its summary is stale until a retry "
                          "succeeds", run_id)
        elif _worth_saying(failure.attempts):
            log.warning("draftscope: refreshing run %s failed again (%d in a row, next try in %.0f s): %s",
                        run_id, failure.attempts, pause, failure.reason)

    def _refreshed(self, run_id: str) -> None:
        with self._cond:
            was = self.failures.pop(run_id, None)
            self._not_before.pop(run_id, None)
        if was is not None:
            log.warning("draftscope: run %s refreshed after %d failures", run_id, was.attempts)

    def _since_last(self, run_id: str, now: float) -> float:
        """Seconds since the run's last refresh; infinite for a run never refreshed (due at once,
        however recently the clock started)."""
        return now - self._last.get(run_id, -math.inf)

    def _wait_s(self) -> float:
        now = self.clock()
        due = [max(self.debounce_s - self._since_last(r, now), self._not_before.get(r, now) - now)
               for r in self._dirty]
        return max(0.0, min([self.poll_s, *due]))

    def _is_due(self, run_id: str, now: float) -> bool:
        return self._since_last(run_id, now) >= self.debounce_s and now >= self._not_before.get(run_id, now)

    def _due(self) -> bool:
        now = self.clock()
        return any(self._is_due(r, now) for r in self._dirty)

    def _take(self, force: bool) -> list[str]:
        """Dirty runs whose debounce (and retry pause) has passed (all of them when ``force``),
        marked clean."""
        with self._cond:
            now = self.clock()
            runs = [r for r in self._dirty if force or self._is_due(r, now)]
            for r in runs:
                self._dirty.discard(r)
                self._last[r] = now
            return runs

    def _poll(self, since: float | None) -> None:
        """Mark dirty the runs whose batch count differs from the one their aggregates saw."""
        with self.engine.connect() as conn:
            if since is None:
                candidates = None
            else:
                candidates = list(conn.execute(sa.select(_BATCHES.c.run_id).distinct()
                                               .where(_BATCHES.c.received_at > since)).scalars())
                if not candidates:
                    return
            counts = batch_counts(conn, candidates)
            query = sa.select(_STATS.c.run_id, _STATS.c.batches_seen)
            if candidates is not None:
                query = query.where(_STATS.c.run_id.in_(candidates))
            seen = dict(conn.execute(query).all())
        changed = {r for r, (n, _) in counts.items() if seen.get(r) != n}
        if changed:
            with self._cond:
                self._dirty |= changed


def _worth_saying(attempts: int) -> bool:
    """A failure that keeps repeating is logged at its 2nd, 4th, 8th, ... attempt (each is counted)."""
    return attempts & (attempts - 1) == 0


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))
