"""Diagnose a stored run from its aggregates and replace its findings with the fresh diagnosis."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import sqlalchemy as sa

from draftscope.findings import Finding, runtime_findings, static_findings
from draftscope.spec import SpecError, TargetSpec, engines, read_draft, read_target
from draftscope.spec.block import model_dir
from draftscope.spec.draft import DraftFeatureSpec
from draftscope.spec.target import check_target_matches
from draftscope.store.imported_spec import imported_spec
from draftscope.store.stats import fold_run_stats, observation, update_run_stats
from draftscope.store.tables import BATCHES, FINDINGS, RUNS
from draftscope_tracer.redact import redact_server_args

RUN_LOCK_CLASS = 0x6473  # advisory lock (class, hashtext(run_id)): one refresh of a run at a time


def refresh_run(engine: sa.Engine, run_id: str) -> list[Finding] | None:
    """Fold the run's new rows into its aggregates (``draftscope.store.stats``), then diagnose it:
    runtime findings from the aggregates, plus static findings from the recorded draft and target
    directories when they are readable here (else from an imported bundle's feature spec).
    Replaces the run's static and runtime findings when they changed (tracer-recorded findings
    without a source stay).

    Returns the findings, or None when the run does not exist, when its batches carried findings
    of their own (an imported bundle: diagnosed once, on import), which are kept as they came, or
    when another dashboard process on the same PostgreSQL store is refreshing it right now
    (``_run_lock``: that refresh folds these batches; a later batch is seen by both processes'
    polls).
    """
    with _run_lock(engine, run_id) as mine:
        return _refresh(engine, run_id) if mine else None


@contextlib.contextmanager
def _run_lock(engine: sa.Engine, run_id: str) -> Iterator[bool]:
    """On PostgreSQL, a transaction-scoped advisory lock on ``run_id`` held on a connection of its
    own for the whole refresh; yields False, at once, when another process holds it. SQLite's
    writers are serialised by ``BEGIN IMMEDIATE``, and an unchanged diagnosis writes nothing."""
    if engine.dialect.name != "postgresql":
        yield True
        return
    with engine.connect() as conn, conn.begin():
        yield conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(
            RUN_LOCK_CLASS, sa.func.hashtext(run_id)))).scalar_one()


def _refresh(engine: sa.Engine, run_id: str) -> list[Finding] | None:
    update_run_stats(engine, run_id)
    with engine.connect() as conn:
        run = _run(conn, run_id)
        carried = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(BATCHES.c.finding_rows), 0))
                               .where(BATCHES.c.run_id == run_id)).scalar_one()
        imported = imported_spec(conn, run_id)
    if run is None or carried:
        return None
    spec, static = _static(run, imported)  # reads files: outside the write transaction
    with engine.connect().execution_options(draftscope_write=True) as conn, conn.begin():
        return _diagnose(conn, run, spec, static)


def analyze_in(conn: sa.Connection, run_id: str) -> list[Finding]:
    """``refresh_run`` inside the caller's write transaction ``conn`` (a bundle import: the run,
    its aggregates and findings commit together). Raises KeyError for an unknown run."""
    fold_run_stats(conn, run_id)
    run = _run(conn, run_id)
    if run is None:
        raise KeyError(f"no run {run_id!r} in the store")
    spec, static = _static(run, imported_spec(conn, run_id))
    return _diagnose(conn, run, spec, static)


def _run(conn: sa.Connection, run_id: str) -> Mapping[str, Any] | None:
    return conn.execute(sa.select(RUNS).where(RUNS.c.id == run_id)).mappings().first()


def _diagnose(conn: sa.Connection, run: Mapping[str, Any], spec: DraftFeatureSpec | None,
              static: list[Finding]) -> list[Finding]:
    static_ids = {f.rule_id for f in static}
    if "aux-convention-ambiguous" in static_ids:  # it already names both readings of the ids
        static_ids.add("captured-layers-differ")
    static_error = any(f.severity == "error" for f in static)
    obs = observation(conn, run["id"], run["facts"])
    obs.server_args = redact_server_args(run["server_args"] or {})  # e.g. --load-format dummy
    # A static finding already names the cause: drop the runtime echo of the same rule, and the
    # "quality, not plumbing" verdict when the plumbing is statically broken.
    findings = static + [f for f in runtime_findings(spec, obs) if f.rule_id not in static_ids
                         and not (static_error and f.rule_id == "acceptance-collapse-quality")]
    _replace_findings(conn, run["id"], findings)
    return findings


def _replace_findings(conn: sa.Connection, run_id: str, findings: list[Finding]) -> None:
    """Store ``findings`` as the run's static and runtime findings, unless they are stored already
    (so an unchanged diagnosis keeps its rows and their ``at``)."""
    mine = (FINDINGS.c.run_id == run_id, FINDINGS.c.source.in_(["static", "runtime"]))
    fields = ("rule_id", "severity", "message", "fix", "evidence", "source", "rid", "first_step")
    rows = [{"rule_id": f.rule_id, "severity": f.severity, "message": f.message, "fix": f.fix,
             "evidence": f.evidence, "source": f.source, "rid": f.evidence.get("rid"),
             "first_step": f.first_step} for f in findings]
    stored = conn.execute(sa.select(*(FINDINGS.c[k] for k in fields)).where(*mine)
                          .order_by(FINDINGS.c.id)).mappings().all()
    if _canonical(rows) == _canonical([dict(r) for r in stored]):
        return
    conn.execute(FINDINGS.delete().where(*mine))
    if rows:
        now = time.time()
        conn.execute(FINDINGS.insert(), [{**r, "run_id": run_id, "at": now} for r in rows])


def _canonical(rows: list[dict[str, Any]]) -> bytes | None:
    try:
        return orjson.dumps(rows, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        return None


def _static(run: Mapping[str, Any], imported: tuple[DraftFeatureSpec, TargetSpec] | None
            ) -> tuple[DraftFeatureSpec | None, list[Finding]]:
    """Static findings from the recorded draft and target directories when they are readable
    here, else from the feature spec an imported bundle carried."""
    facts = run["facts"] or {}
    draft_path = model_dir((facts.get("draft") or {}).get("path") or run["draft_path"])
    target_path = model_dir((facts.get("target") or {}).get("path") or run["target_path"])
    if draft_path and target_path:
        try:
            target = read_target(target_path)
            spec = read_draft(draft_path, target_layers=target.num_layers)
            check_target_matches(spec, target)
        except SpecError:
            return None, []
    elif imported is not None:
        spec, target = imported
    else:
        return None, []
    server_args = redact_server_args(run["server_args"] or {})
    server_args.setdefault("speculative_algorithm", run["algorithm"] or facts.get("algorithm"))
    env = facts.get("sglang_env") if isinstance(facts.get("sglang_env"), dict) else None
    exp = engines.expect(engines.engine_of(facts), spec, target, server_args, env)
    return spec, static_findings(spec, target, exp)
