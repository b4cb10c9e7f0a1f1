"""The tracer's own health: drops by reason, errors and heartbeats by probe, self-disabled probes."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Dict, List


class Health:
    """Cumulative counters, shared by the hooks and the relay thread (the recorder process has its own)."""

    def __init__(self, failure_limit: int = 5):
        self._lock = threading.Lock()
        self.failure_limit = failure_limit
        self.drops: Counter = Counter()
        self.errors: Counter = Counter()
        self.heartbeats: Counter = Counter()
        self.disabled: List[str] = []
        self._in_a_row: Dict[str, int] = {}
        self.last_error: Dict[str, str] = {}

    def drop(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.drops[reason] += n

    def beat(self, probe: str) -> None:
        self.heartbeats[probe] += 1  # one writer per probe: the hook's own thread

    def ok(self, probe: str) -> None:
        self._in_a_row[probe] = 0

    def failed(self, probe: str, exc: BaseException) -> bool:
        """Count a failure of ``probe``; True when it has now failed too often in a row and is disabled."""
        with self._lock:
            self.errors[probe] += 1
            self.last_error[probe] = f"{type(exc).__name__}: {exc}"[:300]
            n = self._in_a_row.get(probe, 0) + 1
            self._in_a_row[probe] = n
            if n >= self.failure_limit and probe not in self.disabled:
                self.disabled.append(probe)
                return True
            return False

    def is_disabled(self, probe: str) -> bool:
        return probe in self.disabled

    def snapshot(self, queue_depth: int) -> dict:
        """A ``HealthRecord`` of the counters now."""
        with self._lock:
            return {"at": time.time(), "drops": dict(self.drops), "errors": dict(self.errors),
                    "heartbeats": dict(self.heartbeats), "disabled_probes": list(self.disabled),
                    "queue_depth": queue_depth}


def combined(scheduler: dict, recorder: dict) -> dict:
    """One ``HealthRecord`` from the scheduler's snapshot and the recorder's: counters added up,
    disabled probes joined, the queue depths added."""
    out = {"at": recorder["at"], "queue_depth": scheduler.get("queue_depth", 0) + recorder["queue_depth"],
           "disabled_probes": sorted(set(scheduler.get("disabled_probes", [])) | set(recorder["disabled_probes"]))}
    for key in ("drops", "errors", "heartbeats"):
        total = Counter(scheduler.get(key, {}))
        total.update(recorder[key])
        out[key] = dict(total)
    return out
