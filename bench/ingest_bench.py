"""Ingest throughput: tensor-sample rows/s into SQLite through `draftscope serve`, while pages load.

Starts `draftscope serve --upgrade` on a temp SQLite database in a subprocess, then for --seconds
posts batches of --batch-rows tensor samples (one poster thread, keep-alive) while another thread
GETs `/` and `/api/v1/runs` every --page-interval-s. Prints sustained rows/s, the server's CPU
seconds (rows per server-CPU-second, which other load on the machine does not distort), batch
latency p50/p99 and page latency p50/p99.

    .venv/bin/python bench/ingest_bench.py --seconds 20 --batch-rows 5000
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
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


def samples(n: int) -> list[dict]:
    """Realistic sample records: 16 requests, consecutive steps, the usual sample points."""
    out, now = [], time.time()
    for i in range(n):
        point, phase, width = POINTS[i % len(POINTS)]
        rows = random.choice((1, 4, 8))
        out.append({"point": point, "phase": phase, "at": now + i * 1e-4, "rid": f"req-{i % 16:04d}",
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
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="draftscope-bench-"))
    url, port = f"sqlite:///{tmp / 'bench.db'}", free_port()
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


def run(args: argparse.Namespace, port: int, server_pid: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    run_id = uuid.uuid4().hex
    post(conn, json.dumps({"schema_version": 1, "batch_id": uuid.uuid4().hex, "run_id": run_id,
                           "sent_at": time.time(), "run": {
                               "engine": "sglang", "engine_version": "0.5.23", "source": "tracer",
                               "status": "running", "started_at": time.time(), "algorithm": "EAGLE3",
                               "target_path": "/models/Llama-3.1-8B-Instruct",
                               "draft_path": "/models/EAGLE3-LLaMA3.1-Instruct-8B"}}).encode())
    # One body, re-stamped with a fresh batch id per post (the client must not be the bottleneck).
    template = json.dumps({"schema_version": 1, "batch_id": "B" * 32, "run_id": run_id,
                           "sent_at": time.time(), "samples": samples(args.batch_rows)}).encode()
    print(f"batch: {args.batch_rows} samples, {len(template) / 1e6:.2f} MB")

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

    reader = threading.Thread(target=pages)
    reader.start()
    batch_s: list[float] = []
    cpu0 = cpu_seconds(server_pid)
    start = time.perf_counter()
    try:
        while time.perf_counter() - start < args.seconds:
            body = template.replace(b"B" * 32, uuid.uuid4().hex.encode(), 1)
            t0 = time.perf_counter()
            post(conn, body)
            batch_s.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
        server_cpu = cpu_seconds(server_pid) - cpu0
    finally:
        stop.set()
        reader.join()
    rows = len(batch_s) * args.batch_rows
    print(f"ingest: {rows} rows in {elapsed:.1f} s = {rows / elapsed:,.0f} rows/s sustained "
          f"({len(batch_s)} batches)")
    print(f"server CPU: {server_cpu:.1f} s = {rows / server_cpu:,.0f} rows per server-CPU-second "
          f"(load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"batch latency: p50 {percentile(batch_s, 50):.0f} ms, p99 {percentile(batch_s, 99):.0f} ms")
    print(f"page latency (/ and /api/v1/runs, {len(page_ms)} loads): "
          f"p50 {percentile(page_ms, 50):.0f} ms, p99 {percentile(page_ms, 99):.0f} ms")


if __name__ == "__main__":
    main()
