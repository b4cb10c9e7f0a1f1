"""Read queries behind the pages and the JSON API."""

from __future__ import annotations

import base64
import math
import time
from typing import Any

import orjson
import sqlalchemy as sa

from draftscope import redact
from draftscope.spec.diff import expected_widths
from draftscope.store import models, retention, stats
from draftscope.store.tables import (BATCHES, BINS, FINDINGS, HEALTH, IMPORTS, REQUESTS, RUN_FIELDS, RUNS, SAMPLES,
                                     STATS, STEPS, of_run)
from draftscope_tracer.redact import redact_server_args, redact_tracer_config

SEVERITY_ORDER = ("error", "warning", "info")
COUNTERS = ("verify_ct", "accepted_drafts", "proposed_drafts")  # spec_* (SGLang) vs traced_*
MAX_REQUESTS_SHOWN = 1000
RUN_LIST_COLUMNS = ("id", "engine", "engine_version", "source", "status", "started_at", "ended_at",
                    "algorithm", "target_path", "draft_path")


def _count(model: type, name: str) -> sa.Label:
    table = model.__table__
    return (sa.select(sa.func.count()).select_from(table).where(table.c.run_id == RUNS.c.id)
            .scalar_subquery().label(f"{name}_count"))


def _batch_sum(column: str, name: str) -> sa.Label:
    """Rows a run received through batches: reads one row per batch, not one per record."""
    return (sa.select(sa.func.coalesce(sa.func.sum(BATCHES.c[column]), 0))
            .where(BATCHES.c.run_id == RUNS.c.id).scalar_subquery().label(f"{name}_count"))


class BadQuery(ValueError):
    """A sort key or filter the query does not know; the message lists the accepted values."""


def _pick(value: str, allowed: dict[str, Any], what: str) -> Any:
    if value not in allowed:
        raise BadQuery(f"Unknown {what} {value!r}; use one of: {', '.join(sorted(allowed))}.")
    return allowed[value]


def _severity_rank(column: sa.ColumnElement) -> sa.ColumnElement:
    return sa.case({s: i for i, s in enumerate(SEVERITY_ORDER)}, value=column,
                   else_=len(SEVERITY_ORDER))


def _worst(column: str) -> sa.ScalarSelect:
    return (sa.select(FINDINGS.c[column]).where(FINDINGS.c.run_id == RUNS.c.id)
            .order_by(_severity_rank(FINDINGS.c.severity), FINDINGS.c.id).limit(1).scalar_subquery())


LIVE_WINDOW_S = 60.0  # a running run is live while batches arrived this recently (health: every 10 s)
RUN_STATES = ("live", "stalled", "ended", "crashed", "imported")


def _last_batch() -> sa.ScalarSelect:
    return (sa.select(sa.func.max(BATCHES.c.received_at)).where(BATCHES.c.run_id == RUNS.c.id)
            .scalar_subquery())


def run_state(last: sa.ColumnElement, now: float | None = None) -> sa.ColumnElement:
    """The one definition of a run's state, for the runs list and the run page alike: crashed (also
    when imported), imported (a bundle), live (running, a batch within ``LIVE_WINDOW_S`` of ``now``),
    stalled (running, nothing since), else the stored status (ended). ``last``: the run's newest batch
    receipt."""
    now = time.time() if now is None else now
    return sa.case((RUNS.c.status == "crashed", "crashed"), (RUNS.c.source == "bundle", "imported"),
                   (sa.and_(RUNS.c.status == "running", last > now - LIVE_WINDOW_S), "live"),
                   (RUNS.c.status == "running", "stalled"), else_=RUNS.c.status)


def _latest_health(column: str) -> sa.ScalarSelect:
    return (sa.select(HEALTH.c[column]).where(HEALTH.c.run_id == RUNS.c.id)
            .order_by(HEALTH.c.at.desc(), HEALTH.c.id.desc()).limit(1).scalar_subquery())


def list_runs(conn: sa.Connection, *, sort: str = "started_at", desc: bool = True,
              status: str | None = None, q: str | None = None, engine: str | None = None,
              severity: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """Runs for the runs list: the columns of ``RUN_LIST_COLUMNS`` plus

    - ``requests_count``, ``steps_count``, ``samples_count``, ``findings_count`` (steps and samples
      summed from ``ingest_batches``: one row per batch, not per record);
    - ``mean_accept_length``: the tracer's, 1 + accepted drafts per sampled verify step;
      ``sglang_accept_length``: SGLang's, sum(output_len) / sum(spec_verify_ct) over requests
      (counts the prefill's token, see ``run_summary``); ``per_position``: acceptance rate per
      draft position 1..n (a list of floats); all three from ``run_stats``, None before any data;
    - ``worst_severity`` / ``worst_rule_id``: the most severe finding (None without findings);
    - ``last_batch_at``; ``state`` (``run_state``): live, stalled, ended, crashed or imported;
      ``live``: state == live;
    - ``dropped``: records the tracer dropped, all reasons (its latest health); ``requests_lost``:
      requests it saw whose record never reached the store (``run_gaps``).

    ``sort``: one of ``RUN_SORTS`` (nulls last either way, then by id); ``status``: one of
    ``RUN_STATES``; ``q``: case-insensitive substring of the id, engine, algorithm, host, target or
    draft path; ``engine``: one of ``ENGINES`` (the serving engine that recorded the run);
    ``severity``: one of ``SEVERITY_FILTERS`` (the worst finding's, ``none``: no finding).
    Raises BadQuery for an unknown sort, status, engine or severity. ``runs_page``: a page of them.
    """
    return [row for _, row in _select_runs(conn, sort=sort, desc=desc, status=status, q=q, engine=engine,
                                           severity=severity, limit=limit)]


SEVERITY_FILTERS = (*SEVERITY_ORDER, "none")
RUNS_PAGE_SIZE = 100  # runs per page of the runs list, its .json twin and GET /api/v1/runs
MAX_RUNS_PAGE = 1000


def runs_page(conn: sa.Connection, *, cursor: str | None = None, limit: int = RUNS_PAGE_SIZE,
              sort: str = "started_at", desc: bool = True,
              **filters: Any) -> tuple[list[dict[str, Any]], str | None]:
    """One page of ``list_runs``: at most ``limit`` runs after ``cursor`` (None: the first page), and
    the cursor of the next page (None on the last). A cursor is opaque: the sort, its direction and the
    last run's sort value and id (keyset paging: a run added meanwhile shifts no other onto the next
    page). Raises BadQuery for a cursor of another sort or one this code did not make."""
    after = _decode_cursor(cursor, sort, desc) if cursor else None
    keyed = _select_runs(conn, sort=sort, desc=desc, limit=limit + 1, after=after, **filters)
    if len(keyed) <= limit:
        return [row for _, row in keyed], None
    key, last = keyed[limit - 1]
    return [row for _, row in keyed[:limit]], _encode_cursor(sort, desc, key, last["id"])


def count_runs(conn: sa.Connection, **filters: Any) -> int:
    """How many runs ``list_runs`` would list with these filters (no sort, no limit)."""
    query = _runs_query(**filters, sort="id", desc=False)[0]
    return conn.execute(sa.select(sa.func.count()).select_from(query.order_by(None).subquery())).scalar_one()


def _encode_cursor(sort: str, desc: bool, key: Any, run_id: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([sort, desc, key, run_id])).decode().rstrip("=")


def _decode_cursor(cursor: str, sort: str, desc: bool) -> tuple[Any, str]:
    """(sort value, run id) after which the page starts; BadQuery when ``cursor`` is not one of ours
    or was made for another sort."""
    try:
        got = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        ok = (isinstance(got, list) and len(got) == 4 and isinstance(got[3], str)
              and (got[2] is None or isinstance(got[2], (str, int, float))))
    except (ValueError, orjson.JSONDecodeError):
        ok = False
    if not ok:
        raise BadQuery(f"cursor {cursor[:40]!r} is not a runs-list cursor: follow the next link "
                       "of a runs page, or leave cursor out for the first page.")
    if got[0] != sort or bool(got[1]) != desc:
        raise BadQuery(f"cursor was made for sort={got[0]} desc={int(bool(got[1]))}, not sort={sort} "
                       f"desc={int(desc)}: leave cursor out to start this sort from its first page.")
    return got[2], got[3]


def _runs_query(*, sort: str, desc: bool, status: str | None = None, q: str | None = None,
                engine: str | None = None, severity: str | None = None,
                after: tuple[Any, str] | None = None) -> tuple[sa.Select, sa.ColumnElement]:
    """The runs list's query (``list_runs``) and its sort key, filtered, ordered, after ``after``."""
    last = _last_batch()
    state = run_state(last)
    columns = {**{c: RUNS.c[c] for c in RUN_LIST_COLUMNS},
               "requests_count": _count(models.Request, "requests"),
               "steps_count": _batch_sum("step_rows", "steps"),
               "samples_count": _batch_sum("sample_rows", "samples"),
               "findings_count": _count(models.Finding, "findings"),
               "mean_accept_length": STATS.c.traced_accept_length,
               "sglang_accept_length": STATS.c.sglang_accept_length,
               "stats_per_position": STATS.c.per_position,
               "worst_severity": _worst("severity"), "worst_rule_id": _worst("rule_id"),
               "last_batch_at": last, "state": state,
               "drops": _latest_health("drops"), "requests_lost": _latest_health("requests_lost")}
    sorts = {k: columns[k] for k in RUN_SORTS}
    sorts["worst_severity"] = sa.case((columns["worst_severity"].is_(None), None),
                                      else_=-_severity_rank(columns["worst_severity"]))
    key = _pick(sort, sorts, "sort key")
    query = sa.select(*(c.label(k) for k, c in columns.items()), key.label("sort_key")).select_from(
        RUNS.outerjoin(STATS, STATS.c.run_id == RUNS.c.id)).where(RUNS.c.status != retention.PRUNING)
    query = query.order_by((key.desc() if desc else key.asc()).nulls_last(), RUNS.c.id)
    if status is not None:
        query = query.where(state == _pick(status, {s: s for s in RUN_STATES}, "run state"))
    if engine is not None:
        query = query.where(RUNS.c.engine == _pick(engine, {e: e for e in ENGINES}, "engine"))
    if severity is not None:
        worst = columns["worst_severity"]
        wanted = _pick(severity, {s: s for s in SEVERITY_FILTERS}, "severity")
        query = query.where(worst.is_(None) if wanted == "none" else worst == wanted)
    if q:
        needle = q.lower()
        query = query.where(sa.or_(*(sa.func.lower(RUNS.c[c]).contains(needle, autoescape=True)
                                     for c in ("id", "engine", "algorithm", "host", "target_path",
                                               "draft_path"))))
    if after is not None:  # the rows the order puts after (value, id): nulls last, ties by id
        value, run_id = after
        if value is None:
            query = query.where(key.is_(None), RUNS.c.id > run_id)
        else:
            beyond = key < value if desc else key > value
            query = query.where(sa.or_(beyond, sa.and_(key == value, RUNS.c.id > run_id), key.is_(None)))
    return query, key


def _select_runs(conn: sa.Connection, *, limit: int, **options: Any) -> list[tuple[Any, dict[str, Any]]]:
    """(sort value, runs-list row) of the runs ``_runs_query`` selects, at most ``limit``."""
    rows = []
    for row in conn.execute(_runs_query(**options)[0].limit(limit)).mappings():
        row = dict(row)
        key = row.pop("sort_key")
        row["per_position"] = [a / p if p else None for p, a in row.pop("stats_per_position") or []]
        row["live"] = row["state"] == "live"
        row["dropped"] = sum((row.pop("drops") or {}).values())
        row["requests_lost"] = row["requests_lost"] or 0
        rows.append((key, redact.redact_row(row, ("target_path", "draft_path"))))
    return rows


ENGINES = ("sglang", "vllm")  # run.engine: the serving engines a tracer records from
RUN_SORTS = ("started_at", "ended_at", "id", "state", "engine", "algorithm", "target_path",
             "draft_path", "requests_count", "steps_count", "samples_count", "findings_count",
             "mean_accept_length", "sglang_accept_length", "worst_severity", "last_batch_at")


def get_run(conn: sa.Connection, run_id: str) -> dict[str, Any] | None:
    """Every stored field of the run and its ``state`` (``run_state``), or None (also for a run being
    pruned: ``retention.PRUNING``, gone to readers while its rows go in chunks). ``server_args`` and
    ``tracer_config`` pass the tracer's allow-lists on the way out (``safe_run``), so a run stored before them
    shows no secret."""
    row = conn.execute(sa.select(*RUN_FIELDS, run_state(_last_batch()).label("state"))
                       .where(RUNS.c.id == run_id, RUNS.c.status != retention.PRUNING)).mappings().first()
    if row is None:
        return None
    return safe_run(dict(row))


def safe_run(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` with ``server_args`` and ``tracer_config`` reduced to their allow-lists and credentials
    scrubbed from every string in it (``redact``): the one filter between a stored run and anything
    that shows it (pages, API, bundles), and between a batch's run record and the store."""
    out = dict(run)
    if out.get("server_args") is not None:
        out["server_args"] = redact_server_args(out["server_args"])
    if out.get("tracer_config") is not None:
        out["tracer_config"] = redact_tracer_config(out["tracer_config"])
    return redact.scrub(out)


def run_findings(conn: sa.Connection, run_id: str) -> list[dict[str, Any]]:
    """The run's findings, errors first, then warnings, then info; in diagnosis order within a
    severity (static before runtime, the root cause first)."""
    rank = sa.case({s: i for i, s in enumerate(SEVERITY_ORDER)}, value=FINDINGS.c.severity,
                   else_=len(SEVERITY_ORDER))
    query = (sa.select(*(c for c in FINDINGS.c if c.name != "run_id"))
             .where(FINDINGS.c.run_id == run_id).order_by(rank, FINDINGS.c.id))
    return [redact.redact_row(dict(row), redact.FINDING_TEXT) for row in conn.execute(query).mappings()]


def findings_by_run(conn: sa.Connection, run_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each listed run's findings as (severity, rule_id) rows, most severe first (the runs list's
    badges and their tooltip): one query for a page of runs."""
    if not run_ids:
        return {}
    query = (sa.select(FINDINGS.c.run_id, FINDINGS.c.severity, FINDINGS.c.rule_id)
             .where(FINDINGS.c.run_id.in_(run_ids))
             .order_by(FINDINGS.c.run_id, _severity_rank(FINDINGS.c.severity), FINDINGS.c.id))
    out: dict[str, list[dict[str, Any]]] = {}
    for row in conn.execute(query).mappings():
        out.setdefault(row["run_id"], []).append({"severity": row["severity"], "rule_id": row["rule_id"]})
    return out


def run_facts(conn: sa.Connection, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each listed run's recorded facts (what sets runs of one draft apart: top-k, ...); one query."""
    if not run_ids:
        return {}
    rows = conn.execute(sa.select(RUNS.c.id, RUNS.c.facts).where(RUNS.c.id.in_(run_ids)))
    return {row.id: row.facts if isinstance(row.facts, dict) else {} for row in rows}


def latest_health(conn: sa.Connection, run_id: str) -> dict[str, Any] | None:
    """The newest tracer health snapshot of the run (cumulative counters), or None."""
    query = (sa.select(HEALTH.c.at, HEALTH.c.drops, HEALTH.c.errors, HEALTH.c.heartbeats,
                       HEALTH.c.disabled_probes, HEALTH.c.queue_depth, HEALTH.c.records_lost,
                       HEALTH.c.requests_lost, HEALTH.c.lost_rids, HEALTH.c.gaps)
             .where(HEALTH.c.run_id == run_id)
             .order_by(HEALTH.c.at.desc(), HEALTH.c.id.desc()).limit(1))
    row = conn.execute(query).mappings().first()
    return None if row is None else dict(row)


MAX_LOST_SHOWN = 100


def run_gaps(conn: sa.Connection, run_id: str) -> dict[str, Any]:
    """What the tracer of the run lost on the way to the store, from its latest health snapshot:
    ``dropped`` (records dropped, all reasons), ``records_lost`` (those meant for the store),
    ``requests_lost`` (requests it saw whose record never arrived), ``missing``: the ids it named of
    those that the store still lacks (it names the first 100), ``unnamed``: how many it did not
    name, and ``windows``: [first, last] time of the lost records."""
    row = latest_health(conn, run_id) or {}
    named = row.get("lost_rids") or []
    stored = set(conn.execute(sa.select(REQUESTS.c.rid).where(REQUESTS.c.run_id == run_id,
                                                               REQUESTS.c.rid.in_(named))).scalars()) \
        if named else set()
    lost = row.get("requests_lost") or 0
    return {"dropped": sum((row.get("drops") or {}).values()), "records_lost": row.get("records_lost") or 0,
            "requests_lost": lost, "missing": [r for r in named if r not in stored][:MAX_LOST_SHOWN],
            "unnamed": max(0, lost - len(named)), "windows": row.get("gaps") or []}


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


def orphan_requests(conn: sa.Connection, run_id: str) -> list[dict[str, Any]]:
    """Request ids with verify steps but no request row: still running, or their finish record was
    dropped. Each with its stored steps (count, first and last index) and when the first was taken.
    From the run's aggregates (``steps.rid``), so current as of the last refresh."""
    orphan = sa.select(BINS.c.key).where(BINS.c.run_id == run_id, BINS.c.series == stats.ORPHANS)
    query = (sa.select(BINS.c.key.label("rid"), BINS.c.n.label("sampled_steps"),
                       sa.cast(BINS.c.lo, sa.Integer).label("first_step"),
                       sa.cast(BINS.c.hi, sa.Integer).label("last_step"))
             .where(BINS.c.run_id == run_id, BINS.c.series == "steps.rid", BINS.c.bucket == 0,
                    BINS.c.key.in_(orphan))
             .limit(MAX_REQUESTS_SHOWN))
    orphans = [dict(row) for row in conn.execute(query).mappings()]
    if orphans:
        first = dict(conn.execute(sa.select(STEPS.c.rid, sa.func.min(STEPS.c.at))
                                  .where(of_run(STEPS, run_id),
                                         STEPS.c.rid.in_([o["rid"] for o in orphans]))
                                  .group_by(STEPS.c.rid)).all())
        for o in orphans:
            o["first_at"] = first.get(o["rid"])
        orphans.sort(key=lambda o: (o["first_at"] is None, o["first_at"] or 0.0, o["rid"]))
    return orphans


def incomplete_requests(conn: sa.Connection, run_id: str) -> list[dict[str, Any]]:
    """Requests the store holds only part of: sampled ones that lack some of their verify steps
    (``missing_steps`` > 0), then ids with steps but no request row (``row_missing``). From the
    run's aggregates (``steps.rid``), so current as of the last refresh."""
    run = get_run(conn, run_id)
    if run is None:
        return []
    stride = step_stride(run)
    R = REQUESTS.c
    steps = (sa.select(BINS.c.key, BINS.c.n)
             .where(BINS.c.run_id == run_id, BINS.c.series == "steps.rid").subquery())
    stored = sa.func.coalesce(steps.c.n, 0)
    query = (sa.select(R.rid, R.sampled, R.traced_verify_ct, stored.label("sampled_steps"))
             .select_from(REQUESTS.outerjoin(steps, steps.c.key == R.rid))
             .where(R.run_id == run_id, R.sampled.is_(True), R.traced_verify_ct > 0,
                    stored < (R.traced_verify_ct + stride - 1) // stride)
             .order_by(R.started_at, R.id).limit(MAX_REQUESTS_SHOWN))
    partial = []
    for row in conn.execute(query).mappings():
        r = _with_completeness(dict(row), stride)
        partial.append({"rid": r["rid"], "row_missing": False, "sampled_steps": r["sampled_steps"],
                        "expected_steps": r["expected_steps"], "missing_steps": r["missing_steps"]})
    orphans = [{"rid": o["rid"], "row_missing": True, "sampled_steps": o["sampled_steps"],
                "expected_steps": None, "missing_steps": None} for o in orphan_requests(conn, run_id)]
    return partial + orphans


def last_batch_at(conn: sa.Connection, run_id: str) -> float | None:
    """When the run's newest batch was stored (a ``running`` run silent for long has lost its tracer)."""
    return conn.execute(sa.select(sa.func.max(BATCHES.c.received_at))
                        .where(BATCHES.c.run_id == run_id)).scalar()


REQUEST_SORTS = ("started_at", "finished_at", "rid", "prompt_len", "output_len", "spec_verify_ct",
                 "accept_length", "finish_reason")


def _differs() -> sa.ColumnElement:
    R = REQUESTS.c
    return sa.or_(*(sa.and_(R[f"spec_{c}"].is_not(None), R[f"traced_{c}"].is_not(None),
                            R[f"spec_{c}"] != R[f"traced_{c}"]) for c in COUNTERS))


MAX_ROW_COUNT = 2**62  # an offset or limit past it (past what the store counts in int8) is the same as it


def _bounded(count: int) -> int:
    """A query's offset or limit within 0 .. ``MAX_ROW_COUNT``: any int a URL gives reads no error."""
    return min(max(count, 0), MAX_ROW_COUNT)


def run_requests_page(conn: sa.Connection, run_id: str, *, accept_min: float | None = None,
                      accept_max: float | None = None, finding: str | None = None,
                      status: str | None = None, sort: str = "started_at", desc: bool = False,
                      offset: int = 0, limit: int = 50) -> tuple[list[dict[str, Any]], int]:
    """One page of the run's requests and the number of requests that pass the filters.

    Filters: ``accept_min`` / ``accept_max`` bound SGLang's accept length (output_len /
    spec_verify_ct; requests without it are left out when a bound is set); ``finding``: a rule id
    (or ``"any"``) of a finding that names the request (``findings.rid``); ``status``: a
    finish_reason, or ``"incomplete"`` for sampled requests whose traced counters disagree with
    SGLang's. ``sort``: one of ``REQUEST_SORTS`` (``accept_length`` is SGLang's), nulls last.
    Raises BadQuery for an unknown sort key.

    Each row: the request's stored fields, ``spec_accept_length``, ``mismatches`` (counters that
    differ), ``traced_accept_length`` and ``sampled_steps`` (mean accept_len and count of its
    stored verify steps, from the run's aggregates: current as of the last refresh), ``expected_steps`` and
    ``missing_steps`` (``_with_completeness``), ``finding_rules`` (rule ids of the findings
    naming it).
    """
    R = REQUESTS.c
    accept = sa.literal_column(models.ACCEPT_LENGTH_SQL, sa.Float)  # as its index has it
    where = [R.run_id == run_id]
    if accept_min is not None:
        where.append(accept >= accept_min)
    if accept_max is not None:
        where.append(accept <= accept_max)
    if finding:
        named = sa.select(FINDINGS.c.rid).where(FINDINGS.c.run_id == run_id,
                                                  FINDINGS.c.rid.is_not(None))
        if finding != "any":
            named = named.where(FINDINGS.c.rule_id == finding)
        where.append(R.rid.in_(named))
    if status == "incomplete":
        where.append(_differs())
    elif status:
        where.append(R.finish_reason == status)
    sorts = {k: R[k] for k in REQUEST_SORTS if k != "accept_length"} | {"accept_length": accept}
    key = _pick(sort, sorts, "sort key")
    total = conn.execute(sa.select(sa.func.count()).select_from(REQUESTS).where(*where)).scalar_one()
    query = (sa.select(*(c for c in REQUESTS.c if c.name not in ("id", "run_id"))).where(*where)
             .order_by((key.desc() if desc else key.asc()).nulls_last(), R.id)
             .offset(_bounded(offset)).limit(_bounded(limit)))
    rows = [_with_accept_stats(dict(r)) for r in conn.execute(query).mappings()]
    rids = [r["rid"] for r in rows]
    if rids:
        steps = _steps_per_request(conn, run_id, rids, raw=summary_state(conn, run_id)["behind"])
        rules: dict[str, list[str]] = {}
        for rid, rule in conn.execute(sa.select(FINDINGS.c.rid, FINDINGS.c.rule_id).distinct()
                                      .where(FINDINGS.c.run_id == run_id, FINDINGS.c.rid.is_not(None))
                                      .order_by(FINDINGS.c.rule_id)):
            rules.setdefault(rid, []).append(rule)
        stride = step_stride(get_run(conn, run_id) or {})
        for r in rows:
            r["traced_accept_length"], r["sampled_steps"] = steps.get(r["rid"], (None, 0))
            r["finding_rules"] = rules.get(r["rid"], [])
            _with_completeness(r, stride)
    return rows, total


def _steps_per_request(conn: sa.Connection, run_id: str, rids: list[str],
                       raw: bool) -> dict[str, tuple[float, int]]:
    """(mean accept_len, count) of the stored verify steps of each of ``rids``: from the run's
    aggregates (``steps.rid``: a CSV of every request reads no step), or, ``raw``, from the steps
    themselves (the aggregates are behind the stored batches: a refresh failed or has yet to run)."""
    steps: dict[str, tuple[float, int]] = {}
    for i in range(0, len(rids), 500):
        chunk = rids[i:i + 500]
        if raw:
            query = (sa.select(STEPS.c.rid, sa.func.sum(STEPS.c.accept_len), sa.func.count())
                     .where(of_run(STEPS, run_id), STEPS.c.rid.in_(chunk)).group_by(STEPS.c.rid))
        else:
            query = (sa.select(BINS.c.key, BINS.c.total, BINS.c.n)
                     .where(BINS.c.run_id == run_id, BINS.c.series == "steps.rid", BINS.c.bucket == 0,
                            BINS.c.key.in_(chunk)))
        steps.update((rid, ((total or 0) / n, n)) for rid, total, n in conn.execute(query))
    return steps


STALE_AFTER_S = 30.0  # a summary still behind its batches this long after the newest one is stale


def summary_state(conn: sa.Connection, run_id: str, now: float | None = None) -> dict[str, Any]:
    """How current the run's summary (``run_stats`` and its bins) is: ``batches`` stored, ``built_from``
    how many of them, ``updated_at``; ``steps_stored`` (verify steps its batches brought);
    ``behind``: built from fewer batches than stored; ``stale``: behind although the newest batch
    arrived more than ``STALE_AFTER_S`` ago (a live run's summary lags by the refresh's debounce;
    longer, the refresh has failed or no dashboard refreshes this store)."""
    batches = conn.execute(sa.select(sa.func.count(), sa.func.max(BATCHES.c.received_at),
                                     sa.func.coalesce(sa.func.sum(BATCHES.c.step_rows), 0))
                           .where(BATCHES.c.run_id == run_id)).one()
    built = conn.execute(sa.select(STATS.c.batches_seen, STATS.c.updated_at)
                         .where(STATS.c.run_id == run_id)).first()
    count, newest, steps = batches
    behind = (built.batches_seen if built else 0) < count
    now = time.time() if now is None else now
    return {"batches": count, "built_from": built.batches_seen if built else 0,
            "updated_at": built.updated_at if built else None, "steps_stored": int(steps), "behind": behind,
            "stale": behind and newest is not None and newest < now - STALE_AFTER_S}


MAX_TIME_BINS, MAX_SEQ_BINS = 200, 100


def _rebin(buckets: list[dict[str, Any]], limit: int) -> tuple[int, list[list[dict[str, Any]]]]:
    """Group stored buckets (sorted) into at most ``limit`` groups of ``factor`` neighbours."""
    if not buckets:
        return 1, []
    span = buckets[-1]["bucket"] - buckets[0]["bucket"] + 1
    factor = max(1, math.ceil(span / limit))
    groups: dict[int, list[dict[str, Any]]] = {}
    for b in buckets:
        groups.setdefault(b["bucket"] // factor, []).append(b)
    return factor, [groups[g] for g in sorted(groups)]


def _per_position(pairs: list[list[int]]) -> list[dict[str, Any]]:
    return [{"position": i + 1, "proposed": p, "accepted": a, "rate": a / p if p else None}
            for i, (p, a) in enumerate(pairs)]


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def run_summary(conn: sa.Connection, run_id: str) -> dict[str, Any]:
    """The run's aggregates as the run page draws them (from ``run_stats`` and ``run_stat_bins``,
    maintained as data arrives; ``updated_at`` says when). Definitions:

    - ``acceptance``: ``verify_steps``, ``proposed``, ``accepted`` over the stored (sampled) verify
      steps; ``traced_accept_length`` = 1 + accepted / verify_steps (accepted drafts plus the bonus
      token, per verify step); ``per_position`` [{position, proposed, accepted, rate}];
      ``sglang``: SGLang's per-request counters summed over ``requests_counted`` requests
      {verify_ct, accepted, proposed, output_len, accept_length = output_len / verify_ct};
      ``reconcile``: why the two accept lengths differ (see ``_reconcile``).
    - ``over_time``: [{t0, t1, steps, accept_length}] (<= 200 bins, epoch seconds);
      ``by_seq_pos``: [{lo, hi, steps, accept_length}] (<= 100 bins, token positions, hi exclusive).
    - ``widths``: {point: {phase: {width (a string): samples}}} for every sample point;
      ``counts``: {point: samples}.
    - ``norms``: {point: [{t0, t1, n, l2_mean, l2_min, l2_max}]} for ``target.aux[i]`` and
      ``draft.fc.out`` (the mean, min and max of the samples' mean row L2 norm per bin).
    """
    row = stats.get_stats(conn, run_id) or {}
    if not row:  # no aggregates yet; on PostgreSQL bins may commit between two reads: skip them
        return _empty_summary(run_id)
    pairs, totals = row["per_position"], row["request_totals"]
    steps, proposed, accepted = row["verify_steps"], row["proposed"], row["accepted"]
    t0, width = row["t0"] or 0.0, row["time_bin_s"]
    over_time, by_seq, norms, widths, counts = [], [], {}, {}, {}
    factor, groups = _rebin(stats.bins(conn, run_id, "steps.time"), MAX_TIME_BINS)
    for g in groups:
        n, total = sum(b["n"] for b in g), sum(b["total"] for b in g)
        start = t0 + (g[0]["bucket"] // factor) * factor * width
        over_time.append({"t0": start, "t1": start + factor * width, "steps": n,
                          "accept_length": _ratio(total, n)})
    factor, groups = _rebin(stats.bins(conn, run_id, "steps.seq_pos"), MAX_SEQ_BINS)
    seq_bin = row["seq_bin"]
    for g in groups:
        n, total = sum(b["n"] for b in g), sum(b["total"] for b in g)
        lo = (g[0]["bucket"] // factor) * factor * seq_bin
        by_seq.append({"lo": lo, "hi": lo + factor * seq_bin, "steps": n,
                       "accept_length": _ratio(total, n)})
    norm_bins: dict[str, list[dict[str, Any]]] = {}
    for b in stats.bins(conn, run_id, "norms.time"):
        norm_bins.setdefault(b["key"], []).append(b)
    for point, buckets in norm_bins.items():
        factor, groups = _rebin(buckets, MAX_TIME_BINS)
        norms[point] = []
        for g in groups:
            n = sum(b["n"] for b in g)
            start = t0 + (g[0]["bucket"] // factor) * factor * width
            norms[point].append({"t0": start, "t1": start + factor * width, "n": n,
                                 "l2_mean": _ratio(sum(b["total"] for b in g), n),
                                 "l2_min": min((b["lo"] for b in g if b["lo"] is not None), default=None),
                                 "l2_max": max((b["hi"] for b in g if b["hi"] is not None), default=None)})
    for b in stats.bins(conn, run_id, "widths"):
        point, _, phase = b["key"].partition("|")
        widths.setdefault(point, {}).setdefault(phase, {})[str(b["bucket"])] = b["n"]
        counts[point] = counts.get(point, 0) + b["n"]
    sglang = {"verify_ct": totals.get("sglang_verify_ct", 0), "accepted": totals.get("sglang_accepted", 0),
              "proposed": totals.get("sglang_proposed", 0), "output_len": totals.get("sglang_output_len", 0)}
    sglang["accept_length"] = _ratio(sglang["output_len"], sglang["verify_ct"])
    acceptance = {"verify_steps": steps, "proposed": proposed, "accepted": accepted,
                  "traced_accept_length": 1 + accepted / steps if steps else None,
                  "sglang": sglang, "requests_counted": totals.get("sglang_requests", 0),
                  "per_position": _per_position(pairs), "reconcile": _reconcile(totals, steps, accepted)}
    return {"run_id": run_id, "updated_at": row["updated_at"], "requests": row["requests_count"],
            "acceptance": acceptance, "over_time": over_time, "by_seq_pos": by_seq, "widths": widths,
            "norms": norms, "counts": counts}


def _empty_summary(run_id: str) -> dict[str, Any]:
    sglang = {"verify_ct": 0, "accepted": 0, "proposed": 0, "output_len": 0, "accept_length": None}
    acceptance = {"verify_steps": 0, "proposed": 0, "accepted": 0, "traced_accept_length": None,
                  "sglang": sglang, "requests_counted": 0, "per_position": [],
                  "reconcile": _reconcile({}, 0, 0)}
    return {"run_id": run_id, "updated_at": None, "requests": 0, "acceptance": acceptance,
            "over_time": [], "by_seq_pos": [], "widths": {}, "norms": {}, "counts": {}}


def _reconcile(totals: dict[str, int], steps: int, accepted: int) -> dict[str, Any]:
    """SGLang's accept length against the tracer's, term by term.

    SGLang: output_len / verify_ct, where output_len counts every output token, including the one
    the prefill produced (one per request, no verify step), and every verify step emits its
    accepted drafts plus one token of the target. So output_len = accepted + verify_ct +
    requests + ``unexplained_tokens`` (0 unless output was cut short, e.g. at max_new_tokens or a
    stop string inside an accepted run). The tracer: 1 + accepted / verify steps, over the verify
    steps it stored (``steps_not_sampled`` = SGLang's verify steps it did not store).
    """
    verify_ct, output_len = totals.get("sglang_verify_ct", 0), totals.get("sglang_output_len", 0)
    requests, sg_accepted = totals.get("sglang_requests", 0), totals.get("sglang_accepted", 0)
    return {
        "sglang_accept_length": _ratio(output_len, verify_ct),
        "prefill_tokens": requests,
        "sglang_accept_length_without_prefill": _ratio(output_len - requests, verify_ct),
        "sglang_drafts_accept_length": 1 + sg_accepted / verify_ct if verify_ct else None,
        "unexplained_tokens": output_len - (sg_accepted + verify_ct + requests) if verify_ct else None,
        "traced_accept_length": 1 + accepted / steps if steps else None,
        "steps_not_sampled": max(verify_ct - steps, 0),
        "sampled_requests": totals.get("sampled_requests", 0),
        "sampled_verify_ct": totals.get("sampled_verify_ct", 0),
        "sampled_accepted": totals.get("sampled_accepted", 0),
        "sampled_output_len": totals.get("sampled_output_len", 0),
        "sampled_sglang_accept_length": _ratio(totals.get("sampled_output_len", 0),
                                               totals.get("sampled_verify_ct", 0)),
        "traced_counters": {"verify_ct": totals.get("traced_verify_ct", 0),
                            "accepted": totals.get("traced_accepted", 0),
                            "proposed": totals.get("traced_proposed", 0)},
        "incomplete_requests": totals.get("incomplete", 0),
    }


def compare_summary(conn: sa.Connection, run_a: str, run_b: str) -> dict[str, Any]:
    """``run_summary`` of both runs: {"a": ..., "b": ...}."""
    return {"a": run_summary(conn, run_a), "b": run_summary(conn, run_b)}


def get_request(conn: sa.Connection, run_id: str, rid: str) -> dict[str, Any] | None:
    """One request of the run with its counter mismatches, or None."""
    query = (sa.select(*(c for c in REQUESTS.c if c.name not in ("id", "run_id")))
             .where(REQUESTS.c.run_id == run_id, REQUESTS.c.rid == rid))
    row = conn.execute(query).mappings().first()
    return None if row is None else _with_accept_stats(dict(row))


def request_steps(conn: sa.Connection, run_id: str, rid: str) -> list[dict[str, Any]]:
    """The request's sampled verify steps in order."""
    query = (sa.select(*(c for c in STEPS.c if c.name not in ("id", "run_key", "rid")))
             .where(of_run(STEPS, run_id), STEPS.c.rid == rid).order_by(STEPS.c.step_index))
    return [dict(row) for row in conn.execute(query).mappings()]


def request_samples(conn: sa.Connection, run_id: str, rid: str) -> list[dict[str, Any]]:
    """The request's tensor samples by step, then time (the raw slice is left out)."""
    query = (sa.select(*(c for c in SAMPLES.c if c.name not in ("id", "run_key", "rid", "raw_b64")))
             .where(of_run(SAMPLES, run_id), SAMPLES.c.rid == rid)
             .order_by(SAMPLES.c.step_index, SAMPLES.c.at, SAMPLES.c.id))
    return [dict(row) for row in conn.execute(query).mappings()]


class NotFound(LookupError):
    """No such run or request; the message says what was asked for and where to look."""


RUN_VIEW_REQUESTS = 100


def run_view(conn: sa.Connection, run_id: str) -> dict[str, Any]:
    """Everything ``GET /api/v1/runs/{run_id}`` returns: the run, its findings, latest health, the
    summary (``run_summary``), the first ``RUN_VIEW_REQUESTS`` requests (``run_requests_page``),
    ``requests_total``, ``orphan_requests``, ``gaps`` (``run_gaps``), ``last_batch_at``,
    ``summary_state`` (how current the summary is) and ``imported`` (``imported_from``). The run
    carries its ``state`` (``run_state``)."""
    run = get_run(conn, run_id)
    if run is None:
        raise NotFound(f"No run {run_id!r} is stored. The runs list at / shows every stored run; "
                       "a tracer's run appears there once its first batch has arrived.")
    requests, total = run_requests_page(conn, run_id, limit=RUN_VIEW_REQUESTS)
    return {"run": run, "findings": run_findings(conn, run_id), "health": latest_health(conn, run_id),
            "summary": run_summary(conn, run_id), "requests": requests, "requests_total": total,
            "orphan_requests": orphan_requests(conn, run_id), "gaps": run_gaps(conn, run_id),
            "last_batch_at": last_batch_at(conn, run_id), "summary_state": summary_state(conn, run_id),
            "imported": imported_from(conn, run_id)}


def imported_from(conn: sa.Connection, run_id: str) -> dict[str, Any] | None:
    """Where an imported run came from: the bundle's origin (file or upload name), sha256, import
    time, and who made it when (manifest ``created_by``, ``created_at``); None for a traced run."""
    row = conn.execute(sa.select(IMPORTS.c.origin, IMPORTS.c.sha256, IMPORTS.c.imported_at, IMPORTS.c.manifest)
                       .where(IMPORTS.c.run_id == run_id)).mappings().first()
    if row is None:
        return None
    manifest = row["manifest"]
    return {"origin": row["origin"], "sha256": row["sha256"], "imported_at": row["imported_at"],
            "created_by": manifest.get("created_by"), "created_at": manifest.get("created_at"),
            "requests": manifest.get("requests")}


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
        request = _with_accept_stats({**{c.name: None for c in REQUESTS.c if c.name not in ("id", "run_id")},
                                      "rid": rid, "row_missing": True})
    else:
        request["row_missing"] = False
    request["sampled_steps"] = len(steps)
    _with_completeness(request, step_stride(run))
    expected = expected_widths(run["facts"])  # per phase: the decode steps take the draft's hidden state
    for sample in samples:
        want = expected.get(sample["phase"])
        sample["width_mismatch"] = (sample["point"] == "draft.input" and want is not None
                                    and sample["width"] != want)
    return {"run": run, "request": request, "expected_draft_input_width": expected["prefill"],
            "steps": steps, "samples": samples}
