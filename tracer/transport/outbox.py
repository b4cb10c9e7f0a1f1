"""What leaves the scheduler process: the hooks' calls (``records`` functions over summary handles), queued
for the recorder process by the relay thread (``relay.Relay``), which is started at attach."""

from __future__ import annotations

from typing import Callable, Optional

from draftscope_tracer.transport import records
from draftscope_tracer.transport.relay import Relay


class Transport:
    """``submit`` a call for the recorder; a refused call (no relay, queue full) frees what it held."""

    def __init__(self):
        self.writer: Optional[Relay] = None

    def submit(self, probe: str, fn: Callable, *args, pendings=()) -> bool:
        call = records.Call(probe, fn, args, pendings)
        if self.writer is not None and self.writer.submit(call):
            return True
        call.release()
        return False

    def close(self, status: str = "ended", timeout_s: float = 10.0) -> None:
        if self.writer is not None:
            self.writer.close(timeout_s, status=status)
