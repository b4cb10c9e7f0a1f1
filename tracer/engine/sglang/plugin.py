"""The SGLang plugin entry point (``sglang.srt.plugins``: ``draftscope = draftscope_tracer.engine.sglang.plugin:register``).

Dormant unless DRAFTSCOPE_URL, DRAFTSCOPE_DB or DRAFTSCOPE_FILE is set; DRAFTSCOPE_DISABLE=1 turns it off. Attaches only in
scheduler processes, never raises into SGLang, and refuses (one log line) when a hook target is missing.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.engine.attachment import Attachment
from draftscope_tracer.engine.hooks import HookHandle, register as register_hooks, unresolved

log = logging.getLogger("draftscope.tracer")

W = "sglang.srt.speculative.eagle_worker_v2"
S = "sglang.srt.managers.scheduler.Scheduler"
TARGETS = {
    "init": f"{S}.init_model_worker",
    "event_loop": f"{S}.run_event_loop",
    "finish": f"{S}.process_batch_result",
    "verify": f"{W}.EAGLEWorkerV2.verify",
    "draft": f"{W}.EagleDraftWorker.draft",
    "prefill": f"{W}.EagleDraftWorker._draft_extend_for_prefill",
    "draft_extend": f"{W}.EagleDraftWorker._draft_extend_for_decode",
    "graphs": f"{W}.EagleDraftWorker.init_cuda_graphs",
}

PLUGIN = Attachment()  # this process's hooks and its Tracer, once registered


def _in_scheduler_process() -> bool:
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "run_scheduler_process" and \
                frame.f_globals.get("__name__") == "sglang.srt.managers.scheduler":
            return True
        frame = frame.f_back
    return False


def register() -> None:
    """Called by SGLang's ``load_plugins()`` in every process; attaches in scheduler processes only."""
    try:
        _register()
    except Exception as exc:  # never stop the server from starting
        log.error("draftscope: tracer not attached: %s: %s", type(exc).__name__, exc)


def _register(in_scheduler: Optional[bool] = None) -> None:
    config = TracerConfig.from_env()
    if config is None or PLUGIN.tracer is not None:
        return
    if not (_in_scheduler_process() if in_scheduler is None else in_scheduler):
        return
    import sglang

    version = getattr(sglang, "__version__", "unknown")
    missing = unresolved(list(TARGETS.values()))
    if missing:
        log.error("draftscope: tracer not attached: SGLang %s lacks %s (supported: 0.5.23)",
                  version, ", ".join(missing))
        return
    from draftscope_tracer.engine.sglang.tracer import Tracer

    PLUGIN.handles[:] = [HookHandle(TARGETS[name], fn) for name, fn in _AROUND.items()]
    PLUGIN.tracer = Tracer(config, version, hooks=dict(zip(_AROUND, PLUGIN.handles)))
    register_hooks(PLUGIN.handles)
    log.info("draftscope: tracer registered (sample rate %.4g, sink %s)", config.sample_rate,
             "sqlite" if config.db else config.file or config.safe_url)


detach = PLUGIN.detach  # remove every hook and flush; safe to call twice
_live = PLUGIN.live


# -- AROUND hooks: call the original exactly once, with the same arguments; tracer work is guarded --
# The forward hooks return at once when no live request is sampled (``t.sampled.live`` empty).
def _around_init(orig, scheduler, *args, **kwargs):
    try:
        out = orig(scheduler, *args, **kwargs)
    except Exception as exc:  # SGLang refused to start: leave a crashed run that says why
        t = _live()
        if t is not None:
            t.guard("init", t.start_failed, scheduler, exc)
        raise
    t = _live()
    if t is not None:
        t.health.beat("init")
        if t.guard("init", t.attach, scheduler) is None and t.transport.writer is None and t.recording:
            t.core.active = False  # attach failed before a writer existed: stay out of the way
    return out


def _around_event_loop(orig, scheduler, *args, **kwargs):
    t = PLUGIN.tracer
    if t is not None and t.core.active and not t.core.attached:
        log.error("draftscope: tracer off: SGLang did not apply its hook on %s (see \"Failed to apply "
                  "hooks\" above)", TARGETS["init"])
        t.core.active = False
    try:
        return orig(scheduler, *args, **kwargs)
    except BaseException as exc:
        t = PLUGIN.tracer
        if t is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            t.guard("event_loop", t.crashed, exc)
        raise


def _around_finish(orig, scheduler, batch, result, *args, **kwargs):
    t = _live()
    if t is None:
        return orig(scheduler, batch, result, *args, **kwargs)
    t.health.beat("finish")
    reqs = batch.reqs
    counted = t.sampled.counted_rows(reqs)  # the live sampled requests: the tracer's totals are theirs
    with t.sigterm.deferred():  # SGLang answers requests in here; their records must be queued first
        out = orig(scheduler, batch, result, *args, **kwargs)
        if counted:
            t.guard("totals", t.count, batch, result, counted)
        reported = t.reported  # a request finished in one result is still in the next batch (overlap)
        # Req.finished() read as the field it tests: a method call per request of the batch costs µs every iteration
        done = [r for r in reqs if r.finished_reason is not None and r.rid not in reported]
        if done:
            t.guard("finish", t.on_finished, done)
    return out


def _around_verify(orig, worker, batch, *args, **kwargs):
    t = _live()
    if t is None or not t.sampled.live:
        return orig(worker, batch, *args, **kwargs)
    verify_input = batch.spec_info  # replaced later in the iteration: read it now
    out = orig(worker, batch, *args, **kwargs)
    t.health.beat("verify")
    t.guard("verify", t.probes.on_verify, batch, verify_input, out)
    return out


def _around_draft(orig, worker, batch, *args, **kwargs):
    t = _live()
    if t is None or not t.sampled.live or not t.recording:
        return orig(worker, batch, *args, **kwargs)
    t.health.beat("draft")
    rows = t.guard("draft", t.probes.on_draft_input, worker, batch)  # the draft's input, before the draft replaces it
    out = orig(worker, batch, *args, **kwargs)
    if rows:
        t.guard("draft", t.probes.drafts.read_steps, worker, rows)
    return out


def _around_graphs(orig, worker, *args, **kwargs):
    """Before SGLang captures the draft's CUDA graphs (or, with graphs off, does nothing): the step tap; after,
    the draft extend's output logits watched."""
    t = _live()
    if t is not None:
        t.health.beat("graphs")
        t.guard("graphs", t.install_step_tap, worker)
    out = orig(worker, *args, **kwargs)
    t = _live()
    if t is not None:
        t.guard("graphs", t.watch_draft_extend, worker)
    return out


def _around_prefill(orig, worker, batch, target_hidden_states, *args, **kwargs):
    t = _live()
    if t is None or not t.recording:
        return orig(worker, batch, target_hidden_states, *args, **kwargs)
    t.health.beat("prefill")
    rows = t.guard("prefill", t.admit, batch)
    out = orig(worker, batch, target_hidden_states, *args, **kwargs)
    if rows:
        t.guard("prefill", t.probes.on_prefill, worker, batch, target_hidden_states, out, rows)
    return out


def _around_draft_extend(orig, worker, batch, batch_result, *args, **kwargs):
    t = _live()
    if t is None or not t.sampled.live or not t.recording:
        return orig(worker, batch, batch_result, *args, **kwargs)
    t.health.beat("draft_extend")
    done, upcoming = t.guard("draft_extend", t.probes.draft_extend_rows, batch) or ([], [])
    out = orig(worker, batch, batch_result, *args, **kwargs)
    if done or upcoming:
        t.guard("draft_extend", t.probes.on_draft_extend, worker, batch, batch_result, done, upcoming)
    return out


_AROUND = {
    "init": _around_init, "event_loop": _around_event_loop, "finish": _around_finish,
    "verify": _around_verify, "draft": _around_draft, "prefill": _around_prefill,
    "draft_extend": _around_draft_extend, "graphs": _around_graphs,
}
