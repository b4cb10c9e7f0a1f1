"""The hooks' side of the summaries: where each launch is reduced.

A launch takes the rows to summarise (a host list; the logits are read in place, at those rows or at rows of
their own) and returns a handle whose ``result()`` the recorder process reads (the handle is pickled to it: see
``stats.py``). CUDA tensors go to a ``summarize.Summarizer`` per tensor layout (created lazily): the rows are
padded into its static ``rows`` buffer and reduced on the device; a launch on the same buffers and rows as an
earlier one goes through that launch's plan (``Summarizer.launch_plan``). CPU tensors are copied by
``host_reduce.host_rows`` and reduced in the recorder (``reduce="device"`` sends them through the Summarizer's
torch path instead). ``records.py`` turns each ``Summary`` into records.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Union

import torch

from draftscope_tracer.config import REDUCE_MODES
from draftscope_tracer.device.devicecopy import device_index
from draftscope_tracer.health import Health
from draftscope_tracer.device.host_reduce import host_rows
from draftscope_tracer.stats import RowCopies
from draftscope_tracer.device.summarize import Pending, Summarizer
from draftscope_tracer.device.summary_ring import Layout
from draftscope_tracer.device.summary_triton import hooked

RING_BYTES = 16 * 2**20  # pinned bytes per layout's ring: unread launches before launches drop
PLANS = 64  # launches kept as plans (a decode batch's launches repeat on the same buffers every iteration)
RING_SLOTS = (128, 4096)  # at least / at most, whatever the layout's size (`summary_ring_full` past that)


def capacity(n: int) -> int:
    """Rows of the Summarizer that takes ``n`` rows (powers of two, at least 8)."""
    return max(8, 1 << (n - 1).bit_length())


def ring_size(layout_bytes: int) -> int:
    """Ring slots for a layout of ``layout_bytes``: ``RING_BYTES`` of them, within ``RING_SLOTS``."""
    return min(RING_SLOTS[1], max(RING_SLOTS[0], RING_BYTES // max(layout_bytes, 1)))


class Summaries:
    """Summarizers keyed by (width, chunk width, vocab, device); ``max_rows`` grows by powers of two.

    ``reduce="auto"`` reduces CPU tensors in the recorder (``host_rows``) and CUDA tensors on the
    device; ``"device"`` always uses the Summarizer (its torch path on a CPU). :meth:`prepare` builds
    (and runs once) the Summarizers of the layouts a server will use, at attach: a Summarizer built later,
    in a hook, allocates pinned memory and compiles its kernels there.
    """

    def __init__(self, health: Health, topk: int, reduce: str = "auto"):
        if reduce not in REDUCE_MODES:
            raise ValueError(f"reduce must be one of {REDUCE_MODES}, got {reduce!r}")
        self.health, self.topk, self.reduce = health, topk, reduce
        self._by_shape: Dict[tuple, Summarizer] = {}
        self._plans: Dict[tuple, tuple] = {}  # plan key -> (Summarizer, its plan, the index tensors the plan reads)

    def prepare(self, device: torch.device, layouts: Sequence[tuple]) -> None:
        """Build each ``(width, chunk width, vocab or None, rows, dtype, logits dtype, gather)`` layout's Summarizer
        on ``device`` (CUDA) and run it once on zeros: its kernels compile and its buffers exist before the first
        request (``gather``: with a verify's token ids, see ``Summarizer.summarize``)."""
        device = torch.device(device)
        if device.type != "cuda" and self.reduce == "auto":
            return
        for width, chunk, vocab, rows, dtype, logits_dtype, gather in layouts:
            hidden = torch.zeros(1, width, dtype=dtype, device=device)
            logits = None if vocab is None else torch.zeros(1, vocab, dtype=logits_dtype, device=device)
            ints = (*(torch.zeros(1, dtype=torch.int64, device=device) for _ in range(4)), 1) if gather else None
            pending = self.launch(hidden, [0] * rows, chunk_width=chunk, logits=logits, ints=ints)
            if pending is not None:
                pending.result()

    def _summarizer(self, width: int, chunk: int, vocab: Optional[int], n: int, device, gather: bool) -> Summarizer:
        key = (width, chunk, vocab, device, gather)
        summ = self._by_shape.get(key)
        if summ is None or summ.max_rows < n:
            rows = capacity(n)
            topk = min(self.topk, vocab) if vocab else self.topk
            size = ring_size(Layout(rows, width // chunk, vocab, topk, gather).nbytes)
            summ = self._by_shape[key] = Summarizer(max_rows=rows, width=width, chunk_width=chunk, vocab_size=vocab,
                                                    topk=topk, ring_size=size, device=device, gather=gather)
        return summ

    def launch(self, hidden: torch.Tensor, rows: Sequence[int], *,
               chunk_width: Optional[int] = None, logits: Optional[torch.Tensor] = None,
               stats: bool = True, tag=None, ints: Optional[tuple] = None,
               logit_rows: Optional[Sequence[int]] = None) -> Optional[Union[Pending, RowCopies]]:
        """Summarise ``rows`` of ``hidden`` (and their top-k of ``logits``, read in place at ``logit_rows``: the
        logits' row of each entry of ``rows``, default ``rows``); None when dropped (counted). ``stats=False``: only
        the top-k is read (the device path computes the statistics anyway). ``ints``: a verify's token ids, read at
        ``rows`` on the device (``Summarizer.summarize``; device tensors only)."""
        n = len(rows)
        if n == 0 or hidden.shape[0] == 0:
            return None
        if hidden.is_cpu and self.reduce == "auto":
            return host_rows(hidden, rows, chunk_width=_chunk(hidden, chunk_width), logits=logits, topk=self.topk,
                             stats=stats, tag=tag, logit_rows=logit_rows)
        key = self._plan_key(hidden, rows, chunk_width, logits, ints, logit_rows)
        planned = self._plans.get(key)
        # a plan calls its Triton kernel's launcher: not after that Summarizer fell back to torch, nor with a
        # launch hook set (a profiler: every launch through the JITFunction)
        if planned is not None and planned[0].backend == "triton" and not hooked():
            try:
                pending = planned[0].launch_plan(planned[1], tag)
            except Exception:  # noqa: BLE001 - the launch below decides again (and falls back to torch if need be)
                del self._plans[key]
            else:
                if pending is None:
                    self.health.drop("summary_ring_full")
                return pending
        vocab = None if logits is None else int(logits.shape[-1])
        summ = self._summarizer(int(hidden.shape[-1]), _chunk(hidden, chunk_width), vocab, n, hidden.device,
                                ints is not None)
        # each padded list in one copy (from a pinned slot on CUDA: no wait for queued work)
        index = device_index(rows, hidden.device, pad=summ.max_rows)
        at = None if logit_rows is None else device_index(logit_rows, hidden.device, pad=summ.max_rows)
        if index is None or (logit_rows is not None and at is None):
            self.health.drop("host_slots_full")
            return None
        if hidden.requires_grad:
            hidden = hidden.detach()
        if logits is not None and logits.requires_grad:
            logits = logits.detach()
        pending = summ.summarize(hidden, index, logits=logits, tag=tag, ints=ints, logit_rows=at)
        if pending is None:
            self.health.drop("summary_ring_full")
        elif (plan := summ.last_plan()) is not None:
            if len(self._plans) >= PLANS:
                self._plans.clear()
            self._plans[key] = (summ, plan, index, at)  # the index tensors held: the plan reads their addresses
        return pending

    @staticmethod
    def _plan_key(hidden, rows, chunk_width, logits, ints, logit_rows) -> tuple:
        """What a launch's plan depends on: each tensor's address, shape, strides and dtype, the rows (and the
        logits' rows), the chunk width."""
        return (hidden.data_ptr(), hidden.shape, hidden.stride(), hidden.dtype, chunk_width, tuple(rows),
                None if logits is None else (logits.data_ptr(), logits.shape, logits.stride(), logits.dtype),
                None if logit_rows is None else tuple(logit_rows),
                None if ints is None else (*[(t.data_ptr(), t.dtype, t.shape, t.stride()) for t in ints[:4]], ints[4]))


def _chunk(hidden: torch.Tensor, chunk_width: Optional[int]) -> int:
    """The chunk width a launch on ``hidden`` takes: ``chunk_width`` where it divides the row, else the whole row
    (worked out past the plan lookup: a planned launch needs none of it)."""
    width = int(hidden.shape[-1])
    return chunk_width if chunk_width and width % chunk_width == 0 else width
