"""The dashboard application: ``create_app(settings)`` wires the store, the API and the pages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path

from alembic.runtime.migration import MigrationContext
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from jinja2_fragments.fastapi import Jinja2Blocks

from draftscope import api, db, metrics, queries
from draftscope.facts_view import fact_sections
from draftscope.ingest import BatchWriter
from draftscope.refresh import RunRefresher
from draftscope.settings import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
STATIC_DIR = REPO_ROOT / "static"
HTMX_JS = "htmx-2.0.4.min.js"


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}g}"


templates = Jinja2Blocks(directory=str(TEMPLATES_DIR))  # autoescapes .html templates
templates.env.filters["when"] = _when
templates.env.filters["num"] = _num
templates.env.globals["htmx_js"] = HTMX_JS


def _block(request: Request, name: str) -> str | None:
    """Only block ``name`` for an htmx request (live refresh), the whole page otherwise."""
    return name if request.headers.get("hx-request") else None


def not_found(request: Request, message: str) -> HTMLResponse:
    return templates.TemplateResponse(request, "not_found.html", {"message": message}, status_code=404)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The dashboard for ``settings`` (default: from the environment)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        checkpointer = None
        if db.is_sqlite_file(settings.database_url):
            checkpointer = db.WalCheckpointer(settings.database_url)
            checkpointer.start()
        engine = db.make_engine(settings.database_url, autocheckpoint=checkpointer is None)
        app.state.engine = engine
        app.state.writer = BatchWriter(engine)
        app.state.refresher = RunRefresher(engine, debounce_s=settings.refresh_debounce_s)
        app.state.refresher.start()
        try:
            yield
        finally:
            app.state.refresher.stop()
            engine.dispose()
            if checkpointer is not None:
                checkpointer.stop()

    app = FastAPI(title="draftscope", lifespan=lifespan, docs_url=None, redoc_url=None)  # /docs: metrics.py
    app.state.settings = settings
    app.include_router(api.router)
    from draftscope import bundle_web  # after this module's templates exist
    app.include_router(bundle_web.router)
    app.include_router(metrics.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", response_class=HTMLResponse)
    def runs_page(request: Request):
        """Runs list; an htmx request gets only the table."""
        with request.app.state.engine.connect() as conn:
            runs = queries.list_runs(conn)
        return templates.TemplateResponse(request, "runs.html", {"runs": runs},
                                          block_name=_block(request, "runs_table"))

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run_page(request: Request, run_id: str):
        """One run: findings first, then identity, attach-time facts, tracer health, requests."""
        try:
            with request.app.state.engine.connect() as conn:
                data = queries.run_view(conn, run_id)
        except queries.NotFound as exc:
            return not_found(request, str(exc))
        context = {**data, "fact_sections": fact_sections(data["run"]["facts"])}
        return templates.TemplateResponse(request, "run.html", context,
                                          block_name=_block(request, "live"))

    @app.get("/runs/{run_id}/requests/{rid:path}", response_class=HTMLResponse)
    def request_page(request: Request, run_id: str, rid: str):
        """One request: its verify-step timeline and its tensor samples."""
        try:
            with request.app.state.engine.connect() as conn:
                data = queries.request_view(conn, run_id, rid)
        except queries.NotFound as exc:
            return not_found(request, str(exc))
        context = {k: v for k, v in data.items() if k != "request"} | {"req": data["request"]}
        return templates.TemplateResponse(request, "request.html", context)

    @app.get("/healthz")
    def healthz(request: Request) -> JSONResponse:
        """Liveness plus the database revision against the head this draftscope ships."""
        with request.app.state.engine.connect() as conn:
            revision = MigrationContext.configure(conn).get_current_revision()
        head = db.head_revision()
        ok = revision == head
        return JSONResponse({"status": "ok" if ok else "schema_behind", "db_revision": revision,
                             "head_revision": head}, status_code=200 if ok else 503)

    return app
