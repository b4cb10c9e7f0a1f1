"""Dashboard page latency and weight on a large run, while ingest continues.

1. Starts the dashboard (`create_app`, served by uvicorn as `draftscope serve` does) on a temp
   SQLite store, wrapped in an ASGI layer that adds a `Server-Timing` header: the time from the
   request's arrival to its response's start (routing, queries, rendering, waiting for a thread).
2. Fills one run of --requests requests x --steps-per-request verify steps (2 tensor samples per
   step) through `ingest.BatchWriter` (the ingest API's own code) from this process, a writer
   beside the dashboard as the tracer's SQLite sink or `draftscope import` would be; the
   dashboard's refresher folds the run's aggregates as the batches land. Prints the fill rate and
   how long after the last batch the aggregates had caught up.
3. Starts a second process that posts a second, live run to `POST /api/v1/batches` at
   --ingest-rows-s rows/s for the rest of the bench.
4. Loads each page --rounds times (round-robin over the pages, one keep-alive connection) and
   prints p50 / p95 / max of the server time, rounds alternating between the live run posting and
   paused (SIGSTOP), the p95 of the wall time on loopback, and the page weight: HTML bytes, plus
   the JS and CSS files it links from /static/ (each counted once).
   Before that, small runs are added until the store holds --runs runs (the runs list at scale),
   and once their aggregates are folded the dashboard is restarted (on PostgreSQL after a
   ``VACUUM (ANALYZE)``, the work autovacuum does after a bulk load; ``--no-vacuum``: not): the first
   load of each page is its first view in a freshly started process. ``--drop-caches`` (root, Linux)
   also empties the OS page cache before that restart (``sync; echo 3 > /proc/sys/vm/drop_caches``;
   on PostgreSQL while its server is stopped, so that its shared buffers start empty too): each
   page's first view then reads the store from disk.
5. Where the time goes: the dashboard process's CPU time per page load (while the live run is
   paused), and the CPU time of each data-layer query behind the pages, called in this process on
   the same store (the best of 5); machine load inflates CPU time far less than wall time.
6. Store bytes per verify step, by table and index, and by column of the steps and samples tables
   (SQLite: ``dbstat``; PostgreSQL: relation sizes and ``pg_column_size``).

    .venv/bin/python bench/page_bench.py --keep               # 10,000 requests, 1,000,000 steps
    .venv/bin/python bench/page_bench.py --keep --requests 100000   # 10,000,000 steps (~9 GB)
    .venv/bin/python bench/page_bench.py --store DIR          # again on a kept store (no fill)
    .venv/bin/python bench/page_bench.py --store DIR --drop-caches   # first views from a cold OS cache
    .venv/bin/python bench/page_bench.py --postgres           # the same on a throwaway PostgreSQL
    .venv/bin/python bench/page_bench.py --postgres --store DIR --drop-caches   # a kept PostgreSQL store, cold
    .venv/bin/python bench/page_bench.py --requests 500       # a quick look
    .venv/bin/python bench/page_bench.py --keep --requests 100000 --copies 100   # 10M steps in ~30 min
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.server import free_port, wait_for_port  # noqa: E402

POINTS = [("target.aux[0]", "prefill", 128), ("target.aux[1]", "prefill", 128),
          ("target.aux[2]", "prefill", 128), ("draft.fc.out", "draft_extend", 128)]
FACTS = {"algorithm": "EAGLE3", "spec_topk": 1,
         "target": {"hidden_size": 128, "num_layers": 8, "capture_aux_hidden_states": True,
                    "layers_to_capture": [2, 5, 7]},
         "draft": {"embed_width": 128, "fc_in_features": 384, "hidden_size": 128}}
DRAFTS = 3  # drafted positions per verify step


def run_record(started_at: float) -> dict:
    return {"engine": "sglang", "engine_version": "0.5.23", "source": "tracer", "status": "running",
            "started_at": started_at, "host": "bench", "pid": os.getpid(), "algorithm": "EAGLE3",
            "target_path": "/models/Llama-3.1-8B-Instruct",
            "draft_path": "/models/EAGLE3-LLaMA3.1-Instruct-8B", "facts": FACTS,
            "tracer_config": {"step_stride": 1}}


def request_batch(run_id: str, rids: list[str], steps: int, t0: float, rng: random.Random,
                  run: dict | None = None) -> bytes:
    """One batch: ``rids`` finished requests with ``steps`` verify steps each, 2 samples per step."""
    requests, step_rows, samples = [], [], []
    for rid in rids:
        prompt = rng.randrange(100, 2000)
        start = t0 + rng.random() * 3000
        accepted_total = 0
        for i in range(steps):
            a = min(DRAFTS, int(rng.expovariate(0.8)))  # accepted drafts this step
            accepted_total += a
            at = start + 0.02 * i
            flags = [p < a for p in range(DRAFTS)]
            step_rows.append({"rid": rid, "step_index": i, "at": at, "seq_pos": prompt + 2 * i,
                              "drafted_tokens": [rng.randrange(32000) for _ in range(DRAFTS)],
                              "accept_len": a + 1, "accept_flags": flags,
                              "bonus_token": rng.randrange(32000),
                              "draft_topk": [[[rng.randrange(32000), 0.5], [rng.randrange(32000), 0.2]]
                                             for _ in range(DRAFTS)],
                              "target_topk": [[[rng.randrange(32000), 0.6], [rng.randrange(32000), 0.1]]
                                              for _ in range(DRAFTS)]})
            base = {"at": at, "rid": rid, "step_index": i, "dtype": "bfloat16", "rows": 1,
                    "l2_mean": rng.uniform(20, 80), "l2_max": 90.0, "mean": 0.0, "std": 0.5,
                    "absmax": 9.0, "nan_count": 0, "inf_count": 0}
            point, phase, width = POINTS[i % len(POINTS)]
            samples.append({**base, "point": "draft.input", "phase": "draft_decode",
                            "shape": [1, 128], "width": 128})
            samples.append({**base, "point": point, "phase": phase, "shape": [1, width], "width": width})
        output = accepted_total + steps + 1
        requests.append({"rid": rid, "sampled": True, "prompt_len": prompt, "output_len": output,
                         "started_at": start, "finished_at": start + 0.02 * steps,
                         "finish_reason": rng.choice(["stop", "stop", "length"]),
                         "spec_verify_ct": steps, "spec_accepted_drafts": accepted_total,
                         "spec_proposed_drafts": DRAFTS * steps, "traced_verify_ct": steps,
                         "traced_accepted_drafts": accepted_total,
                         "traced_proposed_drafts": DRAFTS * steps})
    return orjson.dumps({"schema_version": 1, "batch_id": uuid.uuid4().hex, "run_id": run_id,
                         "sent_at": time.time(), "run": run, "requests": requests,
                         "steps": step_rows, "samples": samples})


def fill(url: str, run_id: str, args: argparse.Namespace) -> None:
    from draftscope.store import db
    from draftscope.store.ingest import BatchWriter

    engine = db.make_engine(url)
    writer, rng = BatchWriter(engine), random.Random(0)
    t0 = time.time() - 4000
    writer.write(orjson.dumps({"schema_version": 1, "batch_id": uuid.uuid4().hex, "run_id": run_id,
                               "sent_at": time.time(), "run": run_record(t0)}))
    start, rows, per = time.perf_counter(), 0, args.requests_per_batch
    filled = args.requests // args.copies  # through BatchWriter; --copies makes up the rest
    for first in range(0, filled, per):
        rids = [f"req-{i:05d}" for i in range(first, min(first + per, filled))]
        body = request_batch(run_id, rids, args.steps_per_request, t0, rng)
        result = writer.write(body)
        rows += sum(result.rows.values())
        print(f"\r  stored {first + len(rids):,} / {filled:,} requests", end="", flush=True)
    elapsed = time.perf_counter() - start
    print(f"\nfill: {rows:,} rows in {elapsed:.0f} s = {rows / elapsed:,.0f} rows/s "
          f"(BatchWriter, {per} requests per batch)")
    engine.dispose()


def copy_fill(url: str, run_id: str, copies: int) -> None:
    """Copy the run's stored requests, steps and samples ``copies - 1`` times in SQL (INSERT ... SELECT: new
    ids, the run's key kept), the k-th copy's rids numbered on by k x the requests stored (``req-01000`` ...),
    and one ``ingest_batches`` row per batch copied; the dashboard's refresher folds the copies as it would
    batches: a large store in minutes instead of an hour."""
    import sqlalchemy as sa

    from draftscope.store import db
    from draftscope.store.stats import PG_WRITE_LOCK
    from draftscope.store.tables import BATCHES, REQUESTS

    engine = db.make_engine(url)
    sqlite = engine.dialect.name == "sqlite"
    number = "{k} + CAST(substr(rid, 5) AS INTEGER)"
    rid = (f"printf('req-%05d', {number})" if sqlite else  # as f"req-{i:05d}"
           f"'req-' || lpad(CAST({number} AS TEXT), greatest(5, length(CAST({number} AS TEXT))), '0')")
    with engine.connect() as conn:
        columns = {t: [c["name"] for c in sa.inspect(conn).get_columns(t) if c["name"] != "id"]
                   for t in ("requests", "verify_steps", "tensor_samples")}
        top = {t: conn.exec_driver_sql(f"SELECT max(id) FROM {t}").scalar_one() for t in columns}
        per = conn.execute(sa.select(sa.func.count()).where(REQUESTS.c.run_id == run_id)).scalar_one()
        batches = conn.execute(sa.select(BATCHES).where(BATCHES.c.run_id == run_id, BATCHES.c.step_rows > 0)).all()
    start = time.perf_counter()
    for k in range(1, copies):
        with engine.connect().execution_options(draftscope_write=True) as conn, conn.begin():
            if sqlite:
                conn.exec_driver_sql("PRAGMA cache_size=-262144")
            else:  # as a batch writer: the refresher's id bound waits for this transaction
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock_shared(PG_WRITE_LOCK)))
            for table, last in top.items():
                picked = ", ".join(rid.format(k=k * per) if c == "rid" else c for c in columns[table])
                run = "run_id = :run" if "run_id" in columns[table] else \
                    "run_key = (SELECT key FROM runs WHERE id = :run)"
                conn.execute(sa.text(f"INSERT INTO {table} ({', '.join(columns[table])}) SELECT {picked} "
                                     f"FROM {table} WHERE id <= {last} AND {run} ORDER BY id"), {"run": run_id})
            conn.execute(sa.insert(BATCHES), [{**b._mapping, "batch_id": uuid.uuid4().hex,
                                               "received_at": time.time()} for b in batches])
        if sqlite:
            with engine.connect() as conn:
                conn.connection.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        print(f"\r  copied {k} / {copies - 1}", end="", flush=True)
    engine.dispose()
    print(f"\ncopies: {copies - 1} in {time.perf_counter() - start:.0f} s")


def ingest_forever(port: int, rows_s: float) -> None:
    """The live run: batches of 10 requests x 50 steps (1,510 rows) at ``rows_s`` rows/s."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    run_id, rng, n = sys.argv[sys.argv.index("--live-run") + 1], random.Random(1), 0
    run = run_record(time.time())
    while True:
        t = time.perf_counter()
        rids = [f"live-{n + i:06d}" for i in range(10)]
        body = request_batch(run_id, rids, 50, time.time(), rng, run=run)
        run, n = None, n + 10
        conn.request("POST", "/api/v1/batches", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"live ingest failed: {response.status}")
        time.sleep(max(0.0, 1510 / rows_s - (time.perf_counter() - t)))


class ServerTiming:
    """ASGI wrapper: ``Server-Timing: app;dur=MS`` from the request's arrival to the response start."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()

        async def timed(message):
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - start) * 1000
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"server-timing", f"app;dur={ms:.2f}".encode())]}
            await send(message)

        await self.app(scope, receive, timed)


def serve(url: str, port: int) -> None:
    import uvicorn

    from draftscope.settings import Settings
    from draftscope.store import db
    from draftscope.web.app import create_app

    db.upgrade(url)
    uvicorn.run(ServerTiming(create_app(Settings(database_url=url))), host="127.0.0.1", port=port,
                log_level="warning")


def get(conn: http.client.HTTPConnection, path: str) -> tuple[int, bytes, float, float]:
    """Status, body, wall seconds, server seconds (Server-Timing; NaN without it)."""
    t = time.perf_counter()
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    wall = time.perf_counter() - t
    timing = re.search(r"dur=([0-9.]+)", response.getheader("server-timing") or "")
    return response.status, body, wall, float(timing.group(1)) / 1000 if timing else float("nan")


def weight(conn: http.client.HTTPConnection, html: bytes) -> int:
    """Bytes of the JS and CSS a page links from /static/."""
    total = 0
    for path in sorted(set(re.findall(rb'(?:src|href)="(/static/[^"]+\.(?:js|css))"', html))):
        status, body, _, _ = get(conn, path.decode())
        total += len(body) if status == 200 else 0
    return total


def wait_for(conn: http.client.HTTPConnection, run_id: str, steps: int, timeout_s: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        status, body, _, _ = get(conn, f"/api/v1/runs/{run_id}")
        if status == 200 and orjson.loads(body)["summary"]["acceptance"]["verify_steps"] >= steps:
            return time.perf_counter() - start
        time.sleep(0.5)
    raise SystemExit(f"the dashboard's aggregates did not reach {steps} steps in {timeout_s} s")


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18] if len(values) >= 2 else values[0]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(conn: http.client.HTTPConnection, pages: dict[str, str], rounds: int, live_pid: int,
            server_pid: int) -> None:
    """Round-robin over ``pages``; rounds alternate between the live run posting and paused. While
    paused, the dashboard process's CPU time is summed per page (its other threads idle then)."""
    server = {(name, busy): [] for name in pages for busy in (True, False)}
    cpu = {name: 0.0 for name in pages}
    wall: dict[str, list[float]] = {name: [] for name in pages}
    info: dict[str, tuple[int, int, int, float]] = {}
    for name, path in pages.items():
        status, body, _, s = get(conn, path)
        info[name] = (status, len(body), weight(conn, body) if status == 200 else 0, s * 1000)
    for r in range(rounds):
        busy = r % 2 == 0
        os.killpg(live_pid, signal.SIGCONT if busy else signal.SIGSTOP)
        time.sleep(0.5)
        for name, path in pages.items():
            if info[name][0] == 200:
                before = cpu_seconds(server_pid)
                _, _, w, s = get(conn, path)
                if not busy:
                    cpu[name] += cpu_seconds(server_pid) - before
                server[name, busy].append(s * 1000)
                wall[name].append(w * 1000)
    os.killpg(live_pid, signal.SIGCONT)
    print(f"\n{'page':<16} {'path':<40} {'status':>6} {'first':>6} {'p50':>6} {'p95':>6} {'max':>6}"
          f" {'idle50':>6} {'idle95':>6} {'cpu':>5} {'wall95':>6} {'HTML':>9} {'JS+CSS':>8}")
    for name, path in pages.items():
        status, html, assets, first = info[name]
        busy, idle = sorted(server[name, True]) or [float("nan")], sorted(server[name, False]) or [float("nan")]
        walls = sorted(wall[name]) or [float("nan")]
        shown = path if len(path) <= 40 else path[:37] + "..."
        print(f"{name:<16} {shown:<40} {status:>6} {first:>6.0f} {statistics.median(busy):>6.0f}"
              f" {p95(busy):>6.0f} {busy[-1]:>6.0f} {statistics.median(idle):>6.0f} {p95(idle):>6.0f}"
              f" {cpu[name] * 1000 / max(1, len(server[name, False])):>5.0f} {p95(walls):>6.0f}"
              f" {html:>9,} {assets:>8,}")
    print(f"(ms of server time (Server-Timing). first: the first load in a freshly started process; p50/p95/max: {rounds // 2} "
          f"loads while the live run is posted; idle50/idle95: {rounds - rounds // 2} loads with it "
          "paused, interleaved; cpu: the dashboard process's CPU ms per load while paused; wall95: "
          "p95 of the wall time on loopback, all loads. Bytes: the response; JS+CSS: the /static/ "
          "files it links)")


def profile_queries(url: str, big: str, rid: str) -> None:
    """CPU ms of each query behind the pages (best of 5), in this process."""
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from draftscope.store import db, queries
    from draftscope.web.metrics import StoreCollector

    def scrape(conn) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StoreCollector(conn))
        return generate_latest(registry)

    calls = {"list_runs": lambda c: queries.list_runs(c),
             "run_summary": lambda c: queries.run_summary(c, big),
             "run_requests_page (50)": lambda c: queries.run_requests_page(c, big),
             "run_requests_page sorted": lambda c: queries.run_requests_page(
                 c, big, sort="accept_length", desc=True, offset=500),
             "incomplete_requests": lambda c: queries.incomplete_requests(c, big),
             "run_view (api run)": lambda c: queries.run_view(c, big),
             "request_view": lambda c: queries.request_view(c, big, rid),
             "compare_summary": lambda c: queries.compare_summary(c, big, big),
             "metrics scrape": scrape}
    engine = db.make_engine(url)
    print(f"\n{'query':<28} {'CPU ms':>7}")
    with engine.connect() as conn:
        for name, call in calls.items():
            best = float("inf")
            for _ in range(5):
                t = time.process_time()
                call(conn)
                best = min(best, time.process_time() - t)
                conn.rollback()
            print(f"{name:<28} {best * 1000:>7.1f}")
    engine.dispose()


def add_runs(url: str, runs: int) -> None:
    """Small runs (5 requests x 10 steps each) until the store holds ``runs`` runs."""
    from draftscope.store import db, models
    from draftscope.store.ingest import BatchWriter

    import sqlalchemy as sa

    engine = db.make_engine(url)
    with engine.connect() as conn:
        have = conn.execute(sa.select(sa.func.count()).select_from(models.Run.__table__)).scalar_one()
    writer, rng, t0 = BatchWriter(engine), random.Random(2), time.time() - 86400
    for i in range(have, runs):
        run_id = uuid.uuid4().hex
        writer.write(request_batch(run_id, [f"small-{k}" for k in range(5)], 10, t0 + 60 * i, rng,
                                   run={**run_record(t0 + 60 * i), "status": "ended"}))
    if runs > have:
        print(f"runs list: {runs - have:,} small runs added ({runs:,} in the store)")
    engine.dispose()


def store_bytes(url: str) -> None:
    """Bytes per verify step (of all the store's runs) by table and index, and by column of the
    steps and samples tables."""
    import sqlalchemy as sa

    from draftscope.store import db, models

    engine = db.make_engine(url)
    with engine.connect() as conn:
        steps = conn.execute(sa.select(sa.func.sum(models.RunStats.__table__.c.verify_steps))).scalar_one()
        if conn.dialect.name == "sqlite":
            sizes = conn.exec_driver_sql("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").all()
            column_size = "CASE typeof({c}) WHEN 'null' THEN 0 WHEN 'real' THEN 8 WHEN 'integer' THEN " \
                          "(CASE WHEN {c} BETWEEN 0 AND 1 THEN 0 WHEN {c} BETWEEN -128 AND 127 THEN 1 " \
                          "WHEN {c} BETWEEN -32768 AND 32767 THEN 2 WHEN {c} BETWEEN -8388608 AND 8388607 " \
                          "THEN 3 WHEN {c} BETWEEN -2147483648 AND 2147483647 THEN 4 ELSE 8 END) " \
                          "ELSE length(CAST({c} AS BLOB)) END"
        else:
            sizes = conn.exec_driver_sql(
                "SELECT c.relname, pg_relation_size(c.oid) + COALESCE(pg_relation_size(c.reltoastrelid), 0) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')").all()
            column_size = "COALESCE(pg_column_size({c}), 0)"
        total = sum(b for _, b in sizes)
        print(f"\nstore: {total / 1e9:.2f} GB, {total / steps:,.0f} bytes per verify step "
              f"({steps:,} steps in all its runs; {conn.dialect.name})")
        print(f"{'table or index':<36} {'bytes/step':>10} {'share':>6}")
        for name, b in sorted(sizes, key=lambda x: -x[1]):
            if b / steps >= 0.5:
                print(f"{name:<36} {b / steps:>10,.1f} {b / total:>6.1%}")
        for table, per_step in (("verify_steps", 1), ("tensor_samples", 2)):
            columns = [c["name"] for c in sa.inspect(conn).get_columns(table)]
            sums = conn.exec_driver_sql(
                f"SELECT {', '.join(f'AVG({column_size.format(c=c)})' for c in columns)} "
                f"FROM (SELECT * FROM {table} ORDER BY id DESC LIMIT 100000) AS recent").one()
            shown = ", ".join(f"{c} {v * per_step:.1f}" for c, v in zip(columns, sums) if v)
            print(f"{table} values per verify step (x{per_step} rows; bytes, the newest 100,000 rows): "
                  f"{sum(v or 0 for v in sums) * per_step:.0f} = {shown}")
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--steps-per-request", type=int, default=100)
    parser.add_argument("--requests-per-batch", type=int, default=100)
    parser.add_argument("--ingest-rows-s", type=float, default=5000,
                        help="rows/s of the live run posted while pages are measured")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--runs", type=int, default=1000,
                        help="small runs added until the store holds this many (the runs list)")
    parser.add_argument("--no-vacuum", dest="vacuum", action="store_false",
                        help="PostgreSQL: measure while autovacuum works through the fill, not after "
                             "a VACUUM (ANALYZE)")
    parser.add_argument("--postgres", action="store_true",
                        help="a PostgreSQL server (Debian's binaries) instead of SQLite, its cluster in "
                             "the store's folder (thrown away unless --keep)")
    parser.add_argument("--copies", type=int, default=1,
                        help="fill --requests / COPIES requests through BatchWriter, then copy them in SQL "
                             "until --requests (fast; each table's pages come out more clustered than a "
                             "live fill's)")
    parser.add_argument("--drop-caches", action="store_true",
                        help="empty the OS page cache (root) before the dashboard restarts (PostgreSQL: "
                             "with its server stopped): cold first views")
    parser.add_argument("--keep", action="store_true", help="keep the store's folder (printed)")
    parser.add_argument("--store", type=Path, help="a folder a --keep run left: measure it, no fill")
    parser.add_argument("--live-run", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.live_run:
        ingest_forever(args.port, args.ingest_rows_s)
        return
    if args.serve:
        serve(args.serve, args.port)
        return
    if args.copies > 1 and args.requests % args.copies:
        parser.error("--copies: a divisor of --requests")
    tmp = args.store or Path(tempfile.mkdtemp(prefix="draftscope-pages-"))
    try:
        if args.postgres:  # the cluster in the store's folder (data/, log)
            from testbed.postgres import create_database, postgres_cluster

            with postgres_cluster(tmp, shared_buffers="1GB") as base:
                bench(args, f"{base}/pages" if args.store else create_database(base, "pages"), tmp)
        else:
            bench(args, f"sqlite:///{tmp / 'pages.db'}", tmp)
    finally:
        if args.keep or args.store:
            print(f"store kept: --store {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def start_server(url: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", url, "--port", str(port)],
                              start_new_session=True)
    wait_for_port(port, server)
    return server, port


def stop(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def biggest_run(url: str) -> str:
    import sqlalchemy as sa

    from draftscope.store import db, models

    engine = db.make_engine(url)
    with engine.connect() as conn:
        stats = models.RunStats.__table__
        run_id = conn.execute(sa.select(stats.c.run_id).order_by(stats.c.verify_steps.desc()).limit(1)).scalar_one()
    engine.dispose()
    return run_id


def all_folded(url: str, timeout_s: float) -> float:
    """Seconds until every run's aggregates have counted all its batches."""
    import sqlalchemy as sa

    from draftscope.store import db, models
    from draftscope.store.stats import batch_counts

    engine, start = db.make_engine(url), time.perf_counter()
    try:
        while time.perf_counter() - start < timeout_s:
            with engine.connect() as conn:
                counts = batch_counts(conn)
                stats = models.RunStats.__table__
                seen = dict(conn.execute(sa.select(stats.c.run_id, stats.c.batches_seen)).all())
            if all(seen.get(r) == n for r, (n, _) in counts.items()):
                return time.perf_counter() - start
            time.sleep(0.5)
        raise SystemExit(f"the dashboard's aggregates did not catch up in {timeout_s} s")
    finally:
        engine.dispose()


def vacuum_analyze(url: str) -> float:
    """``VACUUM (ANALYZE)`` of the whole database (PostgreSQL); its seconds."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    started = time.monotonic()
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("VACUUM (ANALYZE)")
    finally:
        engine.dispose()
    return time.monotonic() - started


def drop_caches() -> None:
    """Empty the OS page cache (Linux, root): the store's next reads come from disk."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as exc:
        raise SystemExit(f"--drop-caches needs root on Linux ({exc}); run as root or leave it out")
    print("OS page cache dropped: the first views below read the store from disk")


def bench(args: argparse.Namespace, url: str, store: Path | None) -> None:
    """Fill (unless --store), add small runs, restart the dashboard, measure, profile, count bytes."""
    server = live = None
    try:
        big, live_id = uuid.uuid4().hex, uuid.uuid4().hex
        steps = args.requests * args.steps_per_request
        server, port = start_server(url)
        if args.store:
            big = biggest_run(url)
            print(f"run {big} of {store}: measured again, no fill")
        else:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            print(f"run {big}: {args.requests:,} requests, {steps:,} verify steps, {2 * steps:,} samples")
            fill(url, big, args)
            if args.copies > 1:
                copy_fill(url, big, args.copies)
            print(f"aggregates caught up {wait_for(conn, big, steps, 3600):.1f} s after the last batch")
        add_runs(url, args.runs)
        print(f"every run's aggregates caught up {all_folded(url, 600):.1f} s later")
        stop(server)
        if url.startswith("postgresql") and args.vacuum:
            print(f"VACUUM (ANALYZE) after the fill: {vacuum_analyze(url):.1f} s (what autovacuum does "
                  "in the background after a bulk load, here before the measurement)")
        if args.drop_caches and url.startswith("postgresql"):  # its shared buffers go with the server
            from testbed.postgres import restart_cluster

            restart_cluster(store, between=drop_caches)
        elif args.drop_caches:
            drop_caches()
        server, port = start_server(url)  # a cold process: no page rendered yet
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        live = subprocess.Popen([sys.executable, __file__, "--live-run", live_id, "--port", str(port),
                                 "--ingest-rows-s", str(args.ingest_rows_s)], start_new_session=True)
        wait_for(conn, live_id, 1, 60)
        rid = f"req-{args.requests // 2:05d}"
        pages = {"runs list": "/", "run page": f"/runs/{big}",
                 "requests table": f"/runs/{big}/requests?sort=accept_length&desc=true&offset=500",
                 "request page": f"/runs/{big}/requests/{rid}",
                 "compare": f"/compare?a={big}&b={live_id}", "metrics": "/metrics",
                 "api run": f"/api/v1/runs/{big}", "api runs": "/api/v1/runs"}
        print(f"live run {live_id}: posting ~{args.ingest_rows_s:,.0f} rows/s to the ingest API "
              f"while pages load; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        measure(conn, pages, args.rounds, live.pid, server.pid)
        status, body, _, _ = get(conn, f"/api/v1/runs/{live_id}")
        print(f"live run after the bench: {orjson.loads(body)['summary']['acceptance']['verify_steps']:,}"
              f" verify steps folded; load average {os.getloadavg()[0]:.1f}")
        stop(live)
        live = None
        profile_queries(url, big, rid)
        store_bytes(url)
    finally:
        stop(live)
        stop(server)

if __name__ == "__main__":
    main()
