"""Tracers of simulated SGLang servers: each process replays a recorded trace (``demo/*.jsonl``, as
the real tracer wrote it) as a run of its own, finishing the recorded requests again and again, under
new request ids and with their times moved to now, at --rows-s rows/s, until SIGTERM or SIGINT.
Tracer i replays the i-th trace given (cycling); the default rate, 200 rows/s, is ``fleet_bench``'s.

The records go through the tracer's own ``Writer`` and ``HttpSink``, as a traced server's recorder
sends them: a batch a second, a health record every 10 s (with the heartbeats of the hooks that
fired in the recording), resends with backoff, and the run marked ``ended`` at the end.

Standard library and ``draftscope_tracer`` only, so that it runs in the dashboard's image (compose's
``fleet`` profile); the ingest token is DRAFTSCOPE_INGEST_TOKEN:

    python bench/fleet_tracers.py --url http://127.0.0.1:8178 --tracers 4 demo/healthy.jsonl demo/aux-off.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import NamedTuple

from draftscope_tracer.health import Health
from draftscope_tracer.transport.http_sink import HttpSink
from draftscope_tracer.transport.writer import Writer

TABLES = ("requests", "steps", "samples")  # a finished request's records
TIMES = ("at", "started_at", "finished_at")

Records = dict[str, list[dict]]


class Recording(NamedTuple):
    run: dict
    requests: list[Records]  # the records of each request that finished, in order
    probes: list[str]  # the tracer hooks that fired (its last health record's heartbeats)


def load(path: Path) -> Recording:
    """The recorded run, its finished requests' records and the hooks that fired."""
    batches = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_rid: dict[str, Records] = {}
    for batch in batches:
        for table in TABLES:
            for record in batch.get(table) or ():
                by_rid.setdefault(record["rid"], {t: [] for t in TABLES})[table].append(record)
    finished = [r for r in by_rid.values() if r["requests"]]
    if not finished:
        raise SystemExit(f"{path}: no request finished in this trace, nothing to replay")
    health = [h for b in batches for h in b.get("health") or ()]
    probes = sorted(p for p, n in (health[-1]["heartbeats"] if health else {}).items() if n)
    return Recording(next(b["run"] for b in batches if b.get("run")), finished, probes)


def again(records: Records, rid: str, shift_s: float) -> Records:
    """``records`` as those of a new request ``rid``, ``shift_s`` seconds later."""
    return {table: [{**r, "rid": rid, **{k: r[k] + shift_s for k in TIMES if r.get(k) is not None}}
                    for r in recs] for table, recs in records.items()}


def replay(url: str, token: str | None, trace: Path, index: int, rows_s: float) -> None:
    """One tracer: ``trace`` as a new run at ``rows_s`` until SIGTERM or SIGINT, then the run ends."""
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    recording = load(trace)
    run = {**{k: v for k, v in recording.run.items() if k != "ended_at"}, "status": "running",
           "started_at": time.time(), "host": f"{socket.gethostname()}-{index}", "pid": os.getpid()}
    health = Health()
    sink = HttpSink(url, health.drop, token=token, timeout_s=10.0, max_buffered_batches=256)
    writer = Writer(sink, health, lambda: run, run_id=uuid.uuid4().hex)
    start, rows, n = time.monotonic(), 0, 0
    while not stopping:
        recorded = recording.requests[n % len(recording.requests)]
        records = again(recorded, uuid.uuid4().hex, time.time() - recorded["requests"][0]["finished_at"])
        writer.submit(lambda records=records: records)
        for probe in recording.probes:  # the hooks fired for this request, as in the recording
            health.beat(probe)
        n, rows = n + 1, rows + sum(map(len, records.values()))
        time.sleep(max(0.0, start + rows / rows_s - time.monotonic()))
    writer.close(timeout_s=60)
    # one write of the whole line: the tracers share stdout, and print() writes the text and its newline
    # apart where stdout is unbuffered (PYTHONUNBUFFERED in the image), so two lines could run together
    sys.stdout.write(f"tracer {index} ({trace.name}): {n} requests, {rows} rows sent; drops {dict(health.drops)}\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path, help="recorded traces (JSON lines), replayed in turn")
    parser.add_argument("--url", required=True, help="the dashboard (or the proxy in front of several)")
    parser.add_argument("--tracers", type=int, default=4)
    parser.add_argument("--rows-s", type=float, default=200, help="rows/s per tracer")
    args = parser.parse_args()
    for trace in args.traces:
        load(trace)  # a trace with nothing to replay stops here, not in a tracer
    token = os.environ.get("DRAFTSCOPE_INGEST_TOKEN") or None
    tracers = [multiprocessing.Process(target=replay, args=(args.url, token, args.traces[i % len(args.traces)],
                                                            i, args.rows_s)) for i in range(args.tracers)]
    for t in tracers:
        t.start()

    def forward(_signum: int, _frame: object) -> None:  # docker stop signals this process alone
        for t in tracers:
            with contextlib.suppress(ProcessLookupError):  # already gone
                os.kill(t.pid, signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    print(f"{args.tracers} tracers x {args.rows_s:,.0f} rows/s -> {args.url}", flush=True)
    for t in tracers:
        t.join()


if __name__ == "__main__":
    main()
