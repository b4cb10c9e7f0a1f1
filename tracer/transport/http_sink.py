"""POST wire batches to the dashboard's ingest API (stdlib only), with backoff and a bounded buffer."""

from __future__ import annotations

import base64
import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Any, Callable, Deque, Dict, Optional, Tuple
from urllib.parse import unquote, urlsplit, urlunsplit

from draftscope_tracer.transport import wire
from draftscope_tracer.transport.outage import Outage
from draftscope_tracer.redact import public_url

log = logging.getLogger("draftscope.tracer")


def _count(batch: Dict[str, Any]) -> int:
    return sum(len(batch.get(k) or ()) for k in ("requests", "steps", "samples", "health", "findings"))


class _Retryable(Exception):
    """A 5xx answer, a connection error or an answer cut short: the batch is kept and sent again later."""


def _endpoint(url: str) -> Tuple[str, Optional[str]]:
    """``{url}/api/v1/batches`` with ``url``'s query kept (a proxy's token may ride there), and the
    ``Authorization: Basic`` value of its userinfo (urllib would read that as part of the host)."""
    parts = urlsplit(url)
    basic = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        basic = "Basic " + base64.b64encode(pair).decode()
    netloc = parts.netloc.rpartition("@")[2]
    path = parts.path.rstrip("/") + "/api/v1/batches"
    return urlunsplit((parts.scheme, netloc, path, parts.query, "")), basic


class HttpSink:
    """Delivers batches in order to ``{url}/api/v1/batches``; never raises into the writer.

    ``token`` is sent as ``Authorization: Bearer``; without one, credentials in the URL
    (``https://user:pass@host/``, for a proxy in front of the dashboard) go as Basic auth.
    ``drop(reason, n, batch)`` is told of every batch it gives up on (``Health.drop``).

    A batch the dashboard stored but whose answer was lost (the connection cut, the answer cut short, a
    proxy's 502) is sent again; the dashboard answers ``"status": "duplicate"`` for a batch id it holds,
    and that counts as delivered (``delivered``, ``recovered``), never as dropped."""

    def __init__(self, url: str, drop: Callable[[str, int, dict], None], *, token: Optional[str] = None,
                 timeout_s: float = 5.0, max_buffered_batches: int = 64,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0):
        self._url, basic = _endpoint(url)
        self.endpoint = public_url(url) + "/api/v1/batches"  # as logs show it: no credentials
        self._drop = drop
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        elif basic:
            self._headers["Authorization"] = basic
        self.timeout_s = timeout_s
        self._buffer: Deque[Dict[str, Any]] = deque()
        self.max_buffered_batches = max_buffered_batches
        self._backoff0, self._max_backoff = backoff_s, max_backoff_s
        self._backoff = backoff_s
        self._retry_at = 0.0
        self.delivered = 0  # batches the dashboard holds (stored now, or by an attempt whose answer was lost)
        self.recovered = 0  # of those, found stored by a retry ("duplicate")
        self.snapshot: Optional[Callable[[], Dict[str, Any]]] = None  # the writer's health record, now
        self.name = f"the HTTP sink ({self.endpoint})"
        self.outage = Outage(self.name, f"batches are buffered (up to {max_buffered_batches}), then the "
                                        "oldest are dropped (counted)")

    def send(self, batch: Dict[str, Any]) -> None:
        self._buffer.append(batch)
        while len(self._buffer) > self.max_buffered_batches:
            self._evict_oldest()
        if time.monotonic() >= self._retry_at:
            self._deliver()

    def close(self, deadline_s: float = 5.0) -> None:
        """Try what is still buffered until ``deadline_s``; count the rest as dropped at shutdown."""
        end = time.monotonic() + deadline_s
        while self._buffer and time.monotonic() < end:
            if not self._deliver():
                time.sleep(min(self._backoff0, max(0.0, end - time.monotonic())))
        for batch in self._buffer:
            self._drop("shutdown", max(_count(batch), 1), batch)
        self._buffer.clear()

    def _evict_oldest(self) -> None:
        old = self._buffer.popleft()
        self._drop("sink_error", max(_count(old), 1), old)
        self.outage.dropped(_count(old))
        if old.get("run") and self._buffer and not self._buffer[0].get("run"):
            self._buffer[0]["run"] = old["run"]  # the store needs the run before any record
        if self.snapshot is not None and self._buffer:  # the loss travels with the newest batch
            health = self._buffer[-1].setdefault("health", [])
            health[-1:] = [self.snapshot()]

    def _deliver(self) -> bool:
        """Send buffered batches in order; False when the dashboard is unreachable for now."""
        while self._buffer:
            batch = self._buffer[0]
            try:
                status = self._post(batch)
            except _Retryable as exc:
                self._retry_at = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, self._max_backoff)
                self.outage.failed(str(exc))
                return False
            except urllib.error.HTTPError as exc:  # 4xx: this batch will never be accepted
                self._buffer.popleft()
                self._drop("sink_rejected", max(_count(batch), 1), batch)
                log.warning("draftscope: %s rejected a batch: HTTP %s %s", self.endpoint, exc.code,
                            exc.read(300).decode("utf-8", "replace"))
                if batch.get("run") and self._buffer and not self._buffer[0].get("run"):
                    self._buffer[0]["run"] = batch["run"]
                continue
            self._buffer.popleft()
            self._delivered(batch, status)
            self._backoff = self._backoff0
            self.outage.ok()
        return True

    def _delivered(self, batch: Dict[str, Any], status: Optional[str]) -> None:
        """Count a batch the dashboard holds; "duplicate": a retry, whose first attempt was stored (each
        batch id is sent again only after an attempt failed)."""
        self.delivered += 1
        if status == "duplicate":
            self.recovered += 1
            log.info("draftscope: batch %s was stored by an earlier attempt whose answer was lost; "
                     "counted delivered", batch.get("batch_id"))

    def _post(self, batch: Dict[str, Any]) -> Optional[str]:
        """POST one batch; the dashboard's ``status`` ("stored" or "duplicate"), None if it gave none."""
        body = wire.to_json(batch)
        req = urllib.request.Request(self._url, data=body, headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                answer = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:
                raise _Retryable(f"HTTP {exc.code}") from exc
            raise
        except http.client.HTTPException as exc:  # an answer cut short (IncompleteRead, BadStatusLine)
            raise _Retryable(f"the answer was lost: {type(exc).__name__}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise _Retryable(str(getattr(exc, "reason", exc))) from exc
        try:
            return json.loads(answer).get("status")
        except (ValueError, AttributeError):
            return None
