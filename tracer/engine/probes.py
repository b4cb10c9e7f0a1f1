"""The hooks' tensor probes: what each forward hook summarises of the sampled rows (draft input, the
draft's ``fc`` output recomputed off-graph, target aux chunks, draft and target top-k) and the verify
step records. A :class:`TensorProbes` holds the sampled requests (``requests.Sampled``), a capture object
(``capture.Capture``: what runs on the device) and a transport object (``transport.Transport``: what leaves
the process); everything here runs on SGLang's scheduler thread and never waits for the device.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional

import torch

from draftscope_tracer.device import recompute
from draftscope_tracer.transport import records
from draftscope_tracer.device.capture import Capture
from draftscope_tracer.device.devicecopy import HostInts, device_index
from draftscope_tracer.health import Health
from draftscope_tracer.engine.requests import Sampled
from draftscope_tracer.transport.outbox import Transport

ROWS_PER_REQUEST = 32  # prompt / draft-extend rows per sampled request that are summarised (the last ones)
# Points that describe the draft's wiring rather than each step's input are recorded at every
# PERIODIC_STEPS-th step: draft.input in draft_decode (the draft's own hidden state), draft.logits
# statistics, draft.fc.out in draft_extend (its recompute is a GEMM), and draft.input in draft_extend when it
# is the verify's target.aux rows (recorded every step).
PERIODIC_STEPS = 8


_DTYPE_NAMES: Dict[torch.dtype, str] = {}


def _dtype(t: torch.Tensor) -> str:
    return _dtype_name(t.dtype)


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


class TensorProbes:
    """The hooks' work on sampled rows: prefill, draft decode, verify, draft extend."""

    def __init__(self, sampled: Sampled, capture: Capture, transport: Transport, health: Health):
        self.sampled, self.capture, self.transport, self.health = sampled, capture, transport, health
        self.summaries = capture.summaries
        self.draft_seed: Dict[str, tuple] = {}  # rid -> (Pending, row, mapped) of the draft's next position 1
        self.draft_steps: Dict[str, tuple] = {}  # rid -> (StepTopk, row, mapped) of positions 2.. of this step
        self._verify_hidden: Optional[tuple] = None  # (tensor, rows, summary) of the last verify's aux rows

    def forget(self, rid: str) -> None:
        """A finished request: what its next step would have read goes (a step tap read back to its slots)."""
        self.draft_seed.pop(rid, None)
        steps = self.draft_steps.pop(rid, None)
        if steps is not None and all(v[0] is not steps[0] for v in self.draft_steps.values()):
            steps[0].release()

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
        self._features(worker, target_hidden, rows, spans, "prefill", with_aux=True)
        h = getattr(draft_input, "hidden_states", None)
        if h is not None and h.shape[0] == len(batch.reqs):
            self._draft_seeds(worker, h, rows, "prefill")

    def _features(self, worker, h: torch.Tensor, rows: List[tuple], spans: List[tuple], phase: str,
                  with_aux: bool, p_in=None, input_every: int = 1, fc_every: int = 1) -> None:
        """draft.input (at steps that are multiples of ``input_every``; + target.aux[i] chunks) and
        draft.fc.out (at steps that are multiples of ``fc_every``: the recompute is the costliest work
        of a hook) of the given row spans: two launches (one when ``p_in`` already summarises those
        rows of ``h``)."""
        if h is None or not rows:
            return
        sel = [k for a, b in spans for k in range(a, b)]
        groups, at = [], 0
        for a, b in spans:
            groups.append(list(range(at, at + b - a)))
            at += b - a
        H = self.capture.target_hidden
        width = int(h.shape[-1])
        chunks = width // H if H and width % H == 0 else 1
        if p_in is None:
            p_in = self.summaries.launch(h, sel, chunk_width=width // chunks)
        fc_groups, fc_sel = [], []
        for (a, b), (_, _, step) in zip(spans, rows):
            fc_groups.append(list(range(len(fc_sel), len(fc_sel) + b - a)) if step % fc_every == 0 else None)
            if step % fc_every == 0:
                fc_sel += range(a, b)
        index = device_index(fc_sel, h.device) if fc_sel else None
        if fc_sel and index is None:
            self.health.drop("host_slots_full")
        p_fc, fc_dtype = self._fc(worker, h, index) if index is not None else (None, None)
        self.transport.submit(phase, records.features, p_in, p_fc, rows, groups, fc_groups, phase, time.time(), width,
                    _dtype(h), H, chunks, with_aux, input_every, fc_dtype, pendings=(p_in, p_fc))

    def _fc(self, worker, h: torch.Tensor, index: torch.Tensor) -> tuple:
        """(the summary of the draft's ``fc`` on rows ``index`` of ``h``, its output dtype), or (None, None)
        when ``fc`` would not run; its CUDA graph when the rows fit it."""
        graph = self.capture.fc
        if graph is not None and graph.takes(h, index.shape[0]):
            pending = graph.launch(h, index)
            if pending is None:
                self.health.drop("summary_ring_full")
            return pending, _dtype_name(graph.out_dtype)
        fc_out = recompute.fc(worker.draft_runner.model, h.index_select(0, index))
        if fc_out is None:
            return None, None
        return self.summaries.launch(fc_out, range(fc_out.shape[0])), _dtype(fc_out)

    def _draft_seeds(self, worker, h: torch.Tensor, rows: List[tuple], phase: str,
                     logits: Optional[torch.Tensor] = None) -> None:
        """Top-k of the draft's logits at position 1 of each request's next verify step: summarised from the
        draft extend's own output ``logits`` (one row per request of the batch) where its graph left them,
        else recomputed from rows ``h[i]`` of its output hidden states (``recompute.logits``; captured as a
        CUDA graph at attach where it can be). Periodic steps also record a ``draft.logits`` sample
        (statistics of the whole row: non-finite logits show broken weights)."""
        periodic = [j for j, (_, _, step) in enumerate(rows) if step % PERIODIC_STEPS == 0]
        if logits is not None:
            self.health.beat("draft_extend_logits")  # counted: the engine's logits, not a recompute
            pending, vocab = self.summaries.launch(logits, [i for i, _, _ in rows], logits=logits,
                                                   stats=bool(periodic)), int(logits.shape[-1])
        else:
            pending, vocab = self._recomputed_seeds(worker, h, rows, periodic)
        if pending is None:
            return
        mapped = self.capture.hot_map(worker)
        for j, (_, rid, _) in enumerate(rows):
            self.draft_seed[rid] = (pending, j, mapped)
        # always queued, so that every launch is read (a device launch holds a ring slot until then)
        self.transport.submit(phase, records.draft_logits, pending, rows, periodic, phase, time.time(), vocab,
                              pendings=(pending,))

    def _recomputed_seeds(self, worker, h: torch.Tensor, rows: List[tuple], periodic: List[int]) -> tuple:
        """(the summary of the draft's logits recomputed at rows ``h[i]``, its vocabulary), or (None, None)."""
        index = device_index([i for i, _, _ in rows], h.device)
        if index is None:
            self.health.drop("host_slots_full")
            return None, None
        graph = self.capture.seeds
        if graph is not None and graph.takes(h, len(rows)):
            pending = graph.launch(h, index)
            if pending is None:
                self.health.drop("summary_ring_full")
            return pending, graph.summary.vocab_size
        out = recompute.logits(worker.draft_runner.model, h.index_select(0, index))
        if out is None:
            return None, None
        return self.summaries.launch(out, range(len(rows)), logits=out, stats=bool(periodic)), int(out.shape[-1])

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
            self._features(worker, h, periodic, [(i, i + 1) for i, _, _ in periodic], "draft_decode", with_aux=False)
        if self.capture.step_tap is None or not rows:
            return []
        n = self.capture.step_tap.select([i for i, _, _ in rows])
        if n < len(rows):
            self.health.drop("draft_tap_full", len(rows) - n)
        return rows[:n]

    def on_draft_steps(self, worker, rows: List[tuple]) -> None:
        """After the draft: the step tap's top-k of positions 2.. (a tree's: of every node, and its shape) for
        ``rows``, copied without blocking."""
        steps, mapped = self.capture.step_tap.read(len(rows)), self.capture.hot_map(worker)
        if steps is None:
            self.health.drop("host_slots_full", len(rows))
            return
        for j, (_, rid, _) in enumerate(rows):
            old = self.draft_steps.get(rid)
            if old is not None and old[0] is not steps:
                old[0].release()  # a draft whose verify was not recorded: its slot goes back
            self.draft_steps[rid] = (steps, j, mapped)

    # -- verify -----------------------------------------------------------------------------------
    def on_verify(self, batch, verify_input, result) -> None:
        """Counts the verify step of each sampled request; records the ones whose step is sampled."""
        reqs = batch.reqs
        rows = self.sampled.rows_of(reqs)
        live = self.sampled.live
        for _, rid in self.sampled.found(reqs):
            live[rid] += 1
        if not rows or result is None or getattr(result, "accept_lens", None) is None:
            return
        N = int(verify_input.draft_token_num)
        nodes = [i * N + p for i, _, _ in rows for p in range(N)]
        reqs_at = [i for i, _, _ in rows]
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
                    self.forget(rid)
                return
            ints = records.GatheredInts(pending, len(rows), N)
        shape = records.VerifyShape(N, int(hidden.shape[-1]) // H if aux else 0, H if aux else None,
                                    _dtype(hidden) if aux else None, getattr(verify_input, "topk", 1) > 1)
        # the draft extend that follows reads the same rows of the same tensor as its input
        self._verify_hidden = (hidden, [r[:2] for r in rows], pending) if aux and N <= ROWS_PER_REQUEST else None
        drafts = {rid: (self.draft_seed.pop(rid, None), self.draft_steps.pop(rid, None)) for _, rid, _ in rows}
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
            same = verified is not None and verified[0] is h and verified[1] == [r[:2] for r in done]
            self._features(worker, h, done, [(max(i * N, (i + 1) * N - ROWS_PER_REQUEST), (i + 1) * N)
                                             for i, _, _ in done], "draft_extend", with_aux=False,
                           p_in=verified[2] if same else None, input_every=1 if not same else PERIODIC_STEPS,
                           fc_every=PERIODIC_STEPS)
        seed = getattr(getattr(batch_result, "next_draft_input", None), "hidden_states", None)
        logits, self.capture.extend_logits = self.capture.extend_logits, None
        if logits is not None and logits.shape[0] != len(batch.reqs):
            logits = None
        if upcoming and seed is not None and seed.shape[0] == len(batch.reqs):
            self._draft_seeds(worker, seed, [(i, rid, s - 1) for i, rid, s in upcoming], "draft_extend", logits)
