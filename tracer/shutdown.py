"""The tracer's last flush when the scheduler process ends: chained onto SIGTERM (how process managers
and the test bed stop SGLang), at exit, and when the scheduler's event loop raises."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable

SHUTDOWN_DEADLINE_S = 2.0  # longest a SIGTERM or a crash waits for the final flush


class SigtermChain:
    """On SIGTERM: ``close("ended", SHUTDOWN_DEADLINE_S)``, then the previous handler's turn (or, where
    that was the default, the process still dies of the signal)."""

    def __init__(self, close: Callable[[str, float], None]):
        self.close = close
        self.previous: Any = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; atexit still flushes
        self.previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self)

    def __call__(self, signum, frame) -> None:
        try:
            self.close("ended", SHUTDOWN_DEADLINE_S)
        finally:
            previous = self.previous
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:  # SIG_DFL (or unknown): die of the signal as before
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
