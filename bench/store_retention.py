"""Store growth and retention on SQLite: bytes per sampled request and per day, and prune time on a
large store, with the ingest latency a writer sees while the prune runs.

1. Fills a template run of --requests sampled requests x --steps-per-request verify steps (2 tensor
   samples per step: page_bench's generator) through ``ingest.BatchWriter`` into a new store
   (schema head, incremental auto-vacuum) and prints the store's live bytes per sampled request,
   and per day for a server at N requests/s sampled 1 in 16.
2. Grows the store to --size by copying the template's rows under new run ids (``INSERT ... SELECT``,
   the same row shapes), each copy a run last written one hour earlier than the one before.
3. Prunes to --prune-to (``retention.prune``: whole runs, oldest first) and gives the pages back
   (``retention.reclaim``), while a thread stores one small batch of a live run every 0.1 s through
   ``BatchWriter``; prints the time of each phase, the file size before and after, the largest
   WAL seen, and that writer's latency (p50, p99, max) in each phase, its three slowest batches
   split into the wait for the write lock (``BEGIN IMMEDIATE``) and the commit, and retention's own
   steps (delete chunks, vacuum steps, checkpoints: count, total, p50, max) from its debug log.

    .venv/bin/python bench/store_retention.py --size 1GB --prune-to 500MB    # the figures in docs/benchmarks.md
    .venv/bin/python bench/store_retention.py --size 3GB --prune-to 1500MB
    .venv/bin/python bench/store_retention.py --size 500MB --prune-to 250MB  # a quick look
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import orjson
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.page_bench import request_batch, run_record  # noqa: E402
from draftscope import units  # noqa: E402
from draftscope.store import db, retention  # noqa: E402
from draftscope.store.ingest import BatchWriter  # noqa: E402
from draftscope_tracer.transport import wire  # noqa: E402

COPIED = ("requests", "verify_steps", "tensor_samples", "ingest_batches")


def live_bytes(engine) -> int:
    with engine.connect() as conn:
        return retention.store_bytes(conn)


def fill_template(engine, args) -> str:
    run_id, rng, t0 = uuid.uuid4().hex, random.Random(0), time.time() - 30 * 86400
    writer = BatchWriter(engine)
    writer.write(orjson.dumps({"schema_version": 1, "batch_id": uuid.uuid4().hex, "run_id": run_id,
                               "sent_at": t0, "run": {**run_record(t0), "status": "ended"}}))
    for first in range(0, args.requests, 10):
        rids = [f"req-{i:05d}" for i in range(first, min(first + 10, args.requests))]
        writer.write(request_batch(run_id, rids, args.steps_per_request, t0, rng))
    return run_id


def copy_run(raw, template: str, age_s: float) -> str:
    """The template's rows again under a new run id, its batches received ``age_s`` ago."""
    new = uuid.uuid4().hex
    run_cols = [c for c in ["id", *wire.RunRecord.__annotations__]]
    cur = raw.cursor()
    cur.execute("BEGIN IMMEDIATE")
    cur.execute(f"INSERT INTO runs ({', '.join(run_cols)}, key) SELECT ?, {', '.join(run_cols[1:])}, "
                "(SELECT MAX(key) + 1 FROM runs) FROM runs WHERE id = ?", (new, template))
    for table in COPIED:
        cols = wire.TABLE_COLUMNS.get(table) or ["run_id", "batch_id", "sent_at", "received_at", "request_rows",
                                                 "step_rows", "sample_rows", "health_rows", "finding_rows"]
        run, rest = cols[0], cols[1:]
        this = "?" if run == "run_id" else "(SELECT key FROM runs WHERE id = ?)"  # run_key: the run's key
        select = [{"batch_id": "batch_id || ?", "received_at": "?"}.get(c, c) for c in rest]
        params = (new, new, time.time() - age_s, template) if table == "ingest_batches" else (new, template)
        cur.execute(f"INSERT INTO {table} ({run}, {', '.join(rest)}) SELECT {this}, {', '.join(select)} "
                    f"FROM {table} WHERE {run} = {this}", params)
    cur.execute("COMMIT")
    return new


def grow(url: str, engine, template: str, size: int) -> int:
    raw = engine.raw_connection()
    try:
        copies, start = 0, time.perf_counter()
        while live_bytes(engine) < size:
            copy_run(raw, template, age_s=3600.0 * (10_000 - copies))
            copies += 1
            print(f"\r  {copies} runs, {live_bytes(engine) / 1e9:.2f} GB", end="", flush=True)
        raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        raw.close()
    print(f"\ngrow: {copies + 1} runs, {live_bytes(engine) / 1e9:.2f} GB live, file "
          f"{os.path.getsize(db_path(url)) / 1e9:.2f} GB, in {time.perf_counter() - start:.0f} s")
    return copies + 1


def db_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


class LiveWriter(threading.Thread):
    """A live run's writer: one small batch (2 requests x 5 steps) every 0.1 s; keeps latencies and,
    per batch, where it waited: for the write lock (``BEGIN IMMEDIATE``) and in its commit (which may
    run an automatic WAL checkpoint)."""

    def __init__(self, engine, wal: Path):
        super().__init__(daemon=True)
        self.wal, self.wal_max = wal, 0
        self.writer, self.run_id, self.rng = BatchWriter(engine), uuid.uuid4().hex, random.Random(1)
        self.latencies: list[float] = []
        self.parts: list[tuple[float, float, float]] = []  # (total, begin wait, commit) per batch
        self._mark: dict[str, float] = {}
        self.stop = threading.Event()
        sa.event.listen(engine, "before_cursor_execute", self._before)
        sa.event.listen(engine, "after_cursor_execute", self._after)
        sa.event.listen(engine, "commit", self._commit)
        self.writer.write(orjson.dumps({"schema_version": 1, "batch_id": uuid.uuid4().hex, "run_id": self.run_id,
                                        "sent_at": time.time(), "run": run_record(time.time())}))

    def run(self) -> None:
        i = 0
        while not self.stop.wait(0.1):
            body = request_batch(self.run_id, [f"live-{i}", f"live-{i + 1}"], 5, time.time(), self.rng)
            self._mark.clear()
            start = time.perf_counter()
            self.writer.write(body)
            end = time.perf_counter()
            self.latencies.append(end - start)
            self.parts.append((end - start, self._mark.get("begun", start) - self._mark.get("begin", start),
                               end - self._mark.get("commit", end)))
            self.wal_max = max(self.wal_max, self.wal.stat().st_size if self.wal.exists() else 0)
            i += 2

    def _before(self, conn, cursor, statement, *args) -> None:
        if threading.current_thread() is self and statement == "BEGIN IMMEDIATE":
            self._mark["begin"] = time.perf_counter()

    def _after(self, conn, cursor, statement, *args) -> None:
        if threading.current_thread() is self and statement == "BEGIN IMMEDIATE":
            self._mark["begun"] = time.perf_counter()

    def _commit(self, conn) -> None:
        if threading.current_thread() is self:
            self._mark["commit"] = time.perf_counter()


class StepLog(logging.Handler):
    """Collects ``retention``'s debug records of each step's time (``extra={"step": (kind, s)}``)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.steps: dict[str, list[float]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "step"):
            kind, seconds = record.step
            self.steps.setdefault(kind, []).append(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="10GB", help="grow the store to this many live bytes")
    parser.add_argument("--prune-to", default="5GB", help="then prune it to this")
    parser.add_argument("--requests", type=int, default=1000, help="sampled requests in the template run")
    parser.add_argument("--steps-per-request", type=int, default=100)
    parser.add_argument("--dir", help="where the store goes (default: a temp dir, removed after)")
    args = parser.parse_args()
    folder = Path(args.dir or tempfile.mkdtemp(prefix="draftscope-retention-"))
    url = f"sqlite:///{folder / 'store.db'}"
    try:
        db.upgrade(url)
        engine = db.make_engine(url)
        start = time.perf_counter()
        template = fill_template(engine, args)
        per_request = live_bytes(engine) / args.requests
        print(f"template: {args.requests:,} sampled requests x {args.steps_per_request} verify steps "
              f"(2 samples each) in {time.perf_counter() - start:.0f} s")
        print(f"bytes per sampled request: {per_request:,.0f} ({per_request / args.steps_per_request:,.0f} "
              "per verify step with its 2 samples)")
        for rate in (1, 10, 100):
            print(f"  a server at {rate} requests/s sampled 1 in 16: {rate / 16 * 86400 * per_request / 1e9:,.2f} "
                  "GB per day")
        runs = grow(url, engine, template, units.parse_size(args.size))
        steps = StepLog()
        logging.getLogger("draftscope.store.retention").addHandler(steps)
        logging.getLogger("draftscope.store.retention").setLevel(logging.DEBUG)
        live = LiveWriter(engine, Path(db_path(url) + "-wal"))
        live.start()
        file_before = os.path.getsize(db_path(url))
        start, load = time.perf_counter(), [os.getloadavg()[0]]
        report = retention.prune(engine, max_bytes=units.parse_size(args.prune_to))
        pruned = time.perf_counter() - start
        during_prune = sorted(live.latencies)
        start = time.perf_counter()
        load.append(os.getloadavg()[0])
        freed = retention.reclaim(engine)
        reclaimed = time.perf_counter() - start
        live.stop.set()
        live.join()
        during_reclaim = sorted(live.latencies[len(during_prune):])
        parts = {"prune": live.parts[:len(during_prune)], "reclaim": live.parts[len(during_prune):]}
        print(f"prune to {args.prune_to}: {len(report.deleted)} of {runs} runs deleted in {pruned:.1f} s "
              f"({pruned / max(len(report.deleted), 1):.2f} s per run), live bytes "
              f"{report.bytes_before / 1e9:.2f} -> {report.bytes_after / 1e9:.2f} GB")
        print(f"reclaim: {freed:,} pages given back in {reclaimed:.1f} s; file {file_before / 1e9:.2f} -> "
              f"{os.path.getsize(db_path(url)) / 1e9:.2f} GB; largest WAL seen {live.wal_max / 1e9:.2f} GB")
        for phase, lat in (("prune", during_prune), ("reclaim", during_reclaim)):
            print(f"a live run's batches during the {phase} ({len(lat)}): p50 {statistics.median(lat) * 1e3:.0f} ms, "
                  f"p99 {lat[int(0.99 * (len(lat) - 1))] * 1e3:.0f} ms, max {lat[-1] * 1e3:.0f} ms")
            worst = sorted(parts[phase], reverse=True)[:3]
            print("  slowest: " + "; ".join(f"{t * 1e3:.0f} ms (lock wait {b * 1e3:.0f}, commit {c * 1e3:.0f})"
                                            for t, b, c in worst))
        print(f"load average (1 min) at the start of the prune {load[0]:.1f}, of the reclaim {load[1]:.1f}, "
              f"at the end {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
        for kind, times in sorted(steps.steps.items()):
            times.sort()
            print(f"retention {kind}: {len(times)} in {sum(times):.1f} s, p50 {statistics.median(times) * 1e3:.0f} ms, "
                  f"max {times[-1] * 1e3:.0f} ms")
        engine.dispose()
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
