"""Read queries behind the pages and the JSON API."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from draftscope import models
from draftscope.facts_view import expected_draft_input_width
from draftscope_tracer.redact import redact_server_args

_RUNS = models.Run.__table__
_BATCHES = models.IngestBatch.__table__
RUN_LIST_COLUMNS = ("id", "engine", "engine_version", "source", "status", "started_at", "ended_at",
                    "algorithm", "target_path", "draft_path")


def _count(model: type, name: str) -> sa.Label:
    table = model.__table__
    return (sa.select(sa.func.count()).select_from(table).where(table.c.run_id == _RUNS.c.id)
            .scalar_subquery().label(f"{name}_count"))


def _batch_sum(column: str, name: str) -> sa.Label:
    """Rows a run received through batches: reads one row per batch, not one per record."""
    return (sa.select(sa.func.coalesce(sa.func.sum(_BATCHES.c[column]), 0))
            .where(_BATCHES.c.run_id == _RUNS.c.id).scalar_subquery().label(f"{name}_count"))


def list_runs(conn: sa.Connection, limit: int = 200) -> list[dict[str, Any]]:
    """The newest runs first, each with its record counts (requests, steps, samples, findings).

    Steps and samples are summed from ``ingest_batches`` (every writer records its row counts
    there), so the list stays fast while a run grows to millions of samples.
    """
    query = (sa.select(*(_RUNS.c[c] for c in RUN_LIST_COLUMNS), _count(models.Request, "requests"),
                       _batch_sum("step_rows", "steps"), _batch_sum("sample_rows", "samples"),
                       _count(models.Finding, "findings"))
             .order_by(_RUNS.c.started_at.desc()).limit(limit))
    return [dict(row) for row in conn.execute(query).mappings()]


SEVERITY_ORDER = ("error", "warning", "info")
_FINDINGS = models.Finding.__table__
_HEALTH = models.TracerHealth.__table__
_REQUESTS = models.Request.__table__
_STEPS = models.VerifyStep.__table__
_SAMPLES = models.TensorSample.__table__
COUNTERS = ("verify_ct", "accepted_drafts", "proposed_drafts")  # spec_* (SGLang) vs traced_*
MAX_REQUESTS_SHOWN = 1000


def get_run(conn: sa.Connection, run_id: str) -> dict[str, Any] | None:
    """Every stored field of the run, or None. ``server_args`` pass the tracer's allow-list on the way
    out, so a run stored before it (the whole ``vars(server_args)``, secrets included) shows none."""
    row = conn.execute(sa.select(_RUNS).where(_RUNS.c.id == run_id)).mappings().first()
    if row is None:
        return None
    run = dict(row)
    if run.get("server_args") is not None:
        run["server_args"] = redact_server_args(run["server_args"])
    return run


def run_findings(conn: sa.Connection, run_id: str) -> list[dict[str, Any]]:
    """The run's findings, errors first, then warnings, then info."""
    rank = sa.case({s: i for i, s in enumerate(SEVERITY_ORDER)}, value=_FINDINGS.c.severity,
                   else_=len(SEVERITY_ORDER))
    query = (sa.select(*(c for c in _FINDINGS.c if c.name != "run_id"))
             .where(_FINDINGS.c.run_id == run_id).order_by(rank, _FINDINGS.c.rule_id, _FINDINGS.c.id))
    return [dict(row) for row in conn.execute(query).mappings()]


def latest_health(conn: sa.Connection, run_id: str) -> dict[str, Any] | None:
    """The newest tracer health snapshot of the run (cumulative counters), or None."""
    query = (sa.select(_HEALTH.c.at, _HEALTH.c.drops, _HEALTH.c.errors, _HEALTH.c.heartbeats,
                       _HEALTH.c.disabled_probes, _HEALTH.c.queue_depth)
             .where(_HEALTH.c.run_id == run_id)
             .order_by(_HEALTH.c.at.desc(), _HEALTH.c.id.desc()).limit(1))
    row = conn.execute(query).mappings().first()
    return None if row is None else dict(row)


def _with_accept_stats(request: dict[str, Any]) -> dict[str, Any]:
    """Add ``mismatches`` (counters where SGLang's and the tracer's totals differ) and SGLang's
    mean accept length (``output_len / spec_verify_ct``, as SGLang's ``spec_accept_length``)."""
    request["mismatches"] = [c for c in COUNTERS if request[f"spec_{c}"] is not None
                             and request[f"traced_{c}"] is not None
                             and request[f"spec_{c}"] != request[f"traced_{c}"]]
    verify_ct, output_len = request["spec_verify_ct"], request["output_len"]
    request["spec_accept_length"] = output_len / verify_ct if verify_ct and output_len is not None else None
    return request


def step_stride(run: dict[str, Any]) -> int:
    """The run's ``DRAFTSCOPE_STEP_STRIDE``: a sampled request records every n-th verify step."""
    return max(1, int((run.get("tracer_config") or {}).get("step_stride") or 1))


def _with_completeness(request: dict[str, Any], stride: int) -> dict[str, Any]:
    """Add ``expected_steps`` (verify steps a sampled request records: one per ``stride`` of the
    tracer's own count) and ``missing_steps`` (how many of those the store lacks: dropped)."""
    traced = request.get("traced_verify_ct")
    expected = -(-traced // stride) if request.get("sampled") and traced else None
    request["expected_steps"] = expected
    request["missing_steps"] = max(0, expected - request["sampled_steps"]) if expected is not None else 0
    return request


def run_requests(conn: sa.Connection, run_id: str, stride: int = 1,
                 limit: int = MAX_REQUESTS_SHOWN) -> list[dict[str, Any]]:
    """The run's requests in arrival order, with counter mismatches, mean accept lengths (SGLang's,
    and the tracer's over the sampled verify steps) and the steps the store lacks (``missing_steps``)."""
    mean_accept = sa.cast(sa.func.avg(_STEPS.c.accept_len), sa.Float)  # PostgreSQL: not Decimal
    steps = (sa.select(_STEPS.c.rid, mean_accept.label("traced_accept_length"),
                       sa.func.count().label("sampled_steps"))
             .where(_STEPS.c.run_id == run_id).group_by(_STEPS.c.rid).subquery())
    query = (sa.select(*(c for c in _REQUESTS.c if c.name not in ("id", "run_id")),
                       steps.c.traced_accept_length, sa.func.coalesce(steps.c.sampled_steps, 0)
                       .label("sampled_steps"))
             .select_from(_REQUESTS.outerjoin(steps, steps.c.rid == _REQUESTS.c.rid))
             .where(_REQUESTS.c.run_id == run_id)
             .order_by(_REQUESTS.c.started_at, _REQUESTS.c.id).limit(limit))
    return [_with_completeness(_with_accept_stats(dict(row)), stride) for row in conn.execute(query).mappings()]


def orphan_requests(conn: sa.Connection, run_id: str) -> list[dict[str, Any]]:
    """Request ids with verify steps but no request row: still running, or their finish record was
    dropped. Each with its stored steps (count, first and last index) and when the first was taken."""
    rows = sa.select(_REQUESTS.c.rid).where(_REQUESTS.c.run_id == run_id)
    query = (sa.select(_STEPS.c.rid, sa.func.count().label("sampled_steps"),
                       sa.func.min(_STEPS.c.step_index).label("first_step"),
                       sa.func.max(_STEPS.c.step_index).label("last_step"),
                       sa.func.min(_STEPS.c.at).label("first_at"))
             .where(_STEPS.c.run_id == run_id, _STEPS.c.rid.not_in(rows))
             .group_by(_STEPS.c.rid).order_by(sa.func.min(_STEPS.c.at)).limit(MAX_REQUESTS_SHOWN))
    return [dict(row) for row in conn.execute(query).mappings()]


def incomplete_requests(conn: sa.Connection, run_id: str) -> list[dict[str, Any]]:
    """Requests the store holds only part of: sampled ones that lack some of their verify steps
    (``missing_steps`` > 0), then ids with steps but no request row (``row_missing``)."""
    run = get_run(conn, run_id)
    if run is None:
        return []
    partial = [{"rid": r["rid"], "row_missing": False, "sampled_steps": r["sampled_steps"],
                "expected_steps": r["expected_steps"], "missing_steps": r["missing_steps"]}
               for r in run_requests(conn, run_id, step_stride(run)) if r["missing_steps"]]
    orphans = [{"rid": o["rid"], "row_missing": True, "sampled_steps": o["sampled_steps"],
                "expected_steps": None, "missing_steps": None} for o in orphan_requests(conn, run_id)]
    return partial + orphans


def last_batch_at(conn: sa.Connection, run_id: str) -> float | None:
    """When the run's newest batch was stored (a ``running`` run silent for long has lost its tracer)."""
    return conn.execute(sa.select(sa.func.max(_BATCHES.c.received_at))
                        .where(_BATCHES.c.run_id == run_id)).scalar()


def get_request(conn: sa.Connection, run_id: str, rid: str) -> dict[str, Any] | None:
    """One request of the run with its counter mismatches, or None."""
    query = (sa.select(*(c for c in _REQUESTS.c if c.name not in ("id", "run_id")))
             .where(_REQUESTS.c.run_id == run_id, _REQUESTS.c.rid == rid))
    row = conn.execute(query).mappings().first()
    return None if row is None else _with_accept_stats(dict(row))


def request_steps(conn: sa.Connection, run_id: str, rid: str) -> list[dict[str, Any]]:
    """The request's sampled verify steps in order."""
    query = (sa.select(*(c for c in _STEPS.c if c.name not in ("id", "run_id", "rid")))
             .where(_STEPS.c.run_id == run_id, _STEPS.c.rid == rid).order_by(_STEPS.c.step_index))
    return [dict(row) for row in conn.execute(query).mappings()]


def request_samples(conn: sa.Connection, run_id: str, rid: str) -> list[dict[str, Any]]:
    """The request's tensor samples by step, then time (the raw slice is left out)."""
    query = (sa.select(*(c for c in _SAMPLES.c if c.name not in ("id", "run_id", "rid", "raw_b64")))
             .where(_SAMPLES.c.run_id == run_id, _SAMPLES.c.rid == rid)
             .order_by(_SAMPLES.c.step_index, _SAMPLES.c.at, _SAMPLES.c.id))
    return [dict(row) for row in conn.execute(query).mappings()]


class NotFound(LookupError):
    """No such run or request; the message says what was asked for and where to look."""


def run_view(conn: sa.Connection, run_id: str) -> dict[str, Any]:
    """Everything the run page shows (and ``GET /api/v1/runs/{run_id}`` returns)."""
    run = get_run(conn, run_id)
    if run is None:
        raise NotFound(f"No run {run_id!r} is stored. The runs list at / shows every stored run; "
                       "a tracer's run appears there once its first batch has arrived.")
    return {"run": run, "findings": run_findings(conn, run_id), "health": latest_health(conn, run_id),
            "requests": run_requests(conn, run_id, step_stride(run)),
            "orphan_requests": orphan_requests(conn, run_id), "last_batch_at": last_batch_at(conn, run_id)}


def request_view(conn: sa.Connection, run_id: str, rid: str) -> dict[str, Any]:
    """Everything the request page shows (and its JSON twin returns)."""
    run = get_run(conn, run_id)
    if run is None:
        raise NotFound(f"No run {run_id!r} is stored, so it has no request {rid!r}. The runs list "
                       "at / shows every stored run.")
    request = get_request(conn, run_id, rid)
    steps, samples = request_steps(conn, run_id, rid), request_samples(conn, run_id, rid)
    if request is None and not (steps or samples):
        raise NotFound(f"Run {run_id!r} has no request {rid!r}. Its requests are listed on "
                       f"/runs/{run_id}.")
    if request is None:  # steps without their request row: shown, marked ``row_missing``
        request = _with_accept_stats({**{c.name: None for c in _REQUESTS.c if c.name not in ("id", "run_id")},
                                      "rid": rid, "row_missing": True})
    else:
        request["row_missing"] = False
    request["sampled_steps"] = len(steps)
    _with_completeness(request, step_stride(run))
    expected = expected_draft_input_width(run["facts"])
    for sample in samples:
        sample["width_mismatch"] = (sample["point"] == "draft.input" and expected is not None
                                    and sample["width"] != expected)
    return {"run": run, "request": request, "expected_draft_input_width": expected,
            "steps": steps, "samples": samples}
