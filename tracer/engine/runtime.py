"""The tracer inside one scheduler process: state, sinks, writer, and the work each hook does.

Unsampled requests cost nothing in the forward hooks: the hooks return at once when no live request is
sampled (``Tracer.sampled.live`` is empty), and otherwise touch only the sampled rows. Sampled rows are
summarised on the device by ``summarize.Summarizer`` (one launch per tensor layout and hook call),
copied once without blocking, and turned into records in the recorder process (each hook queues a
``records.Call``; ``relay.Relay`` pickles it there). Per-request totals are counted from ``accept_lens``
where SGLang has already brought them to the host (its result processing).

Hook-thread state (sampled requests and their step counters, totals, draft top-k waiting for their
verify) is touched only by SGLang's scheduler thread; queued calls carry only what they were handed.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
import traceback
import uuid
from typing import Any, Callable, Dict, List, Optional

import torch

from draftscope_tracer.engine import coverage
from draftscope_tracer.transport import records
from draftscope_tracer.engine import requests
from draftscope_tracer.transport import wire
from draftscope_tracer.engine import facts as facts_mod
from draftscope_tracer.device.capture import Capture, device_plan
from draftscope_tracer.config import TracerConfig
from draftscope_tracer.health import Health
from draftscope_tracer.model_paths import relative_to_root
from draftscope_tracer.redact import scrub
from draftscope_tracer.engine.probes import TensorProbes
from draftscope_tracer.transport.relay import Relay
from draftscope_tracer.engine.requests import Sampled
from draftscope_tracer.engine.sampling import request_sampled
from draftscope_tracer.engine.shutdown import SHUTDOWN_DEADLINE_S, SigtermChain
from draftscope_tracer.transport.outbox import Transport

log = logging.getLogger("draftscope.tracer")


REPORTED_RIDS = 4096  # finished requests remembered, so that each is reported once


class InjectedFault(RuntimeError):
    """Raised inside a probe named in DRAFTSCOPE_FAULT (tests the fault path)."""


class Tracer:
    """State, plumbing (guard), attach and shutdown, per-request accounting. Composed of its parts: the
    sampled requests (``sampled``), the device side (``capture``), what leaves the process (``transport``),
    and the hooks' tensor work over them (``probes``)."""

    def __init__(self, config: TracerConfig, sglang_version: str, hooks: Optional[Dict[str, Any]] = None):
        self.config = config
        self._testing = bool(config.fault) or config.sync_debug  # guard's slower path: faults, sync debug
        self.hooks = hooks or {}  # name -> hooks.HookHandle, checked at attach (coverage.check)
        self.attached = False
        self.expected_to_fire: List[str] = []  # checked once, when the first sampled request finishes
        self.sglang_version = sglang_version
        self.health = Health(config.probe_failure_limit)
        self.run_id = uuid.uuid4().hex
        self.run: Dict[str, Any] = {"engine": "sglang", "engine_version": sglang_version, "source": "tracer",
                                    "status": "running", "started_at": time.time(), "host": socket.gethostname(),
                                    "pid": os.getpid(), "tracer_config": config.public()}
        self.sigterm = SigtermChain(self.close)  # installed at attach, on the main thread
        self.recording = False  # this rank writes records (first TP rank of its DP group, last PP rank)
        self.active = True
        self.sampled = Sampled(config.step_stride)  # hook-thread state, as are the totals below
        self.capture = Capture(self.health, config.topk, config.reduce)
        self.transport = Transport()
        self.probes = TensorProbes(self.sampled, self.capture, self.transport, self.health)
        self.first_seen: Dict[str, float] = {}
        self.reported: Dict[str, None] = {}  # the last REPORTED_RIDS finished requests, in order (reported once)
        self.totals: Dict[str, List[int]] = {}  # rid -> [verify steps, accepted drafts, proposed drafts]
        self.num_draft_tokens: Optional[int] = None

    # -- plumbing ---------------------------------------------------------------------------------
    def guard(self, probe: str, fn: Callable, *args) -> Any:
        """Run ``fn``; any exception is counted against ``probe``, never raised into SGLang.
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
            health.ok(probe)
            return out
        except Exception as exc:
            if self.config.sync_debug and probe not in self.health.last_error:
                log.warning("draftscope: probe %s failed under DRAFTSCOPE_SYNC_DEBUG: %s\n%s", probe, exc,
                            traceback.format_exc(limit=-6))
            if self.health.failed(probe, exc):
                log.warning("draftscope: probe %s failed %d times in a row and is disabled (%s)",
                            probe, self.health.failure_limit, self.health.last_error[probe])
            return None

    def close(self, status: str = "ended", timeout_s: float = 10.0) -> None:
        self.transport.close(status, timeout_s)

    # -- attach -----------------------------------------------------------------------------------
    def attach(self, scheduler) -> None:
        """After the scheduler built its workers: rank, facts, sink, writer, shutdown handlers."""
        from draftscope_tracer.transport.sinks import open_sink

        self.attached = True
        self.recording = _is_recording_rank()
        spec = getattr(scheduler, "draft_worker", None)
        self.num_draft_tokens = getattr(spec, "speculative_num_draft_tokens", None)
        self.capture.target_hidden = facts_mod._safe(lambda: scheduler.tp_worker.model_runner.model_config.hidden_size)
        if not self.recording:
            return
        facts, run_fields = facts_mod.collect(scheduler, self.sglang_version)
        facts["tracing"] = coverage.account_for(scheduler, self.hooks)
        self.expected_to_fire = facts["tracing"]["expected_to_fire"]
        self.run.update(run_fields, facts=facts)
        plan = device_plan(scheduler, spec, facts_mod._safe)
        if plan is not None:
            self.capture.prepare(**plan)
            facts["tracing"]["device"] = self.capture.describe()
        sink = open_sink(self.config, self.health.drop)  # the recorder opens its own: fail here, once, if unusable
        if sink is None:
            self.active = False
            return
        sink.close()
        self.transport.writer = Relay(self.config, self.health, dict(self.run), self.run_id)
        atexit.register(self.close)
        self.sigterm.install()

    def start_failed(self, scheduler, exc: BaseException) -> None:
        """The scheduler's workers failed to build (SGLang refused to start): write one run, ended
        ``crashed``, with the exception and the paths it was given, straight through the sink (the
        process is about to die with its children, a recorder included), so the dashboard says why
        it never served."""
        from draftscope_tracer.transport.sinks import open_sink

        self.attached = True
        if not _is_recording_rank():
            return
        facts, run_fields = facts_mod.start_failure(scheduler, self.sglang_version, exc)
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

    def crashed(self, exc: BaseException) -> None:
        """The scheduler's event loop raised: flush what is there with status ``crashed``."""
        self.health.failed("scheduler", exc)
        self.close("crashed", SHUTDOWN_DEADLINE_S)

    # -- prefill: target aux -> draft extend --------------------------------------------------------
    def install_step_tap(self, worker) -> None:
        """Before SGLang captures the draft's graphs: the step tap (``capture``), on the recording rank."""
        if _is_recording_rank():
            self.capture.install_step_tap(worker, self.guard)

    def watch_draft_extend(self, worker) -> None:
        """After SGLang captured the draft's graphs: the draft extend's logits kept for the hook (``capture``)."""
        if _is_recording_rank():
            self.capture.watch_draft_extend(worker)

    def admit(self, batch) -> List[tuple]:
        """Decide sampling for the requests of a prefill batch; the sampled rows of step 0."""
        now, rate = time.time(), self.config.sample_rate
        for r in batch.reqs:
            rid = r.rid
            if rid not in self.first_seen:
                self.first_seen[rid] = now
                if request_sampled(rid, rate):
                    self.sampled.admit(rid)
        if batch.forward_mode.is_idle():
            return []
        return self.sampled.rows_of(batch.reqs)

    # -- results: per-request totals and finished requests -------------------------------------------
    def count(self, batch, result, rows) -> None:
        """The tracer's own totals of the sampled requests (``rows``: ``(row, rid)``, live before the result),
        from ``accept_lens`` as SGLang's result processing left them on the host: one verify step each,
        ``accept_len - 1`` accepted drafts. Unsampled requests cost nothing here."""
        acc = getattr(result, "accept_lens", None)
        if acc is None or not batch.forward_mode.is_decode() or not rows:
            return
        requests.count(self.totals, acc.tolist(), rows, self.num_draft_tokens)

    def on_finished(self, reqs) -> None:
        now = time.time()
        out = []
        reported = self.reported
        for req in reqs:
            rid = req.rid
            reported[rid] = None
            if len(reported) > REPORTED_RIDS:
                del reported[next(iter(reported))]
            sampled = self.sampled.finish(rid)
            traced = self.totals.pop(rid, [0, 0, 0]) if sampled else None
            record, mismatch = requests.finished_record(req, sampled, traced,
                                                        self.first_seen.pop(rid, None), self.num_draft_tokens, now)
            if mismatch:
                self.health.failed("totals_mismatch", RuntimeError(mismatch))
            if sampled and record["spec_verify_ct"] and self.expected_to_fire:  # once, on the first such request
                coverage.warn_not_fired(self.expected_to_fire, self.health.heartbeats, rid, record["spec_verify_ct"])
                self.expected_to_fire = []
            self.probes.forget(rid)
            out.append(record)
        if self.recording:
            self.transport.submit("finish", records.finished, out)


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


def _is_recording_rank() -> bool:
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        last_pp = getattr(getattr(p, "pp_group", None), "is_last_rank", True)
        return getattr(p, "attn_tp_rank", getattr(p, "tp_rank", 0)) == 0 and bool(last_pp)
    except Exception:
        return True
