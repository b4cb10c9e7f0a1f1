"""The tracer's engine-neutral core, which each engine's tracer is built on (``sglang.tracer.Tracer``,
``vllm.tracer.VLLMTracer``): the run record, the guard every hook's work runs under (fault injection, sync
debug, a probe that keeps failing turned off), the recorder started at attach, the crashed run written when
the engine refuses to start, and closing (ended, or crashed).
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
import traceback
import uuid
from typing import Any, Callable, Dict, Optional

import torch

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.engine.shutdown import CRASH_DEADLINE_S, SigtermChain
from draftscope_tracer.health import Health
from draftscope_tracer.model_paths import relative_to_root
from draftscope_tracer.redact import scrub
from draftscope_tracer.transport import wire
from draftscope_tracer.transport.outbox import Transport
from draftscope_tracer.transport.relay import Relay

log = logging.getLogger("draftscope.tracer")


class InjectedFault(RuntimeError):
    """Raised inside a probe named in DRAFTSCOPE_FAULT (tests the fault path)."""


class TracerCore:
    """One tracer's run and plumbing. ``active``: the hooks do their work (False once the tracer stepped out
    of the way); ``attached``: attach ran (or the engine failed before it could)."""

    def __init__(self, config: TracerConfig, engine: str, engine_version: str, run_id: Optional[str] = None,
                 before_close: Optional[Callable[[], None]] = None):
        """``before_close``: what the engine's tracer flushes itself before the recorder closes."""
        self.config, self.before_close = config, before_close
        self.pid = os.getpid()
        self._testing = bool(config.fault) or config.sync_debug  # guard's slower path: faults, sync debug
        self.health = Health(config.probe_failure_limit)
        self.run_id = run_id or uuid.uuid4().hex
        self.run: Dict[str, Any] = {"engine": engine, "engine_version": engine_version, "source": "tracer",
                                    "status": "running", "started_at": time.time(), "host": socket.gethostname(),
                                    "pid": os.getpid(), "tracer_config": config.public()}
        self.transport = Transport()
        self.sigterm = SigtermChain(self.close)  # installed with the recorder, on the main thread
        self.active, self.attached, self.closed = True, False, False

    def guard(self, probe: str, fn: Callable, *args) -> Any:
        """Run ``fn``; any exception is counted against ``probe``, never raised into the engine.
        ``DRAFTSCOPE_SYNC_DEBUG``: ``fn`` runs under CUDA sync-debug "error" (attach excepted: it reads
        the draft's weights once, before serving)."""
        health = self.health
        if health.disabled and probe in health.disabled:
            return None
        try:
            if self._testing:
                if probe in self.config.fault:
                    raise InjectedFault(f"DRAFTSCOPE_FAULT={probe}")
                out = _under_sync_debug(fn, args) if self.config.sync_debug and probe != "init" else fn(*args)
            else:
                out = fn(*args)
            health.in_a_row[probe] = 0
            return out
        except Exception as exc:
            if self.config.sync_debug and probe not in health.last_error:
                log.warning("draftscope: probe %s failed under DRAFTSCOPE_SYNC_DEBUG: %s\n%s", probe, exc,
                            traceback.format_exc(limit=-6))
            if health.failed(probe, exc, say=not self.config.sync_debug):
                log.warning("draftscope: probe %s failed %d times in a row and is disabled (%s)",
                            probe, health.failure_limit, health.last_error[probe])
            return None

    def start_recording(self) -> bool:
        """The recorder process for this run, and the handlers that close it at exit and on SIGTERM. False, with
        nothing started, when the sink cannot be opened (checked here once: the recorder opens its own)."""
        from draftscope_tracer.transport.sinks import open_sink

        sink = open_sink(self.config, self.health.drop)
        if sink is None:
            return False
        sink.close()
        self.transport.writer = Relay(self.config, self.health, dict(self.run), self.run_id)
        atexit.register(self.close)
        self.sigterm.install()
        return True

    def write_start_failure(self, run_fields: Dict[str, Any], facts: Dict[str, Any]) -> None:
        """The engine refused to start: one run, ended ``crashed``, with the facts of why, straight through the
        sink (the process is about to die, and no recorder runs), so the dashboard says why it never served."""
        from draftscope_tracer.transport.sinks import open_sink

        sink = open_sink(self.config, self.health.drop)
        if sink is None:
            return
        run = relative_to_root(scrub({**self.run, **run_fields, "facts": facts, "status": "crashed",
                                      "ended_at": time.time()}), self.config.models_root)
        try:
            sink.send({"schema_version": wire.SCHEMA_VERSION, "batch_id": uuid.uuid4().hex,
                       "run_id": self.run_id, "sent_at": time.time(), "run": run})
        finally:
            sink.close()

    def close(self, status: str = "ended", timeout_s: float = 10.0) -> None:
        """Flush (``before_close``, then the recorder) and close, once; a copy of this tracer in a forked child
        does nothing (its recorder belongs to the parent)."""
        if os.getpid() != self.pid or self.closed:
            return
        self.closed = True
        if self.before_close is not None:
            self.before_close()
        self.transport.close(status, timeout_s)

    def crashed(self, probe: str, exc: BaseException) -> None:
        """The engine died serving: the error counted against ``probe``, what is there flushed with status
        ``crashed``."""
        self.health.failed(probe, exc)
        self.close("crashed", CRASH_DEADLINE_S)


_DTYPE_NAMES: Dict[torch.dtype, str] = {}


def dtype_name(t: "torch.Tensor | torch.dtype") -> str:
    """``torch.bfloat16`` (or a tensor of it) -> ``"bfloat16"`` (worked out once per dtype: hooks call it often)."""
    dtype = t if isinstance(t, torch.dtype) else t.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _under_sync_debug(fn: Callable, args: tuple) -> Any:
    """``fn(*args)`` with CUDA sync-debug mode "error" (any host sync raises), then the previous mode."""
    if not torch.cuda.is_available():
        return fn(*args)
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn(*args)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
