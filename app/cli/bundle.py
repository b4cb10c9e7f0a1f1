"""``draftscope export`` (a run as a trace bundle) and the bundle half of ``draftscope import``."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator, Optional

import typer

SHOW_PROGRESS_FROM = 10_000  # records; smaller runs export and import in well under a second


def export(
    run_id: Annotated[str, typer.Argument(help="The run to export (its id, as on the runs list).")],
    requests: Annotated[Optional[list[str]], typer.Option("--requests", metavar="RID", help="Export only this request (repeat for more); run-level records come too.")] = None,
    include_text: Annotated[bool, typer.Option("--include-text", help="Add text.jsonl: each request's generated text, decoded from the recorded token ids with the target's tokenizer (needs it readable here).")] = False,
    keep_paths: Annotated[bool, typer.Option("--keep-paths", help="Keep paths under your home directory as they are (default: written ~/...).")] = False,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Bundle file to write (default: draftscope-RUN.zip here).", dir_okay=False)] = None,
    db_url: Annotated[Optional[str], typer.Option("--db", help="Database URL (default: DRAFTSCOPE_DATABASE_URL or sqlite:///./var/draftscope.db).")] = None,
) -> None:
    """Write a run as a trace bundle (one zip) to attach to a bug report.

    The bundle holds the run's records, findings, feature spec and versions; never secrets (server
    args pass an allow-list), and no text unless --include-text. Exit 1: no such run or request.
    """
    from draftscope.bundle.export import ExportError, count_records, export_to_file
    from draftscope.bundle.text import TextUnavailable

    engine = _engine(db_url)
    path = output or Path(f"draftscope-{run_id[:12]}.zip")
    try:
        total = count_records(engine, run_id, requests)
        with _progress("exporting", total) as advance:
            manifest = export_to_file(engine, run_id, path, requests=requests,
                                      include_text=include_text, keep_paths=keep_paths,
                                      progress=advance)
    except (ExportError, TextUnavailable) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    finally:
        engine.dispose()
    counts = manifest["counts"]
    typer.echo(f"wrote {path} ({path.stat().st_size:,} bytes): run {run_id}, "
               f"{counts['requests']} requests, {counts['verify_steps']} verify steps, "
               f"{counts['tensor_samples']} samples, {counts['findings']} findings"
               f"{', with text' if include_text else ''}")


def import_bundles(url: str, paths: list[Path]) -> int:
    """Import each bundle in ``paths`` (each whole or not at all); the number that failed."""
    from draftscope.bundle.loader import store_bundle
    from draftscope.bundle.reader import BundleError, read_bundle
    from draftscope.store.ingest import BatchWriter

    engine = _engine(url)
    failed = 0
    try:
        writer = BatchWriter(engine)
        for path in paths:
            try:
                with path.open("rb") as file:
                    bundle = read_bundle(file)
                    total = sum(bundle.manifest.counts.values())
                    with _progress(f"importing {path.name}", total) as advance:
                        result = store_bundle(writer, bundle, origin=path.name, progress=advance)
            except BundleError as exc:
                typer.echo(f"{path}: {exc} Nothing was imported.", err=True)
                failed += 1
                continue
            typer.echo(f"{path}: {result.status} run {result.run_id} (bundle sha256 "
                       f"{result.sha256[:12]}..., {result.counts['requests']} requests)")
    finally:
        engine.dispose()
    return failed


def _engine(db_url: str | None):
    from draftscope.settings import Settings
    from draftscope.store import db

    url = db_url or Settings().database_url
    state = db.schema_state(url)
    if not state.ok:
        typer.echo(state.problem(), err=True)
        raise typer.Exit(2)
    return db.make_engine(url)


@contextmanager
def _progress(what: str, total: int) -> Iterator:
    """A rich progress bar on a terminal for runs of at least SHOW_PROGRESS_FROM records."""
    if total < SHOW_PROGRESS_FROM or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)
