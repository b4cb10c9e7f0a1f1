"""Engine creation and schema migration (Alembic, configured in code) for the store."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import draftscope.migrations
from draftscope_tracer.redact import scrub_text

MIGRATIONS_DIR = Path(draftscope.migrations.__file__).parent
log = logging.getLogger(__name__)


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def make_engine(url: str, autocheckpoint: bool = True) -> sa.Engine:
    """An engine for ``url``; SQLite files get WAL, a busy timeout, enforced foreign keys and (new
    ones) incremental auto-vacuum (``draftscope.store.retention`` gives freed pages back).

    Connections opened with ``execution_options(draftscope_write=True)`` begin SQLite
    transactions with ``BEGIN IMMEDIATE``. ``autocheckpoint=False`` leaves WAL checkpoints to a
    ``WalCheckpointer`` instead of the committing writer.
    """
    sa_url = sa.make_url(url)
    if sa_url.get_backend_name() != "sqlite":
        return sa.create_engine(url, json_serializer=_json_dumps, pool_pre_ping=True)
    if sa_url.database and sa_url.database != ":memory:" and not _is_uri(sa_url):
        Path(sa_url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, json_serializer=_json_dumps, connect_args={"timeout": 30})
    writable = not _is_uri(sa_url)

    @sa.event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        if writable and cur.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
            try:  # takes on a new file; on an old one at its next VACUUM
                cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
            except sqlite3.OperationalError:  # a full disk: reads must still work (the next connection tries)
                pass
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA cache_size=-65536")  # 64 MiB: index pages stay in memory under ingest
        if not autocheckpoint:
            cur.execute("PRAGMA wal_autocheckpoint=0")
        cur.close()
        dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)

    @sa.event.listens_for(engine, "begin")
    def _sqlite_begin(conn: sa.Connection) -> None:
        # Writers take the write lock up front, so a busy database waits instead of failing
        # when a read transaction would later need to become a write transaction.
        immediate = conn.get_execution_options().get("draftscope_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


class WalCheckpointer:
    """Copies a SQLite store's WAL back into the database from a thread of its own.

    With autocheckpoint off (``make_engine(url, autocheckpoint=False)``) commits stay short and
    the page copying, during which sqlite3 releases the GIL, runs beside the request thread. A
    checkpoint that fails (a full disk) is counted and logged, once per stretch of failures, and
    the thread keeps going; ``problem()`` says what fails while it does (``/healthz``).
    """

    def __init__(self, url: str, interval_s: float = 0.5):
        self.path = sa.make_url(url).database
        self.interval_s = interval_s
        self.errors = 0
        self.failing_since: float | None = None
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="draftscope-wal-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def problem(self) -> str | None:
        """What is failing, or None while checkpoints succeed."""
        since, error = self.failing_since, self.last_error
        if since is None:
            return None
        return (f"WAL checkpoints fail since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(since))} "
                f"({error}); the WAL file grows until one succeeds.")

    def _run(self) -> None:
        conn = None
        try:
            while not self._stop.wait(self.interval_s):
                conn = self._checkpoint(conn, "PASSIVE")
            self._checkpoint(conn, "TRUNCATE")
        finally:
            if conn is not None:
                conn.close()

    def _checkpoint(self, conn: sqlite3.Connection | None, mode: str) -> sqlite3.Connection | None:
        """One checkpoint; its failure counted and logged (the first of a stretch with its traceback).
        Returns the connection to use next (None: open one next time)."""
        try:
            if conn is None:
                conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
            if self.failing_since is not None:
                log.warning("draftscope: WAL checkpoints work again after %d failures", self.errors)
                self.failing_since = self.last_error = None
            return conn
        except Exception as exc:  # never dies: counted, logged, tried again at the next interval
            self.errors += 1
            self.last_error = failure_reason(exc)
            if self.failing_since is None:
                self.failing_since = time.time()
                log.exception("draftscope: WAL checkpoint (%s) of %s failed; retrying every %.1f s",
                              mode, self.path, self.interval_s)
            return conn


def _is_uri(sa_url: sa.URL) -> bool:
    """A SQLite ``file:`` URI (``sqlite:///file:PATH?mode=ro&uri=true``: a read-only store)."""
    return sa_url.query.get("uri") == "true"


def is_sqlite_file(url: str) -> bool:
    """A SQLite store in a file this process may checkpoint (not a ``file:`` URI, not in memory)."""
    sa_url = sa.make_url(url)
    return sa_url.get_backend_name() == "sqlite" and sa_url.database not in (None, "", ":memory:") \
        and not _is_uri(sa_url)


def alembic_config(url: str) -> Config:
    """Alembic configuration for ``url``, with the migrations shipped in ``draftscope.migrations``."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``"base"``: drop everything)."""
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    """The newest revision shipped with this version of draftscope."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None, f"no Alembic revisions under {MIGRATIONS_DIR}"
    return head


def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at; None when it has never been migrated."""
    if _missing_sqlite_file(url):
        return None
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def _missing_sqlite_file(url: str) -> bool:
    sa_url = sa.make_url(url)
    return (sa_url.get_backend_name() == "sqlite" and bool(sa_url.database)
            and sa_url.database != ":memory:" and not Path(sa_url.database).exists())


def failure_reason(exc: BaseException) -> str:
    """One line that says why ``exc`` happened, for pages and ``/healthz``: the database driver's own
    error where SQLAlchemy wraps one (``database or disk is full``), credentials scrubbed."""
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0][:300]
    return scrub_text(f"{type(cause).__name__}: {first}" if first else type(cause).__name__)


def display_url(url: str) -> str:
    """``url`` with any password hidden, for messages."""
    return sa.make_url(url).render_as_string(hide_password=True)


@dataclass(frozen=True)
class SchemaState:
    """Where a database stands against the migrations shipped with this draftscope."""

    url: str
    current: str | None
    head: str

    @property
    def ok(self) -> bool:
        return self.current == self.head

    def problem(self) -> str:
        """What is wrong and the command that fixes it ('' when the database is at head)."""
        if self.ok:
            return ""
        where = display_url(self.url)
        fix = f"Run: draftscope db upgrade --db '{where}'   (or start with: draftscope serve --upgrade)"
        if self.current is None:
            return (f"Database {where} has no draftscope schema (missing or never migrated; "
                    f"head is {self.head}).\n{fix}")
        return (f"Database {where} is at revision {self.current}, but this draftscope needs "
                f"revision {self.head}.\n{fix}")


def schema_state(url: str) -> SchemaState:
    """Compare the database at ``url`` with the head revision."""
    return SchemaState(url=url, current=current_revision(url), head=head_revision())
