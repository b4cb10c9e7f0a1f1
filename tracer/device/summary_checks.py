"""What a ``Summarizer`` accepts: its arguments when it is built (:func:`check_arguments`) and each launch's
inputs (:class:`LaunchCheck`); anything else is refused with a ValueError naming the first argument that is
wrong."""

from __future__ import annotations

from typing import Optional

import torch

from draftscope_tracer.device.summary_triton import triton

LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # read as they are, summarised in fp32


def check_arguments(max_rows: int, width: int, chunk_width: int, vocab_size: Optional[int], topk: int,
                    ring_size: int, backend: str, gather: bool) -> None:
    """A ValueError naming the first argument of a ``Summarizer`` that cannot be built."""
    if max_rows < 1 or width < 1 or chunk_width < 1 or width % chunk_width:
        raise ValueError(f"need max_rows >= 1 and chunk_width dividing width; got max_rows={max_rows}, "
                         f"width={width}, chunk_width={chunk_width}")
    if vocab_size is not None and not 1 <= topk <= vocab_size:
        raise ValueError(f"topk={topk} must be between 1 and vocab_size={vocab_size}")
    if ring_size < 1:
        raise ValueError(f"need ring_size >= 1; got {ring_size}")
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "triton" and triton is None:
        raise ValueError("backend='triton' needs the triton package; install it or use backend='auto'")
    if gather and vocab_size is None:
        raise ValueError("gather needs a vocabulary: it rides on a verify's summary (hidden states and logits)")


class LaunchCheck:
    """The inputs one layout's launches take: shape/dtype/device checks only, metadata, never data (no host
    sync). One expression on the hot path (each launch pays for it); the message is worked out only when it
    fails (:meth:`_explain`)."""

    def __init__(self, *, max_rows: int, width: int, vocab_size: Optional[int], device: torch.device,
                 gather: bool):
        self.max_rows, self.width, self.vocab_size, self.device, self.gather = \
            max_rows, width, vocab_size, device, gather

    def __call__(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor],
                 ints: Optional[tuple], logit_rows: Optional[torch.Tensor]) -> None:
        kind = self.device.type
        if (hidden.dim() == 2 and hidden.shape[1] == self.width and hidden.shape[0] > 0 and hidden.is_floating_point()
                and rows.shape[0] == self.max_rows and rows.dim() == 1 and rows.dtype == torch.int64
                and hidden.device.type == kind and rows.device.type == kind
                and (logits is None and logit_rows is None if self.vocab_size is None else
                     (logits is not None and logits.dim() == 2 and logits.shape[1] == self.vocab_size
                      and logits.dtype in LOGITS_DTYPES and logits.device.type == kind
                      and (logits.shape[0] == hidden.shape[0] if logit_rows is None else
                           (logits.shape[0] > 0 and logit_rows.dim() == 1 and logit_rows.shape[0] == self.max_rows
                            and logit_rows.dtype == torch.int64 and logit_rows.device.type == kind))))
                and (ints is not None) == self.gather):
            return
        self._explain(hidden, rows, logits, ints, logit_rows)

    def _explain(self, hidden, rows, logits, ints, logit_rows) -> None:
        """Raise a ValueError naming the first argument refused."""
        def need(ok: bool, what) -> None:  # ``what``: a callable, so the message is built only on failure
            if not ok:
                raise ValueError(f"Summarizer: {what()}")

        need(hidden.dim() == 2 and hidden.shape[1] == self.width and hidden.shape[0] > 0,
             lambda: f"hidden must be [n>0, {self.width}], got {list(hidden.shape)}")
        need(hidden.is_floating_point(), lambda: f"hidden must be a float tensor, got {hidden.dtype}")
        need(rows.shape == (self.max_rows,) and rows.dtype == torch.int64,
             lambda: f"rows must be int64 [{self.max_rows}] (pad with -1), got {rows.dtype} {list(rows.shape)}")
        for name, t in (("hidden", hidden), ("rows", rows), ("logits", logits), ("logit_rows", logit_rows)):
            need(t is None or t.device.type == self.device.type,
                 lambda: f"{name} is on {t.device if t is not None else None}, the Summarizer on {self.device}")
        if self.vocab_size is None:
            need(logits is None, lambda: "logits given but the Summarizer was built without vocab_size")
            need(logit_rows is None, lambda: "logit_rows given but the Summarizer was built without vocab_size")
        else:
            n = "n>0" if logit_rows is not None else hidden.shape[0]
            need(logits is not None and logits.dim() == 2 and logits.shape[1] == self.vocab_size
                 and (logits.shape[0] == hidden.shape[0] if logit_rows is None else logits.shape[0] > 0),
                 lambda: f"logits must be [{n}, {self.vocab_size}], got "
                 f"{None if logits is None else list(logits.shape)}")
            need(logits.dtype in LOGITS_DTYPES,
                 lambda: f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
            need(logit_rows is None or (logit_rows.shape == (self.max_rows,) and logit_rows.dtype == torch.int64),
                 lambda: f"logit_rows must be int64 [{self.max_rows}] (-1 where rows is), got {logit_rows.dtype} "
                 f"{list(logit_rows.shape)}")
        need((ints is not None) == self.gather,
             lambda: f"ints {'missing' if self.gather else 'given'}: this layout was built with gather={self.gather}")
        raise ValueError(f"Summarizer: arguments refused: hidden {hidden.dtype} {list(hidden.shape)}, rows "
                         f"{rows.dtype} {list(rows.shape)}")
