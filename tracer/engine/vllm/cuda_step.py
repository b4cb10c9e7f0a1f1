"""The step hooks' CUDA branch (vLLM on a GPU): the same records as the CPU branch (``step.StepProbes``), with
nothing on the hooks' path waiting for the GPU.

- Rows: worked out on the host from vLLM's CPU metadata (``step_layout``), never by reading a device tensor.
- Summaries: launched by ``cuda_summaries.CudaSummaries`` (the device layer the SGLang tracer uses), built at
  attach for the server's widths (:meth:`CudaStep.prepare`), so no hook allocates pinned memory or compiles a
  kernel; the draft's top-k held for each request's next verify by ``held_drafts.HeldDrafts``.
- Token ids of the sampled requests (the sampler's kept ids, the drafts verified, the verified token's position):
  one non-blocking copy per step into a pinned slot, read on this thread once its event has completed; the
  tracer's totals are counted and the verify records queued then (``verify_steps.VerifySteps``, over
  ``step_ids.Ledger``). The verify rows are summarised in the drafter's hook, on vLLM's own concatenation of the
  aux hidden states where it has the target's rows (``VerifySteps.launch``).

Everything here runs on the model runner's thread.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

import torch

from draftscope_tracer.engine.sampling import step_sampled
from draftscope_tracer.engine.vllm.cuda_summaries import CudaSummaries
from draftscope_tracer.engine.vllm.held_drafts import HeldDrafts
from draftscope_tracer.engine.vllm.requests import Requests
from draftscope_tracer.engine.vllm.step_layout import Pick, Verify, built, logit_rows, step_rows
from draftscope_tracer.engine.vllm.verify_steps import VerifySteps
from draftscope_tracer.health import Health
from draftscope_tracer.transport.outbox import Transport


class CudaStep:
    """The CUDA branch of one tracer's step hooks: which requests each step counts and records, handed to its
    summaries, its held draft top-k and its steps whose ids are not read yet."""

    def __init__(self, config, requests: Requests, transport: Transport, health: Health):
        self.config, self.requests = config, requests
        self.summaries = CudaSummaries(health, config.topk)
        self.drafts = HeldDrafts(requests)
        self.verify_steps = VerifySteps(requests, transport, health, self.summaries, self.drafts)

    def prepare(self, device: torch.device, dtype: torch.dtype, hidden: int, aux: int, vocab: int,
                draft_hidden: Optional[int], num_spec: int, max_requests: int) -> dict:
        """At attach: the summaries' pinned slots, buffers and kernels (``CudaSummaries.prepare``)."""
        return self.summaries.prepare(device, dtype, hidden, aux, vocab, draft_hidden, num_spec, max_requests)

    # -- the runner's propose_draft_token_ids ------------------------------------------------------
    def before_propose(self, runner, a: Dict[str, Any], context, logits=None) -> Optional[Any]:
        """As ``StepProbes.before_propose``: each sampled request's verify counted (once its ids are read), the
        recorded verify rows summarised (the target's top-k from ``logits``, the step's target logits); the ids copied
        without blocking. ``context``: ``step.StepContext``."""
        now, rate, stride = time.time(), self.config.sample_rate, self.config.step_stride
        so, spec = a["scheduler_output"], a["spec_decode_metadata"]
        book = self.requests
        self.verify_steps.read()
        done = [rid for rid in so.finished_req_ids if rid in book.first_seen]
        if done:  # ended since the last step (reported here when the scheduler runs in another process)
            self.verify_steps.ended(done)
        counted, picks, verify, rows, logit_at = [], [], [], [], []
        req_ids, drafts = runner.input_batch.req_ids, spec.num_draft_tokens if spec is not None else None
        for r in step_rows(req_ids, so.num_scheduled_tokens, drafts, only=book.see(req_ids, now, rate)):
            step = book.sampled[r.rid]  # only the sampled ones: nothing of the others is copied, counted or recorded
            if r.drafts:
                counted.append((r.index, r.rid, r.drafts))
                book.sampled[r.rid] = step + 1
            if not step_sampled(step, stride):
                continue
            picks.append(built(Pick, (r.index, r.rid, step, "draft_extend" if r.drafts else "prefill")))
            if r.drafts:
                verify.append(built(Verify, (r.index, r.rid, step, list(range(len(rows), len(rows) + r.drafts + 1)),
                                             r.verified.start, r.draft_offset, r.drafts,
                                             book.proposed.pop(r.rid, None))))
                rows.extend(r.verified)
                logit_at.extend(r.logits)
        target = self.verify_steps.add(runner, a, counted, verify, rows, (logits, logit_at, logit_rows(
            req_ids, drafts)), now) if counted else None
        if not picks:
            return None
        return context(picks, [], target, (None, 0, None), now)

    # -- the drafter -------------------------------------------------------------------------------
    def on_draft_input(self, ctx, a: Dict[str, Any]) -> None:
        """What the draft receives, at the picks' rows (``CudaSummaries.draft_input_rows``); the step's verify rows
        summarised on it where it is vLLM's concatenation of the aux hidden states row for row (its padded batch:
        ``token_indices_to_sample`` given), in the same launch when the draft's rows are the verify rows (a decode
        step: ``VerifySteps.launch``)."""
        hidden = a["target_hidden_states"]
        chunk = self.summaries.draft_input_rows(ctx, a)
        if ctx.target is not None:
            padded = a.get("token_indices_to_sample") is not None
            ctx.p_in = self.verify_steps.launch(ctx.target, hidden if padded else None, ctx.rows, chunk)
        if ctx.p_in is None:
            self.summaries.draft_input(ctx, hidden, chunk)

    def after_propose(self, ctx) -> None:
        """The step's verify rows summarised, if the drafter's hook did not (``VerifySteps.launch``)."""
        self.verify_steps.launch(ctx.target)

    def on_fc(self, ctx, out: torch.Tensor) -> None:
        """The draft's ``fc`` output at the same rows."""
        self.summaries.fc(ctx, out)

    def on_draft_logits(self, ctx, logits: torch.Tensor) -> None:
        """The picks' rows of the draft's logits at one draft position (``CudaSummaries.draft_logits``)."""
        self.summaries.draft_logits(ctx, logits)

    def keep_drafts(self, ctx) -> None:
        """The step's draft top-k, one launch for every position, held for each pick's next verify
        (``HeldDrafts.keep``)."""
        summary = self.summaries.draft_topk(ctx)
        if summary is not None:
            self.drafts.keep(ctx, summary, len(ctx.draft_topk))

    # -- ends --------------------------------------------------------------------------------------
    def finishing(self, rid: str) -> None:
        """The scheduler frees ``rid`` (same process): ``VerifySteps.finishing``."""
        self.verify_steps.finishing(rid)

    def close(self) -> None:
        """Before the last totals are reported: read every step still in flight (waits: the tracer is closing)."""
        self.verify_steps.close()
