"""JSON API: batch ingest (``POST /api/v1/batches``, ``ingest_router``: the ingest token guards it),
runs, one run, one request of a run (``router``: the dashboard includes it behind the read token)."""

from __future__ import annotations

import secrets
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from draftscope.store import queries
from draftscope.store.ingest import IngestError
from draftscope.store.wire_schema import batch_json_schema
from draftscope.web import pages

router = APIRouter(prefix="/api/v1")
ingest_router = APIRouter(prefix="/api/v1")


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def as_json(data: Any) -> Response:
    """``data`` as JSON; non-finite floats (stored NaN statistics) become null."""
    return Response(orjson.dumps(data), media_type="application/json")


@ingest_router.post("/batches", openapi_extra={"requestBody": {
    "required": True, "content": {"application/json": {"schema": batch_json_schema()}}}})
async def post_batch(request: Request) -> Response:
    """Store one tracer batch (see ``draftscope_tracer/transport/wire.py``); all of it or nothing."""
    settings = request.app.state.settings
    if settings.ingest_token is not None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.encode(),
                                                                   settings.ingest_token.encode()):
            return error(401, "Ingest needs 'Authorization: Bearer <token>' with the token the "
                              "dashboard was started with (DRAFTSCOPE_INGEST_TOKEN); give the "
                              "tracer the same token.")
    body = await _read_limited(request, settings.max_batch_bytes)
    if body is None:
        return error(413, f"Batch is larger than {settings.max_batch_bytes} bytes "
                          "(DRAFTSCOPE_MAX_BATCH_BYTES). Flush smaller batches from the tracer "
                          "or raise the limit.")
    try:
        result = await run_in_threadpool(request.app.state.writer.write, body)
    except IngestError as exc:
        return error(exc.status, exc.message)
    if result.status == "stored":
        request.app.state.refresher.notify(result.run_id)
    return JSONResponse({"status": result.status, "batch_id": result.batch_id,
                         "run_id": result.run_id, "rows": result.rows})


async def _read_limited(request: Request, limit: int) -> bytes | None:
    """The request body, or None as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


@router.get("/runs")
def get_runs(request: Request, engine: str | None = None, cursor: str | None = None,
             limit: int = pages.PageSize) -> Response:
    """Runs, newest first, with record counts, ``limit`` at a time; the ``Link`` header's
    ``rel="next"`` address has the next page (none on the last). ``?engine=sglang|vllm``: that
    engine's runs only."""
    try:
        with request.app.state.engine.connect() as conn:
            runs, after = queries.runs_page(conn, engine=engine or None, cursor=cursor, limit=limit)
    except queries.BadQuery as exc:
        return error(400, str(exc))
    return Response(orjson.dumps(runs), media_type="application/json", headers=pages.next_link(request, after))


@router.get("/runs/{run_id}")
def get_run(request: Request, run_id: str) -> Response:
    """One run: its fields (facts included), findings by severity, latest health, requests."""
    try:
        with request.app.state.engine.connect() as conn:
            return as_json(queries.run_view(conn, run_id))
    except queries.NotFound as exc:
        return error(404, str(exc))


@router.get("/runs/{run_id}/requests/{rid:path}")
def get_request(request: Request, run_id: str, rid: str) -> Response:
    """One request of a run: its counters, verify steps and tensor samples."""
    try:
        with request.app.state.engine.connect() as conn:
            data = queries.request_view(conn, run_id, rid)
    except queries.NotFound as exc:
        return error(404, str(exc))
    return as_json({k: v for k, v in data.items() if k != "run"} | {"run_id": run_id})
