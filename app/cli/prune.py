"""``draftscope prune``: delete whole runs by id, by age or down to a size, and give the space back."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from draftscope import units
from draftscope.settings import Settings
from draftscope.store import db, retention


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def prune(
    older_than: Annotated[Optional[str], typer.Option("--older-than", help="Delete runs last written longer ago than this: 7d, 12h, 30m, 2w.")] = None,
    run: Annotated[Optional[list[str]], typer.Option("--run", help="Delete this run (repeatable).")] = None,
    max_size: Annotated[Optional[str], typer.Option("--max-size", help="Then delete the least recently written runs until the store's live rows take at most this: 10GB, 500MB, 2GiB.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say which runs would go (sizes estimated), delete nothing.")] = False,
    vacuum: Annotated[bool, typer.Option("--vacuum", help="Afterwards rewrite the store with a full VACUUM: once for a SQLite store made before schema 0004, to switch incremental auto-vacuum on (blocks writers while it runs).")] = False,
    db_url: Annotated[Optional[str], typer.Option("--db", help="Database URL (default: DRAFTSCOPE_DATABASE_URL or sqlite:///./var/draftscope.db).")] = None,
) -> None:
    """Delete whole runs: each is hidden from every page first, then its rows go in short transactions.

    A run still being written (running with data in the last hour, or any batch in the last minute) is never deleted.

    SQLite gives the freed pages back to the file system in small steps; ingest keeps going meanwhile.

    The dashboard does this by itself with DRAFTSCOPE_RETAIN_MAX_BYTES and DRAFTSCOPE_RETAIN_DAYS.

    Exit 0: done; 1: a run named with --run is not stored or is being written, or the store is
    still (with --dry-run: would still be) over --max-size; 2: bad arguments or store.
    """
    try:
        age = units.parse_age(older_than) if older_than else None
        size = units.parse_size(max_size) if max_size else None
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    if age is None and size is None and not run and not vacuum:
        typer.echo("error: say what to prune: --older-than AGE, --run ID or --max-size SIZE "
                   "(or --vacuum alone to rewrite the store).", err=True)
        raise typer.Exit(2)
    url = (Settings(database_url=db_url) if db_url else Settings()).database_url
    state = db.schema_state(url)
    if not state.ok:
        typer.echo(state.problem(), err=True)
        raise typer.Exit(2)
    engine = db.make_engine(url)
    try:
        started = time.monotonic()
        report = retention.prune(engine, older_than_s=age, max_bytes=size, run_ids=tuple(run or ()),
                                 dry_run=dry_run)
        verb = "would delete" if dry_run else "deleted"
        for r, estimate in report.deleted:
            typer.echo(f"{verb} run {r.id} ({r.status}, last data "
                       f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(r.last_at))} UTC, {r.rows} records, "
                       f"~{_gb(estimate)})")
        for run_id in report.kept_writing:
            typer.echo(f"kept run {run_id}: it is being written", err=True)
        for run_id in report.unknown:
            typer.echo(f"no run {run_id} is stored", err=True)
        freed = 0
        if not dry_run and report.deleted:
            freed = retention.reclaim(engine)
        if vacuum and not dry_run:
            retention.vacuum(engine)
        typer.echo(f"{len(report.deleted)} runs {verb} in {time.monotonic() - started:.1f} s; live rows "
                   f"{_gb(report.bytes_before)} -> {_gb(report.bytes_after)}"
                   + (f"; {freed} free pages given back" if freed else "")
                   + ("; store rewritten (VACUUM)" if vacuum and not dry_run else ""))
    finally:
        engine.dispose()
    over = size is not None and report.bytes_after > size
    if over:
        why = (f"the runs left are being written ({', '.join(report.kept_writing)})" if report.kept_writing
               else "no run is left to delete")
        typer.echo(f"error: the store's live rows {'would still take' if dry_run else 'still take'} "
                   f"{_gb(report.bytes_after)}, over --max-size {_gb(size)}: {why}. Prune again once "
                   "they have ended, or raise --max-size.", err=True)
    if over or set(run or ()) & (set(report.kept_writing) | set(report.unknown)):
        raise typer.Exit(1)
