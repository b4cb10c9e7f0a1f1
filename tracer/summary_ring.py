"""The Summarizer's way back to the host: the result layout, a ring of (pinned) host buffers that one
non-blocking copy fills, the :class:`Pending` handle of each copy, and the decoding into a ``Summary``."""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Optional

import torch

from .stats import ChunkStats, Resolved, RowSummary, Summary
from .summary_torch import SUMS


class Layout:
    """Typed views onto 8-byte-aligned regions of one byte buffer: ``rows``, ``sums``, ``absmax`` and,
    with a vocabulary, ``topk_p``/``topk_id``."""

    def __init__(self, max_rows: int, num_chunks: int, vocab_size: Optional[int], topk: int):
        R, K = max_rows, num_chunks
        fields: list[tuple[str, torch.dtype, tuple[int, ...]]] = [
            ("rows", torch.int64, (R,)), ("sums", torch.float32, (len(SUMS), R, K)),
            ("absmax", torch.float32, (R, K))]
        if vocab_size is not None:
            fields += [("topk_p", torch.float32, (R, topk)), ("topk_id", torch.int64, (R, topk))]
        self.fields, offset = [], 0
        for name, dtype, shape in fields:
            nbytes = math.prod(shape) * torch.tensor([], dtype=dtype).element_size()
            self.fields.append((name, dtype, shape, offset, nbytes))
            offset += (nbytes + 7) // 8 * 8
        self.nbytes = offset

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: buf[off:off + n].view(dtype).view(shape) for name, dtype, shape, off, n in self.fields}


def decode(h: dict[str, torch.Tensor], chunk_width: int, tag: Any) -> Summary:
    """A host buffer's views as a ``Summary`` (padding rows left out; top-k best first, ties by id)."""
    rows = h["rows"].tolist()
    n = max((i + 1 for i, r in enumerate(rows) if r >= 0), default=0)  # rows past the last one are padding:
    rows = rows[:n]  # read only up to it (a Summarizer's capacity may be far above what a launch uses)
    sums, nan, nonfinite, sumsq = h["sums"][:, :n].tolist()
    absmax = h["absmax"][:n].tolist()
    topk = None
    if "topk_id" in h:  # unsorted on the device
        topk = [sorted(zip(i, p), key=lambda e: (-e[1], e[0])) for i, p in zip(h["topk_id"][:n].tolist(),
                                                                              h["topk_p"][:n].tolist())]
    out, H = [], chunk_width
    for r, row in enumerate(rows):
        if row < 0:
            continue
        chunks = []
        for c in range(len(sums[r])):
            mean, ss = sums[r][c] / H, sumsq[r][c]
            var = max(ss / H - mean * mean, 0.0) if math.isfinite(ss) and math.isfinite(mean) else math.nan
            chunks.append(ChunkStats(l2=math.sqrt(ss) if ss >= 0 else math.nan, mean=mean,
                                     std=math.sqrt(var) if var == var else math.nan, absmax=absmax[r][c],
                                     nan_count=int(nan[r][c]), inf_count=int(nonfinite[r][c] - nan[r][c]), width=H))
        out.append(RowSummary(row=row, chunks=chunks, topk=None if topk is None else topk[r]))
    return Summary(tag=tag, rows=out)


class Ring:
    """``size`` host buffers (pinned on CUDA, one allocation); a launch takes a free one or is dropped
    (``drops``)."""

    def __init__(self, layout: Layout, size: int, device: torch.device, chunk_width: int):
        pin = device.type == "cuda"
        self.chunk_width = chunk_width
        # one allocation for every slot: a pinned allocation per slot would cost a ``cudaHostAlloc`` each
        memory = torch.zeros(size, layout.nbytes, dtype=torch.uint8, pin_memory=pin)
        self._bufs = list(memory.unbind(0))
        self._views = [layout.views(b) for b in self._bufs]
        self._busy = [False] * size
        # one completion event per slot, re-recorded by each launch that takes it (creating an event per
        # launch costs host time)
        self._events = [torch.cuda.Event() for _ in range(size)] if device.type == "cuda" else None
        self._next = 0
        self.drops = 0  # launches refused because every slot was still unread
        self.launches = 0  # copies made (bench/gpu_hooks.py counts launches per iteration)

    def reserve(self) -> Optional[int]:
        n = len(self._busy)
        for i in range(n):
            slot = (self._next + i) % n
            if not self._busy[slot]:
                self._busy[slot] = True
                self._next = (slot + 1) % n
                return slot
        self.drops += 1
        return None

    def release(self, slot: int) -> None:
        self._busy[slot] = False

    def copy_out(self, slot: int, device_buf: torch.Tensor, tag: Any) -> "Pending":
        """One non-blocking copy of ``device_buf`` into ``slot``; an event marks its completion on CUDA."""
        self._bufs[slot].copy_(device_buf, non_blocking=True)
        event = None
        if self._events is not None:
            event = self._events[slot]
            event.record()
        self.launches += 1
        return Pending(lambda: decode(self._views[slot], self.chunk_width, tag), lambda: self.release(slot),
                       event, tag)


class Pending:
    """Handle of one launch: wait for it and decode it on a background thread."""

    def __init__(self, decode_slot: Callable[[], Summary], release_slot: Callable[[], None],
                 event: Optional["torch.cuda.Event"], tag: Any):
        self._decode, self._release, self._event, self.tag = decode_slot, release_slot, event, tag
        self._held = True
        self._summary: Optional[Summary] = None
        self._lock = threading.Lock()

    def __reduce__(self):
        """Pickled (for the recorder process) as its decoded summary: waits for the copy first."""
        return Resolved, (self.result(),)

    def result(self) -> Summary:
        """Wait for the copy, decode it, free the ring slot. Idempotent; blocks the calling thread only."""
        with self._lock:
            if self._summary is None:
                if not self._held:
                    raise RuntimeError("this Pending was released without being read")
                if self._event is not None:
                    self._event.synchronize()
                self._summary = self._decode()
                self._release()
                self._held = False
            return self._summary

    def release(self) -> None:
        """Free the ring slot without decoding (e.g. at shutdown). Safe to call more than once."""
        with self._lock:
            if self._held and self._summary is None:
                if self._event is not None:
                    self._event.synchronize()
                self._release()
                self._held = False
