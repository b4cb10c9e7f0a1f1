"""The step tap's softmax top-k by the summary kernel (:class:`TapTopk`), where its rows are padded with -1.

The step tap's work is recorded inside SGLang's draft-decode CUDA graphs, so every replay runs it, sampled or not.
Done by :func:`~draftscope_tracer.device.softmax_topk.softmax_topk` over the rows the graph's batch holds, that is
~59 µs of GPU a replay at one row of a 163,840-wide vocabulary on an H100 (docs/benchmarks.md), whatever is
selected. The summary kernel (``summary_triton._summary_kernel``) takes a row buffer padded with -1 instead: a
padding row's programs return at once, so a replay with nothing selected costs one launch that does nothing, and
a selected row costs what a summary of it costs (11-17 µs at 1-16 rows there). It reads each logits row once, in
place at the tap's rows, and writes the row's top-k and their softmax probabilities, best first, straight into the
tap's buffers of that draft step (``into``): one kernel a step, no copy after it.

Triton compiles a variant per argument specialisation, and nothing may compile inside SGLang's graph capture: the
variants the draft's logits can take (float32, as SGLang's logits processor returns them; 1, 2 and 16 rows, the
row counts Triton tells apart: equal to 1, a multiple of 16, any other) are compiled when the tap is installed,
before SGLang captures its graphs; logits of any other kind take ``softmax_topk`` (:meth:`TapTopk.takes`).
"""

from __future__ import annotations

from typing import Optional

import torch

from draftscope_tracer.device.summarize import Summarizer

HIDDEN = 8  # the width of the stand-in hidden row: the kernel reads one (its statistics are not used)


class TapTopk:
    """The summary kernel over the tap's ``rows`` buffer (``[R]`` int64, -1 for an unused slot) of logits ``[n, vocab]``."""

    def __init__(self, rows: torch.Tensor, vocab: int, topk: int, backend: str = "auto", into=()):
        """Builds the Summarizer and compiles its variants (a GPU's; ``backend="triton"`` on a CPU runs Triton's
        interpreter, as the tests do). ``into``: the tap's ``(probs, ids)`` of each draft step, written directly
        where they are ``[rows, topk]`` and contiguous. Raises where the Triton path is not taken."""
        device = rows.device
        self.vocab, self.rows = vocab, rows
        self._summary = Summarizer(max_rows=rows.numel(), width=HIDDEN, vocab_size=vocab, topk=min(topk, vocab),
                                   ring_size=1, device=device, backend=backend)
        self._hidden = torch.zeros(1, HIDDEN, dtype=torch.float32, device=device)
        views = self._summary.device_views
        self._probs, self._ids = views["topk_p"], views["topk_id"]
        self._into = {(p.data_ptr(), i.data_ptr()): self._summary.outputs_with_topk(p, i) for p, i in into
                      if p.shape == self._probs.shape and i.shape == self._ids.shape and p.is_contiguous()
                      and i.is_contiguous()}
        self._variants: set = set()
        one = torch.full_like(rows, -1)
        one[0] = 0  # one selected row: every program's path is compiled
        first = next(iter(self._into.values()), None)  # the steps' buffers share one alignment (16 bytes)
        for n in (1, 2, 16):  # into where the writes will go: the first step's buffers, else the device buffer
            logits = torch.zeros(n, vocab, dtype=torch.float32, device=device)
            if first is not None:
                self._summary.compute_into(first, self._hidden, one, logits, logit_rows=one)
            else:
                self._summary.compute(self._hidden, one, logits, logit_rows=one)
            self._variants.add(_variant(logits))
        if self._summary.backend != "triton" or self._summary.fallbacks:
            raise RuntimeError(f"the summary kernel is not taken here: {self._summary.fallback_error}")

    def takes(self, logits: torch.Tensor) -> bool:
        """Whether ``logits`` match a compiled variant (else the caller takes ``softmax_topk``)."""
        return (logits.shape[-1] == self.vocab and self._summary.backend == "triton"
                and _variant(logits) in self._variants)

    def write(self, logits: torch.Tensor, probs: torch.Tensor, ids: torch.Tensor) -> None:
        """The top-k of each selected row of ``logits`` into its slot of ``probs`` and ``ids`` (``[R, k]``, best first;
        an unused slot keeps what it held, which no read takes). Into the tap's own buffers of a step (``into``) by
        the kernel alone; else into the Summarizer's and copied. Device operations only: graph-capturable."""
        out = self._into.get((probs.data_ptr(), ids.data_ptr()))
        if out is not None:
            if self._summary.compute_into(out, self._hidden, self.rows, logits, logit_rows=self.rows):
                return
        else:
            self._summary.compute(self._hidden, self.rows, logits, logit_rows=self.rows)
        k = probs.shape[-1]  # the torch path (or buffers not taken directly): the Summarizer's buffer, copied
        probs.copy_(self._probs[:, :k])
        ids.copy_(self._ids[:, :k])


def _variant(logits: torch.Tensor) -> tuple:
    """What the summary kernel specialises on in ``logits`` (its dtype and alignment, its row count as Triton tells
    counts apart, its row stride), and that its rows are contiguous."""
    n = logits.shape[0]
    return (logits.dtype, logits.data_ptr() % 16 == 0, n == 1, n % 16 == 0, logits.stride(0), logits.stride(-1) == 1)


def draft_vocab(runner) -> Optional[int]:
    """The width of the draft's logits (its logits processor's vocabulary, else its ``lm_head`` rows), or None."""
    model = getattr(runner, "model", None)
    vocab = getattr(getattr(getattr(model, "logits_processor", None), "config", None), "vocab_size", None)
    if not isinstance(vocab, int):
        weight = getattr(getattr(model, "lm_head", None), "weight", None)
        vocab = int(weight.shape[0]) if isinstance(weight, torch.Tensor) else None
    return vocab
