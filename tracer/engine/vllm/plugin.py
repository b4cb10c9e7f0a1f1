"""The vLLM plugin entry point (``vllm.general_plugins``: ``draftscope = draftscope_tracer.engine.vllm.plugin:register``).

Dormant unless DRAFTSCOPE_URL, DRAFTSCOPE_DB or DRAFTSCOPE_FILE is set (``TracerConfig.from_env``, as on
SGLang); DRAFTSCOPE_DISABLE=1 turns it off. vLLM calls ``register`` once per process (API server, engine
core, workers). The hooks go into the engine-core and worker processes: at once when ``register`` runs
inside ``EngineCore.__init__`` or a worker's start (spawned processes), else around ``EngineCore.__init__``
so that an engine core forked from this process (or built in it: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
installs them first (its forked workers inherit them). Each process records with a tracer of its own, into
the one run ``DRAFTSCOPE_RUN_ID`` names (``tracer``), which the first process sets for its children. A vLLM
lacking a hook target gets one log line and nothing attached. Every hook calls vLLM's method exactly once,
with the same arguments; the tracer's work around it is guarded (counted, never raised).
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from typing import Any, Dict, Optional, Tuple

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.engine.attachment import Attachment
from draftscope_tracer.engine.hooks import HookHandle, unresolved
from draftscope_tracer.engine.vllm.patches import install

log = logging.getLogger("draftscope.tracer")

ENGINE_CORE = "vllm.v1.engine.core.EngineCore.__init__"
RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"
TARGETS = {
    "init": "vllm.v1.worker.cpu_model_runner.CPUModelRunner.load_model",
    "init_gpu": f"{RUNNER}.load_model",
    "verify": f"{RUNNER}.propose_draft_token_ids",
    "draft": "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer.propose",
    "fc": "vllm.model_executor.models.llama_eagle3.Eagle3LlamaForCausalLM.combine_hidden_states",
    "draft_logits": "vllm.model_executor.models.llama_eagle3.Eagle3LlamaForCausalLM.compute_logits",
    "spec_stats": f"{SCHEDULER}.make_spec_decoding_stats",
    "finish": f"{SCHEDULER}._free_request",
    "execute": f"{RUNNER}.execute_model",
    "sample": f"{RUNNER}.sample_tokens",
    "target_logits": f"{RUNNER}._sample",
    "engine_dead": "vllm.v1.engine.core.EngineCoreProc._send_engine_dead",
}
# the positional parameters of the hooked methods after ``self`` (vLLM 0.32)
VERIFY_ARGS = ("scheduler_output", "sampled_token_ids", "sampling_metadata", "hidden_states", "sample_hidden_states",
               "aux_hidden_states", "spec_decode_metadata", "common_attn_metadata", "slot_mappings")
DRAFT_ARGS = ("num_speculative_tokens", "target_token_ids", "target_positions", "target_hidden_states",
              "next_token_ids", "token_indices_to_sample", "common_attn_metadata", "sampling_metadata")
SPEC_STATS_ARGS = ("spec_decoding_stats", "num_draft_tokens", "num_accepted_tokens", "num_invalid_spec_tokens",
                   "request_id")

STARTS = ("vllm.v1.engine.core", "vllm.v1.worker.worker_base")  # modules whose code calls register in the
# processes the hooks serve
PLUGIN = Attachment(forked=True)  # the hooks, and the VLLMTracer of this process (a forked child makes its own)
_CONFIG: Optional[TracerConfig] = None
RUN_ID_ENV = "DRAFTSCOPE_RUN_ID"  # the run every process of one vLLM server writes into (not a setting)
_VERSION = "unknown"


def register() -> None:
    """Called by vLLM's ``load_general_plugins()`` in every process; never raises into vLLM."""
    try:
        _register()
    except Exception as exc:  # never stop the server from starting
        log.error("draftscope: tracer not attached: %s: %s", type(exc).__name__, exc)


def _register() -> None:
    global _CONFIG
    config = TracerConfig.from_env()
    if config is None or _CONFIG is not None:
        return
    _CONFIG = config
    os.environ.setdefault(RUN_ID_ENV, uuid.uuid4().hex)  # inherited by the engine core and its workers
    if _in_engine_process():
        _install_engine_hooks()
        return
    missing = unresolved([ENGINE_CORE])
    if missing:
        log.error("draftscope: tracer not attached: vLLM lacks %s (supported: 0.32)", missing[0])
        return
    install(HookHandle(ENGINE_CORE, _around_engine_core))


def _in_engine_process() -> bool:
    frame = sys._getframe()
    while frame is not None:
        if frame.f_globals.get("__name__") in STARTS:
            return True
        frame = frame.f_back
    return False


def _install_engine_hooks() -> None:
    """Once per process tree: the hooks on the scheduler and the model runner (forked children inherit them)."""
    global _VERSION
    if PLUGIN.handles:
        return
    import vllm

    _VERSION = getattr(vllm, "__version__", "unknown")
    missing = unresolved(list(TARGETS.values()))
    if missing:
        log.error("draftscope: tracer not attached: vLLM %s lacks %s (supported: 0.32)", _VERSION, ", ".join(missing))
        return
    PLUGIN.handles[:] = [HookHandle(TARGETS[name], fn) for name, fn in _AROUND.items()]
    for handle in PLUGIN.handles:
        install(handle)
    log.info("draftscope: tracer registered in vLLM (sample rate %.4g, sink %s)",
             _CONFIG.sample_rate, "sqlite" if _CONFIG.db else _CONFIG.file or _CONFIG.safe_url)


detach = PLUGIN.detach  # remove every hook and flush; safe to call twice
_live = PLUGIN.live


def _tracer():
    """This process's tracer (made on first use: a forked child's copy of its parent's is not its own)."""
    t = PLUGIN.tracer
    if t is None or t.core.pid != os.getpid():
        from draftscope_tracer.engine.vllm.tracer import VLLMTracer

        t = PLUGIN.tracer = VLLMTracer(_CONFIG, _VERSION, os.environ.get(RUN_ID_ENV) or uuid.uuid4().hex)
    return t


def _scheduler_side(scheduler):
    """The tracer for a scheduler hook, attached on first use when no runner attached it in this process."""
    t = _tracer()
    core = t.core
    if core.active and not core.attached:
        if not t.guard("init", lambda: t.attach(list(_AROUND), vllm_config=scheduler.vllm_config)):
            core.active = False
    return t if core.active and core.attached else None


def _bind(names: Tuple[str, ...], args: tuple, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    return {**dict(zip(names, args)), **kwargs}


# -- AROUND hooks ---------------------------------------------------------------------------------
def _around_engine_core(orig, engine_core, *args, **kwargs):
    try:
        _install_engine_hooks()
    except Exception as exc:
        log.error("draftscope: tracer not attached: %s: %s", type(exc).__name__, exc)
    return orig(engine_core, *args, **kwargs)


def _around_init(orig, runner, *args, **kwargs):
    try:
        out = orig(runner, *args, **kwargs)
    except Exception as exc:  # vLLM refused to load the models: leave a crashed run that says why
        t = _tracer()
        if t.core.active and not t.core.attached:
            t.guard("init", t.start_failed, runner, exc)
        raise
    t = _tracer()
    if t.core.active and not t.core.attached:
        t.health.beat("init")
        if not t.guard("init", lambda: t.attach(list(_AROUND), runner=runner)):
            t.core.active = False  # attach failed or declined: stay out of the way
    return out


def _around_target_logits(orig, runner, logits, *args, **kwargs):
    """The target's logits of the step (each request's verified token and drafts, in batch order), as vLLM's
    sampler is about to read them: held for the step hooks (``propose_draft_token_ids`` runs later in the same
    ``sample_tokens``, which lets them go), so the tracer reads the target's top-k from the rows vLLM computed
    instead of computing them again. The sampler works on copies: these stay as it received them (after the grammar
    bitmask vLLM applies in place for structured output, before the sampler)."""
    t = _live()
    if t is not None:
        t.logits = logits
    return orig(runner, logits, *args, **kwargs)


def _around_verify(orig, runner, *args, **kwargs):
    t = _live()
    if t is None:
        return orig(runner, *args, **kwargs)
    t.health.beat("verify")
    ctx = t.guard("verify", t.steps.before_propose, runner, _bind(VERIFY_ARGS, args, kwargs), t.logits)
    t.ctx = ctx
    try:
        out = orig(runner, *args, **kwargs)
    finally:
        t.ctx = None
    if ctx is not None:
        t.guard("verify", t.steps.after_propose, ctx)
    return out


def _around_draft(orig, drafter, *args, **kwargs):
    t = _live()
    ctx = t.ctx if t is not None else None
    if ctx is None:
        return orig(drafter, *args, **kwargs)
    t.health.beat("draft")
    t.guard("draft", t.steps.on_draft_input, ctx, _bind(DRAFT_ARGS, args, kwargs))
    out = orig(drafter, *args, **kwargs)
    t.guard("draft", t.steps.after_draft, ctx)
    return out


def _around_fc(orig, model, hidden_states, *args, **kwargs):
    out = orig(model, hidden_states, *args, **kwargs)
    t = _live()
    ctx = t.ctx if t is not None else None
    if ctx is not None:
        t.health.beat("fc")
        t.guard("fc", t.steps.on_fc, ctx, hidden_states, out)
    return out


def _around_draft_logits(orig, model, hidden_states, *args, **kwargs):
    out = orig(model, hidden_states, *args, **kwargs)
    t = _live()
    ctx = t.ctx if t is not None else None
    if ctx is not None and out is not None:
        t.health.beat("draft_logits")
        t.guard("draft_logits", t.steps.on_draft_logits, ctx, out)
    return out


def _around_spec_stats(orig, scheduler, *args, **kwargs):
    t = _scheduler_side(scheduler)
    if t is not None:
        t.guard("totals", t.requests.count_vllm, _bind(SPEC_STATS_ARGS, args, kwargs))
    return orig(scheduler, *args, **kwargs)


def _around_finish(orig, scheduler, request, *args, **kwargs):
    t = _scheduler_side(scheduler)
    if t is not None:
        t.health.beat("finish")
        t.guard("finish", t.finished, request)
    return orig(scheduler, request, *args, **kwargs)


def _around_step(orig, runner, *args, **kwargs):
    """A forward pass or sampling step that raises kills vLLM's engine: before the error leaves this
    worker, its run ends ``crashed`` with the error (this process records the steps; its recorder is
    running, so the flush is quick)."""
    try:
        return orig(runner, *args, **kwargs)
    except Exception as exc:
        t = _live()
        if t is not None:
            t.guard("engine", t.crashed, exc)
        raise
    finally:  # the step's target logits are not held past it (``_around_target_logits``)
        t = PLUGIN.tracer
        if t is not None:
            t.logits = None


def _around_engine_dead(orig, engine_core, *args, **kwargs):
    """vLLM's engine core hit a fatal error and is about to tell its client it is dead: a tracer this
    process already runs ends its part ``crashed`` with the error (called inside vLLM's ``except``, so
    ``sys.exc_info`` holds it). The store keeps the run crashed over a later ``ended`` from another
    process."""
    t = _live()
    if t is not None:
        exc = sys.exc_info()[1] or RuntimeError("vLLM's engine core reported a fatal error")
        t.guard("engine", t.crashed, exc)
    return orig(engine_core, *args, **kwargs)


_AROUND = {
    "init": _around_init, "init_gpu": _around_init, "verify": _around_verify, "draft": _around_draft,
    "fc": _around_fc, "draft_logits": _around_draft_logits, "spec_stats": _around_spec_stats, "finish": _around_finish,
    "execute": _around_step, "sample": _around_step, "target_logits": _around_target_logits,
    "engine_dead": _around_engine_dead,
}
