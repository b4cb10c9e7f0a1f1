"""Ingest throughput: tensor-sample rows/s into SQLite through `draftscope serve`, while pages load.

Starts `draftscope serve --upgrade` on a temp SQLite database in a subprocess, then for --seconds
posts batches of --batch-rows tensor samples (--posters threads, each one keep-alive connection
posting one batch after another) while another thread GETs `/` and `/api/v1/runs` every
--page-interval-s. Prints sustained rows/s, the server's CPU seconds (rows per server-CPU-second,
which other load on the machine distorts far less), batch latency p50/p99 and page latency p50/p95/p99.

--profile instead stores the same batches in this process, as the server's ingest thread does
(``BatchWriter.write``), with its aggregates refreshed and its WAL checkpointed as the server does
every so many batches, and prints the CPU time per row of each part (cProfile on thread CPU time):
where the time of a row goes, without HTTP.

    .venv/bin/python bench/ingest_bench.py --seconds 20 --batch-rows 5000
    .venv/bin/python bench/ingest_bench.py --seconds 20 --batch-rows 5000 --posters 2
    .venv/bin/python bench/ingest_bench.py --profile --batch-rows 5000
    .venv/bin/python bench/ingest_bench.py --seconds 20 --batch-rows 5000 --postgres

--postgres stores into a throwaway PostgreSQL server (testbed/postgres.py: Debian's binaries,
``fsync=off``) instead of SQLite, and counts the CPU of its backends serving the bench's database
beside the dashboard's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.server import free_port, wait_for_port  # noqa: E402

POINTS = [("draft.input", "draft_decode", 12288), ("target.aux[0]", "verify", 4096),
          ("target.aux[1]", "verify", 4096), ("target.aux[2]", "verify", 4096),
          ("draft.fc.out", "draft_decode", 4096), ("draft.logits", "draft_decode", 32000)]


COHORT = "C" * 8  # in every rid of the template; each batch's own random prefix replaces it


def samples(n: int) -> list[dict]:
    """Realistic sample records: 16 requests, consecutive steps, the usual sample points."""
    out, now = [], time.time()
    for i in range(n):
        point, phase, width = POINTS[i % len(POINTS)]
        rows = random.choice((1, 4, 8))
        out.append({"point": point, "phase": phase, "at": now + i * 1e-4, "rid": f"{COHORT}-{i % 16:04d}",
                    "step_index": i // 16, "shape": [rows, width], "dtype": "bfloat16",
                    "width": width, "rows": rows, "l2_mean": random.uniform(20, 80),
                    "l2_max": random.uniform(80, 200), "mean": random.gauss(0, 0.05),
                    "std": random.uniform(0.2, 1.5), "absmax": random.uniform(5, 60),
                    "nan_count": 0, "inf_count": 0})
    return out


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) >= 2 else float("nan")


def post(conn: http.client.HTTPConnection, body: bytes) -> None:
    conn.request("POST", "/api/v1/batches", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = response.read()
    if response.status != 200 or b'"stored"' not in payload:
        raise RuntimeError(f"ingest failed: {response.status} {payload[:300]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--batch-rows", type=int, default=5000)
    parser.add_argument("--page-interval-s", type=float, default=0.1)
    parser.add_argument("--posters", type=int, default=1, help="concurrent posting connections")
    parser.add_argument("--profile", action="store_true",
                        help="CPU time per row by part of ingest, in this process (no server)")
    parser.add_argument("--batches", type=int, default=60, help="--profile: batches stored")
    parser.add_argument("--postgres", action="store_true",
                        help="a throwaway PostgreSQL server (Debian's binaries) instead of SQLite")
    args = parser.parse_args()
    if args.profile:
        profile(args)
        return
    if args.postgres:
        from testbed.postgres import create_database, postgres_cluster

        with postgres_cluster(shared_buffers="1GB") as base:
            bench(args, create_database(base, PG_DATABASE))
        return
    tmp = Path(tempfile.mkdtemp(prefix="draftscope-bench-"))
    try:
        bench(args, f"sqlite:///{tmp / 'bench.db'}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


PG_DATABASE = "ingestbench"  # its backends' command lines name it (``pg_cpu_seconds``)


def bench(args: argparse.Namespace, url: str) -> None:
    port = free_port()
    draftscope = Path(sys.executable).with_name("draftscope")  # the console script of this venv
    server = subprocess.Popen([str(draftscope), "serve", "--db", url,
                               "--port", str(port), "--upgrade"], start_new_session=True)
    try:
        wait_for_port(port, server)
        run(args, port, server.pid)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pg_cpu_seconds() -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving ``PG_DATABASE`` (by pid)."""
    out = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f" {PG_DATABASE} ".encode() in (proc / "cmdline").read_bytes():
                out[int(proc.name)] = cpu_seconds(int(proc.name))
        except OSError:  # gone meanwhile
            pass
    return out


def run_batch(run_id: str) -> bytes:
    return json.dumps({"schema_version": 1, "batch_id": uuid.uuid4().hex, "run_id": run_id,
                       "sent_at": time.time(), "run": {
                           "engine": "sglang", "engine_version": "0.5.23", "source": "tracer",
                           "status": "running", "started_at": time.time(), "algorithm": "EAGLE3",
                           "target_path": "/models/Llama-3.1-8B-Instruct",
                           "draft_path": "/models/EAGLE3-LLaMA3.1-Instruct-8B"}}).encode()


def sample_template(run_id: str, batch_rows: int) -> bytes:
    """One body, re-stamped per post by :func:`stamp` (the client must not be the bottleneck)."""
    return json.dumps({"schema_version": 1, "batch_id": "B" * 32, "run_id": run_id,
                       "sent_at": time.time(), "samples": samples(batch_rows)}).encode()


def stamp(template: bytes) -> bytes:
    """``template`` with a fresh batch id and its own 16 requests (a random rid prefix, as SGLang's rids
    are random): as from a server, no two batches sample the same (request, step). Re-sending the same
    rids and steps in every batch (this bench until 2026-12-05) puts each batch's index entries between
    all the earlier ones, which no tracer does, and made SQLite 2.3x slower per row at a million rows."""
    return template.replace(b"B" * 32, uuid.uuid4().hex.encode(), 1).replace(COHORT.encode(),
                                                                           uuid.uuid4().hex[:8].encode())


def run(args: argparse.Namespace, port: int, server_pid: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    run_id = uuid.uuid4().hex
    post(conn, run_batch(run_id))
    template = sample_template(run_id, args.batch_rows)
    print(f"batch: {args.batch_rows} samples, {len(template) / 1e6:.2f} MB; {args.posters} poster(s)")

    stop = threading.Event()
    page_ms: list[float] = []

    def pages() -> None:
        page_conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        paths = ["/", "/api/v1/runs"]
        while not stop.is_set():
            t0 = time.perf_counter()
            page_conn.request("GET", paths[len(page_ms) % 2])
            response = page_conn.getresponse()
            response.read()
            assert response.status == 200, response.status
            page_ms.append(time.perf_counter() - t0)
            stop.wait(args.page_interval_s)

    batch_s: list[float] = []
    failures: list[BaseException] = []

    def poster(conn: http.client.HTTPConnection) -> None:
        try:
            while not stop.is_set():
                body = stamp(template)
                t0 = time.perf_counter()
                post(conn, body)
                batch_s.append(time.perf_counter() - t0)
        except BaseException as exc:  # reported after the others stop
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=pages)]
    threads += [threading.Thread(target=poster, args=(c,)) for c in
                [conn, *(http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                         for _ in range(args.posters - 1))]]
    cpu0, pg0 = cpu_seconds(server_pid), pg_cpu_seconds()
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    stop.wait(args.seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    server_cpu = cpu_seconds(server_pid) - cpu0
    pg1 = pg_cpu_seconds()
    pg_cpu = sum(t - pg0.get(pid, 0.0) for pid, t in pg1.items())
    if failures:
        raise failures[0]
    rows = len(batch_s) * args.batch_rows
    print(f"ingest: {rows} rows in {elapsed:.1f} s = {rows / elapsed:,.0f} rows/s sustained "
          f"({len(batch_s)} batches)")
    print(f"server CPU: {server_cpu:.1f} s = {rows / server_cpu:,.0f} rows per server-CPU-second "
          f"(load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    if pg1:
        print(f"PostgreSQL backends' CPU: {pg_cpu:.1f} s; dashboard + backends: "
              f"{rows / (server_cpu + pg_cpu):,.0f} rows per CPU-second")
    print(f"batch latency: p50 {percentile(batch_s, 50):.0f} ms, p99 {percentile(batch_s, 99):.0f} ms")
    print(f"page latency (/ and /api/v1/runs, {len(page_ms)} loads): p50 {percentile(page_ms, 50):.0f} ms, "
          f"p95 {percentile(page_ms, 95):.0f} ms, p99 {percentile(page_ms, 99):.0f} ms")


def profile(args: argparse.Namespace) -> None:
    """CPU time per row of each part of storing --batches batches through ``BatchWriter.write``:
    each part is timed (thread CPU time) by calling the function the writer calls, then the write
    itself; its SQL part is the write less the parse and the rows."""
    from draftscope.store import db, ingest
    from draftscope.store.analyze import refresh_run
    from draftscope.store.ingest_checks import check_batch
    from draftscope_tracer.transport import wire

    tmp = Path(tempfile.mkdtemp(prefix="draftscope-bench-"))
    url = f"sqlite:///{tmp / 'bench.db'}"
    db.upgrade(url)
    engine = db.make_engine(url, autocheckpoint=False)  # as `draftscope serve`
    checkpointer = db.WalCheckpointer(url)
    writer, run_id = ingest.BatchWriter(engine), uuid.uuid4().hex
    writer.write(run_batch(run_id))
    template = sample_template(run_id, args.batch_rows)
    bodies = [stamp(template) for _ in range(args.batches)]
    refresh_every = max(1, round(100_000 / args.batch_rows))  # the server's 2 s debounce at 50k rows/s
    parts = dict.fromkeys(("decode + wire schema (msgspec)", "ingest_checks", "rows (tuples, JSON columns)",
                           "SQLite (inserts, commit, batch claim)", "aggregates + findings (refresher)",
                           "WAL checkpoint (own thread in the server)"), 0.0)
    names = list(parts)
    clock, checkpoint_conn = time.thread_time, None
    try:
        for i, body in enumerate(bodies, 1):
            t0 = clock()
            batch = ingest.parse_batch(body)
            t1 = clock()
            check_batch(batch)
            t2 = clock()
            for key, table in wire.RECORD_TABLES.items():
                ingest._table_rows(batch.run_id, getattr(batch, key), table)
            t3 = clock()
            writer.write(body)
            t4 = clock()
            if i % refresh_every == 0 or i == len(bodies):
                refresh_run(engine, run_id)
            t5 = clock()
            checkpoint_conn = checkpointer._checkpoint(checkpoint_conn, "PASSIVE")  # the server: every 0.5 s
            t6 = clock()
            for name, seconds in zip(names, ((t1 - t0) - (t2 - t1), t2 - t1, t3 - t2,
                                             (t4 - t3) - (t1 - t0) - (t3 - t2), t5 - t4, t6 - t5)):
                parts[name] += seconds
    finally:
        if checkpoint_conn is not None:
            checkpoint_conn.close()
        engine.dispose()
        shutil.rmtree(tmp, ignore_errors=True)
    rows, total = args.batches * args.batch_rows, sum(parts.values())
    print(f"{rows:,} sample rows in {args.batches} batches of {args.batch_rows} (no HTTP): {total:.2f} "
          f"CPU s = {rows / total:,.0f} rows per CPU-second; load average {os.getloadavg()[0]:.1f}")
    print(f"{'part':<44} {'µs/row':>7} {'share':>6}")
    for name, seconds in parts.items():
        print(f"{name:<44} {seconds / rows * 1e6:>7.2f} {seconds / total:>6.1%}")


if __name__ == "__main__":
    main()
