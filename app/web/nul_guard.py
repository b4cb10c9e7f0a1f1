"""Refuse a request whose address holds a NUL character (``%00``), before any route reads it.

No stored id, path or text holds one (ingest refuses them, ``ingest_checks``), so such an address can
match nothing; and PostgreSQL cannot even compare text with a NUL in it (it raises), which would
answer 500 for a lookup that should answer "no such thing".
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send


class RefuseNul:
    """ASGI middleware: 400 for a path or query string holding NUL (raw or percent-encoded)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
                "\x00" in scope.get("path", "")
                or b"\x00" in unquote_to_bytes(scope.get("query_string", b"").replace(b"+", b" "))):
            response = JSONResponse({"error": "The address holds a NUL character (%00); no run, request "
                                              "or value stored here has one. Remove it from the URL."},
                                    status_code=400)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
