"""What another web site cannot make a browser do to the dashboard, and the headers every answer carries.

One ASGI layer around the whole app (outside its error handling, so that error pages carry the
headers too), checking each request in this order:

1. **Host** (DNS rebinding): the ``Host`` header must name this dashboard: a loopback name
   (127.0.0.1, localhost, ::1; any port), ``DRAFTSCOPE_ALLOWED_HOSTS``, the address given to
   ``serve --host`` and the host of ``DRAFTSCOPE_PUBLIC_URL``. Else 400 naming the setting.
   ``/healthz`` answers any Host (a proxy's or orchestrator's health check; it holds no trace).
2. **Cross-site writes**: a POST (any method but GET/HEAD/OPTIONS) that a browser sends on behalf of
   another site is refused with 403: ``Sec-Fetch-Site`` other than ``same-origin`` / ``none``, or,
   from a browser too old to send it, an ``Origin`` that is not this Host. A request with neither
   header is not a browser's (curl, the CLI, a tracer) and goes on to its token checks.
3. **Ingest's body type**: ``POST /api/v1/batches`` takes ``application/json`` only (415 for
   anything else), so no HTML form or "simple" cross-site request can carry a batch.

Every answer gets ``HEADERS`` (a Content-Security-Policy the pages' vendored scripts pass, no
framing, nosniff, a same-origin referrer), and every answer but ``/static`` ``Cache-Control:
no-store`` (pages and exports are never kept by a browser or a shared cache).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from draftscope.settings import LOOPBACK_HOSTS, Settings

INGEST_PATH = "/api/v1/batches"
ANY_HOST_PATHS = frozenset({"/healthz"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
EMPTY_STYLE = "sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="  # base64 sha256 of b""
CSP = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    # plotly.js adds its rules through CSSOM (insertRule) to <style> elements it creates empty: the
    # hash of the empty text lets in those and only those (no 'unsafe-inline')
    f"style-src 'self' '{EMPTY_STYLE}'",
    "img-src 'self' data:",  # the page icon and swagger-ui's CSS icons are data: URIs
    "font-src 'self'",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])
HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}


def host_name(host_header: str) -> str:
    """The name in a ``Host`` header, lower case, without port or IPv6 brackets."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.index("]")] if "]" in host else ""
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class HostAllowList:
    """The names a ``Host`` header may carry: exact names, ``*.domain`` (its subdomains), ``*`` (any)."""

    def __init__(self, names: list[str]):
        names = [n.strip().lower().strip("[]") for n in names if n.strip()]
        self.any = "*" in names
        self.exact = frozenset(n for n in names if not n.startswith("*"))
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))

    def allows(self, host_header: str) -> bool:
        name = host_name(host_header)
        return self.any or (name != "" and (name in self.exact or name.endswith(self.suffixes)))


def answered_names(settings: Settings) -> list[str]:
    """Every name the dashboard answers to under ``settings`` (module docstring)."""
    names = [*LOOPBACK_HOSTS, *settings.allowed_hosts]
    if settings.host not in WILDCARD_BINDS:
        names.append(settings.host)
    if settings.public_url:
        names.append(urlsplit(settings.public_url).hostname or "")
    return names


def cross_site(headers: Headers) -> str | None:
    """Why a write is a browser's on behalf of another site (None: same origin, or not a browser)."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return None if site in ("same-origin", "none") else f"Sec-Fetch-Site is {site!r}"
    origin = headers.get("origin")
    if origin is None:
        return None
    if urlsplit(origin).netloc.lower() == headers.get("host", "").lower():
        return None
    return f"Origin {origin!r} is not this dashboard"


def _answer(path: str, status: int, message: str) -> Response:
    """A refusal as JSON for the API (as its other errors), as text for everything else."""
    if path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    return PlainTextResponse(message + "\n", status_code=status)


def _media_type(headers: Headers) -> str:
    return headers.get("content-type", "").partition(";")[0].strip().lower()


class Guard:
    """The ASGI layer of the module docstring around ``app``."""

    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.hosts = HostAllowList(answered_names(settings))

    def refusal(self, scope: Scope) -> Response | None:
        headers = Headers(scope=scope)
        path, method = scope["path"], scope["method"]
        if path not in ANY_HOST_PATHS and not self.hosts.allows(headers.get("host", "")):
            name = host_name(headers.get("host", "")) or "(none)"
            return _answer(path, 400, (
                f"This dashboard does not answer to the host name {name!r}: it answers to loopback "
                f"names and to those in DRAFTSCOPE_ALLOWED_HOSTS (draftscope serve --allowed-host). "
                f"If this is how people and tracers reach it, add {name!r} there; a page that is "
                "not this dashboard's (DNS rebinding) is refused on purpose."))
        if method not in SAFE_METHODS:
            reason = cross_site(headers)
            if reason is not None:
                return _answer(path, 403, (
                    f"Refused a cross-site {method} to {path}: {reason}. This dashboard takes form "
                    "posts only from its own pages; API clients and tracers send no Origin."))
            if path == INGEST_PATH and _media_type(headers) != "application/json":
                given = _media_type(headers) or "none"
                return _answer(path, 415, (
                    f"Ingest takes Content-Type: application/json only (this request's: {given}). "
                    "Send batches with the tracer's HTTP sink, or set the header."))
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith("/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers.setdefault(name, value)
                if not static:
                    headers.setdefault("cache-control", "no-store")
            await send(message)

        refused = self.refusal(scope)
        if refused is not None:
            await refused(scope, receive, send_with_headers)
        else:
            await self.app(scope, receive, send_with_headers)
