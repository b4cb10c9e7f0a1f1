"""Store a validated bundle: through the ingest path, in one transaction, once.

The run and its records go in as wire batches (``BatchWriter.store``), the import is recorded in
``bundle_imports`` (origin, the bundle's sha256, its manifest), and the run's findings are
recomputed, all in one transaction: a failure anywhere leaves the store as it was. The same
bundle imported again changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import sqlalchemy as sa

from draftscope.bundle import format as fmt
from draftscope.bundle.reader import Bundle, BundleError, gc_paused
from draftscope.store.analyze import analyze_in
from draftscope.store.ingest import BatchWriter, IngestError
from draftscope.store.tables import IMPORTS, RUNS
from draftscope.store.wire_schema import FastBatch
from draftscope_tracer.transport import wire

RECORDS_PER_BATCH = 20_000


@dataclass(frozen=True)
class ImportResult:
    status: str  # "imported" | "already imported"
    run_id: str
    sha256: str
    counts: dict[str, int]


def store_bundle(writer: BatchWriter, bundle: Bundle, origin: str,
                 progress: Callable[[int], None] | None = None) -> ImportResult:
    """Store ``bundle`` as one run marked imported from ``origin``; raises BundleError."""
    counts = dict(bundle.manifest.counts)
    with writer.transaction() as conn:
        if conn.execute(sa.select(IMPORTS.c.sha256)
                        .where(IMPORTS.c.sha256 == bundle.sha256)).first() is not None:
            return ImportResult("already imported", bundle.run_id, bundle.sha256, counts)
        _refuse_known_run(conn, bundle.run_id)
        try:
            with gc_paused():
                for batch in _batches(bundle):  # reads the records again (checksums too)
                    if writer.store(conn, batch).status != "stored":
                        raise BundleError(f"Batch {batch.batch_id} of this bundle is already "
                                          "stored; nothing was imported.")
                    if progress is not None:
                        progress(sum(len(getattr(batch, k)) for k in fmt.BATCH_KEYS.values()))
        except IngestError as exc:
            raise BundleError(f"The bundle's records do not fit the store: {exc.message}") from None
        conn.execute(IMPORTS.insert().values(
            sha256=bundle.sha256, run_id=bundle.run_id, origin=origin, imported_at=time.time(),
            manifest=bundle.manifest.model_dump(mode="json")))
        analyze_in(conn, bundle.run_id)  # aggregates and findings commit with the rest
    return ImportResult("imported", bundle.run_id, bundle.sha256, counts)


def _refuse_known_run(conn: sa.Connection, run_id: str) -> None:
    row = conn.execute(sa.select(RUNS.c.source).where(RUNS.c.id == run_id)).first()
    if row is None:
        return
    came = conn.execute(sa.select(IMPORTS.c.origin, IMPORTS.c.sha256)
                        .where(IMPORTS.c.run_id == run_id)).first()
    how = (f"imported from {came.origin} (bundle sha256 {came.sha256[:12]}...)" if came
           else f"recorded here (source {row.source!r})")
    raise BundleError(f"Run {run_id} is already stored in this dashboard, {how}; this bundle "
                      "holds the same run, so nothing was imported. Open /runs/" + run_id + ".")


def _batches(bundle: Bundle) -> Iterator[Any]:
    """The bundle's records as wire batches, the run record (marked ``source: bundle``) first."""
    manifest = bundle.manifest
    run = msgspec.structs.replace(bundle.run, source="bundle")
    n = 0

    def batch(run_record: Any = None, **records: list) -> Any:
        nonlocal n
        n += 1
        return FastBatch(schema_version=wire.SCHEMA_VERSION, batch_id=f"bundle-{bundle.sha256}-{n}",
                         run_id=manifest.run_id, sent_at=manifest.created_at, run=run_record,
                         **records)

    yield batch(run)
    for table, records in bundle.chunks(RECORDS_PER_BATCH):
        yield batch(**{fmt.BATCH_KEYS[table]: records})
