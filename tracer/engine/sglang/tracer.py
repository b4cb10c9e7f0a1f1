"""The tracer inside one SGLang scheduler process: attach, and the per-request work of its hooks.

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

import time
from typing import Any, Dict, List, Optional

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.device.capture import Capture, device_plan
from draftscope_tracer.engine.core import TracerCore
from draftscope_tracer.engine.sampling import request_sampled
from draftscope_tracer.engine.sglang import coverage, facts as facts_mod, requests
from draftscope_tracer.engine.sglang.probes import TensorProbes
from draftscope_tracer.engine.sglang.requests import Sampled
from draftscope_tracer.transport import records

REPORTED_RIDS = 4096  # finished requests remembered, so that each is reported once


class Tracer:
    """Attach and per-request accounting, built on the engine-neutral ``core`` (run record, guard, recorder,
    close). Composed of its parts: the sampled requests (``sampled``), the device side (``capture``), what
    leaves the process (``transport``), and the hooks' tensor work over them (``probes``)."""

    def __init__(self, config: TracerConfig, sglang_version: str, hooks: Optional[Dict[str, Any]] = None):
        self.core = core = TracerCore(config, "sglang", sglang_version)
        self.config, self.health, self.transport, self.sigterm = config, core.health, core.transport, core.sigterm
        self.guard = core.guard
        self.hooks = hooks or {}  # name -> hooks.HookHandle, checked at attach (coverage.check)
        self.expected_to_fire: List[str] = []  # checked once, when the first sampled request finishes
        self.sglang_version = sglang_version
        self.recording = False  # this rank writes records (first TP rank of its DP group, last PP rank)
        self.sampled = Sampled(config.step_stride)  # hook-thread state, as are the totals below
        self.capture = Capture(self.health, config.topk, config.reduce)
        self.probes = TensorProbes(self.sampled, self.capture, self.transport, self.health)
        self.first_seen: Dict[str, float] = {}
        self.reported: Dict[str, None] = {}  # the last REPORTED_RIDS finished requests, in order (reported once)
        self.totals: Dict[str, List[int]] = {}  # rid -> [verify steps, accepted drafts, proposed drafts]
        self.num_draft_tokens: Optional[int] = None

    # -- attach -----------------------------------------------------------------------------------
    def attach(self, scheduler) -> None:
        """After the scheduler built its workers: rank, facts, the device side, the recorder."""
        self.core.attached = True
        self.recording = _is_recording_rank()
        spec = getattr(scheduler, "draft_worker", None)
        self.num_draft_tokens = getattr(spec, "speculative_num_draft_tokens", None)
        self.capture.target_hidden = facts_mod._safe(lambda: scheduler.tp_worker.model_runner.model_config.hidden_size)
        if not self.recording:
            return
        facts, run_fields = facts_mod.collect(scheduler, self.sglang_version)
        facts["tracing"] = coverage.account_for(scheduler, self.hooks)
        self.expected_to_fire = facts["tracing"]["expected_to_fire"]
        self.core.run.update(run_fields, facts=facts)
        plan = device_plan(scheduler, spec, facts_mod._safe)
        if plan is not None:
            self.capture.prepare(**plan)
            facts["tracing"]["device"] = self.capture.describe()
        if not self.core.start_recording():
            self.core.active = False

    def start_failed(self, scheduler, exc: BaseException) -> None:
        """The scheduler's workers failed to build (SGLang refused to start): a crashed run that says why."""
        self.core.attached = True
        if _is_recording_rank():
            facts, run_fields = facts_mod.start_failure(scheduler, self.sglang_version, exc)
            self.core.write_start_failure(run_fields, facts)

    def crashed(self, exc: BaseException) -> None:
        """The scheduler's event loop raised: flush what is there with status ``crashed``."""
        self.core.crashed("scheduler", exc)

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
            self.probes.drafts.forget(rid)
            out.append(record)
        if not self.sampled.live and self.capture.step_tap is not None:  # the draft hook no longer runs: the graphs'
            self.capture.step_tap.select([])  # replays read no rows until a request is sampled again
        if self.recording:
            self.transport.submit("finish", records.finished, out)


def _is_recording_rank() -> bool:
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        last_pp = getattr(getattr(p, "pp_group", None), "is_last_rank", True)
        return getattr(p, "attn_tp_rank", getattr(p, "tp_rank", 0)) == 0 and bool(last_pp)
    except Exception:
        return True
