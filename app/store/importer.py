"""Import trace batches from JSON-lines files (one wire batch per line) into a store.

The tracer's file sink (``DRAFTSCOPE_FILE``) writes such files; the demo traces in ``demo/`` are
such files, recorded from the real SGLang engine. Every line goes through the ingest path, so a
file imported twice is stored once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from draftscope.store.analyze import refresh_run
from draftscope.store.ingest import BatchWriter, IngestError
from draftscope.store.models import Run


@dataclass
class ImportReport:
    stored: int = 0
    duplicates: int = 0
    errors: list[str] = field(default_factory=list)  # "file:line: message"


def import_files(engine: sa.Engine, paths: list[Path]) -> ImportReport:
    """Store every batch of every file; a bad line is reported by file and line and skipped.
    Each run that received batches is then diagnosed once (aggregates and findings)."""
    writer, report, runs = BatchWriter(engine), ImportReport(), set()
    for path in paths:
        with path.open("rb") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    result = writer.write(line)
                except IngestError as exc:
                    report.errors.append(f"{path}:{number}: {exc.message}")
                    continue
                if result.status == "stored":
                    report.stored += 1
                    runs.add(result.run_id)
                else:
                    report.duplicates += 1
    for run_id in sorted(runs):
        refresh_run(engine, run_id)
    return report


def trace_files(folder: Path) -> list[Path]:
    """The ``*.jsonl`` files of ``folder``, sorted, so runs import in a stable order."""
    return sorted(folder.glob("*.jsonl"))


def store_is_empty(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(sa.select(Run.id).limit(1)).first() is None
