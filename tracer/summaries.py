"""The hooks' side of the summaries: where each launch is reduced, and the records built from them.

A launch takes the rows to summarise (a host list or an int64 tensor) and returns a handle whose
``result()`` the writer thread reads. CUDA tensors go to a ``summarize.Summarizer`` per tensor layout
(created lazily): the rows are padded into its static ``rows`` buffer and reduced on the device. CPU
tensors are copied by ``host_reduce.HostRows`` and reduced on the writer thread (``reduce="device"``
sends them through the Summarizer's torch path instead). The writer turns each ``Summary`` into
``SampleRecord`` fields or top-k lists.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from .config import REDUCE_MODES
from .health import Health
from .host_reduce import HostRows
from .summarize import ChunkStats, Pending, Summarizer, Summary

RING_SIZE = 128  # unread launches per layout before launches drop (counted as `summary_ring_full`)


class Summaries:
    """Summarizers keyed by (width, chunk width, vocab, device); ``max_rows`` grows by powers of two.

    ``reduce="auto"`` reduces CPU tensors on the reading thread (``HostRows``) and CUDA tensors on the
    device; ``"device"`` always uses the Summarizer (its torch path on a CPU).
    """

    def __init__(self, health: Health, topk: int, reduce: str = "auto"):
        if reduce not in REDUCE_MODES:
            raise ValueError(f"reduce must be one of {REDUCE_MODES}, got {reduce!r}")
        self.health, self.topk, self.reduce = health, topk, reduce
        self._by_shape: Dict[tuple, Tuple[Summarizer, torch.Tensor]] = {}

    def launch(self, hidden: torch.Tensor, rows: Union[Sequence[int], torch.Tensor], *,
               chunk_width: Optional[int] = None, logits: Optional[torch.Tensor] = None,
               stats: bool = True, tag=None) -> Optional[Union[Pending, HostRows]]:
        """Summarise ``rows`` of ``hidden`` (and their top-k of ``logits``); None when dropped (counted).
        ``stats=False``: only the top-k is read (the device path computes the statistics anyway)."""
        n = len(rows)
        if n == 0 or hidden.shape[0] == 0:
            return None
        width = int(hidden.shape[-1])
        chunk = chunk_width if chunk_width and width % chunk_width == 0 else width
        if hidden.device.type == "cpu" and self.reduce == "auto":
            return HostRows(hidden, rows, chunk_width=chunk, logits=logits, topk=self.topk, stats=stats, tag=tag)
        vocab = None if logits is None else int(logits.shape[-1])
        if logits is not None and logits.dtype != torch.float32:
            logits = logits.float()
        key = (width, chunk, vocab, hidden.device)
        summ, buf = self._by_shape.get(key, (None, None))
        if summ is None or summ.max_rows < n:
            max_rows = max(8, 1 << (n - 1).bit_length())
            summ = Summarizer(max_rows=max_rows, width=width, chunk_width=chunk, vocab_size=vocab,
                              topk=min(self.topk, vocab) if vocab else self.topk, ring_size=RING_SIZE,
                              device=hidden.device)
            buf = torch.empty(max_rows, dtype=torch.int64, device=hidden.device)
            self._by_shape[key] = (summ, buf)
        buf.fill_(-1)
        src = rows if isinstance(rows, torch.Tensor) else torch.tensor(list(rows), dtype=torch.int64)
        buf[:n].copy_(src, non_blocking=True)
        pending = summ.summarize(hidden.detach(), buf, logits=None if logits is None else logits.detach(), tag=tag)
        if pending is None:
            self.health.drop("summary_ring_full")
        return pending


def merged_stats(summary: Summary, positions: Sequence[int], chunks: Optional[Sequence[int]] = None) -> dict:
    """``SampleRecord`` statistics over whole rows made of ``chunks`` (default: all) of ``positions``.

    One plain loop over the cells (the writer thread runs this for every sample record)."""
    rows = summary.rows
    total = wsum = nan = inf = 0
    absmax = -math.inf
    l2: List[float] = []
    cells: List[ChunkStats] = []
    for p in positions:
        row = rows[p].chunks if chunks is None else [rows[p].chunks[c] for c in chunks]
        sq = 0.0
        for c in row:
            total += c.width
            wsum += c.mean * c.width
            sq += c.l2 * c.l2
            absmax = c.absmax if c.absmax > absmax or c.absmax != c.absmax else absmax
            nan += c.nan_count
            inf += c.inf_count
        l2.append(math.sqrt(sq))
        cells += row
    if not l2:
        raise ValueError("merged_stats needs at least one row")
    mean = wsum / total
    var = sum(c.width * (c.std * c.std + (c.mean - mean) ** 2) for c in cells) / total
    return {"rows": len(l2), "width": total // len(l2), "l2_mean": _finite(sum(l2) / len(l2)),
            "l2_max": _finite(max(l2)), "mean": _finite(mean),
            "std": _finite(math.sqrt(var) if var >= 0 else math.nan), "absmax": _finite(absmax),
            "nan_count": nan, "inf_count": inf}


def topk_list(topk: Sequence[Tuple[int, float]], id_map: Optional[List[int]] = None) -> List[List[float]]:
    """``[[target id, prob], ...]`` of one row's top-k, draft ids mapped through ``id_map``."""
    if id_map is not None:
        topk = [(id_map[i], p) for i, p in topk]
    if math.isfinite(math.fsum(p for _, p in topk)):
        return [[i, round(p, 6)] for i, p in topk]
    return [[i, _finite(round(p, 6))] for i, p in topk]


def _finite(v: float) -> Optional[float]:
    return v if math.isfinite(v) else None
