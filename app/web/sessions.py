"""Login sessions: what the login page's cookie holds, kept in the store so that logout revokes it.

The cookie is ``<session id>.<HMAC of the id under the read token>``. The store keeps the sha256 of
the id (``login_sessions``), never the id, with an expiry; a session is valid while its row exists
and has not expired. So logout (the row deleted) ends it on every dashboard process sharing the
store, a new read token ends every session (the HMAC no longer matches), and a forged cookie is
refused without a query. Expiry is absolute (``MAX_AGE_S`` after login): a read never writes, so
use does not extend it. Expired rows are deleted at the next login.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

import sqlalchemy as sa

from draftscope.store.tables import SESSIONS

MAX_AGE_S = 7 * 24 * 3600


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def _mac(session_id: str, read_token: str) -> str:
    return hmac.new(read_token.encode(), b"draftscope session v2|" + session_id.encode(),
                    hashlib.sha256).hexdigest()


def start(engine: sa.Engine, read_token: str, now: float | None = None) -> str:
    """A new session (expired ones deleted on the way); returns the cookie value."""
    now = time.time() if now is None else now
    session_id = secrets.token_urlsafe(32)
    with engine.begin() as conn:
        conn.execute(SESSIONS.delete().where(SESSIONS.c.expires_at <= now))
        conn.execute(SESSIONS.insert().values(id=_digest(session_id), created_at=now,
                                               expires_at=now + MAX_AGE_S))
    return f"{session_id}.{_mac(session_id, read_token)}"


def _session_id(cookie: str, read_token: str) -> str | None:
    """The session id of a well-formed cookie signed with ``read_token``, else None."""
    session_id, dot, mac = cookie.partition(".")
    if not dot or not session_id:
        return None
    return session_id if secrets.compare_digest(mac.encode(), _mac(session_id, read_token).encode()) else None


def is_valid(engine: sa.Engine, cookie: str, read_token: str, now: float | None = None) -> bool:
    """True for the cookie of a session that was started, not ended and has not expired."""
    session_id = _session_id(cookie, read_token)
    if session_id is None:
        return False
    now = time.time() if now is None else now
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.literal(1)).where(
            SESSIONS.c.id == _digest(session_id), SESSIONS.c.expires_at > now)).first() is not None


def end(engine: sa.Engine, cookie: str, read_token: str) -> None:
    """Revoke the session of ``cookie`` (nothing for a cookie that names none)."""
    session_id = _session_id(cookie, read_token)
    if session_id is not None:
        with engine.begin() as conn:
            conn.execute(SESSIONS.delete().where(SESSIONS.c.id == _digest(session_id)))
