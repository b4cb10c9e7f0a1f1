"""Keeps every run's aggregates and findings current from a thread of the dashboard process.

Runs are refreshed (``analyze.refresh_run``) when their batches change: the ingest API calls
``notify`` after a batch commits, and a poll of ``ingest_batches`` (an indexed range on
``received_at``) finds batches that writers outside this process stored, such as the tracer's
SQLite sink or ``draftscope import``. A run is refreshed at most once per ``debounce_s``, so a
busy run is not re-analysed on every batch; its last batch is still refreshed, ``debounce_s`` later
(``refresh_schedule``).

A refresh that fails (a full disk, a store briefly unreachable) is never hidden: the thread logs it,
counts it, keeps going and retries the run after a growing pause; until a retry succeeds ``problem()``
and ``run_problem(run_id)`` say what failed since when, for the pages' banner and ``/healthz``
(``refresh_failures``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa

from draftscope.store.analyze import refresh_run
from draftscope.store.refresh_failures import Failure, RefreshFailures
from draftscope.store.refresh_schedule import RunSchedule
from draftscope.store.stats import batch_counts
from draftscope.store.tables import BATCHES, STATS

log = logging.getLogger(__name__)
POLL_WINDOW_S = 60.0  # batches received this recently are re-checked (writers' clocks and commit order)


class RunRefresher:
    """One thread; ``notify`` never blocks; ``drain`` waits until every known change is folded."""

    def __init__(self, engine: sa.Engine, *, poll_s: float = 1.0, debounce_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.engine, self.poll_s = engine, poll_s
        self._cond = threading.Condition()
        self.schedule = RunSchedule(debounce_s, clock)  # guarded by ``_cond``
        self._asked = self._done = 0  # drain tickets
        self._stopping = False
        self.errors = 0
        self.failures = RefreshFailures(poll_s)
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
            self.schedule.mark({run_id})
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
        return self.failures.problem()

    def run_problem(self, run_id: str) -> Failure | None:
        """The failure of the run's last refresh, or None."""
        return self.failures.of_run(run_id)

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
            self._cond.wait_for(lambda: self._stopping or self._asked > self._done or self.schedule.due(),
                                timeout=self.schedule.wait_s(self.poll_s))
            if self._stopping:
                return False
            ticket = self._asked
        try:
            started = time.time()
            self._poll(self._since)
            self._since = started - POLL_WINDOW_S
            self.failures.polled(None)
        except Exception as exc:  # a store briefly unreachable: the next poll retries
            self.errors += 1
            self.failures.polled(exc)
        with self._cond:
            runs = self.schedule.take(force=ticket > self._done)
        for run_id in runs:
            self._refresh(run_id)
        with self._cond:
            self._done = max(self._done, ticket)
            self._cond.notify_all()
        return True

    def _refresh(self, run_id: str) -> None:
        """Refresh one run; a failure keeps it changed, retried after a pause that doubles while it keeps failing."""
        try:
            refresh_run(self.engine, run_id)
        except Exception as exc:
            self.errors += 1
            pause = self.failures.failed(run_id, exc)
            with self._cond:
                self.schedule.retry_after(run_id, pause)
        else:
            self.failures.refreshed(run_id)
            with self._cond:
                self.schedule.refreshed(run_id)

    def _poll(self, since: float | None) -> None:
        """Mark changed the runs whose batch count differs from the one their aggregates saw."""
        changed = changed_runs(self.engine, since)
        if changed:
            with self._cond:
                self.schedule.mark(changed)


def changed_runs(engine: sa.Engine, since: float | None) -> set[str]:
    """Runs with batches received after ``since`` (epoch seconds; None: every run) whose batch count differs from
    the one their aggregates saw."""
    with engine.connect() as conn:
        if since is None:
            candidates = None
        else:
            candidates = list(conn.execute(sa.select(BATCHES.c.run_id).distinct()
                                           .where(BATCHES.c.received_at > since)).scalars())
            if not candidates:
                return set()
        counts = batch_counts(conn, candidates)
        query = sa.select(STATS.c.run_id, STATS.c.batches_seen)
        if candidates is not None:
            query = query.where(STATS.c.run_id.in_(candidates))
        seen = dict(conn.execute(query).all())
    return {r for r, (n, _) in counts.items() if seen.get(r) != n}
