"""Prometheus ``GET /metrics`` from the store, and the offline API docs at ``/docs`` (``/openapi.json``).

Every scrape reads the per-run aggregates (``run_stats``) of the ``max_runs`` most recently
started runs and one sum over ``ingest_batches``; nothing is kept in this process, so several
dashboard processes on one store report the same numbers. Every per-run series carries ``run_id`` and
``engine`` (``sglang`` or ``vllm``: one per run, so it adds no series). Label cardinality is bounded: ``run_id``
takes at most ``METRICS_RUNS`` values, ``position`` at most ``MAX_POSITIONS``, ``severity`` three,
``reason`` (tracer drops) at most ``MAX_DROP_REASONS``; ``table`` and ``state`` are fixed sets.
docs/dashboard.md lists every metric.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from draftscope.store import queries
from draftscope.store.tables import BATCHES, FINDINGS, STATS
from draftscope.web.templating import templates

router = APIRouter()
METRICS_RUNS = 20  # runs with per-run series: the most recently started
MAX_POSITIONS = 16  # draft positions 1..16; longer drafts' later positions are left out
MAX_DROP_REASONS = 16
SWAGGER_UI = "/static/swagger-ui-5.35.0"
INGEST_TABLES = {"requests": "request_rows", "verify_steps": "step_rows",
                 "tensor_samples": "sample_rows", "tracer_health": "health_rows",
                 "findings": "finding_rows"}
RUN = ["run_id", "engine"]  # every per-run series: the run and the serving engine that recorded it
_REASON = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class StoreCollector(Collector):
    """The store's numbers as metric families, read once per ``collect`` through ``conn``."""

    def __init__(self, conn: sa.Connection, max_runs: int = METRICS_RUNS):
        self.conn, self.max_runs = conn, max_runs
        self.engines: dict[str, str] = {}  # run id -> engine, of the listed runs

    def collect(self) -> Iterator[Metric]:
        conn = self.conn
        runs = queries.list_runs(conn, limit=self.max_runs)
        ids = [r["id"] for r in runs]
        self.engines = {r["id"]: r["engine"] for r in runs}
        stats = {r["run_id"]: r for r in conn.execute(
            sa.select(STATS.c.run_id, STATS.c.verify_steps, STATS.c.proposed, STATS.c.accepted,
                      STATS.c.per_position).where(STATS.c.run_id.in_(ids))).mappings()}
        steps = CounterMetricFamily("draftscope_verify_steps", "Verify steps the tracer stored "
                                    "(sampled requests).", labels=RUN)
        proposed = CounterMetricFamily("draftscope_drafts_proposed", "Draft tokens proposed in "
                                       "the stored verify steps.", labels=RUN)
        accepted = CounterMetricFamily("draftscope_drafts_accepted", "Draft tokens accepted in the "
                                       "stored verify steps.", labels=RUN)
        pos_proposed = CounterMetricFamily("draftscope_position_proposed", "Drafts proposed at each "
                                           "draft position (1-based).", labels=[*RUN, "position"])
        pos_accepted = CounterMetricFamily("draftscope_position_accepted", "Drafts accepted at each "
                                           "draft position (1-based).", labels=[*RUN, "position"])
        accept_len = GaugeMetricFamily("draftscope_accept_length", "Mean accept length: "
                                       "definition=traced (1 + accepted drafts per stored verify "
                                       "step) or sglang (output tokens per verify step, prefill "
                                       "token included).", labels=[*RUN, "definition"])
        live = GaugeMetricFamily("draftscope_run_live", "1 while the run is live (running, a batch "
                                 "within the last minute).", labels=RUN)
        for run in runs:
            s, rid, eng = stats.get(run["id"]), run["id"], run["engine"]
            live.add_metric([rid, eng], 1.0 if run["live"] else 0.0)
            for definition, value in (("traced", run["mean_accept_length"]),
                                      ("sglang", run["sglang_accept_length"])):
                if value is not None:
                    accept_len.add_metric([rid, eng, definition], value)
            if s is None:
                continue
            steps.add_metric([rid, eng], s["verify_steps"])
            proposed.add_metric([rid, eng], s["proposed"])
            accepted.add_metric([rid, eng], s["accepted"])
            for i, (p, a) in enumerate(s["per_position"][:MAX_POSITIONS], start=1):
                pos_proposed.add_metric([rid, eng, str(i)], p)
                pos_accepted.add_metric([rid, eng, str(i)], a)
        yield from (steps, proposed, accepted, pos_proposed, pos_accepted, accept_len, live)
        yield self._findings(ids)
        yield self._drops(ids)
        yield from self._ingest()
        states = GaugeMetricFamily("draftscope_runs", "Runs among the listed ones, by state.",
                                   labels=["state"])
        for state in queries.RUN_STATES:
            states.add_metric([state], sum(r["state"] == state for r in runs))
        yield states

    def _findings(self, ids: list[str]) -> Metric:
        family = GaugeMetricFamily("draftscope_findings", "Findings of the run by severity.",
                                   labels=[*RUN, "severity"])
        counts = {(r, s): n for r, s, n in self.conn.execute(
            sa.select(FINDINGS.c.run_id, FINDINGS.c.severity, sa.func.count())
            .where(FINDINGS.c.run_id.in_(ids)).group_by(FINDINGS.c.run_id, FINDINGS.c.severity))}
        for rid in ids:
            for severity in queries.SEVERITY_ORDER:
                family.add_metric([rid, self.engines[rid], severity], counts.get((rid, severity), 0))
        return family

    def _drops(self, ids: list[str]) -> Metric:
        family = CounterMetricFamily("draftscope_tracer_drops", "Records the tracer dropped, by "
                                     "reason (its latest health snapshot).", labels=[*RUN, "reason"])
        for rid in ids:
            health = queries.latest_health(self.conn, rid)
            drops: dict[str, Any] = (health or {}).get("drops") or {}
            reasons = sorted(r for r in drops if isinstance(r, str) and _REASON.match(r))
            for reason in reasons[:MAX_DROP_REASONS]:
                if isinstance(drops[reason], (int, float)):
                    family.add_metric([rid, self.engines[rid], reason], drops[reason])
        return family

    def _ingest(self) -> Iterator[Metric]:
        sums = self.conn.execute(sa.select(sa.func.count(), *(sa.func.coalesce(sa.func.sum(
            BATCHES.c[column]), 0) for column in INGEST_TABLES.values()))).one()
        batches = CounterMetricFamily("draftscope_ingest_batches", "Batches stored (every run, "
                                      "every writer).")
        batches.add_metric([], sums[0])
        rows = CounterMetricFamily("draftscope_ingest_rows", "Rows stored through batches, by "
                                   "table (every run, every writer).", labels=["table"])
        for table, total in zip(INGEST_TABLES, sums[1:]):
            rows.add_metric([table], total)
        yield batches
        yield rows


@router.get("/metrics")
def metrics(request: Request) -> Response:
    """Prometheus text format; per-run series for the ``METRICS_RUNS`` most recent runs."""
    registry = CollectorRegistry(auto_describe=False)
    with request.app.state.engine.connect() as conn:
        registry.register(StoreCollector(conn))
        body = generate_latest(registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/openapi.json", include_in_schema=False)
def openapi(request: Request) -> JSONResponse:
    """The API's OpenAPI schema (what /docs shows)."""
    return JSONResponse(request.app.openapi())


@router.get("/docs", include_in_schema=False)
def api_docs(request: Request) -> HTMLResponse:
    """Swagger UI from the vendored swagger-ui-dist 5.35.0 in static/ (no CDN), started by
    static/swagger-init.js (no inline script: the Content-Security-Policy allows files only)."""
    return templates.TemplateResponse(request, "docs.html", {"swagger_ui": SWAGGER_UI})
