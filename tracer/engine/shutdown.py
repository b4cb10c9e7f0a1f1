"""The tracer's last flush when the scheduler process ends: chained onto SIGTERM (how process managers
and the test bed stop SGLang), at exit, and when the scheduler's event loop raises."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable, Optional

SHUTDOWN_DEADLINE_S = 2.0  # longest a SIGTERM waits for the final flush (process managers' kill timers run)
# Longest a crash waits: the engine's error path then kills the scheduler's process tree at once where
# SGLang's pre-crash diagnostics are off (SGLANG_PYSPY_DUMP_BEFORE_CRASH=0): what the scheduler still holds
# must be relayed first. The recorder has left that tree and would finish on its own; the wait also ends
# when it exits. Usually well under a second.
CRASH_DEADLINE_S = 10.0


class SigtermChain:
    """On SIGTERM: ``close("ended", SHUTDOWN_DEADLINE_S)``, then the previous handler's turn (or, where
    that was the default, the process still dies of the signal).

    A signal handler runs on the main thread between two bytecodes of whatever it interrupted. Inside
    :meth:`deferred` (result processing: SGLang has answered a request whose record the tracer has
    not queued yet) the signal waits for the block's end, so that record goes out with the last flush.
    """

    def __init__(self, close: Callable[[str, float], None]):
        self.close = close
        self.previous: Any = None
        self._depth = 0
        self._pending: Optional[tuple] = None

    def deferred(self) -> "SigtermChain":
        """``with chain.deferred():`` a block the signal waits for (on the main thread; blocks nest). A plain
        context manager: a generator's costs a few µs, and result processing enters one every iteration."""
        return self

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():  # the signal interrupts the main thread only
            self._depth += 1

    def __exit__(self, *exc) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._depth -= 1
        if not self._depth and self._pending is not None:
            pending, self._pending = self._pending, None
            self(*pending)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; atexit still flushes
        self.previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self)

    def __call__(self, signum, frame) -> None:
        if self._depth:
            self._pending = (signum, frame)
            return
        try:
            self.close("ended", SHUTDOWN_DEADLINE_S)
        finally:
            previous = self.previous
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:  # SIG_DFL (or unknown): die of the signal as before
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
