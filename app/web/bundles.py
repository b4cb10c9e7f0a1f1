"""Bundle routes: download a run (or one request) as a trace bundle; upload a bundle to import.

The downloads read only; ``POST /import`` is the one route here that writes.
"""

from __future__ import annotations

import html
import os
import re
import secrets
import tempfile
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from draftscope.bundle.export import ExportError, Unexportable, export_to_file
from draftscope.bundle.loader import ImportResult, store_bundle
from draftscope.bundle.reader import BundleError, read_bundle
from draftscope.bundle.text import TextUnavailable
from draftscope.web.pages import PageError
from draftscope.web.templating import templates

router = APIRouter()
MAX_UPLOAD_BYTES = 2 * 1024**3  # compressed; the reader's limits bound what it expands to


@router.get("/runs/{run_id}/bundle.zip")
def run_bundle(request: Request, run_id: str, include_text: bool = False,
               keep_paths: bool = False) -> Response:
    """The run as a trace bundle (docs/bundles.md): no secrets, no text unless include_text."""
    return _download(request, run_id, None, include_text, keep_paths)


@router.get("/runs/{run_id}/requests/{rid:path}/bundle.zip")
def request_bundle(request: Request, run_id: str, rid: str, include_text: bool = False,
                   keep_paths: bool = False) -> Response:
    """One request of the run (with the run-level records) as a trace bundle."""
    return _download(request, run_id, [rid], include_text, keep_paths)


def _download(request: Request, run_id: str, requests: list[str] | None, include_text: bool,
              keep_paths: bool) -> Response:
    fd, name = tempfile.mkstemp(prefix="draftscope-bundle-", suffix=".zip")
    os.close(fd)
    path = Path(name)
    try:
        export_to_file(request.app.state.engine, run_id, path, requests=requests,
                       include_text=include_text, keep_paths=keep_paths)
    except Unexportable as exc:
        path.unlink(missing_ok=True)
        raise PageError(409, "Cannot be exported", str(exc), ["Open the run's page or its .json."]) from None
    except ExportError as exc:
        path.unlink(missing_ok=True)
        raise PageError(404, "Not found", str(exc), ["Open the runs list to see every stored run."]) from None
    except TextUnavailable as exc:
        path.unlink(missing_ok=True)
        return HTMLResponse(f"<p>{html.escape(str(exc))}</p>", status_code=409)
    named = f"run-{run_id}" + ("" if requests is None else f"-request-{requests[0]}")  # as the CSV twins
    return FileResponse(path, media_type="application/zip",
                        filename=re.sub(r"[^A-Za-z0-9_.-]+", "_", named) + "-bundle.zip",
                        background=BackgroundTask(path.unlink, missing_ok=True))


@router.get("/import", response_class=HTMLResponse)
def import_page(request: Request) -> HTMLResponse:
    """The upload form."""
    return templates.TemplateResponse(request, "import.html", _context(request, None, None))


@router.post("/import", response_class=HTMLResponse)
async def import_upload(request: Request) -> HTMLResponse:
    """Validate and store an uploaded bundle, whole or not at all. When the dashboard has an ingest
    token, the form's ``token`` field (or a Bearer header) must carry it. An htmx request gets only
    the result block (status 200, so that htmx shows an error inline); others the page with 4xx."""
    result, error, status = None, None, 422
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_UPLOAD_BYTES:
        error = (f"The upload is larger than {MAX_UPLOAD_BYTES:,} bytes. Export fewer requests "
                 "(draftscope export --requests ...) or import it with draftscope import.")
    else:
        form = await request.form(max_files=1, max_fields=1)
        try:
            upload = form.get("bundle")
            if not _token_ok(request, form.get("token")):
                error, status = ("This dashboard takes imports with its ingest token "
                                 "(DRAFTSCOPE_INGEST_TOKEN): enter it in the token field."), 401
            elif not isinstance(upload, UploadFile) or not upload.filename:
                error = "Choose a bundle file (a .zip made by draftscope export or the Export button)."
            else:
                result = await run_in_threadpool(_store_upload, request, upload)
        except BundleError as exc:
            error = f"{exc} Nothing was imported."
        finally:
            await form.close()
    htmx = bool(request.headers.get("hx-request"))
    return templates.TemplateResponse(request, "import.html", _context(request, result, error),
                                      status_code=200 if error is None or htmx else status,
                                      block_name="result" if htmx else None)


def _context(request: Request, result: ImportResult | None, error: str | None) -> dict:
    return {"result": result, "error": error,
            "token_required": request.app.state.settings.ingest_token is not None}


def _token_ok(request: Request, field: object) -> bool:
    """No ingest token set, or the form's token field / a Bearer header carries it."""
    expected = request.app.state.settings.ingest_token
    if expected is None:
        return True
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    given = bearer if scheme.lower() == "bearer" else (field if isinstance(field, str) else "")
    return secrets.compare_digest(given.encode(), expected.encode())


def _store_upload(request: Request, upload: UploadFile) -> ImportResult:
    bundle = read_bundle(upload.file)
    name = re.sub(r"[\x00-\x1f\x7f]", "?", upload.filename)[:200]  # no NUL or line break in the store
    return store_bundle(request.app.state.writer, bundle, origin=f"upload {name}")
