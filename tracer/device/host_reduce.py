"""Statistics of CPU tensors: the hook copies the sampled rows and takes their top-k; the recorder
process reduces the copies with numpy.

On a CPU the "device" is the host and there is nothing to overlap. :func:`host_rows` is the CPU
stand-in for a :class:`~draftscope_tracer.device.summarize.Summarizer` launch: in the hook it copies the
selected rows with numpy indexing (SGLang reuses its buffers) and takes the top-k of their logits
(softmax, then ``topk``: two torch operations, several times cheaper than numpy's partition). The
:class:`~draftscope_tracer.stats.RowCopies` it returns are pickled to the recorder process, whose
``result()`` computes the per-chunk statistics of the same
:class:`~draftscope_tracer.stats.Summary` with a handful of numpy operations.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from draftscope_tracer.device.devicecopy import host_view
from draftscope_tracer.stats import RowCopies


def host_rows(hidden: torch.Tensor, rows: Union[Sequence[int], torch.Tensor], *, chunk_width: int,
              logits: Optional[torch.Tensor], topk: int, stats: bool = True, tag: Any = None,
              logit_rows: Optional[Sequence[int]] = None) -> RowCopies:
    """Rows ``rows`` of ``hidden`` copied now (with the top-k of ``logits`` at ``logit_rows``, the logits' row of
    each entry of ``rows``; default ``rows``). ``stats=False`` keeps only the top-k (rows without chunk
    statistics)."""
    rows = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
    x = _rows_of(hidden, rows) if stats else None
    probs = ids = None
    if logits is not None:
        at = rows if logit_rows is None else list(logit_rows)
        rows_l = x if logits is hidden and stats and at == rows else _rows_of(logits, at)
        top = torch.softmax(torch.from_numpy(rows_l), -1).topk(min(topk, rows_l.shape[-1]), dim=-1)
        probs, ids = top.values.numpy(), top.indices.numpy()
    return RowCopies(rows, chunk_width, x, probs, ids, tag)


def _rows_of(t: torch.Tensor, rows: list) -> np.ndarray:
    """A float32/float64 copy of ``t[rows]`` (numpy indexing: a few microseconds, where torch's
    indexing operators cost several times that on small tensors)."""
    view = host_view(t.detach())
    if view is None:  # bfloat16: numpy has no such type
        return t.detach().index_select(0, torch.tensor(rows, dtype=torch.int64)).float().numpy()
    out = view[rows]
    return out if out.dtype in (np.float32, np.float64) else out.astype(np.float32)
