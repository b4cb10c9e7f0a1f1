"""Keeps every run's aggregates and findings current from a thread of the dashboard process.

Runs are refreshed (``analyze.refresh_run``) when their batches change: the ingest API calls
``notify`` after a batch commits, and a poll of ``ingest_batches`` (an indexed range on
``received_at``) finds batches that writers outside this process stored, such as the tracer's
SQLite sink or ``draftscope import``. A run is refreshed at most once per ``debounce_s``, so a
busy run is not re-analysed on every batch; its last batch is still refreshed, ``debounce_s`` later.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa

from draftscope import models
from draftscope.analyze import refresh_run
from draftscope.stats import batch_counts

log = logging.getLogger(__name__)
_BATCHES = models.IngestBatch.__table__
_STATS = models.RunStats.__table__
POLL_WINDOW_S = 60.0  # batches received this recently are re-checked (writers' clocks and commit order)


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
        self._thread = threading.Thread(target=self._run, name="draftscope-refresh", daemon=True)

    def start(self) -> None:
        self._thread.start()

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

    def _run(self) -> None:
        since = None  # first pass: every run whose batches differ from its aggregates
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._asked > self._done or
                                    self._due(), timeout=self._wait_s())
                if self._stopping:
                    return
                ticket = self._asked
            try:
                started = time.time()
                self._poll(since)
                since = started - POLL_WINDOW_S
            except Exception:  # a store briefly unreachable: the next poll retries
                self.errors += 1
                log.exception("draftscope: polling ingest_batches failed")
            for run_id in self._take(force=ticket > self._done):
                try:
                    refresh_run(self.engine, run_id)
                except Exception:
                    self.errors += 1
                    log.exception("draftscope: refreshing run %s failed", run_id)
            with self._cond:
                self._done = max(self._done, ticket)
                self._cond.notify_all()

    def _since_last(self, run_id: str, now: float) -> float:
        """Seconds since the run's last refresh; infinite for a run never refreshed (due at once,
        however recently the clock started)."""
        return now - self._last.get(run_id, -math.inf)

    def _wait_s(self) -> float:
        now = self.clock()
        due = [self.debounce_s - self._since_last(r, now) for r in self._dirty]
        return max(0.0, min([self.poll_s, *due]))

    def _due(self) -> bool:
        now = self.clock()
        return any(self._since_last(r, now) >= self.debounce_s for r in self._dirty)

    def _take(self, force: bool) -> list[str]:
        """Dirty runs whose debounce has passed (all of them when ``force``), marked clean."""
        with self._cond:
            now = self.clock()
            runs = [r for r in self._dirty if force or self._since_last(r, now) >= self.debounce_s]
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
