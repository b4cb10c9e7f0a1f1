"""The dashboard application: ``create_app(settings)`` wires the store, the API and the pages."""

from __future__ import annotations

import gc
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp

from draftscope.resources import STATIC_DIR
from draftscope.settings import Settings
from draftscope.store import db
from draftscope.store.ingest import BatchWriter
from draftscope.store.refresh import RunRefresher
from draftscope.store.retention import Policy, Retainer
from draftscope.web import access, api, bundles, charts, metrics, pages, templating
from draftscope.web.guard import Guard
from draftscope.web.healthz import health
from draftscope.web.login_throttle import LoginThrottle
from draftscope.web.nul_guard import RefuseNul

log = logging.getLogger("draftscope.web.app")


def _wants_html(request: Request) -> bool:
    path = request.url.path
    return not (path.startswith("/api/") or path.endswith((".json", ".csv")))


def _install_error_pages(app: FastAPI) -> None:
    """Pages get error pages that say what to do next; the API and twins keep JSON errors."""

    @app.exception_handler(access.NeedsLogin)
    async def needs_login(request: Request, exc: access.NeedsLogin):
        return access.refusal(request)

    @app.exception_handler(pages.PageError)
    async def page_error(request: Request, exc: pages.PageError):
        return pages.error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def bad_query(request: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:])) or 'request'}: {e['msg']}"
                             for e in exc.errors())
        if not _wants_html(request):
            return JSONResponse({"detail": exc.errors()}, status_code=422)
        return pages.error_response(request, pages.PageError(
            400, "Bad request", f"This page cannot read its parameters ({problems}).",
            ["Fix or remove the query parameters in the address bar."]))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        if not _wants_html(request):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
        title = "Not found" if exc.status_code == 404 else f"Error {exc.status_code}"
        return pages.error_response(request, pages.PageError(
            exc.status_code, title, f"Nothing is served at {request.url.path}.",
            ["Open the runs list to see every stored run."]))

    @app.exception_handler(Exception)
    async def crash(request: Request, exc: Exception):
        ref = uuid.uuid4().hex[:12]
        log.exception("unhandled error %s on %s %s", ref, request.method, request.url.path)
        message = (f"draftscope failed while building this page (error reference {ref}). The full "
                   "traceback is in the dashboard's log under that reference.")
        if not _wants_html(request):
            return JSONResponse({"error": "internal error", "reference": ref}, status_code=500)
        return pages.error_response(request, pages.PageError(
            500, "Something went wrong", message,
            ["Reload the page: a store that is being migrated or written can fail a read once.",
             f"If it persists, report it with the reference {ref} and the log lines around it "
             "(draftscope export RUN_ID makes a bundle of the run without prompts or secrets)."]))


def _freeze_start_up() -> None:
    """Once per process: what start-up made lives as long as the process, so it goes out of the cyclic
    collector's way (``gc.freeze``); a full collection (~60 ms over the ~130,000 objects of the modules,
    templates and plotly) then no longer lands on a page load."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True


_frozen = False


class Dashboard(FastAPI):
    """FastAPI with ``draftscope.web.guard`` outside everything, its error handling included."""

    def build_middleware_stack(self) -> ASGIApp:
        return Guard(RefuseNul(super().build_middleware_stack()), self.state.settings)


class UnsafeSettings(ValueError):
    """Settings the dashboard refuses to start with (a token too short to guard anything)."""


def create_app(settings: Settings | None = None) -> FastAPI:
    """The dashboard for ``settings`` (default: from the environment); ``UnsafeSettings`` when a
    token is too short."""
    settings = settings or Settings()
    problems = settings.token_problems(auto_made=True)
    if problems:
        raise UnsafeSettings(" ".join(problems))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        checkpointer = None
        if db.is_sqlite_file(settings.database_url):
            checkpointer = db.WalCheckpointer(settings.database_url)
            checkpointer.start()
        app.state.checkpointer = checkpointer
        engine = db.make_engine(settings.database_url, autocheckpoint=checkpointer is None)
        app.state.engine = engine
        app.state.writer = BatchWriter(engine)
        app.state.refresher = RunRefresher(engine, debounce_s=settings.refresh_debounce_s)
        app.state.refresher.start()
        policy = Policy(max_age_s=settings.retain_days * 86400 if settings.retain_days else None,
                        max_bytes=settings.retain_max_bytes)
        app.state.retainer = Retainer(engine, policy, settings.retain_interval_s) if policy else None
        if app.state.retainer is not None:
            app.state.retainer.start()
        charts.warm_up()
        templating.warm_up()
        _freeze_start_up()
        try:
            yield
        finally:
            if app.state.retainer is not None:
                app.state.retainer.stop()
            app.state.refresher.stop()
            engine.dispose()
            if checkpointer is not None:
                checkpointer.stop()

    # /docs and /openapi.json: metrics.py, behind the read token like every other read
    app = Dashboard(title="draftscope", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.settings = settings
    app.state.login_throttle = LoginThrottle()
    _install_error_pages(app)
    # Open: ingest (its own token), the login page, /healthz and /static. Everything else reads.
    app.include_router(api.ingest_router)
    app.include_router(access.router)
    app.include_router(api.router, dependencies=[access.READ])
    # bundles before pages: its .../requests/{rid}/bundle.zip is more specific
    app.include_router(bundles.router, dependencies=[access.READ])
    app.include_router(pages.router, dependencies=[access.READ])
    app.include_router(metrics.router, dependencies=[access.READ])
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/healthz")
    def healthz(request: Request) -> JSONResponse:
        """Liveness, the database revision against this draftscope's head, background work (``healthz``)."""
        body, status = health(request.app.state)
        return JSONResponse(body, status_code=status)

    return app
