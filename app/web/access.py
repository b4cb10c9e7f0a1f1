"""Who may read: the read token (``DRAFTSCOPE_READ_TOKEN``), separate from the ingest token.

When a read token is set, every route included with ``READ`` needs one of: ``Authorization: Bearer
<token>`` (API and CLI clients), HTTP Basic with the token as password (any user name), or the
cookie that the login page sets (a session in the store, ``draftscope.web.sessions``: HttpOnly,
SameSite=Strict, Secure over HTTPS; logout revokes it). A browser that asks for a page without it is
sent to ``/login``; anything else gets 401 with what to send. Wrong tokens at the login page are
slowed per client (``draftscope.web.login_throttle``). Open to all: ``/healthz``, ``/static``, the login
page itself and ingest (which has its own token).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Annotated
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response

from draftscope.web import sessions
from draftscope.web.templating import templates

COOKIE = "draftscope_read"
LOGIN = "/login"
NEEDS_TOKEN = ("This dashboard needs its read token (DRAFTSCOPE_READ_TOKEN): send 'Authorization: "
               "Bearer <token>' (or HTTP Basic with the token as password), or log in at /login.")

router = APIRouter()


class NeedsLogin(Exception):
    """A read without a valid credential; ``web`` answers it with a redirect or a 401."""


def _same(given: str, expected: str) -> bool:
    return secrets.compare_digest(given.encode(), expected.encode())


def _header_token(request: Request) -> str | None:
    """The token of a Bearer header, or the password of a Basic one."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return None
    return None


def is_reader(request: Request) -> bool:
    """True when no read token is set, or the request carries it (header or login cookie)."""
    token = request.app.state.settings.read_token
    if token is None:
        return True
    given = _header_token(request)
    if given is not None and _same(given, token):
        return True
    cookie = request.cookies.get(COOKIE)
    return cookie is not None and sessions.is_valid(request.app.state.engine, cookie, token)


def require_reader(request: Request) -> None:
    """The dependency of every read route (``READ``)."""
    if not is_reader(request):
        raise NeedsLogin()


READ = Depends(require_reader)


def _wants_page(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def refusal(request: Request) -> Response:
    """A browser navigation goes to the login page and back; htmx is told to go there; anything
    else gets 401 (JSON, or text for ``/metrics``) naming what to send."""
    back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    login = f"{LOGIN}?next={quote(back, safe='')}"
    if request.headers.get("hx-request"):
        return Response(status_code=401, headers={"HX-Redirect": login})
    if request.method == "GET" and _wants_page(request):
        return RedirectResponse(login, status_code=303)
    headers = {"WWW-Authenticate": 'Bearer realm="draftscope"'}
    if request.url.path == "/metrics":
        return PlainTextResponse(NEEDS_TOKEN + "\n", status_code=401, headers=headers)
    return JSONResponse({"error": NEEDS_TOKEN}, status_code=401, headers=headers)


def _local(target: str | None) -> str:
    """``target`` when it is a path on this dashboard, else ``/`` (no open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    parts = urlsplit(target)
    return "/" if parts.scheme or parts.netloc else target


def _login_page(request: Request, next_path: str, error: str | None, status: int = 200,
                headers: dict[str, str] | None = None) -> Response:
    # 200 with the error shown, also for a wrong token: the form is the answer, not a failed load.
    return templates.TemplateResponse(request, "login.html", {"next": next_path, "error": error},
                                      status_code=status, headers=headers)


def _client(request: Request) -> str:
    """The client's address (the proxy's X-Forwarded-For where uvicorn trusts the proxy)."""
    return request.client.host if request.client else "unknown"


@router.get(LOGIN)
def login_form(request: Request, next: str = "/") -> Response:
    """The login page: one field, the read token."""
    return _login_page(request, _local(next), None)


@router.post(LOGIN)
def login(request: Request, token: Annotated[str, Form()] = "",
          next: Annotated[str, Form()] = "/") -> Response:
    """Check the token (not before the client's wait after wrong ones is over); on success start a
    session, set its cookie and go back to ``next``."""
    expected = request.app.state.settings.read_token
    target = _local(next)
    if expected is None:
        return RedirectResponse(target, status_code=303)
    client, tries = _client(request), request.app.state.login_throttle
    wait_s = tries.wait_s(client)
    if wait_s == 0 and _same(token, expected):
        tries.right(client)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, sessions.start(request.app.state.engine, expected),
                            max_age=sessions.MAX_AGE_S, path="/", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response
    if wait_s == 0:
        wait_s = tries.wrong(client)
        if wait_s == 0:
            return _login_page(request, target, "That is not this dashboard's read token.")
    return _login_page(request, target, f"Too many wrong tokens from {client}: try again in {wait_s} s.",
                       status=429, headers={"Retry-After": str(wait_s)})


@router.post("/logout")
def logout(request: Request) -> Response:
    """End this browser's session (in the store: every dashboard process forgets it) and show the
    login page."""
    token, cookie = request.app.state.settings.read_token, request.cookies.get(COOKIE)
    if token is not None and cookie is not None:
        sessions.end(request.app.state.engine, cookie, token)
    response = RedirectResponse(LOGIN, status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
    return response
