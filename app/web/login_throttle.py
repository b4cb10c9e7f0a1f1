"""Wrong read tokens at the login page, slowed per client address, in this process's memory.

The first ``FREE_TRIES`` wrong tries in a row cost nothing; each one after them makes the client wait
twice as long as the one before (1 s, 2 s, 4 s, ... up to ``MAX_WAIT_S``) before its next try is
even checked. A right token forgets the client's count. The count lives in the process: behind a
proxy with two dashboards a client gets each process's tries, and without the proxy's address in
``DRAFTSCOPE_FORWARDED_ALLOW_IPS`` every client counts as the proxy (docs/security.md).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

FREE_TRIES = 5
MAX_WAIT_S = 15 * 60.0
MAX_CLIENTS = 10_000  # the oldest client's count is forgotten past this many


class LoginThrottle:
    """Per-client counts of wrong tries and when the next try may come."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, tuple[int, float]] = OrderedDict()  # client -> (wrong, not before)

    def wait_s(self, client: str) -> int:
        """Whole seconds ``client`` must wait before its next try is checked (0: now)."""
        with self._lock:
            _, not_before = self._clients.get(client, (0, 0.0))
        return max(0, math.ceil(not_before - self._clock()))

    def wrong(self, client: str) -> int:
        """Count a wrong try; returns the seconds until the next one is checked."""
        with self._lock:
            count = self._clients.pop(client, (0, 0.0))[0] + 1
            wait = 0.0 if count < FREE_TRIES else min(MAX_WAIT_S, 2.0 ** (count - FREE_TRIES))
            self._clients[client] = (count, self._clock() + wait)
            while len(self._clients) > MAX_CLIENTS:
                self._clients.popitem(last=False)
        return math.ceil(wait)

    def right(self, client: str) -> None:
        """Forget ``client``'s wrong tries."""
        with self._lock:
            self._clients.pop(client, None)
