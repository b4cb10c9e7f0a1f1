"""Write a run of the store as a trace bundle. Reads only (one consistent snapshot), writes a zip.

What a bundle leaves out is in ``privacy``: secret names, credentials in any value (the run record
through ``queries.safe_run``, findings and the feature spec through ``redact.scrub``), home paths.

Records stream from the database into JSON-lines members; JSON columns are copied as the text the
store holds (``orjson.Fragment``), so a large run is not decoded and re-encoded row by row.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson
import sqlalchemy as sa

from draftscope.bundle import format as fmt
from draftscope.bundle.privacy import drop_secrets, private_run, shorten_paths
from draftscope.bundle.readme import readme_text
from draftscope.bundle.text import load_tokenizer, text_line
from draftscope.redact import scrub
from draftscope.spec import SpecError, read_draft, read_target
from draftscope.spec.block import model_dir
from draftscope.store import models, retention, wire_schema
from draftscope.store.tables import REQUESTS, RUN_FIELDS, RUNS, key_of, of_run
from draftscope_tracer.transport import wire

Progress = Callable[[int], None]  # called with the number of records just written
_FETCH = 5000
# deflate level 1: about half the export CPU of the default (6) on record JSON, for a bundle about
# a sixth larger. Members carry zip's fixed 1980 date: the same records give the same member bytes.
COMPRESS_LEVEL = 1


class ExportError(Exception):
    """No such run or request; the message says where to look."""


class Unexportable(ExportError):
    """A stored run a bundle cannot hold (an engine the bundle format does not know)."""


def count_records(engine: sa.Engine, run_id: str, requests: list[str] | None = None) -> int:
    """How many records an export of ``run_id`` writes (for a progress bar's total)."""
    with engine.connect() as conn:
        key = key_of(conn, run_id)
        return sum(conn.execute(sa.select(sa.func.count()).select_from(_table(t))
                                .where(*_where(t, run_id, key, requests))).scalar_one()
                   for t in fmt.TABLE_MEMBERS)


def export_bundle(engine: sa.Engine, run_id: str, out: IO[bytes], *, requests: list[str] | None = None,
                  include_text: bool = False, keep_paths: bool = False,
                  progress: Progress | None = None) -> dict[str, Any]:
    """Write the bundle of ``run_id`` (only ``requests`` when given) to ``out``; returns the manifest.

    Raises ExportError for an unknown run or request, ``text.TextUnavailable`` when
    ``include_text`` cannot decode here; nothing is written to the store.
    """
    with _snapshot(engine) as conn:
        run = conn.execute(sa.select(*RUN_FIELDS).where(RUNS.c.id == run_id, RUNS.c.status != retention.PRUNING)
                           ).mappings().first()
        if run is None:  # or being pruned (retention.PRUNING): gone
            raise ExportError(f"No run {run_id!r} is stored. `draftscope serve` lists the stored "
                              "runs at /, and GET /api/v1/runs returns them.")
        run = {k: v for k, v in run.items() if k != "id"}
        if run["engine"] not in wire_schema.ENGINES:  # stored by an older draftscope that took any engine
            raise Unexportable(f"Run {run_id!r} was recorded by engine {run['engine']!r}, which a trace "
                               f"bundle cannot hold (it knows {', '.join(wire_schema.ENGINES)}); its pages, "
                               "JSON and CSV still show it.")
        _check_requests(conn, run_id, requests)
        tokenizer = load_tokenizer(run["target_path"]) if include_text else None
        private = private_run(run) if keep_paths else shorten_paths(private_run(run))
        created = time.time()
        members: dict[str, dict[str, Any]] = {}
        counts: dict[str, int] = {}
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED,
                             compresslevel=COMPRESS_LEVEL) as zf:
            members[fmt.RUN] = _put(zf, fmt.RUN, orjson.dumps(private, option=orjson.OPT_INDENT_2))
            emitted: dict[str, list[dict]] | None = {} if include_text else None
            findings: list[dict[str, Any]] = []
            for table, name in fmt.TABLE_MEMBERS.items():
                rows = _records(conn, table, run_id, requests)
                if table == "findings":  # free text a tracer wrote: credentials scrubbed (``redact``)
                    findings = [r if keep_paths else shorten_paths(r) for r in
                                (scrub(orjson.loads(orjson.dumps(row))) for row in rows)]
                    rows = iter(findings)
                elif table == "verify_steps" and emitted is not None:
                    rows = _collect_steps(rows, emitted)
                members[name], counts[table] = _put_lines(zf, name, rows, progress)
            if tokenizer is not None and emitted is not None:
                lines = (text_line(tokenizer, rid, steps) for rid, steps in emitted.items())
                members[fmt.TEXT], counts["text"] = _put_lines(zf, fmt.TEXT, lines, None)
            manifest = {
                "bundle_schema_version": fmt.BUNDLE_SCHEMA_VERSION,
                "wire_schema_version": wire.SCHEMA_VERSION,
                "created_at": created,
                "created_by": f"draftscope {_version()}",
                "run_id": run_id,
                "engine": private.get("engine") or "sglang",
                "requests": requests,
                "include_text": include_text,
                "paths": "kept" if keep_paths else "shortened",
                **_environment(private),
                "server_args": private["server_args"],
                "feature_spec": _feature_spec(run, keep_paths),
                "findings": findings,
                "counts": counts,
            }
            readme = readme_text(manifest).encode()
            members[fmt.README] = _put(zf, fmt.README, readme)
            manifest["members"] = dict(sorted(members.items()))
            fmt.Manifest.model_validate(manifest)  # the reader's own check, before anyone else's
            body = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
            _put(zf, fmt.MANIFEST, body)
    return manifest


def export_to_file(engine: sa.Engine, run_id: str, path: Path, **options: Any) -> dict[str, Any]:
    """``export_bundle`` into ``path``, written beside it first so that a failure leaves no file."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        with partial.open("wb") as out:
            manifest = export_bundle(engine, run_id, out, **options)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return manifest


def _snapshot(engine: sa.Engine) -> sa.Connection:
    """A read-only connection that sees one snapshot (PostgreSQL: REPEATABLE READ, read only)."""
    if engine.dialect.name == "postgresql":
        return engine.connect().execution_options(isolation_level="REPEATABLE READ",
                                                  postgresql_readonly=True)
    return engine.connect()


def _check_requests(conn: sa.Connection, run_id: str, requests: list[str] | None) -> None:
    if requests is None:
        return
    known = set(conn.execute(sa.select(REQUESTS.c.rid).where(REQUESTS.c.run_id == run_id,
                                                             REQUESTS.c.rid.in_(requests))).scalars())
    missing = [rid for rid in requests if rid not in known]
    if missing:
        raise ExportError(f"Run {run_id!r} has no request {', '.join(map(repr, missing))}. Its "
                          f"requests are listed on /runs/{run_id} and by GET /api/v1/runs/{run_id}.")


def _table(table: str) -> sa.Table:
    return models.RECORD_MODELS[table].__table__


def _where(table: str, run_id: str, key: int | None, requests: list[str] | None) -> list[Any]:
    """Rows of the run (``key``: its key's value, ``tables.key_of``); with a selection, those of the selected
    requests plus run-level rows."""
    t = _table(table)
    clauses = [of_run(t, run_id, key)]
    if requests is not None and "rid" in t.c and table != "tracer_health":
        clauses.append(t.c.rid.in_(requests) if table == "requests"
                       else sa.or_(t.c.rid.in_(requests), t.c.rid.is_(None)))
    return clauses


def _records(conn: sa.Connection, table: str, run_id: str, requests: list[str] | None):
    """The table's records of the run as wire dicts, JSON columns as stored text (Fragments)."""
    t = _table(table)
    columns = wire.TABLE_COLUMNS[table][1:]
    selected = [sa.cast(t.c[c], sa.Text) if c in wire.JSON_COLUMNS else t.c[c] for c in columns]
    json_at = [i for i, c in enumerate(columns) if c in wire.JSON_COLUMNS]
    query = sa.select(*selected).where(*_where(table, run_id, key_of(conn, run_id), requests)).order_by(t.c.id)
    for row in conn.execution_options(yield_per=_FETCH).execute(query):
        values = list(row)
        for i in json_at:
            if values[i] is not None:
                values[i] = orjson.Fragment(values[i])
        yield {c: v for c, v in zip(columns, values) if v is not None}


def _collect_steps(rows, emitted: dict[str, list[dict]]):
    """Pass verify steps through, keeping what ``text.jsonl`` needs of each."""
    for row in rows:
        step = orjson.loads(orjson.dumps({k: row.get(k) for k in ("drafted_tokens", "accept_flags",
                                                                    "bonus_token")}))
        emitted.setdefault(row["rid"], []).append(step)
        yield row


def _put(zf: zipfile.ZipFile, name: str, data: bytes) -> dict[str, Any]:
    with zf.open(name, "w") as member:
        member.write(data)
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _put_lines(zf: zipfile.ZipFile, name: str, rows,
               progress: Progress | None) -> tuple[dict[str, Any], int]:
    """Write ``rows`` as JSON lines into member ``name``; (its sha256 and size, rows written)."""
    digest, size, count, chunk = hashlib.sha256(), 0, 0, []
    with zf.open(name, "w", force_zip64=True) as member:
        for row in rows:
            chunk.append(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
            count += 1
            if len(chunk) == _FETCH:
                size += _flush(member, digest, chunk, progress)
        size += _flush(member, digest, chunk, progress)
    return {"sha256": digest.hexdigest(), "size": size}, count


def _flush(member: IO[bytes], digest: Any, chunk: list[bytes], progress: Progress | None) -> int:
    data = b"".join(chunk)
    member.write(data)
    digest.update(data)
    if progress is not None and chunk:
        progress(len(chunk))
    chunk.clear()
    return len(data)


def _version() -> str:
    try:
        return importlib.metadata.version("draftscope")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _environment(run: dict[str, Any]) -> dict[str, Any]:
    """Versions and hardware: the serving engine's (SGLang's or vLLM's) from the run, the rest from the tracer's ``environment``
    fact (None where the tracer that recorded the run did not record it)."""
    env = (run.get("facts") or {}).get("environment") or {}
    engine = run.get("engine") or "sglang"
    versions = {"draftscope": _version(), engine: run.get("engine_version")}
    versions |= {k: env.get(k) for k in ("python", "torch", "cuda", "driver")}
    return {"versions": {k: None if v is None else str(v) for k, v in versions.items()},
            "hardware": env.get("hardware")}


def _feature_spec(run: dict[str, Any], keep_paths: bool) -> dict[str, Any]:
    """The draft's feature spec and the target's shape, read from the recorded directories."""
    facts = run.get("facts") or {}
    draft_rec = (facts.get("draft") or {}).get("path") or run.get("draft_path")
    target_rec = (facts.get("target") or {}).get("path") or run.get("target_path")
    draft_dir, target_dir = model_dir(draft_rec), model_dir(target_rec)  # a folder on this host, else None
    try:
        if not draft_rec or not target_rec:
            raise SpecError(Path(draft_rec or target_rec or "."), "was not recorded by the tracer")
        if not draft_dir or not target_dir:  # scrubbed before Path() folds a URL's "//" out of scrub's reach
            raise SpecError(Path(scrub(target_rec if draft_dir else draft_rec)), "is not a folder on this host")
        target = read_target(target_dir)
        draft = read_draft(draft_dir, target_layers=target.num_layers).to_dict()
    except (SpecError, OSError, ValueError) as exc:
        return {"draft": None, "target": None,
                "unavailable": scrub(f"not readable where the bundle was made: {exc}")}
    for key in ("config", "training", "verifier"):
        draft[key] = drop_secrets(draft.get(key))
    spec = {"draft": draft, "target": target.__dict__.copy(), "unavailable": None}
    return scrub(orjson.loads(orjson.dumps(spec if keep_paths else shorten_paths(spec),
                                           option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)))
