"""What the refresh thread (``refresh.RunRefresher``) failed to do, since when: the poll of ``ingest_batches`` and
each run's refresh. A failure is logged when it starts, again at its 2nd, 4th, 8th, ... attempt in a row, and
when it ends; until then ``problem()`` and ``of_run(run_id)`` say it, for the pages' banner and ``/healthz``."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from draftscope.store.db import failure_reason

log = logging.getLogger("draftscope.store.refresh")  # the refresh thread's log lines, under one name
RETRY_S = (2.0, 60.0)  # a failed run is retried after 2 s, doubling up to 60 s while it keeps failing


@dataclass
class Failure:
    """A run's refresh failing since ``since`` (epoch seconds): ``attempts`` in a row, the last ``reason``."""

    since: float
    reason: str
    attempts: int = 1


class RefreshFailures:
    """The failures going on now: ``poll`` (the poll of ``ingest_batches``) and ``runs`` (run -> its refresh's)."""

    def __init__(self, poll_s: float):
        self.poll_s = poll_s  # the poll's period, for the log
        self._lock = threading.Lock()
        self.runs: dict[str, Failure] = {}
        self.poll: Failure | None = None

    def polled(self, exc: Exception | None) -> None:
        """The poll ended, failing with ``exc`` or not (None)."""
        with self._lock:
            was, self.poll = self.poll, None
            if exc is not None:
                self.poll = _again(was, exc)
        if exc is not None and was is None:
            log.exception("draftscope: polling ingest_batches failed; retrying every %.0f s", self.poll_s)
        elif exc is not None and _worth_saying(self.poll.attempts):
            log.warning("draftscope: polling ingest_batches failed again (%d in a row): %s",
                        self.poll.attempts, self.poll.reason)
        elif was is not None:
            log.warning("draftscope: polling ingest_batches works again after %d failures", was.attempts)

    def failed(self, run_id: str, exc: Exception) -> float:
        """The run's refresh failed with ``exc``; returns the pause before its retry, doubling while it keeps
        failing."""
        with self._lock:
            was = self.runs.get(run_id)
            failure = self.runs[run_id] = _again(was, exc)
        pause = min(RETRY_S[0] * 2 ** (failure.attempts - 1), RETRY_S[1])
        if was is None:
            log.exception("draftscope: refreshing run %s failed; its summary is stale until a retry "
                          "succeeds", run_id)
        elif _worth_saying(failure.attempts):
            log.warning("draftscope: refreshing run %s failed again (%d in a row, next try in %.0f s): %s",
                        run_id, failure.attempts, pause, failure.reason)
        return pause

    def refreshed(self, run_id: str) -> None:
        """The run's refresh succeeded."""
        with self._lock:
            was = self.runs.pop(run_id, None)
        if was is not None:
            log.warning("draftscope: run %s refreshed after %d failures", run_id, was.attempts)

    def problem(self) -> str | None:
        """What is failing, for the pages' banner and ``/healthz``; None while every refresh succeeds."""
        with self._lock:
            poll, failures = self.poll, list(self.runs.values())
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

    def of_run(self, run_id: str) -> Failure | None:
        """The failure of the run's last refresh, or None."""
        with self._lock:
            return self.runs.get(run_id)


def _again(was: Failure | None, exc: Exception) -> Failure:
    """The failure after ``was`` (None: the first) failed once more with ``exc``."""
    return Failure(was.since if was else time.time(), failure_reason(exc), was.attempts + 1 if was else 1)


def _worth_saying(attempts: int) -> bool:
    """A failure that keeps repeating is logged at its 2nd, 4th, 8th, ... attempt (each is counted)."""
    return attempts & (attempts - 1) == 0


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))
