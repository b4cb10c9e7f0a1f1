"""A recompute and the summary of its output as one CUDA graph, captured when the tracer attaches.

The draft extend's hook recomputes the draft's logits at position 1 of the next step (``recompute.logits``:
final norm, ``lm_head``) and, every few steps, its ``fc`` output; eagerly that is a handful of kernel
launches plus the summary's, each costing host time. :class:`Graphed` captures them once, on a static
input of ``rows`` rows: a hook then copies its sampled rows into that input (one ``index_select``),
replays the graph and copies the summary out (``Summarizer.publish``). Rows past those copied hold an
earlier launch's input; their summaries are computed and never read.

Capture happens at attach, before the server serves (``torch.cuda.graph`` synchronises the device);
when it fails (a module that cannot be captured), the hooks keep the eager path.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from draftscope_tracer.device.summaries import ring_size
from draftscope_tracer.device.summarize import Pending, Summarizer
from draftscope_tracer.device.summary_ring import Layout

log = logging.getLogger("draftscope.tracer")


class Graphed:
    """``fn`` on a static ``[rows, width]`` input and the summary of its output (top-k too with ``logits``)."""

    def __init__(self, fn: Callable[[torch.Tensor], Optional[torch.Tensor]], rows: int, width: int,
                 dtype: torch.dtype, device: torch.device, topk: int, logits: bool):
        self.rows, self.width, self.dtype = rows, width, dtype
        self.input = torch.zeros(rows, width, dtype=dtype, device=device)
        self._views = [self.input[:n] for n in range(rows + 1)]  # slicing costs host time: made once
        # the graph reads these rows by address: held for its lifetime
        self._index = index = torch.arange(rows, dtype=torch.int64, device=device)
        with torch.no_grad():
            out = fn(self.input)  # eager first: Triton compiles, SGLang's modules warm up
        if out is None:
            raise ValueError("nothing to recompute for this draft")
        out_width, self.out_dtype = int(out.shape[-1]), out.dtype
        vocab, topk = (out_width if logits else None), min(topk, out_width)
        self.summary = Summarizer(max_rows=rows, width=out_width, vocab_size=vocab, topk=topk, device=device,
                                  ring_size=ring_size(Layout(rows, 1, vocab, topk).nbytes))

        def body() -> None:
            with torch.no_grad():
                y = fn(self.input)
                self.summary.compute(y, index, y if logits else None)

        body()
        torch.cuda.synchronize(device)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            body()
        self.graph.replay()
        torch.cuda.synchronize(device)

    def takes(self, h: torch.Tensor, n: int) -> bool:
        """Whether ``n`` rows of ``h`` fit this graph's input."""
        return 0 < n <= self.rows and h.dtype == self.dtype and h.dim() == 2 and h.shape[1] == self.width \
            and h.device == self.input.device

    def launch(self, h: torch.Tensor, index: torch.Tensor, tag=None) -> Optional[Pending]:
        """Rows ``index`` of ``h`` into the input, one replay, the summary copied out; None when its ring is full."""
        torch.index_select(h, 0, index, out=self._views[index.shape[0]])
        self.graph.replay()
        return self.summary.publish(tag)


def capture(name: str, *args, **kwargs) -> Optional[Graphed]:
    """A :class:`Graphed`, or None (logged) when the recompute cannot be captured."""
    try:
        return Graphed(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the eager path stays; never stop the server
        log.warning("draftscope: the %s recompute runs eagerly (not captured as a CUDA graph: %s: %s)",
                    name, type(exc).__name__, exc)
        return None
