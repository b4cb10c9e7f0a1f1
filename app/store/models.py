"""Store tables: one per record kind of ``draftscope_tracer.transport.wire``, same table and column names.

``runs.id`` is the wire ``run_id``; record tables have an integer primary key and a foreign key to
their run: ``run_id``, or in the two largest tables (``verify_steps``, ``tensor_samples``) ``run_key``,
the run's integer ``runs.key`` (4 bytes in a row and in its index entry where the id takes 33).
``ingest_batches`` remembers every batch id so that a batch sent twice is stored once.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlmodel import Field, SQLModel


def _json(nullable: bool = True) -> Any:
    return Field(default=None, sa_type=sa.JSON, nullable=nullable)


def _str(nullable: bool = True, **kw: Any) -> Any:
    return Field(default=None, sa_type=sa.String, nullable=nullable, **kw)


def _run_fk() -> Any:
    return Field(sa_type=sa.String, nullable=False, foreign_key="runs.id", ondelete="CASCADE")


def _run_key_fk() -> Any:
    return Field(nullable=False, foreign_key="runs.key", ondelete="CASCADE")


class NextRunKey(sa.sql.expression.ColumnElement):
    """A new run's ``key``: PostgreSQL's identity (concurrent writers), on SQLite one more than the
    largest (its writers take turns). Runs are inserted one at a time."""

    type = sa.Integer()
    inherit_cache = True


@compiles(NextRunKey, "postgresql")
def _next_run_key_pg(_element: NextRunKey, _compiler: Any, **_kw: Any) -> str:
    return "DEFAULT"


@compiles(NextRunKey, "sqlite")
def _next_run_key_sqlite(_element: NextRunKey, _compiler: Any, **_kw: Any) -> str:
    return "(SELECT COALESCE(MAX(key), 0) + 1 FROM runs)"


class Run(SQLModel, table=True):
    """One tracer attach session (or one imported bundle); the wire ``RunRecord`` plus its id, and its
    ``key``: the store's own, which ``verify_steps`` and ``tensor_samples`` name the run by (never shown)."""

    __tablename__ = "runs"
    __table_args__ = (sa.Index("ix_runs_started_at", "started_at"), sa.Index("uq_runs_key", "key", unique=True))

    id: str = Field(sa_type=sa.String, primary_key=True)
    engine: str = _str(nullable=False)
    engine_version: str = _str(nullable=False)
    source: str = _str(nullable=False)
    status: str = _str(nullable=False)
    started_at: float = Field(nullable=False)
    ended_at: float | None = None
    host: str | None = _str()
    pid: int | None = None
    algorithm: str | None = _str()
    target_path: str | None = _str()
    target_arch: str | None = _str()
    target_config_hash: str | None = _str()
    draft_path: str | None = _str()
    draft_arch: str | None = _str()
    draft_config_hash: str | None = _str()
    server_args: dict | None = _json()
    tracer_config: dict | None = _json()
    facts: dict | None = _json()
    key: int | None = Field(default=None, nullable=False, sa_column_kwargs={"default": NextRunKey()})


REQUEST_SORT_COLUMNS = ("started_at", "finished_at", "prompt_len", "output_len", "spec_verify_ct",
                        "finish_reason")
# SGLang's accept length of a request, as the requests table sorts and filters by it: the query
# uses this very text (no bound parameter), so that SQLite and PostgreSQL match it to its index.
ACCEPT_LENGTH_SQL = "CAST(output_len AS FLOAT) / NULLIF(spec_verify_ct, 0)"


class Request(SQLModel, table=True):
    """One request of a run, upserted by (run_id, rid)."""

    __tablename__ = "requests"
    __table_args__ = (
        sa.Index("uq_requests_run_rid", "run_id", "rid", unique=True),
        # The requests table's sort keys (queries.REQUEST_SORTS; rid has the index above): one page
        # of a 100,000-request run is read in index order, not sorted whole.
        *(sa.Index(f"ix_requests_run_{k}", "run_id", k) for k in REQUEST_SORT_COLUMNS),
        sa.Index("ix_requests_run_accept_length", "run_id", sa.text(f"({ACCEPT_LENGTH_SQL})")),
    )

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = _run_fk()
    rid: str = _str(nullable=False)
    sampled: bool | None = None
    prompt_len: int | None = None
    prompt_key: str | None = _str()  # the same prompt, within one tracer process (tracer/engine/prompt_key.py)
    output_len: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = _str()
    spec_verify_ct: int | None = None
    spec_accepted_drafts: int | None = None
    spec_proposed_drafts: int | None = None
    traced_verify_ct: int | None = None
    traced_accepted_drafts: int | None = None
    traced_proposed_drafts: int | None = None


class VerifyStep(SQLModel, table=True):
    """One verify step of one sampled request."""

    __tablename__ = "verify_steps"
    __table_args__ = (
        sa.Index("uq_verify_steps_run_rid_step", "run_key", "rid", "step_index", unique=True),
    )

    id: int | None = Field(default=None, primary_key=True)
    run_key: int = _run_key_fk()
    rid: str = _str(nullable=False)
    step_index: int = Field(nullable=False)
    at: float = Field(nullable=False)
    seq_pos: int | None = None
    drafted_tokens: list = _json(nullable=False)
    accept_len: int = Field(nullable=False)
    accept_flags: list = _json(nullable=False)
    bonus_token: int | None = None
    draft_topk: list | None = _json()
    target_topk: list | None = _json()
    tree_parents: list | None = _json()  # a tree's drafted nodes' parents (0: the verified token); null: a chain


class TensorSample(SQLModel, table=True):
    """Summary statistics of one tensor at one named sample point."""

    __tablename__ = "tensor_samples"
    __table_args__ = (sa.Index("ix_tensor_samples_run_rid_step", "run_key", "rid", "step_index"),)

    id: int | None = Field(default=None, primary_key=True)
    run_key: int = _run_key_fk()
    point: str = _str(nullable=False)
    phase: str = _str(nullable=False)
    at: float = Field(nullable=False)
    rid: str | None = _str()
    step_index: int | None = None
    shape: list = _json(nullable=False)
    dtype: str = _str(nullable=False)
    width: int = Field(nullable=False)
    rows: int = Field(nullable=False)
    l2_mean: float | None = None
    l2_max: float | None = None
    mean: float | None = None
    std: float | None = None
    absmax: float | None = None
    nan_count: int | None = None
    inf_count: int | None = None
    raw_b64: str | None = Field(default=None, sa_type=sa.Text)
    raw_shape: list | None = _json()


class TracerHealth(SQLModel, table=True):
    """A cumulative snapshot of the tracer's own health."""

    __tablename__ = "tracer_health"
    __table_args__ = (sa.Index("ix_tracer_health_run_at", "run_id", "at"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = _run_fk()
    at: float = Field(nullable=False)
    drops: dict = _json(nullable=False)
    errors: dict = _json(nullable=False)
    heartbeats: dict = _json(nullable=False)
    disabled_probes: list = _json(nullable=False)
    queue_depth: int | None = None
    records_lost: int | None = None
    requests_lost: int | None = None
    lost_rids: list | None = _json()
    gaps: list | None = _json()


class Finding(SQLModel, table=True):
    """A diagnosis with a stable rule id."""

    __tablename__ = "findings"
    __table_args__ = (sa.Index("ix_findings_run_id", "run_id"),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = _run_fk()
    rule_id: str = _str(nullable=False)
    severity: str = _str(nullable=False)
    message: str = Field(sa_type=sa.Text, nullable=False)
    fix: str | None = Field(default=None, sa_type=sa.Text)
    evidence: dict | None = _json()
    source: str | None = _str()
    rid: str | None = _str()
    first_step: int | None = None
    at: float | None = None


class IngestBatch(SQLModel, table=True):
    """A batch already stored: its id makes ingest idempotent."""

    __tablename__ = "ingest_batches"
    __table_args__ = (sa.Index("ix_ingest_batches_run_received", "run_id", "received_at"),
                      sa.Index("ix_ingest_batches_received_at", "received_at"))

    batch_id: str = Field(sa_type=sa.String, primary_key=True)
    run_id: str = _run_fk()
    sent_at: float | None = None
    received_at: float = Field(nullable=False)
    request_rows: int = Field(nullable=False)
    step_rows: int = Field(nullable=False)
    sample_rows: int = Field(nullable=False)
    health_rows: int = Field(nullable=False)
    finding_rows: int = Field(nullable=False)


class BundleImport(SQLModel, table=True):
    """A trace bundle imported into this store: which run it holds, where it came from, its manifest."""

    __tablename__ = "bundle_imports"
    __table_args__ = (sa.Index("uq_bundle_imports_run_id", "run_id", unique=True),)

    sha256: str = Field(sa_type=sa.String, primary_key=True)  # of the bundle file
    run_id: str = _run_fk()
    origin: str = _str(nullable=False)  # the file name or upload it came from
    imported_at: float = Field(nullable=False)
    manifest: dict = _json(nullable=False)


class RunStats(SQLModel, table=True):
    """Per-run aggregates, maintained on arrival (``draftscope.store.stats``), read by the pages.

    Steps and samples are insert-only: rows with ``id`` above the watermarks ``step_id_max`` /
    ``sample_id_max`` are not yet counted. Request totals (upserted rows) are recomputed whole.
    ``batches_seen`` is the run's ``ingest_batches`` count at the last refresh.
    """

    __tablename__ = "run_stats"

    run_id: str = Field(sa_type=sa.String, primary_key=True, foreign_key="runs.id",
                        ondelete="CASCADE")
    batches_seen: int = Field(default=0, nullable=False)
    last_batch_at: float | None = None
    step_id_max: int = Field(default=0, nullable=False)
    sample_id_max: int = Field(default=0, nullable=False)
    t0: float | None = None  # time origin of the time bins
    time_bin_s: float = Field(default=1.0, nullable=False)
    seq_bin: int = Field(default=16, nullable=False)
    verify_steps: int = Field(default=0, nullable=False)
    accept_len_sum: int = Field(default=0, nullable=False)
    proposed: int = Field(default=0, nullable=False)
    accepted: int = Field(default=0, nullable=False)
    per_position: list = Field(default_factory=list, sa_type=sa.JSON, nullable=False)  # [[proposed, accepted], ...]
    max_seq_pos: int | None = None
    max_seq_pos_rid: str | None = _str()
    max_seq_pos_step: int | None = None
    traced_accept_length: float | None = None
    sglang_accept_length: float | None = None
    requests_count: int = Field(default=0, nullable=False)
    request_totals: dict = Field(default_factory=dict, sa_type=sa.JSON, nullable=False)
    updated_at: float | None = None


class RunStatBin(SQLModel, table=True):
    """One bucket of one per-run series: ``n`` rows, their ``total`` and, where kept, min and max.

    Series (``draftscope.store.stats``): ``steps.time`` and ``steps.seq_pos`` (n steps, total accept_len),
    ``steps.flags`` (key: the accept_flags pattern), ``steps.rid`` (key: rid; total accept_len, lo
    and hi the first and last step_index), ``widths`` (key ``point|phase``, bucket: width),
    ``norms.time`` (key: point; total, lo, hi of l2_mean), ``nonfinite`` (key: point),
    ``steps.topk_lost`` (key: ``part|rid``; n steps lacking that part of their top-k: topk_gaps),
    ``steps.orphan`` (key: rid; a set, n = 0: the rids with steps but no request row).
    """

    __tablename__ = "run_stat_bins"

    run_id: str = Field(sa_type=sa.String, primary_key=True, foreign_key="runs.id",
                        ondelete="CASCADE")
    series: str = Field(sa_type=sa.String, primary_key=True)
    key: str = Field(sa_type=sa.String, primary_key=True)
    bucket: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    n: int = Field(nullable=False)
    total: float = Field(default=0.0, nullable=False)
    lo: float | None = None
    hi: float | None = None


class LoginSession(SQLModel, table=True):
    """A browser logged in with the read token (``draftscope.web.sessions``): deleted at logout, void
    after ``expires_at``. ``id`` is the sha256 of the session id its cookie holds, never the id."""

    __tablename__ = "login_sessions"
    __table_args__ = (sa.Index("ix_login_sessions_expires_at", "expires_at"),)

    id: str = Field(sa_type=sa.String, primary_key=True)
    created_at: float = Field(nullable=False)
    expires_at: float = Field(nullable=False)


RECORD_MODELS: dict[str, type[SQLModel]] = {
    m.__tablename__: m for m in (Request, VerifyStep, TensorSample, TracerHealth, Finding)
}
