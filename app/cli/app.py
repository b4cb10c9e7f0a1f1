"""The ``draftscope`` command line: serve the dashboard, migrate the store."""

from __future__ import annotations

import ipaddress
import secrets
import zipfile
from pathlib import Path
from typing import Annotated, Optional

import pydantic
import typer

from draftscope.cli.bundle import export
from draftscope.cli.prune import prune
from draftscope.cli.stats import stats
from draftscope.findings import doctor
from draftscope.settings import Settings
from draftscope.store import db, importer

app = typer.Typer(help="draftscope: see what an EAGLE-3 draft model receives inside SGLang.",
                  no_args_is_help=True, add_completion=False)
db_app = typer.Typer(help="Create, migrate and inspect the store database.", no_args_is_help=True)
app.add_typer(db_app, name="db")

DbOption = Annotated[Optional[str], typer.Option(
    "--db", help="Database URL (default: DRAFTSCOPE_DATABASE_URL or sqlite:///./var/draftscope.db).")]


def _settings(db_url: str | None, **overrides: object) -> Settings:
    given = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**given, **({"database_url": db_url} if db_url else {}))


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_url(settings: Settings) -> str:
    """The address to open: DRAFTSCOPE_PUBLIC_URL, else host:port (loopback for a wildcard bind)."""
    if settings.public_url:
        return settings.public_url
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}/"


@app.command()
def serve(
    host: Annotated[Optional[str], typer.Option(help="Address to bind (default: DRAFTSCOPE_HOST or 127.0.0.1). A non-loopback address needs DRAFTSCOPE_INGEST_TOKEN, and a read token or --allow-anonymous-reads.")] = None,
    port: Annotated[Optional[int], typer.Option(help="Port (default: DRAFTSCOPE_PORT or 8177).")] = None,
    db_url: DbOption = None,
    upgrade: Annotated[bool, typer.Option("--upgrade", help="Create or migrate the database to the current schema first.")] = False,
    demo: Annotated[Optional[Path], typer.Option(help="Folder of recorded trace files (*.jsonl) to import when the store has no runs yet.")] = None,
    read_token: Annotated[Optional[str], typer.Option(help="Token every page, API answer, export and /metrics then needs (default: DRAFTSCOPE_READ_TOKEN; prefer the variable: a flag shows in ps). 'auto' makes one up and prints it.")] = None,
    allow_anonymous_reads: Annotated[Optional[bool], typer.Option("--allow-anonymous-reads", help="Serve a non-loopback address without a read token: anyone who reaches it reads every run (default: DRAFTSCOPE_ALLOW_ANONYMOUS_READS).")] = None,
    allowed_host: Annotated[Optional[list[str]], typer.Option("--allowed-host", help="A host name people or tracers reach the dashboard by, besides loopback names, the --host address and DRAFTSCOPE_PUBLIC_URL's host (repeat for more; default: DRAFTSCOPE_ALLOWED_HOSTS, comma-separated). Other Host headers get 400 (DNS rebinding). '*.example.com': its subdomains; '*': any.")] = None,
    forwarded_allow_ips: Annotated[Optional[str], typer.Option(help="Addresses or networks (comma-separated) of the reverse proxy in front, whose X-Forwarded-For and X-Forwarded-Proto the dashboard believes: client addresses, and https for Secure cookies (default: FORWARDED_ALLOW_IPS, else 127.0.0.1,::1).")] = None,
) -> None:
    """Run the dashboard and the ingest API.

    DRAFTSCOPE_INGEST_TOKEN=auto (DRAFTSCOPE_READ_TOKEN=auto) makes up a random ingest (read)
    token and prints it; a token needs at least 16 characters. Tracers write with the ingest token;
    people and API clients read with the read token (log in at /login, or send 'Authorization:
    Bearer <token>'). docs/security.md: who can reach what.
    """
    try:
        settings = _settings(db_url, host=host, port=port, read_token=read_token,
                             allow_anonymous_reads=allow_anonymous_reads, allowed_hosts=allowed_host)
    except pydantic.ValidationError as exc:
        typer.echo("; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors()), err=True)
        raise typer.Exit(2) from None
    problems = settings.token_problems()
    if problems:
        typer.echo("Refusing to start: " + " ".join(problems), err=True)
        raise typer.Exit(2)
    if settings.ingest_token == "auto":
        settings.ingest_token = secrets.token_urlsafe(24)
        typer.echo(f"draftscope: ingest token (send as 'Authorization: Bearer ...'): {settings.ingest_token}")
    if settings.read_token == "auto":
        settings.read_token = secrets.token_urlsafe(24)
        typer.echo(f"draftscope: read token (log in at /login, or send 'Authorization: Bearer ...'): "
                   f"{settings.read_token}")
    if not is_loopback(settings.host) and settings.ingest_token is None:
        typer.echo(f"Refusing to listen on {settings.host}: a non-loopback address would let anyone "
                   "on the network write to the store. Set DRAFTSCOPE_INGEST_TOKEN=<secret> (the "
                   "tracer sends it as a Bearer token), or bind 127.0.0.1.", err=True)
        raise typer.Exit(2)
    if not is_loopback(settings.host) and settings.read_token is None:
        if not settings.allow_anonymous_reads:
            typer.echo(f"Refusing to listen on {settings.host} without a read token: anyone on the "
                       "network could read every run. Set DRAFTSCOPE_READ_TOKEN=<secret> (or "
                       "--read-token), or pass --allow-anonymous-reads (DRAFTSCOPE_ALLOW_ANONYMOUS_READS=1) "
                       "when something else guards the address, or bind 127.0.0.1.", err=True)
            raise typer.Exit(2)
        typer.echo(f"draftscope: reads are open to anyone who reaches {settings.host}:{settings.port} "
                   "(--allow-anonymous-reads; DRAFTSCOPE_READ_TOKEN would guard them).")
    if upgrade:
        db.upgrade(settings.database_url)
    state = db.schema_state(settings.database_url)
    if not state.ok:
        typer.echo(state.problem(), err=True)
        raise typer.Exit(2)

    if demo is not None:
        _seed_demo(settings.database_url, demo)

    import uvicorn

    from draftscope.web.app import create_app
    from draftscope.web.guard import answered_names

    typer.echo(f"draftscope: {open_url(settings)}  (listening on {settings.host}:{settings.port}, "
               f"store: {db.display_url(settings.database_url)})")
    if not is_loopback(settings.host):
        typer.echo(f"draftscope: answers to the host names {', '.join(answered_names(settings))} "
                   "(others get 400: add the names people and tracers use with DRAFTSCOPE_ALLOWED_HOSTS "
                   "or --allowed-host)")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning",
                forwarded_allow_ips=forwarded_allow_ips)


def _seed_demo(url: str, folder: Path) -> None:
    engine = db.make_engine(url)
    try:
        if importer.store_is_empty(engine):
            _report_import(importer.import_files(engine, importer.trace_files(folder)))
    finally:
        engine.dispose()


def _report_import(report: importer.ImportReport) -> None:
    typer.echo(f"imported {report.stored} batches ({report.duplicates} already stored)")
    for line in report.errors:
        typer.echo(line, err=True)


@app.command("import")
def import_traces(
    files: Annotated[list[Path], typer.Argument(help="Trace bundles (*.zip, from draftscope export) or JSON-lines trace files (one wire batch per line, e.g. from the tracer's DRAFTSCOPE_FILE sink).", exists=True, dir_okay=False)],
    db_url: DbOption = None,
) -> None:
    """Import trace bundles and recorded trace files into the store (idempotent).

    A bundle is checked whole (names, sizes, checksums, schema) and stored whole or not at all; the
    same bundle twice is one run. A trace file's batches are each stored once. Exit 1: something
    was refused (named on stderr).
    """
    from draftscope.cli.bundle import import_bundles

    url = _settings(db_url).database_url
    state = db.schema_state(url)
    if not state.ok:
        typer.echo(state.problem(), err=True)
        raise typer.Exit(2)
    bundles = [f for f in files if f.suffix == ".zip" or zipfile.is_zipfile(f)]
    traces = [f for f in files if f not in bundles]
    failed = import_bundles(url, bundles) if bundles else 0
    if traces:
        engine = db.make_engine(url)
        try:
            report = importer.import_files(engine, traces)
        finally:
            engine.dispose()
        _report_import(report)
        failed += len(report.errors)
    if failed:
        raise typer.Exit(1)


@db_app.command("upgrade")
def db_upgrade(db_url: DbOption = None) -> None:
    """Create the database if needed and migrate it to the current schema."""
    url = _settings(db_url).database_url
    db.upgrade(url)
    typer.echo(f"{db.display_url(url)} is at revision {db.current_revision(url)} (head).")


@db_app.command("current")
def db_current(db_url: DbOption = None) -> None:
    """Show the database's schema revision and the head; exit 2 when it is behind."""
    state = db.schema_state(_settings(db_url).database_url)
    typer.echo(f"{db.display_url(state.url)}: revision {state.current or 'none'} (head {state.head})")
    if not state.ok:
        typer.echo(state.problem(), err=True)
        raise typer.Exit(2)


@app.command("doctor", help=doctor.SUMMARY, add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def doctor_command(ctx: typer.Context) -> None:
    # Standard-library code (so it runs from the base install): its arguments are doctor.parser()'s.
    raise typer.Exit(doctor.main(ctx.args))


app.command("stats")(stats)
app.command("export")(export)
app.command("prune")(prune)


if __name__ == "__main__":
    app(prog_name="draftscope")
