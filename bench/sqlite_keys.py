"""SQLite alone, no draftscope code on the path: sample rows per CPU-second into ``tensor_samples``.

    .venv/bin/python bench/sqlite_keys.py [--batches 200] [--batch-rows 5000]

The table and its index as the store declares them (``models.TensorSample``), the dashboard's pragmas
(WAL, ``synchronous=NORMAL``, 64 MiB cache, no autocheckpoint), one ``executemany`` and commit per batch,
the WAL checkpointed at the end (not timed). Three variants, each a fresh file:

- ``moving keys``: each batch samples its own 16 requests (as a server's batches do);
- ``re-sent keys``: every batch the same 16 rids and steps (what ``bench/ingest_bench.py`` sent until
  2026-12-05): each batch's index entries go between all the earlier ones;
- ``text run id``: moving keys, the run named by its 32-character id (the store before migration
  0009) instead of its integer key.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path

import orjson
import sqlalchemy as sa
from sqlalchemy.schema import CreateIndex, CreateTable

from draftscope.store.models import TensorSample

POINTS = [("draft.input", "draft_decode", 12288), ("target.aux[0]", "verify", 4096),
          ("target.aux[1]", "verify", 4096), ("target.aux[2]", "verify", 4096),
          ("draft.fc.out", "draft_decode", 4096), ("draft.logits", "draft_decode", 32000)]
COLUMNS = [c.name for c in TensorSample.__table__.columns if c.name != "id"]


def ddl(text_run_id: bool) -> list[str]:
    """The store's CREATE TABLE and CREATE INDEX of ``tensor_samples``, without its foreign key."""
    table = TensorSample.__table__.to_metadata(sa.MetaData())
    for fk in list(table.foreign_key_constraints):
        table.constraints.discard(fk)
    for column in table.columns:
        column.foreign_keys.clear()
    if text_run_id:
        table.c.run_key.type = sa.String()
    dialect = sa.create_engine("sqlite://").dialect
    return [str(CreateTable(table).compile(dialect=dialect)),
            *(str(CreateIndex(ix).compile(dialect=dialect)) for ix in table.indexes)]


def batch(run: str | int, prefix: str, rows: int) -> list[tuple]:
    """``rows`` sample rows for 16 requests named ``prefix-NNNN``, consecutive steps."""
    now, out = time.time(), []
    for i in range(rows):
        point, phase, width = POINTS[i % len(POINTS)]
        n = random.choice((1, 4, 8))
        record = {"run_key": run, "point": point, "phase": phase, "at": now + i * 1e-4,
                  "rid": f"{prefix}-{i % 16:04d}", "step_index": i // 16,
                  "shape": orjson.dumps([n, width]).decode(), "dtype": "bfloat16", "width": width, "rows": n,
                  "l2_mean": random.uniform(20, 80), "l2_max": random.uniform(80, 200),
                  "mean": random.gauss(0, 0.05), "std": random.uniform(0.2, 1.5),
                  "absmax": random.uniform(5, 60), "nan_count": 0, "inf_count": 0}
        out.append(tuple(record.get(c) for c in COLUMNS))
    return out


def measure(path: Path, variant: str, batches: int, batch_rows: int) -> float:
    """Rows per CPU-second of inserting ``batches`` batches into a fresh store at ``path``."""
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in ("auto_vacuum=INCREMENTAL", "journal_mode=WAL", "synchronous=NORMAL",
                   "cache_size=-65536", "wal_autocheckpoint=0"):
        conn.execute(f"PRAGMA {pragma}")
    for statement in ddl(variant == "text run id"):
        conn.execute(statement)
    run = uuid.uuid4().hex if variant == "text run id" else 1
    same = uuid.uuid4().hex[:8]
    data = [batch(run, same if variant == "re-sent keys" else uuid.uuid4().hex[:8], batch_rows)
            for _ in range(batches)]
    sql = f"INSERT INTO tensor_samples ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    t0 = time.process_time()
    for rows in data:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, rows)
        conn.execute("COMMIT")
    cpu = time.process_time() - t0
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return batches * batch_rows / cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--batch-rows", type=int, default=5000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftscope-sqlite-keys-") as tmp:
        for i, variant in enumerate(("moving keys", "re-sent keys", "text run id")):
            rate = measure(Path(tmp) / f"{i}.db", variant, args.batches, args.batch_rows)
            print(f"{variant:16s} {rate:9,.0f} rows per CPU-second "
                  f"({args.batches} batches of {args.batch_rows:,})")


if __name__ == "__main__":
    main()
