"""The draft's top-k, kept from the draft until the verify that judges it: position 1 of each sampled request's
next step (``seed``: from the draft extend's own logits, or recomputed from its output hidden states) and
positions 2.. (``read_steps``: the step tap inside the draft loop; a tree's every node)."""

from __future__ import annotations

import time
from typing import Dict, List, Optional

import torch

from draftscope_tracer.device import recompute
from draftscope_tracer.device.capture import Capture
from draftscope_tracer.device.devicecopy import device_index
from draftscope_tracer.engine.sglang.requests import PERIODIC_STEPS
from draftscope_tracer.health import Health
from draftscope_tracer.transport import records
from draftscope_tracer.transport.outbox import Transport


class DraftTopk:
    """Per sampled request, the handles of its next verify's drafts (scheduler thread only)."""

    def __init__(self, capture: Capture, transport: Transport, health: Health):
        self.capture, self.summaries, self.transport, self.health = capture, capture.summaries, transport, health
        self.draft_seed: Dict[str, tuple] = {}  # rid -> (Pending, row, mapped) of the draft's next position 1
        self.draft_steps: Dict[str, tuple] = {}  # rid -> (StepTopk, row, mapped) of positions 2.. of this step

    def take(self, rows: List[tuple]) -> Dict[str, tuple]:
        """Per ``(row, rid, step)`` of ``rows``, ``rid``'s drafts (seed, steps) for its verify record (each None when
        not read)."""
        seed, steps = self.draft_seed.pop, self.draft_steps.pop
        return {rid: (seed(rid, None), steps(rid, None)) for _, rid, _ in rows}

    def forget(self, rid: str) -> None:
        """A finished request: what its next step would have read goes (a step tap read back to its slots)."""
        self.draft_seed.pop(rid, None)
        steps = self.draft_steps.pop(rid, None)
        if steps is not None and all(v[0] is not steps[0] for v in self.draft_steps.values()):
            steps[0].release()

    def seed(self, worker, h: torch.Tensor, rows: List[tuple], phase: str,
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

    def read_steps(self, worker, rows: List[tuple]) -> None:
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
