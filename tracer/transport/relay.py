"""The scheduler's end of the recorder process: a thread that pickles the hooks' jobs down a pipe.

The hooks queue jobs (``records`` functions over summary handles); the first one queued wakes the relay
thread, which lets ``POLL_S`` pass for the jobs after it, then pickles what is queued and writes it to
the recorder's stdin, with the scheduler's health counters. While jobs keep coming it takes them every
``POLL_S``; idle, it sleeps until the counters are due (``health_interval_s``) or a recorder is to be
started again. ``close`` runs the last round itself, on the closing thread (``Relay.close`` says why).
Pickling is where a device summary is waited for and read (``summarize.Pending`` pickles as its
decoded summary) and where CPU row copies become arrays; building the records and writing the sink
happen in the recorder (``recorder.py``), off this process's GIL.

A recorder that has died loses the jobs meant for it (counted as ``recorder_down``); a new one is
started ``RESTART_S`` after the last one was lost. After the fifth loss (the probe failure limit)
tracing stops: the ``recorder`` probe is disabled. The recorder runs in its own session and outside the
scheduler's process tree (``recorder.py``, ``--detach``), so neither a signal sent to the server's
process group nor SGLang's SIGKILL of the scheduler's descendants cuts its final flush short.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import math
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from typing import Optional

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.health import Health
from draftscope_tracer.transport.recorder import frame
from draftscope_tracer.shared import Shared, recall
from draftscope_tracer.transport.writer import JobQueue, known_records

log = logging.getLogger("draftscope.tracer")
RESTART_S = 5.0
PID_WAIT_S = 10.0  # for the recorder's launcher to say the recorder's pid
# How long the relay lets jobs gather before it pickles them. Each round takes the GIL from the scheduler
# thread once, and one pickle of several iterations' calls costs less per call (a fifth less for eight
# iterations than for one). A device launch holds its ring slot (``summaries.RING_SIZE`` per layout) until then.
POLL_S = 0.1
# The pipe to the recorder (Linux's default is 64 KiB; 1 MiB is the default most an unprivileged process may ask
# for). A recorder that a loaded machine slows falls this far behind before a round's write waits for it, and
# what is in the pipe when the scheduler is killed still reaches the recorder: one request's last round measured
# 112 KB, and waiting on the default's room had SGLang's shutdown kill the scheduler before its final round.
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux's number, named in Python 3.10+


class _Pickler(pickle.Pickler):
    """Sends each :class:`~draftscope_tracer.shared.Shared` value once per recorder."""

    def __init__(self, file, sent: set):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.sent, self.new = sent, set()

    def reducer_override(self, obj):  # not called for ints, strings, lists, tuples, dicts: cheap
        if type(obj) is Shared:
            if obj.key in self.sent:
                return recall, (obj.key,)
            self.new.add(obj.key)
        return NotImplemented


class Detached:
    """A recorder started with ``--detach`` (and ``--scheduler PID``, this process, for tools that look for
    it): the pipe to its stdin, its pid (the line its launcher writes), and whether it has exited (its end
    of the stdout pipe closed)."""

    def __init__(self):
        cmd = [sys.executable, "-m", "draftscope_tracer.transport.recorder", "--detach", "--scheduler", str(os.getpid())]
        self.launcher = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        with contextlib.suppress(OSError):  # not Linux, or over the user's pipe limit: the default size
            fcntl.fcntl(self.launcher.stdin.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
        self.stdin, self._out, self._pid, self._eof = self.launcher.stdin, self.launcher.stdout.fileno(), None, False

    @property
    def pid(self) -> Optional[int]:
        """The recorder's pid, once its launcher has written it (waits up to ``PID_WAIT_S``; None if the
        launcher failed)."""
        deadline = time.monotonic() + PID_WAIT_S
        while self._pid is None and not self.exited(0.05) and time.monotonic() < deadline:
            pass
        return self._pid

    def exited(self, timeout_s: float = 0.0) -> bool:
        """Whether the recorder has exited, waiting up to ``timeout_s`` for it."""
        deadline = time.monotonic() + timeout_s
        while not self._eof:
            if not select.select([self._out], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            data = os.read(self._out, 64)
            self._eof = not data
            if data.strip().isdigit() and self._pid is None:
                self._pid = int(data)
        self.launcher.poll()  # reaps the launcher
        return self._eof

    def reason(self) -> str:
        code = self.launcher.poll()
        return f"recorder exited (its launcher with code {code})" if code else "recorder exited"


class Relay(JobQueue):
    """Starts the recorder process and feeds it; ``submit``/``close`` as any ``writer.JobQueue``."""

    def __init__(self, config: TracerConfig, health: Health, run: dict, run_id: str):
        super().__init__(health, config.max_queue_items, "draftscope-relay")
        self.health_interval_s = config.health_interval_s
        self._start_frame = frame(pickle.dumps(("start", config, run, run_id), protocol=pickle.HIGHEST_PROTOCOL))
        self._proc: Optional[Detached] = None
        self._sent: set = set()
        self._next_start = 0.0
        self._deadline = 0.0
        self._round = threading.Lock()  # one round at a time: the relay thread's, or close's final one
        self._start()
        self._thread.start()

    @property
    def pid(self) -> Optional[int]:
        return None if self._proc is None else self._proc.pid

    def close(self, timeout_s: float = 10.0, status: str = "ended") -> None:
        """The final round (what is queued, health, ``close``) on the calling thread, then end of input
        for the recorder; waits at most ``timeout_s``. Idempotent.

        Not handed to the relay thread: on SIGTERM to the server's process group SGLang's main process
        sees the detokenizer die of it and SIGKILLs the scheduler at its watchdog's next tick (within
        1 s), so the final round must be in the pipe at once. Here it waits only for a round in progress,
        which the pipe's room (``PIPE_BYTES``) keeps short. The round lock is taken here and by the relay
        thread's rounds, never otherwise by the thread a signal interrupts, so a SIGTERM handler may take it;
        the counters' lock, which that thread may hold, is reentrant (``Health``). The launches a round reads
        are those of queued jobs; the hooks' thread locks only the launches of records it dropped."""
        if not self._stopping(status):  # the relay thread wakes, finds the stop and ends
            return
        self._deadline = time.monotonic() + timeout_s
        if not self._round.acquire(timeout=timeout_s):
            log.warning("draftscope: the relay's last round did not finish within %.1f s; unsent records are lost",
                        timeout_s)
            return
        try:
            self._round_of(self._taken(), stopping=True, next_health=0.0)
        finally:
            self._round.release()

    def _start(self) -> bool:
        try:
            self._proc = Detached()
            self._proc.stdin.write(self._start_frame)
            self._proc.stdin.flush()
        except (OSError, ValueError) as exc:
            self._lost(exc)
            return False
        self._sent = set()
        return True

    def _lost(self, exc: BaseException) -> None:
        self._proc = None
        self._next_start = time.monotonic() + RESTART_S
        if self.health.failed("recorder", exc):
            log.warning("draftscope: recorder process lost %d times (%s: %s); tracing stops",
                        self.health.failure_limit, type(exc).__name__, exc)
        else:
            log.warning("draftscope: recorder process lost (%s: %s); records are dropped until a new one starts",
                        type(exc).__name__, exc)

    def _loop(self) -> None:
        next_health = time.monotonic()
        while True:
            self._sleep(min(next_health, self._restart_at()))
            if self._jobs and not self._stop.is_set():
                self._stop.wait(POLL_S)  # the jobs of the next iterations join this round
            with self._round:
                if self._stop.is_set():
                    return  # ``close`` runs the final round
                next_health = self._round_of(self._taken(), stopping=False, next_health=next_health)

    def _taken(self) -> list:
        return [self._jobs.popleft() for _ in range(len(self._jobs))]

    def _round_of(self, jobs: list, stopping: bool, next_health: float) -> float:
        """One round; the relay thread never dies of one (nor does ``close``): its failure is counted."""
        try:
            return self._relay(jobs, stopping, next_health)
        except Exception as exc:
            self.health.failed("relay", exc)
            self.health.drop("relay_error", len(jobs), known_records(jobs))
            return max(next_health, time.monotonic() + POLL_S)  # tried again, not in a spin

    def _restart_at(self) -> float:
        """When a lost recorder is to be started again (infinity while one runs, or tracing stopped)."""
        if self._proc is not None or self.health.is_disabled("recorder"):
            return math.inf
        return self._next_start

    def _relay(self, jobs: list, stopping: bool, next_health: float) -> float:
        """Send ``jobs`` (and health, and at the end ``close``); returns when health is next due."""
        now = time.monotonic()
        if not self._alive():
            self.health.drop("recorder_down", len(jobs), known_records(jobs))
            for job in jobs:
                job.release()
            return next_health if now < next_health else now + self.health_interval_s
        frames = []
        if jobs or stopping or now >= next_health:
            # the counters before the jobs they count: the recorder's writer may take a health record
            # while it builds them, and one that showed the steps without their hooks' calls would read
            # as hooks that never fired (``hooks-starved``)
            frames.append(frame(pickle.dumps(("health", self.health.snapshot(self.depth())))))
            next_health = now + self.health_interval_s
        if jobs:
            frames.append(frame(self._pickle(jobs)))
        if stopping:
            frames.append(frame(pickle.dumps(("close", self._final_status))))
        if frames:
            self._write(b"".join(frames), jobs)
        if stopping:
            self._finish()
        return next_health

    def _alive(self) -> bool:
        """A recorder is running (a new one is started ``RESTART_S`` after the last one was lost, unless
        it was lost ``probe_failure_limit`` times)."""
        proc = self._proc
        if proc is not None and not proc.exited():
            return True
        if proc is not None:
            self._lost(RuntimeError(proc.reason()))
        if self.health.is_disabled("recorder") or time.monotonic() < self._next_start:
            return False
        return self._start()

    def _pickle(self, jobs: list) -> bytes:
        """One payload for all ``jobs`` (a summary two jobs share crosses once); when that fails, the
        jobs that cannot be pickled (e.g. a summary released) are left out, counted."""
        try:
            return self._dumps(jobs)
        except Exception:
            pass
        ok = []
        for job in jobs:
            try:
                self._dumps([job], trial=True)
                ok.append(job)
            except Exception as exc:
                self.health.failed(f"{job.probe}.build", exc, say=True)
                self.health.drop("build_error", batch=known_records([job]))
                job.release()
        return self._dumps(ok)

    def _dumps(self, obj, trial: bool = False) -> bytes:
        buf = io.BytesIO()
        pickler = _Pickler(buf, self._sent)
        pickler.dump(obj)
        if not trial:  # what a trial carried is not sent
            self._sent |= pickler.new
        return buf.getvalue()

    def _write(self, data: bytes, jobs: list) -> None:
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (OSError, ValueError) as exc:
            self.health.drop("recorder_down", len(jobs), known_records(jobs))
            self._lost(exc)

    def _finish(self) -> None:
        """End of input for the recorder; wait for it until the close deadline."""
        proc = self._proc
        if proc is None:
            return
        try:
            proc.stdin.close()
            if not proc.exited(max(0.0, self._deadline - time.monotonic())):
                log.warning("draftscope: the recorder is still writing at shutdown (pid %s); it finishes on its "
                            "own", proc.pid)
        except (OSError, ValueError) as exc:
            self.health.failed("recorder", exc)
