"""Which runs the refresh thread (``refresh.RunRefresher``) refreshes next: the changed ones whose debounce has
passed since their last refresh and whose retry pause, after a failed refresh, is over."""

from __future__ import annotations

import math
from collections.abc import Callable


class RunSchedule:
    """Changed runs and when each is due; times come from ``clock``. Not locked: its owner holds a lock around
    every call."""

    def __init__(self, debounce_s: float, clock: Callable[[], float]):
        self.debounce_s, self.clock = debounce_s, clock
        self._dirty: set[str] = set()
        self._last: dict[str, float] = {}  # run -> ``clock()`` at its last refresh
        self._not_before: dict[str, float] = {}  # run -> ``clock()`` before which it is not retried

    def mark(self, runs: set[str]) -> None:
        """These runs have changed."""
        self._dirty |= runs

    def retry_after(self, run_id: str, pause_s: float) -> None:
        """The run's refresh failed: it stays changed, due again ``pause_s`` from now."""
        self._not_before[run_id] = self.clock() + pause_s
        self._dirty.add(run_id)

    def refreshed(self, run_id: str) -> None:
        """The run's refresh succeeded: no retry pause holds it back."""
        self._not_before.pop(run_id, None)

    def due(self) -> bool:
        now = self.clock()
        return any(self._is_due(r, now) for r in self._dirty)

    def wait_s(self, poll_s: float) -> float:
        """Seconds until the next changed run is due, at most ``poll_s``."""
        now = self.clock()
        due = [max(self.debounce_s - self._since_last(r, now), self._not_before.get(r, now) - now)
               for r in self._dirty]
        return max(0.0, min([poll_s, *due]))

    def take(self, force: bool) -> list[str]:
        """Changed runs whose debounce (and retry pause) has passed (all of them when ``force``), marked
        unchanged and refreshed now."""
        now = self.clock()
        runs = [r for r in self._dirty if force or self._is_due(r, now)]
        for r in runs:
            self._dirty.discard(r)
            self._last[r] = now
        return runs

    def _is_due(self, run_id: str, now: float) -> bool:
        return self._since_last(run_id, now) >= self.debounce_s and now >= self._not_before.get(run_id, now)

    def _since_last(self, run_id: str, now: float) -> float:
        """Seconds since the run's last refresh; infinite for a run never refreshed (due at once,
        however recently the clock started)."""
        return now - self._last.get(run_id, -math.inf)
