"""The draft's top-k at positions 2.. of its chain, taken inside SGLang's draft-decode loop.

SGLang runs the draft-decode loop (``EagleDraftWorker.draft_forward``: ``speculative_num_steps - 1``
draft forwards, each followed by its argmax) as one CUDA-graph replay, and the logits of those steps
never leave the graph. So the tracer puts its reading into the loop itself: before SGLang captures its
graphs (the hook on ``EagleDraftWorker.init_cuda_graphs``), :class:`StepTap` wraps the draft runner's
``forward`` and the worker's ``draft_forward`` on the instances. Each draft-decode forward then also
writes the softmax top-k of its logits at the rows in a static row buffer into static result buffers:
a few device operations on static buffers, with no host sync and no Python decision that depends on
data, so a captured graph replays exactly what an eager run does. The draft hook fills the row buffer
with the sampled requests' rows before the draft (unused slots -1) and, after it, copies the results
into pinned memory without blocking (:meth:`StepTap.read`).

Costs: in every draft-decode graph replay, sampled or not, one gather of ``ROWS`` logits rows, a
softmax and a top-k per draft step (a few microseconds of GPU time; no host time); eager runs do that
work only when the hook has selected rows. More than ``ROWS`` sampled requests in one batch: the
others get no positions 2.. (counted as ``draft_tap_full`` drops).
"""

from __future__ import annotations

from typing import List, Optional

import torch

from .devicecopy import device_index
from .stats import Resolved

ROWS = 16  # sampled requests per batch whose draft steps are read


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class StepTap:
    """Static buffers and the wrappers of one draft worker (chain drafting, more than one draft step)."""

    def __init__(self, worker, topk: int, guard):
        """``guard(probe, fn, *args)``: the tracer's guard (counts an exception, never raises)."""
        runner = worker.draft_runner
        self.steps = worker.speculative_num_steps - 1
        self.k = topk
        dev = torch.device(worker.device)
        self.rows = torch.full((ROWS,), -1, dtype=torch.int64, device=dev)
        self.probs = torch.zeros((self.steps, ROWS, topk), dtype=torch.float32, device=dev)
        self.ids = torch.full((self.steps, ROWS, topk), -1, dtype=torch.int64, device=dev)
        self.armed = False  # eager runs read only when the draft hook selected rows
        self._step = 0
        forward, draft_forward = runner.forward, worker.draft_forward

        def tapped_forward(forward_batch, *args, **kwargs):
            out = forward(forward_batch, *args, **kwargs)
            guard("draft_steps", self._after, forward_batch, out)
            return out

        def counted_draft_forward(forward_batch, *args, **kwargs):
            self._step = 0
            return draft_forward(forward_batch, *args, **kwargs)

        runner.forward, worker.draft_forward = tapped_forward, counted_draft_forward

    def _after(self, forward_batch, out) -> None:
        """After one draft forward: a draft-decode step (not a draft extend) is counted and, when rows are
        selected or a graph is being captured, read."""
        if forward_batch.forward_mode.is_decode():
            i, self._step = self._step, self._step + 1
            if i < self.steps and (self.armed or _capturing()):
                self._write(i, out.logits_output.next_token_logits)

    def _write(self, i: int, logits: torch.Tensor) -> None:
        """Top-k of step ``i``'s logits at the selected rows (device operations only: graph-capturable)."""
        rows = self.rows.clamp(0, logits.shape[0] - 1)
        k = min(self.k, logits.shape[-1])
        top = torch.topk(torch.softmax(logits.index_select(0, rows).float(), dim=-1), k, dim=-1)
        self.probs[i, :, :k].copy_(top.values)
        self.ids[i, :, :k].copy_(top.indices)

    def select(self, rows: List[int]) -> int:
        """Rows of the next draft to read (at most ``ROWS``); how many were taken."""
        n = min(len(rows), ROWS)
        self.rows.copy_(device_index(rows[:n] + [-1] * (ROWS - n), self.rows.device), non_blocking=True)
        self.armed = True
        return n

    def read(self, n: int) -> "StepTopk":
        """The results of the draft just run for the first ``n`` selected rows, copied without blocking."""
        self.armed = False
        return StepTopk(self.probs[:, :n], self.ids[:, :n])


class StepTopk:
    """Host copies of one draft's step top-k: ``result()[position - 2][row]`` = ``[(id, prob), ...]``
    best first (ties by id). Pickles as the decoded lists (waits for the copy)."""

    def __init__(self, probs: torch.Tensor, ids: torch.Tensor):
        self.event: Optional[torch.cuda.Event] = None
        if probs.is_cuda:
            self._p = torch.empty(probs.shape, dtype=probs.dtype, pin_memory=True)
            self._i = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self._p.copy_(probs, non_blocking=True)
            self._i.copy_(ids, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self._p, self._i = probs.clone(), ids.clone()
        self._value: Optional[list] = None

    def __reduce__(self):
        return Resolved, (self.result(),)

    def result(self) -> list:
        if self._value is None:
            if self.event is not None:
                self.event.synchronize()
            self._value = [[sorted(((t, q) for t, q in zip(i, p) if t >= 0), key=lambda e: (-e[1], e[0]))
                            for i, p in zip(ids, probs)] for ids, probs in zip(self._i.tolist(), self._p.tolist())]
        return self._value
