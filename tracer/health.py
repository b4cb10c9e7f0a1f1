"""The tracer's own health: drops by reason, errors and heartbeats by probe, self-disabled probes, and
what the drops lost (the requests whose records never reach the store, and when: ``gaps``)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Dict, Iterable, List, Mapping, Optional

MAX_LOST_RIDS = 100  # request ids named in a health record; every lost request is counted
MAX_GAPS = 16  # time windows of lost records kept; past it the two closest merge

log = logging.getLogger("draftscope.tracer")


class Health:
    """Cumulative counters, shared by the hooks and the relay thread (the recorder process has its own)."""

    def __init__(self, failure_limit: int = 5):
        # reentrant: a SIGTERM handler's final round (``relay.Relay.close``) reads the counters on the thread it
        # interrupted, which may be inside one of these blocks (a drop counted); a plain lock would hang it there
        self._lock = threading.RLock()
        self.failure_limit = failure_limit
        self.drops: Counter = Counter()
        self.errors: Counter = Counter()
        self.heartbeats: Counter = Counter()
        self.disabled: List[str] = []
        self.in_a_row: Dict[str, int] = {}  # failures of each probe since it last succeeded
        self.last_error: Dict[str, str] = {}
        self.records_lost = 0  # records that would have reached the store (not launches or top-k)
        self.requests_lost = 0  # requests whose finish record was among them
        self.lost_rids: Dict[str, None] = {}  # the first MAX_LOST_RIDS of those, in order
        self.gaps: List[List[float]] = []  # [first, last] time of the lost records, merged

    def drop(self, reason: str, n: int = 1, batch: Optional[Mapping[str, Any]] = None) -> None:
        """Count ``n`` drops of ``reason``. ``batch``: the records they were (wire batch keys to
        records, possibly none): they are lost, so their request ids and time span are kept."""
        with self._lock:
            self.drops[reason] += n
            if batch is not None:
                self._lost(n, batch)

    def _lost(self, n: int, batch: Mapping[str, Any]) -> None:
        self.records_lost += n
        rids = [r["rid"] for r in batch.get("requests") or ()]
        self.requests_lost += len(rids)
        for rid in rids[:max(0, MAX_LOST_RIDS - len(self.lost_rids))]:
            self.lost_rids[rid] = None
        times = [r["at"] for key in ("steps", "samples") for r in batch.get(key) or () if r.get("at")]
        times += [r["finished_at"] for r in batch.get("requests") or () if r.get("finished_at")]
        now = time.time()
        self.gaps = add_gap(self.gaps, [min(times, default=now), max(times, default=now)])

    def beat(self, probe: str) -> None:
        self.heartbeats[probe] += 1  # one writer per probe: the hook's own thread

    def failed(self, probe: str, exc: BaseException, say: bool = False) -> bool:
        """Count a failure of ``probe``; True when it has now failed too often in a row and is disabled. ``say``:
        log the first failure of ``probe`` (for probes that log nothing else of their own)."""
        with self._lock:
            first = probe not in self.last_error
            self.errors[probe] += 1
            self.last_error[probe] = f"{type(exc).__name__}: {exc}"[:300]
            n = self.in_a_row.get(probe, 0) + 1
            self.in_a_row[probe] = n
            disabled = n >= self.failure_limit and probe not in self.disabled
            if disabled:
                self.disabled.append(probe)
        if first and say:  # the run's health counts every failure; the log says what the first one was
            log.warning("draftscope: %s failed (counted in the run's health; later failures are not logged): %s",
                        probe, self.last_error[probe])
        return disabled

    def is_disabled(self, probe: str) -> bool:
        return probe in self.disabled

    def snapshot(self, queue_depth: int) -> dict:
        """A ``HealthRecord`` of the counters now."""
        with self._lock:
            return {"at": time.time(), "drops": dict(self.drops), "errors": dict(self.errors),
                    "heartbeats": dict(self.heartbeats), "disabled_probes": list(self.disabled),
                    "queue_depth": queue_depth, "records_lost": self.records_lost,
                    "requests_lost": self.requests_lost, "lost_rids": list(self.lost_rids),
                    "gaps": [list(g) for g in self.gaps]}


def add_gap(gaps: Iterable[List[float]], gap: List[float]) -> List[List[float]]:
    """``gaps`` with ``gap`` added: sorted, overlapping windows merged, at most ``MAX_GAPS`` (the two
    closest merge)."""
    out: List[List[float]] = []
    for g in sorted([*map(list, gaps), list(gap)]):
        if out and g[0] <= out[-1][1]:
            out[-1][1] = max(out[-1][1], g[1])
        else:
            out.append(g)
    while len(out) > MAX_GAPS:
        i = min(range(len(out) - 1), key=lambda j: out[j + 1][0] - out[j][1])
        out[i:i + 2] = [[out[i][0], out[i + 1][1]]]
    return out


def combined(scheduler: dict, recorder: dict) -> dict:
    """One ``HealthRecord`` from the scheduler's snapshot and the recorder's: counters added up,
    disabled probes joined, the queue depths added."""
    out = {"at": recorder["at"], "queue_depth": scheduler.get("queue_depth", 0) + recorder["queue_depth"],
           "disabled_probes": sorted(set(scheduler.get("disabled_probes", [])) | set(recorder["disabled_probes"]))}
    for key in ("drops", "errors", "heartbeats"):
        total = Counter(scheduler.get(key, {}))
        total.update(recorder[key])
        out[key] = dict(total)
    for key in ("records_lost", "requests_lost"):
        out[key] = scheduler.get(key, 0) + recorder[key]
    out["lost_rids"] = list(dict.fromkeys([*scheduler.get("lost_rids", []), *recorder["lost_rids"]]))[:MAX_LOST_RIDS]
    gaps = recorder["gaps"]
    for gap in scheduler.get("gaps", []):
        gaps = add_gap(gaps, gap)
    out["gaps"] = gaps
    return out
