"""A fleet on PostgreSQL: simulated tracers post through the tracer's own HTTP sink to two dashboard
processes behind one port, for minutes; every batch is stored once, even across a killed dashboard.

1. Starts a throwaway PostgreSQL (Debian's binaries, as the tests do), two ``draftscope serve``
   processes on it and, on one HTTPS port in front of them, the fleet's front door: HAProxy (Debian's
   package) with compose's ``docker/haproxy.cfg`` and the self-signed certificate its entry point
   makes (testbed/front_door.py), round robin, a dashboard failing ``/healthz`` taken out.
2. Starts --tracers processes, each one SGLang server's tracer: its own run, and every
   --flush-s a batch of the requests it finished (``page_bench``'s generator: --steps-per-request
   verify steps with 2 tensor samples each) handed to ``draftscope_tracer``'s ``HttpSink`` (the
   tracer's delivery: in order, buffered, resent with backoff; over HTTPS, trusting the proxy's CA
   through SSL_CERT_FILE) at --rows-s rows/s, for --duration-s.
   The default, 200 rows/s, is a server finishing ~10 requests/s sampled 1 in 16 (100 verify steps,
   3 rows each).
3. Meanwhile loads pages through the proxy (wall time on loopback); at --kill-at-s SIGKILLs one
   dashboard mid-ingest and starts it again --down-s later.
4. Then checks that every batch each tracer sent is stored once (ingest_batches and row counts),
   that the sinks dropped nothing, that both processes' aggregates caught up, and that no run holds
   a finding twice; prints ingest rows/s and the pages' p50 / p95.

    .venv/bin/python bench/fleet_bench.py                          # 16 tracers x 200 rows/s, 3 min
    .venv/bin/python bench/fleet_bench.py --tracers 4 --duration-s 30   # a quick look
"""

from __future__ import annotations

import argparse
import collections
import http.client
import os
import random
import re
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from page_bench import request_batch, run_record  # noqa: E402
from testbed.server import free_port, wait_for_port  # noqa: E402
from testbed.front_door import front_door  # noqa: E402

AUX_OFF = {"capture_aux_hidden_states": False}  # half the tracers: a run with a finding to compute
POSTED = re.compile(r' dashboards/(\S+) \S+ (\d{3}) .*"POST /api/v1/batches ')  # an HAProxy httplog line


def tracer(port: int, index: int, args: argparse.Namespace, out: Path) -> None:
    """One tracer: batches at ``args.rows_s`` through ``HttpSink``; writes what it sent to ``out``."""
    from draftscope_tracer.transport.http_sink import HttpSink

    drops: list[tuple[str, int]] = []
    sink = HttpSink(f"https://localhost:{port}", lambda reason, n, _b: drops.append((reason, n)),
                    timeout_s=10.0, max_buffered_batches=256)
    run_id, rng, sent, rows = uuid.uuid4().hex, random.Random(index), [], 0
    run = run_record(time.time())
    run["host"], run["pid"] = f"gpu-{index}", 1000 + index
    if index % 2:
        run["facts"] = {**run["facts"], "target": {**run["facts"]["target"], **AUX_OFF}}
    rows_per_request = 1 + 3 * args.steps_per_request
    per_batch = max(1, round(args.rows_s * args.flush_s / rows_per_request))
    start, n = time.monotonic(), 0
    while time.monotonic() - start < args.duration_s:
        rids = [f"t{index}-{n + i:06d}" for i in range(per_batch)]
        batch = orjson.loads(request_batch(run_id, rids, args.steps_per_request, time.time(), rng, run=run))
        if index % 2:  # the draft gets the target's last hidden state: fc-bypassed
            batch["samples"].append({**batch["samples"][0], "point": "draft.input", "phase": "draft_extend",
                                     "shape": [4, 128], "width": 128, "rows": 4})
        run, n = None, n + per_batch
        sink.send(batch)
        sent.append(batch["batch_id"])
        rows += per_batch * rows_per_request
        time.sleep(max(0.0, start + len(sent) * per_batch * rows_per_request / args.rows_s - time.monotonic()))
    sink.close(deadline_s=120)
    out.write_bytes(orjson.dumps({"run_id": run_id, "batches": sent, "rows": rows,
                                  "steps": n * args.steps_per_request, "drops": drops}))


def serve(url: str, port: int, log: Path) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "draftscope"
    env = {**os.environ, "DRAFTSCOPE_DATABASE_URL": url}
    return subprocess.Popen([str(exe), "serve", "--port", str(port)], env=env, start_new_session=True,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen | None, sig: int = signal.SIGTERM) -> None:
    if process is not None and process.poll() is None:
        os.killpg(process.pid, sig)
        process.wait(timeout=60)


def load_pages(port: int, tls: ssl.SSLContext, run_ids: list[str], timings: dict[str, list[float]]) -> None:
    """One round of pages through the proxy (a new TLS connection per page: each may go to either process)."""
    pages = {"runs list": "/", "run page": f"/runs/{run_ids[0]}", "api runs": "/api/v1/runs",
             "api run": f"/api/v1/runs/{run_ids[-1]}", "metrics": "/metrics"}
    for name, path in pages.items():
        conn = http.client.HTTPSConnection("localhost", port, timeout=30, context=tls)
        t = time.perf_counter()
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                timings.setdefault(name, []).append((time.perf_counter() - t) * 1000)
        except OSError:
            timings.setdefault(f"{name} (connection lost)", []).append(0.0)
        finally:
            conn.close()


def check(url: str, reports: list[dict]) -> bool:
    """Every batch stored once, rows as sent, no duplicate finding; prints what it finds."""
    import sqlalchemy as sa

    from draftscope.store import db, models
    from draftscope.store.tables import of_run

    engine = db.make_engine(url)
    ok = True
    with engine.connect() as conn:
        B, S, F = models.IngestBatch.__table__, models.VerifyStep.__table__, models.Finding.__table__
        for r in reports:
            stored = set(conn.execute(sa.select(B.c.batch_id).where(B.c.run_id == r["run_id"])).scalars())
            steps = conn.execute(sa.select(sa.func.count()).select_from(S).where(of_run(S, r["run_id"]))).scalar_one()
            if stored != set(r["batches"]) or steps != r["steps"] or r["drops"]:
                ok = False
                print(f"run {r['run_id']}: {len(set(r['batches']) - stored)} batches missing, "
                      f"{len(stored - set(r['batches']))} unknown, {steps:,} steps stored of {r['steps']:,}, "
                      f"drops {r['drops']}")
        dup = conn.execute(sa.select(F.c.run_id, F.c.rule_id, F.c.source, F.c.rid, sa.func.count())
                           .group_by(F.c.run_id, F.c.rule_id, F.c.source, F.c.rid)
                           .having(sa.func.count() > 1)).all()
        findings = dict(conn.execute(sa.select(F.c.run_id, sa.func.count()).group_by(F.c.run_id)).all())
        print(f"findings: {sum(findings.values())} stored for {len(findings)} runs, {len(dup)} stored twice")
        ok = ok and not dup
    engine.dispose()
    return ok


def caught_up(url: str, run_ids: list[str], timeout_s: float) -> float:
    """Seconds until every run's aggregates counted all its batches."""
    import sqlalchemy as sa

    from draftscope.store import db, models
    from draftscope.store.stats import batch_counts

    engine, start = db.make_engine(url), time.monotonic()
    try:
        while time.monotonic() - start < timeout_s:
            with engine.connect() as conn:
                counts = batch_counts(conn, run_ids)
                seen = dict(conn.execute(sa.select(models.RunStats.__table__.c.run_id,
                                                   models.RunStats.__table__.c.batches_seen)).all())
            if all(seen.get(r) == counts[r][0] for r in run_ids):
                return time.monotonic() - start
            time.sleep(0.5)
        raise SystemExit(f"the aggregates did not catch up in {timeout_s} s")
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracers", type=int, default=16)
    parser.add_argument("--rows-s", type=float, default=200, help="rows/s per tracer")
    parser.add_argument("--steps-per-request", type=int, default=100)
    parser.add_argument("--flush-s", type=float, default=1.0, help="seconds between a tracer's batches")
    parser.add_argument("--duration-s", type=float, default=180)
    parser.add_argument("--kill-at-s", type=float, default=60, help="SIGKILL a dashboard then (negative: never)")
    parser.add_argument("--down-s", type=float, default=5, help="how long the killed dashboard stays down")
    parser.add_argument("--tracer", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tracer is not None:
        tracer(args.port, args.tracer, args, args.out)
        return
    from testbed.postgres import create_database, postgres_cluster

    from draftscope.store import db

    tmp = Path(tempfile.mkdtemp(prefix="draftscope-fleet-"))
    with postgres_cluster(max_connections="200") as base:
        url = create_database(base, "fleet")
        db.upgrade(url)
        ports = [free_port(), free_port()]
        dashboards = [serve(url, p, tmp / f"dash-{i}.log") for i, p in enumerate(ports)]
        tracers: list[subprocess.Popen] = []
        try:
            for p, d in zip(ports, dashboards):
                wait_for_port(p, d)
            with front_door(ports, tmp / "proxy") as door:
                ok = fleet(url, ports, dashboards, door.https_port, door.ca_file, tracers, tmp, args)
            print(proxy_report(tmp / "proxy" / "proxy.log"))
        finally:
            for t in tracers:
                stop(t)
            for d in dashboards:
                stop(d)
        if not ok:
            raise SystemExit(f"the dashboards' logs and the tracers' reports are kept in {tmp}")
        shutil.rmtree(tmp, ignore_errors=True)


def fleet(url: str, ports: list[int], dashboards: list[subprocess.Popen], proxy_port: int, ca_file: Path,
          tracers: list[subprocess.Popen], tmp: Path, args: argparse.Namespace) -> bool:
    """Tracers through the proxy for ``args.duration_s``, one dashboard killed on the way; True when
    every batch is stored once and nothing was dropped."""
    common = ["--rows-s", str(args.rows_s), "--steps-per-request", str(args.steps_per_request),
              "--flush-s", str(args.flush_s), "--duration-s", str(args.duration_s)]
    env = {**os.environ, "SSL_CERT_FILE": str(ca_file)}  # the sink (urllib) trusts the proxy's CA
    tracers += [subprocess.Popen([sys.executable, __file__, "--tracer", str(i), "--port", str(proxy_port),
                                  "--out", str(tmp / f"tracer-{i}.json"), *common], env=env, start_new_session=True)
                for i in range(args.tracers)]
    print(f"{args.tracers} tracers x {args.rows_s:,.0f} rows/s for {args.duration_s:.0f} s -> HAProxy https :{proxy_port} "
          f"-> dashboards :{ports[0]} :{ports[1]} -> PostgreSQL; {os.cpu_count()} cores")
    tls = ssl.create_default_context(cafile=str(ca_file))
    start, killed, timings, run_ids = time.monotonic(), None, {}, []
    while any(t.poll() is None for t in tracers):
        elapsed = time.monotonic() - start
        if killed is None and 0 <= args.kill_at_s <= elapsed:
            stop(dashboards[0], signal.SIGKILL)
            killed = time.monotonic()
            print(f"{elapsed:.0f} s: dashboard :{ports[0]} killed (SIGKILL) mid-ingest")
        if killed is not None and dashboards[0].poll() is not None and time.monotonic() - killed >= args.down_s:
            dashboards[0] = serve(url, ports[0], tmp / "dash-0.log")
            print(f"{time.monotonic() - start:.0f} s: dashboard :{ports[0]} started again")
        if len(run_ids) < args.tracers:
            run_ids = db_runs(url)
        if run_ids:
            load_pages(proxy_port, tls, run_ids, timings)
        time.sleep(0.5)
    elapsed = time.monotonic() - start
    reports = [orjson.loads((tmp / f"tracer-{i}.json").read_bytes()) for i in range(args.tracers)]
    rows = sum(r["rows"] for r in reports)
    print(f"sent {sum(len(r['batches']) for r in reports):,} batches, {rows:,} rows in {elapsed:.0f} s: "
          f"{rows / elapsed:,.0f} rows/s stored through the proxy (tracers' sinks closed)")
    print(f"aggregates of all {len(reports)} runs caught up {caught_up(url, [r['run_id'] for r in reports], 300):.1f} s later")
    for name, values in sorted(timings.items()):
        values.sort()
        q = statistics.quantiles(values, n=20)[18] if len(values) > 1 else values[0]
        print(f"  {name:<28} n={len(values):>4} p50 {statistics.median(values):>6.0f} ms  p95 {q:>6.0f} ms")
    ok = check(url, reports)
    print("every batch stored once, nothing dropped" if ok else "LOST OR DUPLICATED DATA (above)")
    return ok


def proxy_report(log: Path) -> str:
    """The tracers' POSTs by the dashboard that answered them and their status, from HAProxy's log."""
    answers = collections.Counter(POSTED.findall(log.read_text()))
    return "proxy: POSTs answered " + ", ".join(f"{n:,} {status} by {server}" for (server, status), n in
                                                sorted(answers.items()))


def db_runs(url: str) -> list[str]:
    import sqlalchemy as sa

    from draftscope.store import db, models

    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.select(models.Run.__table__.c.id).order_by(models.Run.__table__.c.id)).scalars())
    finally:
        engine.dispose()


if __name__ == "__main__":
    main()
