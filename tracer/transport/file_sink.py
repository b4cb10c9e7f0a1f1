"""Append each wire batch as one JSON line to a file (``DRAFTSCOPE_FILE``); ``draftscope import`` reads it."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict

from draftscope_tracer.transport import wire
from draftscope_tracer.transport.outage import Outage


def _count(batch: Dict[str, Any]) -> int:
    return sum(len(batch.get(k) or ()) for k in ("requests", "steps", "samples", "health", "findings"))


class FileSink:
    """Used only by the writer thread. Never raises from ``send``: a failed write (full disk, ...) is
    rolled back to the last whole line, counted as ``sink_error`` drops and logged (``outage.Outage``)."""

    def __init__(self, path: str, drop: Callable[[str, int, dict], None]):
        self.path = path
        self._drop = drop
        self.name = f"the file sink ({path})"
        self.outage = Outage(self.name)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # OSError: caller logs it

    def send(self, batch: Dict[str, Any]) -> None:
        line = wire.to_json(batch) + b"\n"
        end = None
        try:
            end = os.lseek(self._fd, 0, os.SEEK_END)
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]
        except (OSError, ValueError) as exc:
            self._drop("sink_error", max(_count(batch), 1), batch)
            if end is not None:
                try:
                    os.ftruncate(self._fd, end)  # no half line for the importer to trip over
                except OSError:
                    pass
            self.outage.failed(f"{type(exc).__name__}: {exc}", _count(batch))
            return
        self.outage.ok()

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
