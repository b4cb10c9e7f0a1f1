"""The recorder process: builds records from the scheduler's summaries and writes them to the sink.

``python -m draftscope_tracer.transport.recorder`` is started by the scheduler's ``relay.Relay`` and reads
frames from its stdin (a 4-byte little-endian length, then a pickle), a pipe that only that scheduler
process writes to (nothing from users is unpickled):

* ``("start", config, run, run_id)`` first: open the sink, start a ``writer.Writer``;
* a list of jobs (``records.Call`` over summary handles): queued for the writer;
* ``("health", snapshot)``: the scheduler's counters, added to the recorder's own in health records;
* ``("close", status)``: drain, send the final run with ``status``, exit.

End of input without ``close`` (the scheduler died) ends the run as ``crashed``. Building records here
keeps their CPU time off the scheduler's GIL. No torch is imported: summaries arrive as plain data.

``--detach`` (the relay starts it so): the process first leaves the scheduler's process tree, since
SGLang's shutdown SIGKILLs every descendant of the scheduler (``kill_process_tree``), at once where
``SGLANG_PYSPY_DUMP_BEFORE_CRASH=0``, which would cut the final flush short. It forks; the first
process (the launcher the relay started) writes the recorder's pid on stdout and exits, and the
recorder, now no one's child but init's, keeps that stdout pipe open, unused, until it exits: the
relay's sign that it is gone. ``--scheduler PID`` only labels the command line with the process that
started it (``testbed.server.server_processes`` finds a server's recorders by it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import struct
import sys
from typing import Any

from draftscope_tracer.health import Health, combined
from draftscope_tracer.model_paths import relative_to_root
from draftscope_tracer.redact import scrub
from draftscope_tracer.transport.sinks import open_sink
from draftscope_tracer.transport.writer import Writer

log = logging.getLogger("draftscope.tracer")
CLOSE_TIMEOUT_S = 10.0


def frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


def read_frame(stream) -> Any:
    """The next frame's object; EOFError at the end of input (also a frame cut short)."""
    head = stream.read(4)
    if len(head) < 4:
        raise EOFError
    n = struct.unpack("<I", head)[0]
    payload = stream.read(n)
    if len(payload) < n:
        raise EOFError
    return pickle.loads(payload)


def detach() -> None:
    """Fork; the parent writes the child's pid on stdout and exits at once; the child keeps stdout (the
    relay's pipe) open on a descriptor it never closes and points fd 1 at stderr."""
    pid = os.fork()
    if pid:
        with contextlib.suppress(OSError):  # the relay gone already: the recorder reads end of input
            os.write(1, b"%d\n" % pid)
        os._exit(0)
    os.dup(1)  # never closed: the pipe closes when the recorder exits
    os.dup2(2, 1)


def main(argv: list | None = None) -> int:
    if "--detach" in (sys.argv[1:] if argv is None else argv):
        detach()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stdin = sys.stdin.buffer
    _, config, run, run_id = read_frame(stdin)
    # no credential in any recorded value (server args, facts, paths); model paths relative to the models root
    run = relative_to_root(scrub(run), config.models_root)
    health = Health(config.probe_failure_limit)
    scheduler: dict = {}
    sink = open_sink(config, health.drop)
    if sink is None:
        return 2  # logged by open_sink
    writer = Writer(sink, health, lambda: dict(run), run_id=run_id, max_queue_items=config.max_queue_items,
                    max_batch_items=config.max_batch_items, flush_interval_s=config.flush_interval_s,
                    health_interval_s=config.health_interval_s,
                    snapshot=lambda depth: combined(scheduler, health.snapshot(depth)))
    status = "crashed"
    while True:
        try:
            message = read_frame(stdin)
        except EOFError:
            log.warning("draftscope: the scheduler's pipe closed without its final flush (the scheduler died or was "
                        "killed first); what it had not relayed is lost, and the run ends as crashed")
            break
        except Exception as exc:  # a frame that does not unpickle: count it, read the next
            health.failed("recorder", exc)
            health.drop("bad_frame")
            log.warning("draftscope: recorder dropped a frame it could not read: %s: %s", type(exc).__name__, exc)
            continue
        if isinstance(message, tuple):
            if message[0] == "health":
                scheduler = message[1]
            elif message[0] == "close":
                status = message[1]
                break
        else:
            for job in message:
                writer.submit(job)
    writer.close(CLOSE_TIMEOUT_S, status)
    return 0


if __name__ == "__main__":  # run the package's module, not this ``__main__`` copy: one SHARED table
    from draftscope_tracer.transport.recorder import main as package_main

    sys.exit(package_main())
