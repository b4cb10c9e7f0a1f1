"""What the draft receives, recorded: ``draft.input`` of sampled rows (with a prompt's ``target.aux[i]`` chunks)
and ``draft.fc.out``, the draft's ``fc`` recomputed off the forward pass (on its CUDA graph where one was captured
at attach)."""

from __future__ import annotations

import time
from typing import List

import torch

from draftscope_tracer.device import recompute
from draftscope_tracer.device.capture import Capture
from draftscope_tracer.device.devicecopy import device_index
from draftscope_tracer.engine.core import dtype_name
from draftscope_tracer.health import Health
from draftscope_tracer.transport import records
from draftscope_tracer.transport.outbox import Transport


class Features:
    """One ``record`` per hook call and phase: the summaries launched, the record queued (scheduler thread)."""

    def __init__(self, capture: Capture, transport: Transport, health: Health):
        self.capture, self.summaries, self.transport, self.health = capture, capture.summaries, transport, health

    def record(self, worker, h: torch.Tensor, rows: List[tuple], spans: List[tuple], phase: str,
               with_aux: bool, p_in=None, input_every: int = 1, fc_every: int = 1) -> None:
        """draft.input (at steps that are multiples of ``input_every``; + target.aux[i] chunks) and
        draft.fc.out (at steps that are multiples of ``fc_every``: the recompute is the costliest work
        of a hook) of the given row spans: two launches (one when ``p_in`` already summarises those
        rows of ``h``)."""
        if h is None or not rows:
            return
        groups, at = [], 0
        for a, b in spans:
            groups.append(list(range(at, at + b - a)))
            at += b - a
        H = self.capture.target_hidden
        width = int(h.shape[-1])
        chunks = width // H if H and width % H == 0 else 1
        if p_in is None:
            p_in = self.summaries.launch(h, [k for a, b in spans for k in range(a, b)], chunk_width=width // chunks)
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
                              dtype_name(h), H, chunks, with_aux, input_every, fc_dtype, pendings=(p_in, p_fc))

    def _fc(self, worker, h: torch.Tensor, index: torch.Tensor) -> tuple:
        """(the summary of the draft's ``fc`` on rows ``index`` of ``h``, its output dtype), or (None, None)
        when ``fc`` would not run; its CUDA graph when the rows fit it."""
        graph = self.capture.fc
        if graph is not None and graph.takes(h, index.shape[0]):
            pending = graph.launch(h, index)
            if pending is None:
                self.health.drop("summary_ring_full")
            return pending, dtype_name(graph.out_dtype)
        fc_out = recompute.fc(worker.draft_runner.model, h.index_select(0, index))
        if fc_out is None:
            return None, None
        return self.summaries.launch(fc_out, range(fc_out.shape[0])), dtype_name(fc_out)
