"""Statistics of CPU tensors: the hook copies the sampled rows and takes their top-k; the writer thread
reduces the copies with numpy.

On a CPU the "device" is the host and there is nothing to overlap. :class:`HostRows` is the CPU
stand-in for :class:`~draftscope_tracer.summarize.Pending`: in the hook it copies the selected rows
with numpy indexing (SGLang reuses its buffers) and takes the top-k of their logits (softmax, then
``topk``: two torch operations, several times cheaper than numpy's partition);
:meth:`HostRows.result` computes the per-chunk statistics of the same
:class:`~draftscope_tracer.summarize.Summary` with a handful of numpy operations, which cost less per
call than torch's on a few rows.

The reading thread runs no torch operator: on a CPU those share the intra-op thread pool with the
scheduler's forward pass, which measured a third fewer tokens/s at 1 request in 16.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from .devicecopy import host_view
from .summarize import ChunkStats, RowSummary, Summary


class HostRows:
    """Rows ``rows`` of ``hidden`` copied now (with the top-k of those rows of ``logits``); reduced by
    :meth:`result`. ``stats=False`` keeps only the top-k (rows without chunk statistics)."""

    def __init__(self, hidden: torch.Tensor, rows: Union[Sequence[int], torch.Tensor], *, chunk_width: int,
                 logits: Optional[torch.Tensor], topk: int, stats: bool = True, tag: Any = None):
        self.tag, self.chunk_width = tag, chunk_width
        self._rows = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
        self._x: Optional[np.ndarray] = _rows_of(hidden, self._rows) if stats else None
        self._top: Optional[tuple] = None
        if logits is not None:
            rows_l = self._x if logits is hidden and stats else _rows_of(logits, self._rows)
            self._top = torch.softmax(torch.from_numpy(rows_l), -1).topk(min(topk, rows_l.shape[-1]), dim=-1)
        self._summary: Optional[Summary] = None
        self._released = False
        self._lock = threading.Lock()

    def result(self) -> Summary:
        """The summary (computed once, by whichever thread asks first)."""
        with self._lock:
            if self._summary is None:
                if self._released:
                    raise RuntimeError("these HostRows were released without being read")
                self._summary = Summary(tag=self.tag, rows=self._reduce(), draft=None)
                self._x = self._top = None
            return self._summary

    def release(self) -> None:
        with self._lock:
            if self._summary is None:
                self._released = True
                self._x = self._top = None

    def _reduce(self) -> list:
        H = self.chunk_width
        topk = None if self._top is None else _best_first(*self._top)
        cells = [[] for _ in self._rows] if self._x is None else _chunk_stats(self._x, H)
        return [RowSummary(row=row, chunks=cells[r], topk=None if topk is None else topk[r])
                for r, row in enumerate(self._rows)]


def _chunk_stats(x: np.ndarray, H: int) -> list:
    """Per row, the :class:`ChunkStats` of each ``H``-wide chunk (float64; NaN/Inf values make the
    statistics they enter NaN/Inf, as on the device)."""
    n, K = x.shape[0], x.shape[1] // H
    v = x.reshape(n, K, H).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        mean = v.sum(-1) / H
        sumsq = np.einsum("rkh,rkh->rk", v, v)
        absmax = np.abs(v).max(-1)
        var = sumsq / H - mean * mean
        if np.isfinite(sumsq).all():  # every value finite
            nan = inf = [0] * (n * K)
            np.maximum(var, 0.0, out=var)
        else:
            nan, inf = np.isnan(v).sum(-1).ravel().tolist(), np.isinf(v).sum(-1).ravel().tolist()
            var = np.where(np.isfinite(sumsq) & np.isfinite(mean), np.maximum(var, 0.0), np.nan)
        l2, std = np.sqrt(sumsq), np.sqrt(var)
    cells = list(map(ChunkStats, *(a.ravel().tolist() for a in (l2, mean, std, absmax)), nan, inf, [H] * (n * K)))
    return [cells[r * K:(r + 1) * K] for r in range(n)]


def _rows_of(t: torch.Tensor, rows: list) -> np.ndarray:
    """A float32/float64 copy of ``t[rows]`` (numpy indexing: a few microseconds, where torch's
    indexing operators cost several times that on small tensors)."""
    view = host_view(t.detach())
    if view is None:  # bfloat16: numpy has no such type
        return t.detach().index_select(0, torch.tensor(rows, dtype=torch.int64)).float().numpy()
    out = view[rows]
    return out if out.dtype in (np.float32, np.float64) else out.astype(np.float32)


def _best_first(probs: torch.Tensor, ids: torch.Tensor) -> list:
    """Per row: ``(id, probability)`` pairs by probability, then id (``topk`` sorts by value only)."""
    out = []
    for i, p in zip(ids.tolist(), probs.tolist()):
        if len(set(p)) == len(p):  # no ties: topk's order is the order
            out.append(list(zip(i, p)))
        else:
            out.append([(t, -q) for q, t in sorted(zip([-q for q in p], i))])
    return out
