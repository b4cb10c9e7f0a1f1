"""Stopping a traced SGLang server by SIGTERM, on a loaded machine: how each run ends.

--stops times: start the CPU test bed's aux-off server (every request sampled, SQLite store, flushed every
--flush-interval-s as in ``tests/test_bundle_server.py``), answer one request of 32 tokens, then stop it
as the test bed does (``ServerHandle.stop``: SIGTERM to the process group). SGLang's main process then
sees its detokenizer die of the signal and SIGKILLs the scheduler at its subprocess watchdog's next tick,
so the tracer's final round races that kill. While it runs, --load busy processes and one that writes
and fsyncs 512 MB over and over keep the machine loaded. Prints each run's status (``ended`` is right;
``crashed`` means the final round lost the race), whether every verify step reached the store, how long the
server took to stop after the signal, and the tally.

With --signal-to main the SIGTERM goes to SGLang's main process alone, as ``docker stop`` and Kubernetes
send it; SGLang then ends its own children.

    PYTHONPATH=. .venv/bin/python bench/group_stop.py --stops 16 --load 10
    PYTHONPATH=. .venv/bin/python bench/group_stop.py --stops 16 --load 10 --signal-to main
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from draftscope.store import db
from testbed import scenarios
from testbed.server import start_server


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def loaded(busy: int, scratch: Path):
    """``busy`` spinning processes and a disk writer (fsync every 512 MB) until the block ends."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
    for p in spinners:
        p.start()
    writer = subprocess.Popen(["sh", "-c", f"while :; do dd if=/dev/zero of={scratch} bs=1M count=512 "
                                           "conv=fsync 2>/dev/null; done"], start_new_session=True)
    try:
        yield
    finally:
        os.killpg(writer.pid, 9)
        writer.wait()
        for p in spinners:
            p.kill()
        scratch.unlink(missing_ok=True)


def _ended(store: Path, timeout_s: float = 120.0) -> str | None:
    """The run's status once it is no longer ``running`` (None if it never is)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.closing(sqlite3.connect(store, timeout=30)) as conn:
            row = conn.execute("SELECT status FROM runs").fetchone()
        if row and row[0] != "running":
            return row[0]
        time.sleep(0.2)
    return None


def _steps(store: Path) -> tuple[int, int]:
    """(verify steps stored, verify steps the request's finish record counted)."""
    with contextlib.closing(sqlite3.connect(store, timeout=30)) as conn:
        stored = conn.execute("SELECT count(*) FROM verify_steps").fetchone()[0]
        counted = conn.execute("SELECT coalesce(sum(spec_verify_ct), 0) FROM requests").fetchone()[0]
    return stored, counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stops", type=int, default=16, help="servers started and stopped")
    parser.add_argument("--load", type=int, default=10, help="busy processes while they run (0: none)")
    parser.add_argument("--flush-interval-s", type=float, default=0.2, help="DRAFTSCOPE_FLUSH_INTERVAL_S")
    parser.add_argument("--signal-to", choices=("group", "main"), default="group",
                        help="SIGTERM to the process group (systemd, the test bed) or to SGLang's main process "
                             "alone (docker stop, Kubernetes)")
    args = parser.parse_args()
    prepared = scenarios.prepare("aux-off")
    tally: Counter = Counter()
    took: list[float] = []
    with tempfile.TemporaryDirectory(prefix="group-stop-") as tmp, loaded(args.load, Path(tmp) / "load.bin"):
        for i in range(args.stops):
            root = Path(tmp) / f"stop{i}"
            root.mkdir()
            store = root / "trace.db"
            db.upgrade(f"sqlite:///{store}")
            env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0", "DRAFTSCOPE_DB": str(store), "DRAFTSCOPE_SAMPLE_RATE": "1",
                   "DRAFTSCOPE_FLUSH_INTERVAL_S": str(args.flush_interval_s)}
            with start_server(prepared.target_dir, prepared.draft_dir, [*prepared.server_args, "--sleep-on-idle"],
                              root / "server.log", env=env) as server:
                server.generate("Once upon a time", max_new_tokens=32)
                began = time.monotonic()
                if args.signal_to == "main":
                    server.terminate_main()
            took.append(time.monotonic() - began)  # the signal until the server's processes are gone
            status = _ended(store)
            stored, counted = _steps(store)
            tally[status] += 1
            print(f"stop {i}: {status}, verify steps stored {stored} of {counted}, "
                  f"stopped in {took[-1]:.1f} s", flush=True)
    ends = ", ".join(f"{n} {status}" for status, n in sorted(tally.items(), key=str))
    whom = "process group" if args.signal_to == "group" else "main process"
    print(f"{args.stops} stops by SIGTERM to the {whom} under load {args.load}, "
          f"flushed every {args.flush_interval_s} s: {ends}; stopped in {statistics.median(took):.1f} s "
          f"(median), {max(took):.1f} s at most")


if __name__ == "__main__":
    main()
