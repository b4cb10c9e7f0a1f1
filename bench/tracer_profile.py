"""Where the tracer's time goes in the real CPU SGLang server: py-spy samples of the scheduler process.

Starts one traced server as ``bench/tracer_overhead.py`` does (rate 1/16, one intra-op thread, SQLite
store), then runs units of 16 greedy requests, ``--sampled`` of each unit sampled by the tracer, for
``--seconds`` while ``py-spy record --nonblocking`` samples the scheduler process (py-spy must be
installed: ``pip install py-spy``). A sample is the tracer's when, walking from the innermost frame
out, the first frame of either draftscope's tracer or SGLang is the tracer's (so the forward pass
that a hook calls counts as SGLang's; numpy or torch called by the tracer counts as the tracer's).
Prints, per thread of the scheduler process, its active samples and the tracer's share (samples in a
timed wait of ``threading`` apart: py-spy counts them active while the thread takes the GIL back); the tracer
functions that the scheduler's main thread spends the most samples in; and the CPU seconds of the
scheduler process and of the tracer's recorder process over the window.

    python bench/tracer_profile.py --sampled 1 --seconds 60
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import draftscope_tracer  # noqa: E402
import psutil  # noqa: E402

from draftscope.store import db as store_db  # noqa: E402
from testbed.models import ensure_models  # noqa: E402
from testbed.overhead import request_id  # noqa: E402
from testbed.server import RECORDER, server_processes, start_server  # noqa: E402
from tracer_overhead import UNIT, run_unit  # noqa: E402

TRACER_DIR = f"{Path(draftscope_tracer.__file__).parent}/"  # the server imports the same package


def owner(frame: str) -> str | None:
    """'tracer', 'sglang' or None for a py-spy frame ``function (full path)``."""
    path = frame.rsplit("(", 1)[-1]
    if path.startswith(TRACER_DIR):
        return "tracer"
    if "/sglang/" in path:
        return "sglang"
    return None


def attribute(stack: list[str]) -> str | None:
    """The innermost tracer-or-SGLang frame of ``stack`` (outermost first) when it is the tracer's."""
    for frame in reversed(stack):
        who = owner(frame)
        if who is not None:
            return frame if who == "tracer" else None
    return None


def parse(raw: Path) -> dict:
    """Per thread: samples in a wait of ``threading``'s (py-spy counts a timed wait as active while the
    thread takes the GIL back), other samples, the tracer's among those, and the tracer's by innermost
    tracer frame."""
    threads: dict = collections.defaultdict(
        lambda: {"waiting": 0, "samples": 0, "tracer": 0, "where": collections.Counter()})
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        thread, *frames = stack.split(";")
        t, n = threads[thread], int(count)
        if frames and frames[-1].split(" (", 1)[0].endswith("wait") and frames[-1].endswith("/threading.py)"):
            t["waiting"] += n
            continue
        t["samples"] += n
        frame = attribute(frames)
        if frame is not None:
            t["tracer"] += n
            t["where"][frame] += n
    return threads


def scheduler_and_recorder(pid: int) -> tuple[psutil.Process, psutil.Process | None]:
    procs = server_processes(pid)[1:]
    scheduler = next(p for p in procs if "scheduler" in " ".join([p.name(), *p.cmdline()]))
    recorder = next((p for p in procs if RECORDER in p.cmdline()), None)
    return scheduler, recorder


def cpu(p: psutil.Process | None) -> float:
    if p is None:
        return 0.0
    t = p.cpu_times()
    return t.user + t.system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sampled", type=int, default=1, help=f"requests sampled per unit of {UNIT}")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    work = Path(tempfile.mkdtemp(prefix="draftscope-profile-"))
    store = work / "store.db"
    store_db.upgrade(f"sqlite:///{store}")
    models = ensure_models()
    env = {"OMP_NUM_THREADS": "1", "DRAFTSCOPE_DB": str(store), "DRAFTSCOPE_SAMPLE_RATE": "1/16"}
    with start_server(models.target, models.draft, ["--sleep-on-idle"], work / "server.log", env=env) as server, \
            ThreadPoolExecutor(args.concurrency) as pool:
        run_unit(server, pool, [request_id(f"warm-{i}", False) for i in range(UNIT)], args.concurrency,
                 args.new_tokens)
        scheduler, recorder = scheduler_and_recorder(server.pid)
        raw = work / "scheduler.txt"
        cpu0 = (cpu(scheduler), cpu(recorder))
        record = subprocess.Popen([spy, "record", "--pid", str(scheduler.pid), "--nonblocking", "--threads",
                                   "--nolineno", "--full-filenames", "--format", "raw", "--rate", str(args.rate),
                                   "--duration", str(round(args.seconds)), "--output", str(raw)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        units, end = 0, time.monotonic() + args.seconds
        while time.monotonic() < end:
            rids = [request_id(f"p{units}-{i}", i < args.sampled) for i in range(UNIT)]
            run_unit(server, pool, rids, args.concurrency, args.new_tokens)
            units += 1
        _, err = record.communicate(timeout=args.seconds + 60)
        if record.returncode != 0:
            raise SystemExit(f"py-spy failed ({record.returncode}): {err.strip()}")
        cpu1 = (cpu(scheduler), cpu(recorder))
    threads = parse(raw)
    print(f"{units} units of {UNIT} requests, {args.sampled} sampled in each, over {args.seconds:g} s; "
          f"py-spy at {args.rate} Hz on the scheduler process (pid {scheduler.pid})\n")
    print("| thread | active samples, not in a wait | the tracer's | in a threading wait |\n|---|---|---|---|")
    for name, t in sorted(threads.items(), key=lambda kv: -kv[1]["samples"]):
        share = f"{100 * t['tracer'] / t['samples']:.1f}%" if t["samples"] else "-"
        print(f"| {name} | {t['samples']} | {t['tracer']} ({share}) | {t['waiting']} |")
    main_thread = max(threads.values(), key=lambda t: t["samples"])
    print("\nthe busiest thread's tracer samples, by innermost tracer frame:")
    for frame, n in main_thread["where"].most_common(12):
        print(f"  {n:6d}  {100 * n / main_thread['samples']:5.2f}%  {frame}")
    print(f"\nCPU seconds over the window: scheduler process {cpu1[0] - cpu0[0]:.2f}, "
          f"recorder process {cpu1[1] - cpu0[1]:.2f}; raw samples in {raw}")


if __name__ == "__main__":
    main()
