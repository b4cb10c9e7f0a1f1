"""A sink's failures in SGLang's log: the first one at WARNING with its real error, a summary every
``SUMMARY_S`` while they last, one line when delivery works again."""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

log = logging.getLogger("draftscope.tracer")
SUMMARY_S = 60.0


class Outage:
    """One sink's outage state; ``failed``/``dropped`` while it lasts, ``ok`` after each delivery."""

    def __init__(self, what: str, consequence: str = "records are dropped (counted) until it works again",
                 summary_s: float = SUMMARY_S, clock: Callable[[], float] = time.monotonic):
        self.what, self.consequence, self.summary_s, self.clock = what, consequence, summary_s, clock
        self.since: Optional[float] = None
        self.failures = self.records_dropped = 0
        self.last_error = ""
        self._next_summary = 0.0

    def failed(self, error: str, records_dropped: int = 0) -> None:
        """A delivery failed with ``error`` (``records_dropped`` records lost with it)."""
        now = self.clock()
        if self.since is None:
            self.since, self.failures, self.records_dropped = now, 0, 0
            self._next_summary = now + self.summary_s
            log.warning("draftscope: %s failed: %s; SGLang is unaffected, %s", self.what, error, self.consequence)
        self.failures += 1
        self.last_error = error
        self.records_dropped += records_dropped
        if now >= self._next_summary:
            log.warning("draftscope: %s still failing after %.0f s: %d failures, %d records dropped; last "
                        "error: %s", self.what, now - self.since, self.failures, self.records_dropped, error)
            self._next_summary = now + self.summary_s

    def dropped(self, records: int) -> None:
        """Records lost during the outage other than with a failure (e.g. a full buffer evicted)."""
        if self.since is not None:
            self.records_dropped += records

    def ok(self) -> None:
        """A delivery succeeded: one line if that ends an outage."""
        if self.since is None:
            return
        log.warning("draftscope: %s works again after %.0f s (%d failures, %d records dropped)", self.what,
                    self.clock() - self.since, self.failures, self.records_dropped)
        self.since = None
