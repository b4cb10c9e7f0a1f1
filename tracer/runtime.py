"""The tracer inside one scheduler process: state, sinks, writer, and the work each hook does.

Unsampled requests cost nothing in the forward hooks: the hooks return at once when no live request is
sampled (``Tracer.live`` is empty), and otherwise touch only the sampled rows. Sampled rows are
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

from . import coverage, devicecopy, records, requests, wire
from . import facts as facts_mod
from .config import TracerConfig
from .devicecopy import later_list
from .health import Health
from .recorder import Shared
from .relay import Relay
from .sampling import request_sampled, step_sampled
from .shutdown import SHUTDOWN_DEADLINE_S, SigtermChain
from .probes import TensorProbes
from .steptap import StepTap
from .summaries import Summaries, capacity

log = logging.getLogger("draftscope.tracer")
PREPARED_REQUESTS = 64  # sampled requests per batch the summary buffers are built for at attach (more: built late)


class InjectedFault(RuntimeError):
    """Raised inside a probe named in DRAFTSCOPE_FAULT (tests the fault path)."""


class Tracer(TensorProbes):
    """State, plumbing (guard, submit), attach and shutdown, per-request accounting; the tensor probes
    come from ``probes.TensorProbes``."""

    def __init__(self, config: TracerConfig, sglang_version: str, hooks: Optional[Dict[str, Any]] = None):
        self.config = config
        self.hooks = hooks or {}  # name -> hooks.HookHandle, checked at attach (coverage.check)
        self.attached = False
        self.expected_to_fire: List[str] = []  # checked once, when the first sampled request finishes
        self.sglang_version = sglang_version
        self.health = Health(config.probe_failure_limit)
        self.run_id = uuid.uuid4().hex
        self.run: Dict[str, Any] = {"engine": "sglang", "engine_version": sglang_version, "source": "tracer",
                                    "status": "running", "started_at": time.time(), "host": socket.gethostname(),
                                    "pid": os.getpid(), "tracer_config": config.public()}
        self.writer: Optional[Relay] = None
        self.sigterm = SigtermChain(self.close)  # installed at attach, on the main thread
        self.recording = False  # this rank writes records (first TP rank of its DP group, last PP rank)
        self.active = True
        self.summaries = Summaries(self.health, config.topk, config.reduce)
        # hook-thread state
        self.live: Dict[str, int] = {}  # sampled, unfinished rid -> verify steps seen so far
        self.first_seen: Dict[str, float] = {}
        self.totals: Dict[str, List[int]] = {}  # rid -> [verify steps, accepted drafts, proposed drafts]
        self.draft_seed: Dict[str, tuple] = {}  # rid -> (Pending, row, mapped) of the draft's next position 1
        self.draft_steps: Dict[str, tuple] = {}  # rid -> (StepTopk, row, mapped) of positions 2.. of this step
        self.step_tap: Optional[StepTap] = None  # installed before SGLang captures the draft's graphs
        self._verify_hidden: Optional[tuple] = None  # (tensor, rows, summary) of the last verify's aux rows
        self.target_hidden: Optional[int] = None
        self.num_draft_tokens: Optional[int] = None
        self._hot: Optional[Shared] = None  # hot_token_id, sent to the recorder once

    # -- plumbing ---------------------------------------------------------------------------------
    def guard(self, probe: str, fn: Callable, *args) -> Any:
        """Run ``fn``; any exception is counted against ``probe``, never raised into SGLang.
        ``DRAFTSCOPE_SYNC_DEBUG``: ``fn`` runs under CUDA sync-debug "error" (attach excepted: it reads
        the draft's weights once, before serving)."""
        if self.health.is_disabled(probe):
            return None
        try:
            if probe in self.config.fault:
                raise InjectedFault(f"DRAFTSCOPE_FAULT={probe}")
            if self.config.sync_debug and probe != "init":
                out = _under_sync_debug(fn, args)
            else:
                out = fn(*args)
            self.health.ok(probe)
            return out
        except Exception as exc:
            if self.config.sync_debug and probe not in self.health.last_error:
                log.warning("draftscope: probe %s failed under DRAFTSCOPE_SYNC_DEBUG: %s\n%s", probe, exc,
                            traceback.format_exc(limit=-6))
            if self.health.failed(probe, exc):
                log.warning("draftscope: probe %s failed %d times in a row and is disabled (%s)",
                            probe, self.health.failure_limit, self.health.last_error[probe])
            return None

    def submit(self, probe: str, fn: Callable, *args, pendings=()) -> bool:
        """Queue ``fn(*args)`` (a ``records`` function) for the recorder; a refused call frees the
        summary slots it would have read."""
        call = records.Call(probe, fn, args, pendings)
        if self.writer is not None and self.writer.submit(call):
            return True
        call.release()
        return False

    def rows_of(self, reqs, back: int = 0) -> List[tuple]:
        """``(row, rid, step)`` of the sampled requests in ``reqs`` whose step ``count - back`` is recorded."""
        live, stride = self.live, self.config.step_stride
        # one comprehension over the batch (most requests are not sampled), then the few sampled ones
        found = [(i, r.rid) for i, r in enumerate(reqs) if r.rid in live]
        return [(i, rid, live[rid] - back) for i, rid in found
                if live[rid] - back >= 0 and step_sampled(live[rid] - back, stride)]

    def close(self, status: str = "ended", timeout_s: float = 10.0) -> None:
        if self.writer is not None:
            self.writer.close(timeout_s, status=status)

    # -- attach -----------------------------------------------------------------------------------
    def attach(self, scheduler) -> None:
        """After the scheduler built its workers: rank, facts, sink, writer, shutdown handlers."""
        from .sinks import open_sink

        self.attached = True
        self.recording = _is_recording_rank()
        spec = getattr(scheduler, "draft_worker", None)
        self.num_draft_tokens = getattr(spec, "speculative_num_draft_tokens", None)
        self.target_hidden = facts_mod._safe(lambda: scheduler.tp_worker.model_runner.model_config.hidden_size)
        if not self.recording:
            return
        facts, run_fields = facts_mod.collect(scheduler, self.sglang_version)
        facts["tracing"] = coverage.account_for(scheduler, self.hooks)
        self.expected_to_fire = facts["tracing"]["expected_to_fire"]
        self.run.update(run_fields, facts=facts)
        plan = _device_plan(scheduler, spec)
        if plan is not None:
            self.prepare(**plan)
        sink = open_sink(self.config, self.health.drop)  # the recorder opens its own: fail here, once, if unusable
        if sink is None:
            self.active = False
            return
        sink.close()
        self.writer = Relay(self.config, self.health, dict(self.run), self.run_id)
        atexit.register(self.close)
        self.sigterm.install()

    def prepare(self, device: torch.device, dtype: torch.dtype, hidden: int, aux: int, vocab: int,
                draft_vocab: Optional[int], draft_tokens: int, max_requests: int, hot=None) -> None:
        """At attach, on a GPU: what the hooks would otherwise allocate late (pinned slots, each summary
        layout's buffers and compiled kernels) is made now, and ``hot_token_id`` is read once. Work in a
        hook must never allocate pinned memory: that can wait for the GPU (``devicecopy``)."""
        devicecopy.prepare(device)
        requests = min(max_requests, PREPARED_REQUESTS)
        rows = capacity(requests * draft_tokens)
        layouts = [(aux * hidden, hidden, vocab, rows, dtype), (hidden, hidden, vocab, rows, dtype),
                   (aux * hidden, hidden, None, rows, dtype), (hidden, hidden, None, rows, dtype)]
        if draft_vocab:
            layouts.append((draft_vocab, draft_vocab, draft_vocab, capacity(requests), torch.float32))
        self.summaries.prepare(device, layouts)
        if hot is not None:
            self._hot = Shared("hot_token_id", later_list(hot))

    def start_failed(self, scheduler, exc: BaseException) -> None:
        """The scheduler's workers failed to build (SGLang refused to start): write one run, ended
        ``crashed``, with the exception and the paths it was given, straight through the sink (the
        process is about to die with its children, a recorder included), so the dashboard says why
        it never served."""
        from .sinks import open_sink

        self.attached = True
        if not _is_recording_rank():
            return
        facts, run_fields = facts_mod.start_failure(scheduler, self.sglang_version, exc)
        sink = open_sink(self.config, self.health.drop)
        if sink is None:
            return
        run = {**self.run, **run_fields, "facts": facts, "status": "crashed", "ended_at": time.time()}
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
        """Before SGLang captures the draft's graphs: the tap that reads positions 2.. of a draft chain
        (``steptap``), on the recording rank."""
        if worker.topk == 1 and worker.speculative_num_steps > 1 and _is_recording_rank():
            self.step_tap = StepTap(worker, self.config.topk, self.guard)

    def admit(self, batch) -> List[tuple]:
        """Decide sampling for the requests of a prefill batch; the sampled rows of step 0."""
        now, rate = time.time(), self.config.sample_rate
        for r in batch.reqs:
            rid = r.rid
            if rid not in self.first_seen:
                self.first_seen[rid] = now
                if request_sampled(rid, rate):
                    self.live[rid] = 0
        if batch.forward_mode.is_idle():
            return []
        return self.rows_of(batch.reqs)

    # -- results: per-request totals and finished requests -------------------------------------------
    def count(self, batch, result, live_reqs) -> None:
        """The tracer's own totals, from ``accept_lens`` as SGLang's result processing left them on the
        host: one verify step per request that was live before it, ``accept_len - 1`` accepted drafts."""
        acc = getattr(result, "accept_lens", None)
        if acc is None or not batch.forward_mode.is_decode() or not live_reqs:
            return
        requests.count(self.totals, acc.tolist(), live_reqs, self.num_draft_tokens)

    def on_finished(self, reqs) -> None:
        now = time.time()
        out = []
        for req in reqs:
            rid = req.rid
            sampled = self.live.pop(rid, None) is not None
            record, mismatch = requests.finished_record(req, sampled, self.totals.pop(rid, [0, 0, 0]),
                                                        self.first_seen.pop(rid, None), self.num_draft_tokens, now)
            if mismatch:
                self.health.failed("totals_mismatch", RuntimeError(mismatch))
            if sampled and record["spec_verify_ct"] and self.expected_to_fire:  # once, on the first such request
                coverage.warn_not_fired(self.expected_to_fire, self.health.heartbeats, rid, record["spec_verify_ct"])
                self.expected_to_fire = []
            self.draft_seed.pop(rid, None)
            steps = self.draft_steps.pop(rid, None)
            if steps is not None and all(v[0] is not steps[0] for v in self.draft_steps.values()):
                steps[0].release()  # its pinned slot goes back (no verify will read it)
            out.append(record)
        if self.recording:
            self.submit("finish", records.finished, out)


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


def _device_plan(scheduler, spec) -> Optional[dict]:
    """``Tracer.prepare``'s arguments for a server on a GPU (None on a CPU, or when a value is missing)."""
    safe = facts_mod._safe
    runner = safe(lambda: scheduler.tp_worker.model_runner)
    if runner is None or spec is None or not torch.cuda.is_available() or not str(runner.device).startswith("cuda"):
        return None
    lm = facts_mod._inner_lm(runner.model)
    plan = {"device": torch.device("cuda", torch.cuda.current_device()), "dtype": safe(lambda: runner.model_config.dtype),
            "hidden": safe(lambda: runner.model_config.hidden_size), "vocab": safe(lambda: runner.model_config.vocab_size),
            "aux": len(getattr(getattr(lm, "model", None), "layers_to_capture", None) or ()) or 3,
            "draft_vocab": safe(lambda: spec.draft_runner.model.logits_processor.config.vocab_size),
            "draft_tokens": getattr(spec, "speculative_num_draft_tokens", None),
            "max_requests": getattr(scheduler, "max_running_requests", None), "hot": getattr(spec, "hot_token_id", None)}
    required = ("dtype", "hidden", "vocab", "draft_tokens", "max_requests")
    return plan if all(isinstance(plan[k], (int, torch.dtype)) for k in required) else None


def _is_recording_rank() -> bool:
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        last_pp = getattr(getattr(p, "pp_group", None), "is_last_rank", True)
        return getattr(p, "attn_tp_rank", getattr(p, "tp_rank", 0)) == 0 and bool(last_pp)
    except Exception:
        return True
