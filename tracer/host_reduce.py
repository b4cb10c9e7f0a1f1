"""Statistics of CPU tensors: the hook copies the sampled rows (one gather), the writer thread reduces them.

On a CPU the "device" is the host, so there is nothing to overlap: summarising in the hook would only
run ~25 small torch ops per launch on the scheduler thread. :class:`HostRows` is the CPU stand-in for
:class:`~draftscope_tracer.summarize.Pending`: it holds a copy of the selected rows (SGLang reuses its
buffers), and :meth:`HostRows.result` computes the same :class:`~draftscope_tracer.summarize.Summary`
with a handful of numpy operations, on the thread that reads it.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from .summarize import ChunkStats, RowSummary, Summary


def _host_array(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return (t if t.dtype in (torch.float32, torch.float64) else t.float()).numpy()


class HostRows:
    """Rows ``rows`` of ``hidden`` (and of ``logits``) copied now; reduced by :meth:`result`."""

    def __init__(self, hidden: torch.Tensor, rows: Union[Sequence[int], torch.Tensor], *, chunk_width: int,
                 logits: Optional[torch.Tensor], topk: int, tag: Any = None):
        idx = rows if isinstance(rows, torch.Tensor) else torch.tensor(list(rows), dtype=torch.int64)
        idx = idx.to(torch.int64)
        self.tag, self.chunk_width, self.topk = tag, chunk_width, topk
        self._rows = idx.tolist()
        self._x: Optional[np.ndarray] = _host_array(hidden.index_select(0, idx))
        self._logits: Optional[np.ndarray] = None
        if logits is not None:
            self._logits = self._x if logits is hidden else _host_array(logits.index_select(0, idx))
        self._summary: Optional[Summary] = None
        self._lock = threading.Lock()

    def ready(self) -> bool:
        return True

    def result(self) -> Summary:
        """The summary (computed once, by whichever thread asks first)."""
        with self._lock:
            if self._summary is None:
                if self._x is None:
                    raise RuntimeError("these HostRows were released without being read")
                self._summary = Summary(tag=self.tag, rows=self._reduce(), draft=None)
                self._x = self._logits = None
            return self._summary

    def release(self) -> None:
        with self._lock:
            self._x = self._logits = None

    def _reduce(self) -> list:
        x, H = self._x, self.chunk_width
        n, K = x.shape[0], x.shape[1] // H
        v = x.reshape(n, K, H).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf inputs give NaN/Inf statistics
            sums = v.sum(-1)
            sumsq = np.einsum("rkh,rkh->rk", v, v)
            absmax = np.abs(v).max(-1)
        if np.isfinite(sums).all() and np.isfinite(sumsq).all():  # every value finite
            nan = inf = np.zeros((n, K), dtype=np.int64)
        else:
            nan, inf = np.isnan(v).sum(-1), np.isinf(v).sum(-1)
        with np.errstate(invalid="ignore", over="ignore"):
            mean = sums / H
            var = np.where(np.isfinite(sumsq) & np.isfinite(mean), np.maximum(sumsq / H - mean * mean, 0.0), np.nan)
            l2, std = np.sqrt(sumsq), np.sqrt(var)
        topk = None if self._logits is None else _topk(self._logits, self.topk)
        cols = [a.tolist() for a in (l2, mean, std, absmax, nan, inf)]
        return [RowSummary(row=row, chunks=[ChunkStats(*cells, H) for cells in zip(*(col[r] for col in cols))],
                           topk=None if topk is None else topk[r])
                for r, row in enumerate(self._rows)]


def _topk(logits: np.ndarray, k: int) -> list:
    """Per row: the ``k`` best ``(id, softmax probability)``, best first, ties by id."""
    k = min(k, logits.shape[-1])
    ids = np.argpartition(logits, -k, axis=-1)[:, -k:]
    with np.errstate(invalid="ignore", over="ignore"):
        top = np.take_along_axis(logits, ids, -1).astype(np.float64)
        m = logits.max(-1, keepdims=True).astype(np.float64)
        probs = np.exp(top - m) / np.exp(logits.astype(np.float64) - m).sum(-1, keepdims=True)
    order = np.lexsort((ids, -probs), axis=-1)  # by probability, then id
    ids, probs = np.take_along_axis(ids, order, -1), np.take_along_axis(probs, order, -1)
    return [list(zip(i, q)) for i, q in zip(ids.tolist(), probs.tolist())]
