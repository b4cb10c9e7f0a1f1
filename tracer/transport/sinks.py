"""Choose and open the sink named by the configuration; a sink that cannot open is one log line."""

from __future__ import annotations

import logging
from typing import Callable

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.transport.file_sink import FileSink
from draftscope_tracer.transport.http_sink import HttpSink
from draftscope_tracer.transport.sqlite_sink import SqliteSink, StoreNotReady

log = logging.getLogger("draftscope.tracer")


def open_sink(config: TracerConfig, drop: Callable[[str, int, dict], None]):
    """The SQLite sink when DRAFTSCOPE_DB is set, else the file sink (DRAFTSCOPE_FILE), else the HTTP
    sink; None (logged) when unusable."""
    if config.db:
        try:
            return SqliteSink(config.db)
        except (StoreNotReady, OSError, Exception) as exc:  # sqlite3 errors included
            log.error("draftscope: tracer off: %s", exc)
            return None
    if config.file:
        try:
            return FileSink(config.file, drop)
        except OSError as exc:
            log.error("draftscope: tracer off: DRAFTSCOPE_FILE=%s cannot be opened for appending: %s", config.file, exc)
            return None
    if config.url:
        return HttpSink(config.url, drop, token=config.ingest_token)
    return None
