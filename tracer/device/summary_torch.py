"""The Summarizer's per-op torch path: every device, and the fallback when the Triton path fails.
Its scratch is preallocated: a launch allocates only its gathers of the selected hidden rows and, unless they are
float32 and a multiple of the block wide, logits rows; it never synchronises with the host."""

from __future__ import annotations

import math
from typing import Optional

import torch

SUMS = ("sum", "nan", "nonfinite", "sumsq")  # per (row, chunk) sums as stored on the device, in this order


def pick_block(vocab: int, k: int) -> int:
    """Block width for the two-stage top-k: a divisor of ``vocab`` near 2 * sqrt(vocab / k) if any.

    Both stages then run top-k over a few hundred to a few thousand values per row, where
    ``torch.topk`` is fastest (measured in bench/gpu_summarize.py).
    """
    target = 2 * math.sqrt(vocab / k)
    divisors = [d for d in range(64, min(vocab, 8192) + 1) if vocab % d == 0]
    if divisors:
        return min(divisors, key=lambda d: abs(math.log(d / target)))
    return max(1, 1 << round(math.log2(target)))


class TorchPath:
    """Scratch and launches of the torch path for one Summarizer layout."""

    def __init__(self, *, max_rows: int, num_chunks: int, chunk_width: int, vocab_size: Optional[int],
                 topk: int, block: Optional[int], device: torch.device, gather: bool = False):
        R, K, dev = max_rows, num_chunks, device
        self.max_rows, self.num_chunks, self.chunk_width = max_rows, num_chunks, chunk_width
        self.vocab_size, self.topk = vocab_size, topk
        self.rows_c = torch.zeros(R, dtype=torch.int64, device=dev)
        # x, NaN mask, non-finite mask, x*x of the selected rows, reduced by one matrix-vector product.
        self.work = torch.zeros(len(SUMS), R * K, chunk_width, dtype=torch.float32, device=dev)
        self.ones = torch.ones(chunk_width, dtype=torch.float32, device=dev)
        split = max(d for d in range(1, math.isqrt(chunk_width) + 1) if chunk_width % d == 0)
        self.absmax_part = torch.zeros(R * K, split, dtype=torch.float32, device=dev)
        if vocab_size is None:
            return
        self.block = block or pick_block(vocab_size, topk)
        nb = -(-vocab_size // self.block)
        self.nb, self.kb = nb, min(topk, nb)
        self.lrows_c = torch.zeros(R, dtype=torch.int64, device=dev)
        self.lg = torch.full((R, nb * self.block), -math.inf, dtype=torch.float32, device=dev)  # the rows, fp32
        self.bmax = torch.zeros(R, nb, device=dev)
        self.bval = torch.zeros(R, self.kb, device=dev)
        self.bidx = torch.zeros(R, self.kb, dtype=torch.int64, device=dev)
        self.rmax = torch.zeros(R, 1, device=dev)
        self.rsum = torch.zeros(R, 1, device=dev)
        self.arange = torch.arange(self.block, dtype=torch.int64, device=dev)
        self.cand = torch.zeros(R, self.kb, self.block, dtype=torch.int64, device=dev)
        self.cval = torch.zeros(R, self.kb * self.block, device=dev)
        self.tval = torch.zeros(R, topk, device=dev)
        self.tpos = torch.zeros(R, topk, dtype=torch.int64, device=dev)

    def run(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor], out: dict,
            ints: Optional[tuple] = None, logit_rows: Optional[torch.Tensor] = None) -> None:
        """Write rows, statistics and top-k of the selected rows into ``out`` (the device views), and the verify's
        ``ints`` at them (see ``Summarizer.summarize``: ``logit_rows``, the logits' row of each selected row,
        default ``rows``)."""
        out["rows"].copy_(rows)
        torch.clamp(rows, 0, hidden.shape[0] - 1, out=self.rows_c)
        self._hidden_stats(hidden, out["sums"], out["absmax"])
        if self.vocab_size is not None:
            torch.clamp(rows if logit_rows is None else logit_rows, 0, logits.shape[0] - 1, out=self.lrows_c)
            self._topk(logits, out["topk_p"], out["topk_id"])
        if ints is not None:
            *tensors, n = ints
            at = [self.rows_c, self.rows_c, self.rows_c // n, self.rows_c // n]
            got = torch.stack([t.reshape(-1).index_select(0, i).long() for t, i in zip(tensors, at)], dim=1)
            out["ints"].copy_(torch.where((rows >= 0)[:, None], got, -1))

    def _hidden_stats(self, hidden: torch.Tensor, sums: torch.Tensor, absmax: torch.Tensor) -> None:
        """Sums, NaN/Inf counts and sums of squares in one fp32 ``mv``; absmax in two steps.

        Reductions over few long rows are slow on GPUs (few blocks); a matrix-vector product with
        a ones vector (cuBLAS gemv: fp32 FMA, never TF32) and a two-level max keep kernels wide.
        """
        R, K, H = self.max_rows, self.num_chunks, self.chunk_width
        w = self.work
        x = w[0]
        x.view(R, K * H).copy_(hidden[self.rows_c])
        torch.ne(x, x, out=w[1])
        torch.sub(x, x, out=w[2])  # 0 for finite x, NaN for +-inf and NaN
        torch.ne(w[2], 0, out=w[2])
        torch.mul(x, x, out=w[3])
        torch.mv(w.view(-1, H), self.ones, out=sums.view(-1))
        part = self.absmax_part
        torch.linalg.vector_norm(x.view(R * K, part.shape[1], -1), ord=math.inf, dim=-1, out=part)
        torch.amax(part, dim=-1, out=absmax.view(-1))

    def _topk(self, logits: torch.Tensor, probs: torch.Tensor, ids: torch.Tensor) -> None:
        """Two-stage top-k with exact softmax probabilities over the full row (the logits rows ``lrows_c``, in fp32
        in ``lg``, padded with -inf to a multiple of the block)."""
        R, B, k, V = self.max_rows, self.block, self.topk, self.vocab_size
        lg = self.lg
        if logits.dtype == torch.float32 and lg.shape[1] == V:
            torch.index_select(logits, 0, self.lrows_c, out=lg)
        else:
            lg[:, :V].copy_(logits.index_select(0, self.lrows_c))
            lg[:, V:].fill_(-math.inf)  # the last launch's exp left zeros there
        torch.amax(lg.view(R, self.nb, B), dim=-1, out=self.bmax)
        torch.topk(self.bmax, self.kb, dim=-1, sorted=False, out=(self.bval, self.bidx))
        torch.amax(self.bmax, dim=-1, keepdim=True, out=self.rmax)
        # Probabilities: exp(x - rowmax) over the row, normalised by its sum. Top-k is taken on
        # these exponentials (monotone in the logits), so no second exp is needed.
        torch.sub(lg, self.rmax, out=lg)
        torch.exp(lg, out=lg)
        torch.sum(lg, dim=-1, keepdim=True, out=self.rsum)
        torch.add(self.arange, self.bidx.unsqueeze(-1), alpha=B, out=self.cand)
        cand = self.cand.view(R, -1)
        torch.gather(lg, 1, cand, out=self.cval)
        torch.topk(self.cval, k, dim=-1, sorted=False, out=(self.tval, self.tpos))  # host sorts
        torch.gather(cand, 1, self.tpos, out=ids)
        torch.div(self.tval, self.rsum, out=probs)
