"""Store one wire batch: validate it, then write all of it in one transaction, or nothing.

Rows follow ``draftscope_tracer.transport.wire.TABLE_COLUMNS`` (as the tracer's direct SQLite sink writes them:
one column per record field, absent fields NULL, JSON columns as JSON text, the run named by its id or,
in ``verify_steps`` and ``tensor_samples``, its integer key) and go in with one DBAPI ``executemany`` per
table (PostgreSQL: one ``COPY``); runs and requests are upserts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson
import pydantic
import pydantic_core
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from draftscope.redact import redact_batch
from draftscope.store.ingest_checks import MAX_JSON_DEPTH, Refused, check_batch
from draftscope.store.queries import safe_run
from draftscope.store.stats import PG_WRITE_LOCK
from draftscope.store.tables import BATCHES, REQUESTS, RUNS
from draftscope.store.wire_schema import (SUPPORTED_SCHEMA_VERSIONS, TRACER_STATUSES, Batch, FastBatch,
                                          PlainFastBatch, is_plain)
from draftscope_tracer.transport import wire

MAX_ERRORS_SHOWN = 5
_REQUEST_FIELDS = [c for c in wire.TABLE_COLUMNS["requests"] if c not in ("run_id", "rid")]


try:  # COPY runs on psycopg's own connection: its errors reach us unwrapped
    from psycopg import IntegrityError as _PsycopgIntegrityError

    _DRIVER_INTEGRITY_ERRORS: tuple[type[Exception], ...] = (_PsycopgIntegrityError,)
except ImportError:  # a SQLite-only install (psycopg comes with the ``postgres`` extra)
    _DRIVER_INTEGRITY_ERRORS = ()

_DECODER = msgspec.json.Decoder(FastBatch)
_PLAIN_DECODER = msgspec.json.Decoder(PlainFastBatch)
_JSON_AT = {table: [i for i, c in enumerate(columns) if c in wire.JSON_COLUMNS]
            for table, columns in wire.TABLE_COLUMNS.items()}
_SHAPES = {"tensor_samples": wire.TABLE_COLUMNS["tensor_samples"].index("shape")}  # few distinct values


def _table_rows(run: str | int, records: list[msgspec.Struct], table: str) -> list[tuple[Any, ...]]:
    """Positional rows for ``table`` (columns of ``wire.TABLE_COLUMNS``), JSON columns as text.

    A record's fields are its table's columns after the run's (``run``: its id, or its key in the
    tables keyed so), in order (tests/test_wire_schema.py), so ``astuple`` gives a row; a sample's
    shape is serialised once per distinct shape."""
    astuple, dumps = msgspec.structs.astuple, orjson.dumps
    json_at, shape_at = _JSON_AT[table], _SHAPES.get(table)
    shapes: dict[tuple[int, ...], str] = {}
    rows = []
    for rec in records:
        row = [run, *astuple(rec)]
        for i in json_at:
            value = row[i]
            if value is None:
                continue
            if i == shape_at:
                key = tuple(value)
                text = shapes.get(key)
                if text is None:
                    text = shapes[key] = dumps(value).decode()
                row[i] = text
            else:
                row[i] = dumps(value).decode()
        rows.append(tuple(row))
    return rows


def _insert_many(conn: sa.Connection, table: str, rows: list[tuple[Any, ...]]) -> None:
    """INSERT positional ``rows``: one DBAPI ``executemany`` on SQLite, one ``COPY`` on PostgreSQL.

    This skips SQLAlchemy's per-row parameter processing, the bulk of the cost at tens of
    thousands of rows per second (hence JSON columns arrive serialised already).
    """
    columns = wire.TABLE_COLUMNS[table]
    if conn.dialect.name == "postgresql":
        with conn.connection.driver_connection.cursor() as cursor:
            with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        return
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['?'] * len(columns))})"
    conn.exec_driver_sql(sql, rows)


RUN_IDENTITY = ("engine", "engine_version", "source", "algorithm", "target_path", "target_arch",
                "target_config_hash", "draft_path", "draft_arch", "draft_config_hash")
"""What a run is: set by its first batch (or filled in by a later one while unset), never changed."""
RUN_FIRST_KEPT = ("started_at", "host", "pid", "server_args", "tracer_config")
"""Which process started it, with what: each process of a multi-process server (vLLM's engine core and
its worker) sends its own; the first one stored stays, later ones are ignored."""
_STATUS_RANK = {s: i for i, s in enumerate(TRACER_STATUSES)}  # running < ended < crashed


def _next_status(stored: str, sent: str) -> str:
    """A run's status after a batch says ``sent``: it only advances (running, then ended, then
    crashed: one process's crash outranks another's clean end); a status the server set (``pruning``:
    being deleted) or did not know stays."""
    if stored not in _STATUS_RANK:
        return stored
    return sent if _STATUS_RANK[sent] > _STATUS_RANK[stored] else stored


class IngestError(Exception):
    """A batch that cannot be stored; ``status`` is the HTTP status, the message says what to do."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class IngestResult:
    status: str  # "stored" | "duplicate"
    batch_id: str
    run_id: str
    rows: dict[str, int]


def parse_batch(body: bytes) -> Any:
    """Validate ``body`` against the wire schema and ``ingest_checks`` into a ``FastBatch``, or raise
    IngestError (400/422) naming the field.

    msgspec decodes valid bodies; a body it rejects goes through the pydantic ``Batch``, which
    names every wrong field, or accepts what only msgspec refuses (``NaN`` literals).
    """
    try:
        try:
            batch = (_PLAIN_DECODER if is_plain(body) else _DECODER).decode(body)
        except msgspec.DecodeError:  # includes msgspec.ValidationError
            batch = _parse_slow(body)
    except RecursionError:
        raise IngestError(422, f"Batch nests JSON too deep to read; values in run.server_args, "
                               f"run.tracer_config, run.facts and findings[].evidence may nest "
                               f"{MAX_JSON_DEPTH} levels at most. Nothing was stored.") from None
    if batch.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        raise _unsupported_version(batch.schema_version)
    try:
        check_batch(batch)
    except Refused as exc:
        raise IngestError(422, f"Batch does not match the wire schema: {exc}. Nothing was stored; "
                               "fix the named field (see docs/tracer.md, \"What a tracer may send\").") from None
    return batch


def _parse_slow(body: bytes) -> Any:
    try:
        Batch.model_validate_json(body)
    except pydantic.ValidationError as exc:
        raise _explain(exc, body) from None
    try:
        return msgspec.convert(pydantic_core.from_json(body, allow_inf_nan=True), FastBatch)
    except msgspec.ValidationError as exc:  # e.g. an integer beyond 64 bits
        raise IngestError(422, f"Batch does not match the wire schema: {exc}. Nothing was "
                               "stored; fix the named field (see draftscope_tracer/transport/wire.py).") from None


def _explain(exc: pydantic.ValidationError, body: bytes) -> IngestError:
    errors = exc.errors(include_url=False, include_input=False)
    if errors[0]["type"] == "json_invalid":
        return IngestError(400, f"Request body is not valid JSON: {errors[0]['msg']}. Nothing was "
                                "stored; send one JSON object per batch (see draftscope_tracer/transport/wire.py).")
    parsed = pydantic_core.from_json(body, allow_inf_nan=True)
    if isinstance(parsed, dict) and "schema_version" in parsed \
            and parsed["schema_version"] not in SUPPORTED_SCHEMA_VERSIONS:
        return _unsupported_version(parsed["schema_version"])
    shown = "; ".join(f"{_path(e['loc'])}: {e['msg']}" for e in errors[:MAX_ERRORS_SHOWN])
    more = f" (and {len(errors) - MAX_ERRORS_SHOWN} more)" if len(errors) > MAX_ERRORS_SHOWN else ""
    return IngestError(422, f"Batch does not match the wire schema: {shown}{more}. "
                            "Nothing was stored; fix the named fields (see draftscope_tracer/transport/wire.py).")


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(batch)"


def _unsupported_version(version: Any) -> IngestError:
    supported = ", ".join(map(str, SUPPORTED_SCHEMA_VERSIONS))
    return IngestError(422, f"Unsupported schema_version {version!r}; this draftscope accepts "
                            f"schema_version {supported}. Upgrade the dashboard or the tracer so "
                            "that they match.")


class BatchWriter:
    """Writes batches into one store; on SQLite one writer at a time (``BEGIN IMMEDIATE``)."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        dialects = {"sqlite": sqlite, "postgresql": postgresql}
        if engine.dialect.name not in dialects:
            raise ValueError(f"draftscope stores into SQLite or PostgreSQL, not {engine.dialect.name}")
        self._insert = dialects[engine.dialect.name].insert
        self._lock = threading.Lock() if engine.dialect.name == "sqlite" else None

    def write(self, body: bytes) -> IngestResult:
        """Validate and store one batch body; raises IngestError with nothing stored."""
        batch = parse_batch(body)
        with self.transaction() as conn:
            result = self.store(conn, batch)
            if result.status == "duplicate":
                conn.rollback()
            return result

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """One write transaction (SQLite: ``BEGIN IMMEDIATE``, one writer at a time): commits on
        exit, rolls back on an exception. Several ``store`` calls inside it are all or nothing."""
        with self._lock or nullcontext():
            with self.engine.connect().execution_options(draftscope_write=True) as conn, conn.begin():
                if conn.dialect.name == "postgresql":  # the stats' id bound waits for writers in flight
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock_shared(PG_WRITE_LOCK)))
                yield conn

    def store(self, conn: sa.Connection, batch: Any) -> IngestResult:
        """Write one parsed batch inside ``conn``'s transaction. On a "duplicate" result the caller
        rolls back (the run may already have been upserted)."""
        batch = redact_batch(batch)  # credentials out of its free text, whatever tracer sent it
        counts = {table: len(getattr(batch, key)) for key, table in wire.RECORD_TABLES.items()}
        if batch.run is not None:
            key = self._upsert_run(conn, batch.run_id, msgspec.structs.asdict(batch.run))
        else:
            key = conn.execute(sa.select(RUNS.c.key).where(RUNS.c.id == batch.run_id)).scalar()
        if key is None:
            if self._is_duplicate(conn, batch.batch_id):
                return IngestResult("duplicate", batch.batch_id, batch.run_id, counts)
            raise IngestError(404, f"Unknown run_id {batch.run_id!r}: no run with that id is "
                                   "stored. Send the run record first (a batch with \"run\" set).")
        rows = {table: _table_rows(key if wire.TABLE_COLUMNS[table][0] == "run_key" else batch.run_id,
                                   getattr(batch, name), table)
                for name, table in wire.RECORD_TABLES.items()}
        if not self._claim_batch(conn, batch, counts):
            return IngestResult("duplicate", batch.batch_id, batch.run_id, counts)
        self._upsert_requests(conn, rows.pop("requests"))
        try:
            for table, table_rows in rows.items():
                if table_rows:
                    _insert_many(conn, table, table_rows)
        except (sa.exc.IntegrityError, *_DRIVER_INTEGRITY_ERRORS) as exc:
            raise IngestError(409, "Batch conflicts with stored data (a verify step "
                                   "(rid, step_index) sent twice?): "
                                   f"{getattr(exc, 'orig', exc)}. Nothing was stored.") from None
        return IngestResult("stored", batch.batch_id, batch.run_id, counts)

    def _is_duplicate(self, conn: sa.Connection, batch_id: str) -> bool:
        query = sa.select(BATCHES.c.batch_id).where(BATCHES.c.batch_id == batch_id)
        return conn.execute(query).first() is not None

    def _claim_batch(self, conn: sa.Connection, batch: Any, counts: dict[str, int]) -> bool:
        """Record the batch id; False when it was already stored."""
        stmt = self._insert(BATCHES).values(
            batch_id=batch.batch_id, run_id=batch.run_id, sent_at=batch.sent_at,
            received_at=time.time(), request_rows=counts["requests"],
            step_rows=counts["verify_steps"], sample_rows=counts["tensor_samples"],
            health_rows=counts["tracer_health"], finding_rows=counts["findings"],
        ).on_conflict_do_nothing(index_elements=["batch_id"]).returning(BATCHES.c.batch_id)
        return conn.execute(stmt).first() is not None

    def _upsert_run(self, conn: sa.Connection, run_id: str, record: dict[str, Any]) -> int:
        """Insert the run, or update it as ``RUN_IDENTITY``, ``RUN_FIRST_KEPT`` and ``_next_status`` say:
        identity fields are fixed by the first batch that sets them (another value: 409 naming the
        field), process fields keep their first value, ``facts`` gain new keys only, the status only
        advances. Returns the run's key; raises IngestError(409).

        ``server_args`` and ``tracer_config`` pass the tracer's allow-lists here too: a tracer from
        before them sends them whole."""
        record = safe_run(record)
        inserted = conn.execute(self._insert(RUNS).values(id=run_id, **record)
                                .on_conflict_do_nothing(index_elements=["id"]).returning(RUNS.c.key)).scalar()
        if inserted is not None:
            return inserted
        stored = conn.execute(sa.select(RUNS).where(RUNS.c.id == run_id).with_for_update()).one()
        changes: dict[str, Any] = {}
        for field in RUN_IDENTITY:
            new, old = record.get(field), getattr(stored, field)
            if new is not None and old is not None and new != old:
                raise IngestError(409, f"run.{field}: run {run_id} was recorded with {field} {old!r}, "
                                       f"this batch says {new!r}. A run's identity is fixed by its first "
                                       "batch; a different server or model is a new run (a new run_id). "
                                       "Nothing was stored.")
        for field in (*RUN_IDENTITY, *RUN_FIRST_KEPT):
            if record.get(field) is not None and getattr(stored, field) is None:
                changes[field] = record[field]
        status = _next_status(stored.status, record["status"])
        if status != stored.status:
            changes["status"] = status
        if record.get("ended_at") is not None and (status != stored.status or stored.ended_at is None) \
                and status in ("ended", "crashed"):
            changes["ended_at"] = record["ended_at"]
        if record.get("facts"):
            facts = {**record["facts"], **(stored.facts or {})}
            if facts != stored.facts:
                changes["facts"] = facts
        if changes:
            conn.execute(RUNS.update().where(RUNS.c.id == run_id).values(**changes))
        return stored.key

    def _upsert_requests(self, conn: sa.Connection, rows: list[tuple[Any, ...]]) -> None:
        """Upsert by (run_id, rid); a later non-null field overwrites, within the batch too."""
        if not rows:
            return
        columns = wire.TABLE_COLUMNS["requests"]
        merged: dict[str, dict[str, Any]] = {}
        for row in (dict(zip(columns, values)) for values in rows):
            prior = merged.get(row["rid"])
            merged[row["rid"]] = row if prior is None else \
                {k: (v if v is not None else prior[k]) for k, v in row.items()}
        stmt = self._insert(REQUESTS)
        stmt = stmt.on_conflict_do_update(
            index_elements=["run_id", "rid"],
            set_={c: sa.func.coalesce(stmt.excluded[c], REQUESTS.c[c]) for c in _REQUEST_FIELDS},
        )
        conn.execute(stmt, list(merged.values()))
