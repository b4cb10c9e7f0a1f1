"""The hooks' tensor probes: what each forward hook (prefill, draft decode, verify, draft extend) records of the
sampled rows, and the verify step records. A :class:`TensorProbes` holds the sampled requests
(``requests.Sampled``), a capture object (``capture.Capture``: what runs on the device), a transport object
(``transport.Transport``: what leaves the process), and its two parts: ``features`` (what the draft receives:
``draft.input``, ``target.aux[i]``, ``draft.fc.out``) and ``drafts`` (the draft's top-k until its verify).
Everything here runs on SGLang's scheduler thread and never waits for the device.
"""

from __future__ import annotations

import time
from operator import itemgetter
from typing import List, Optional

import torch

from draftscope_tracer.device.capture import Capture
from draftscope_tracer.device.devicecopy import HostInts
from draftscope_tracer.engine.core import dtype_name
from draftscope_tracer.engine.sglang.draft_topk import DraftTopk
from draftscope_tracer.engine.sglang.features import Features
from draftscope_tracer.engine.sglang.requests import PERIODIC_STEPS, Sampled
from draftscope_tracer.health import Health
from draftscope_tracer.transport import records
from draftscope_tracer.transport.outbox import Transport

ROWS_PER_REQUEST = 32  # prompt / draft-extend rows per sampled request that are summarised (the last ones)
ROW, ROW_RID, STEP = itemgetter(0), itemgetter(0, 1), itemgetter(2)  # of a ``(row, rid, step)``


class TensorProbes:
    """The hooks' work on sampled rows: prefill, draft decode, verify, draft extend."""

    def __init__(self, sampled: Sampled, capture: Capture, transport: Transport, health: Health):
        self.sampled, self.capture, self.transport, self.health = sampled, capture, transport, health
        self.summaries = capture.summaries
        self.features = Features(capture, transport, health)  # what the draft receives
        self.drafts = DraftTopk(capture, transport, health)  # what it proposes, until its verify
        self._verify_hidden: Optional[tuple] = None  # (tensor, rows, summary) of the last verify's aux rows
        self._nodes: tuple = (None, None, None)  # (request rows, N, their verify rows) of the last verify

    def on_prefill(self, worker, batch, target_hidden: torch.Tensor, draft_input, rows: List[tuple]) -> None:
        """draft.input/fc.out of the prompt's last rows; the draft's top-k at position 1 of step 0, from
        the output hidden states the draft extend returns (``draft_input``, one row per request)."""
        extend_lens = list(batch.extend_lens)
        starts = [0]
        for n in extend_lens[:-1]:
            starts.append(starts[-1] + n)
        # on a GPU, a launch takes at most the rows its Summarizer was built for at attach (a larger one would be
        # built here, allocating pinned memory in the hook): many requests at once get fewer prompt rows each
        cap = self.capture.prepared_rows
        per = ROWS_PER_REQUEST if cap is None else max(1, min(ROWS_PER_REQUEST, cap // len(rows)))
        spans = [(max(starts[i], starts[i] + extend_lens[i] - per), starts[i] + extend_lens[i]) for i, _, _ in rows]
        self.features.record(worker, target_hidden, rows, spans, "prefill", with_aux=True)
        h = getattr(draft_input, "hidden_states", None)
        if h is not None and h.shape[0] == len(batch.reqs):
            self.drafts.seed(worker, h, rows, "prefill")

    # -- draft decode -----------------------------------------------------------------------------
    def on_draft_input(self, worker, batch) -> List[tuple]:
        """draft.input of the draft steps (periodic): the draft's own hidden state it starts from. Selects
        the sampled rows in the step tap; returns the rows it took."""
        if batch.forward_mode.is_idle():
            return []
        rows = self.sampled.rows_of(batch.reqs)
        periodic = [r for r in rows if r[2] % PERIODIC_STEPS == 0]
        h = batch.spec_info.hidden_states
        if periodic and h is not None:
            self.features.record(worker, h, periodic, [(i, i + 1) for i, _, _ in periodic], "draft_decode",
                                 with_aux=False)
        tap = self.capture.step_tap
        if tap is None:
            return []
        n = tap.select(list(map(ROW, rows)))  # no rows: the draft graphs' replays read nothing
        if n < len(rows):
            self.health.drop("draft_tap_full", len(rows) - n)
        return rows[:n]

    # -- verify -----------------------------------------------------------------------------------
    def on_verify(self, batch, verify_input, result) -> None:
        """Counts the verify step of each sampled request; records the ones whose step is sampled."""
        reqs = batch.reqs
        rows = self.sampled.rows_of(reqs)
        self.sampled.step(reqs)
        if not rows or result is None or getattr(result, "accept_lens", None) is None:
            return
        N = int(verify_input.draft_token_num)
        reqs_at = list(map(ROW, rows))
        if reqs_at != self._nodes[0] or N != self._nodes[1]:  # a batch's sampled rows repeat every step
            self._nodes = (reqs_at, N, [i * N + p for i in reqs_at for p in range(N)])
        nodes = self._nodes[2]
        tokens = (verify_input.draft_token, result.next_token_ids, batch.seq_lens, result.accept_lens)
        lo = result.logits_output
        hidden, H = lo.hidden_states, self.capture.target_hidden
        aux = hidden is not None and H and hidden.shape[-1] % H == 0
        # on a GPU the summary reads the token ids at its rows (one launch, one copy); on a CPU they are read here
        on_device = lo.next_token_logits.is_cuda and tokens[0].is_cuda and tokens[1].is_cuda and tokens[2].is_cuda \
            and tokens[3].is_cuda and tokens[0].dim() == tokens[1].dim() == tokens[2].dim() == tokens[3].dim() == 1
        ints = None
        if not on_device:
            ints = HostInts([(tokens[0], nodes), (tokens[1], nodes), (tokens[2], reqs_at), (tokens[3], reqs_at)])
            if not ints.ok:
                self.health.drop("host_slots_full", len(rows))
                return
        pending = self.summaries.launch(hidden if aux else lo.next_token_logits, nodes,
                                        chunk_width=H if aux else None, logits=lo.next_token_logits,
                                        ints=(*tokens, N) if on_device else None)
        if on_device:
            if pending is None:  # counted by the launch; the drafts waiting for this step go
                for _, rid, _ in rows:
                    self.drafts.forget(rid)
                return
            ints = records.GatheredInts(pending, len(rows), N)
        shape = records.VerifyShape(N, int(hidden.shape[-1]) // H if aux else 0, H if aux else None,
                                    dtype_name(hidden) if aux else None, getattr(verify_input, "topk", 1) > 1)
        # the draft extend that follows reads the same rows of the same tensor as its input
        self._verify_hidden = (hidden, list(map(ROW_RID, rows)), pending) if aux and N <= ROWS_PER_REQUEST else None
        drafts = self.drafts.take(rows)
        steps = {d[1][0] for d in drafts.values() if d[1] is not None}
        self.transport.submit("verify", records.verify, ints, pending, rows, shape, time.time(), drafts, self.capture.hot,
                              pendings=(pending, None if on_device else ints, *steps))

    # -- draft extend after verify ----------------------------------------------------------------
    def draft_extend_rows(self, batch) -> tuple:
        """(rows of the verify step just done, rows whose next step is recorded)."""
        self.capture.extend_logits = None  # what the graph leaves from here on is this draft extend's
        if batch.forward_mode.is_idle():
            return [], []
        return self.sampled.rows_of(batch.reqs, back=1), self.sampled.rows_of(batch.reqs)

    def on_draft_extend(self, worker, batch, batch_result, done, upcoming) -> None:
        """draft.input/fc.out of the verify step just done; the draft's top-k at position 1 of the next
        step, from the draft extend's output logits where its graph left them, else from its output hidden
        state at each request's last accepted row (``next_draft_input``)."""
        N = worker.speculative_num_draft_tokens
        h = batch_result.logits_output.hidden_states
        verified, self._verify_hidden = self._verify_hidden, None
        if done and h is not None:
            same = verified is not None and verified[0] is h and verified[1] == list(map(ROW_RID, done))
            # with the verify's summary as draft.input, a step that records neither it nor fc.out queues nothing
            if not same or 0 in map(PERIODIC_STEPS.__rmod__, map(STEP, done)):  # a step % PERIODIC_STEPS is 0
                spans = [(max(i * N, (i + 1) * N - ROWS_PER_REQUEST), (i + 1) * N) for i, _, _ in done]
                self.features.record(worker, h, done, spans, "draft_extend", with_aux=False,
                                     p_in=verified[2] if same else None,
                                     input_every=1 if not same else PERIODIC_STEPS, fc_every=PERIODIC_STEPS)
        seed = getattr(getattr(batch_result, "next_draft_input", None), "hidden_states", None)
        logits, self.capture.extend_logits = self.capture.extend_logits, None
        if logits is not None and logits.shape[0] != len(batch.reqs):
            logits = None
        if upcoming and seed is not None and seed.shape[0] == len(batch.reqs):
            self.drafts.seed(worker, seed, [(i, rid, s - 1) for i, rid, s in upcoming], "draft_extend", logits)
