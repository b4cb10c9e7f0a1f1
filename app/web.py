"""The dashboard application: ``create_app(settings)`` wires the store, the API and the pages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from jinja2_fragments.fastapi import Jinja2Blocks
from alembic.runtime.migration import MigrationContext

from draftscope import api, db, queries
from draftscope.ingest import BatchWriter
from draftscope.settings import Settings

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = REPO_ROOT / "templates"
STATIC_DIR = REPO_ROOT / "static"
HTMX_JS = "htmx-2.0.4.min.js"


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


templates = Jinja2Blocks(directory=str(TEMPLATES_DIR))  # autoescapes .html templates
templates.env.filters["when"] = _when
templates.env.globals["htmx_js"] = HTMX_JS


def create_app(settings: Settings | None = None) -> FastAPI:
    """The dashboard for ``settings`` (default: from the environment)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = db.make_engine(settings.database_url)
        app.state.engine = engine
        app.state.writer = BatchWriter(engine)
        try:
            yield
        finally:
            engine.dispose()

    app = FastAPI(title="draftscope", lifespan=lifespan)
    app.state.settings = settings
    app.include_router(api.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", response_class=HTMLResponse)
    def runs_page(request: Request):
        """Runs list; an htmx request gets only the table."""
        with request.app.state.engine.connect() as conn:
            runs = queries.list_runs(conn)
        block = "runs_table" if request.headers.get("hx-request") else None
        return templates.TemplateResponse(request, "runs.html", {"runs": runs}, block_name=block)

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
