"""The top-k of a softmax over long rows without the softmax: :func:`softmax_topk`.

Why: the step tap (``steptap.StepTap._write``) takes the draft's softmax top-k inside every CUDA-graph replay
of SGLang's draft-decode loop. Done as ``torch.topk(torch.softmax(x.float(), -1), k)`` it cost ~100 µs of GPU
per verify step on an H100 at Kimi-K2.5 widths (vocabulary 163,840, batch 1): the softmax kernel (~19 µs)
writes the whole row, and ``torch.topk`` over one long row takes torch's multi-block radix path (the
``mbtopk::*`` kernels, a cub scan, ``gatherTopK``, ``bitonicSortKVInPlace``: ~83 µs).

With few rows (fewer than ``SOFTMAX_ROWS``: a decode batch of 1 to 7 requests, where it cut the step tap's time
to 55-63%) the top-k is taken on the logits (softmax is monotonic) in two stages: ``topk`` within groups of ``W``
columns (one short row per group: torch's single-block path, and one row makes ``V / W`` blocks), then
``topk`` over the groups' candidates; a vocabulary ``W`` does not divide has its tail (fewer than ``W``
columns) take its own small ``topk``, whose candidates join the second stage. Only the chosen entries get a
probability, ``exp(x - max) / sum(exp(x - max))`` with the sum over the full row in float32; no softmax row is
written. Plain torch operations on device tensors, shapes from host ints only: no host sync, no decision on
data, so it can be captured into a CUDA graph (``tests/gpu/test_softmax_topk.py`` checks a graph's replay
against eager runs and against softmax-then-topk on a GPU; ``bench/gpu_softmax_topk.py`` times both). Kernels: 11 for a float32 row that
``W`` divides (two topk, a gather, a div and an add for the ids; the max of the k values, a sub, an exp and a
sum over the row, a gather and a div for the probabilities), 3 more for a tail (its topk, two cats), 1 more
for other dtypes (the max as float32); 7 for a row up to ``DIRECT`` wide.

Ties: on CUDA, ``topk(sorted=False)`` writes the values above the k-th in index order and then the values
equal to it in index order, lowest first; the groups' candidates are laid out in group order, so the second
stage, too, fills a tie at the k-th value with the lowest ids, as ``torch.topk`` on the whole row does (the
results are read sorted by (-prob, id): ``stats.draft_steps``). On CPU, ``torch.topk``'s choice among ties at
the k-th value is not specified, here as before. One difference from a top-k of the probabilities:
distinct logits whose float32 probabilities round to the same value (e.g. both underflow to 0, more than
~103 below the row's max) are chosen by logit here, by id there; their probabilities are equal either way.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

DIRECT = 4096  # rows up to this wide take one topk (a single block); wider ones two stages
# From this many rows on, a softmax then ``torch.topk`` (the rows fill the GPU): bench/gpu_softmax_topk.py on an H100
# at vocabularies 163,840 and 151,936, top-8, the two-stage path's time over the old one's: 0.55-0.63 at 1 row,
# 0.97-1.10 at 8, 1.37-1.57 at 64 (2 to 7 rows not measured)
SOFTMAX_ROWS = 8


def group_width(vocab: int) -> int:
    """Columns per first-stage group: a power of two in [256, 1024] that leaves ~128 or more groups, enough
    blocks to fill an H100 (132 SMs) for one row (163,840 -> 1024: 160 groups; 32,000 -> 256: 125)."""
    w = 1 << max(vocab // 128, 1).bit_length() - 1
    return min(1024, max(256, w))


def softmax_topk(x: torch.Tensor, k: int, out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``x`` ``[n, V]`` (any float dtype): the ``k`` largest softmax probabilities (float32) and
    their ids (int64), written into ``out`` = ``(probs, ids)`` (``[n, k]`` views are fine) or new tensors;
    returns them. Fewer than ``SOFTMAX_ROWS`` rows: :func:`two_stage` (entries in no particular order); more: a
    softmax then ``torch.topk``."""
    n = x.shape[0]
    if out is None:
        out = (torch.empty(n, k, dtype=torch.float32, device=x.device),
               torch.empty(n, k, dtype=torch.int64, device=x.device))
    if n < SOFTMAX_ROWS:
        return two_stage(x, k, out)
    torch.topk(torch.softmax(x.float(), dim=-1), k, dim=-1, out=out)
    return out


def two_stage(x: torch.Tensor, k: int, out: Tuple[torch.Tensor, torch.Tensor], width: Optional[int] = None
              ) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`softmax_topk` of few rows: the top-k of the logits in two stages, the probabilities of the chosen
    entries only (this module's docstring), unsorted. ``width``: the first stage's group width (default
    :func:`group_width`; tests force small ones)."""
    n, V = x.shape
    probs, ids = out
    W = width or group_width(V)
    if V <= DIRECT or V < 2 * W or k >= W:
        vals = torch.topk(x, k, dim=-1, sorted=False, out=(x.new_empty(n, k), ids))[0]
    else:
        G = V // W
        cv, ci = torch.topk(x[:, :G * W].view(n, G, W), k, dim=-1, sorted=False)  # [n, G, k]: ids in each group
        cv, ci = cv.view(n, G * k), ci.view(n, G * k)
        if V > G * W:  # the tail's candidates, ids from G * W: "group" G
            tv, ti = torch.topk(x[:, G * W:], min(k, V - G * W), dim=-1, sorted=False)
            cv, ci = torch.cat([cv, tv], dim=1), torch.cat([ci, ti], dim=1)
        vals, pos = torch.topk(cv, k, dim=-1, sorted=False)
        # candidate p is group p // k's: its id is that group's first column + its id within the group
        torch.add(ci.gather(1, pos), torch.div(pos, k, rounding_mode="floor"), alpha=W, out=ids)
    rowmax = vals.amax(dim=-1, keepdim=True).float()  # the row's max is among its top k
    e = torch.sub(x, rowmax)  # float32 (type promotion) whatever x's dtype
    e.exp_()
    torch.div(e.gather(1, ids), e.sum(dim=-1, keepdim=True), out=probs)
    return probs, ids
