"""softmax_topk (the step tap's top-k) against the softmax-then-topk it replaced, on CPU tensors.

Exact ties at the k-th value: on CUDA both fill them with the lowest ids (tests/gpu/test_softmax_topk.py checks
that); on CPU ``torch.topk``'s choice among them is not specified, for the old path as for the new, so here a
row tied at the k-th value is checked for what is defined: the same probabilities, the same ids above the
k-th value, and the rest all at it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftscope_tracer.device.softmax_topk import DIRECT, SOFTMAX_ROWS, group_width, softmax_topk, two_stage
from draftscope_tracer.stats import draft_steps

VOCABS = (1000, 1024, 4096, 5000, 32000 + 7, 151936, 163840)


def _old(x: torch.Tensor, k: int):
    return torch.topk(torch.softmax(x.float(), dim=-1), k, dim=-1)


def _two_stage(x: torch.Tensor, k: int, width=None):
    """``two_stage`` (what ``softmax_topk`` takes for fewer than ``SOFTMAX_ROWS`` rows) on any number of rows."""
    out = torch.empty(x.shape[0], k, dtype=torch.float32), torch.empty(x.shape[0], k, dtype=torch.int64)
    return two_stage(x, k, out, width)


def _records(probs: torch.Tensor, ids: torch.Tensor) -> list:
    """What the tracer records of these rows: ``[(id, prob), ...]`` best first, ties by id (stats.draft_steps)."""
    return draft_steps([probs.numpy()[None], ids.numpy()[None], np.zeros((0, 0), np.int64)], (probs.shape[0], 1)
                       ).positions[0]


def _check(x: torch.Tensor, k: int, width=None) -> dict:
    """The two-stage top-k of ``x`` against the old path row by row; counts of the rows compared exactly (no tie at the
    k-th value) and of those tied there."""
    n, V = x.shape
    probs, ids = _two_stage(x, k, width)
    assert probs.shape == ids.shape == (n, k) and probs.dtype == torch.float32 and ids.dtype == torch.int64
    old_p, old_i = _old(x, k)
    exact = torch.softmax(x.double(), dim=-1)
    xf = x.float()
    kth = torch.topk(xf, k, dim=-1).values[:, -1:]  # the k-th largest logit: no tie order in it
    above, at = xf > kth, xf == kth
    counts = {"exact": 0, "tied": 0}
    new_rec, old_rec = _records(probs, ids), _records(old_p, old_i)
    for r in range(n):
        got, want = ids[r].tolist(), old_i[r].tolist()
        assert len(set(got)) == k and all(0 <= i < V for i in got), (r, got)
        torch.testing.assert_close(probs[r], exact[r, ids[r]].float(), rtol=1e-5, atol=1e-30)
        # the CPU softmax's own float32 sum is off by up to ~2e-5 at 163,840 wide (against float64)
        torch.testing.assert_close(probs[r].sort().values, old_p[r].sort().values, rtol=1e-4, atol=1e-30)
        if int(above[r].sum()) + int(at[r].sum()) == k:  # no tie at the k-th value: the same entries exactly
            assert set(got) == set(want)
            assert [i for i, _ in new_rec[r]] == [i for i, _ in old_rec[r]]
            counts["exact"] += 1
        else:
            strict = set(torch.nonzero(above[r]).flatten().tolist())
            assert strict <= set(got) and strict <= set(want)
            assert all(bool(at[r, i]) for i in set(got) - strict)
            counts["tied"] += 1
    return counts


@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("n", (1, 3, 64))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_random_rows_give_the_old_top_k(V, n, dtype):
    """Default widths, and a 256-wide first stage on the narrow vocabularies (their default is one topk)."""
    torch.manual_seed(V + n)
    x = (torch.randn(n, V) * 3).to(dtype)
    counts = {"exact": 0, "tied": 0}
    for width in (None, 256) if V <= DIRECT else (None,):
        for k in (1, 8, 20):
            for key, c in _check(x, k, width).items():
                counts[key] += c
    assert counts["exact"] > 0
    if dtype == torch.float32:  # float32 normal draws: no ties
        assert counts["tied"] == 0


@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_ties_inside_the_top_k_give_the_old_records(V, dtype):
    """Integer logits tied among the top k (not at its edge): the same records, ids and their order."""
    torch.manual_seed(V)
    n, k = 16, 20
    x = -torch.rand(n, V) * 5  # below every top entry
    for r in range(n):
        x[r, torch.randperm(V)[:k]] = torch.randint(1, 4, (k,)).float()  # values 1..3: many ties
    x = x.to(dtype)
    for width in (None, 256):
        assert _check(x, k, width) == {"exact": n, "tied": 0}


@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_ties_at_the_kth_value(V, dtype):
    torch.manual_seed(V + 1)
    x = torch.randint(-3, 4, (8, V)).to(dtype)
    for width in (None, 256):
        for k in (1, 8, 20):
            assert _check(x, k, width)["tied"] == 8


@pytest.mark.parametrize("V", VOCABS)
def test_rows_with_minus_infinity(V):
    """Masked entries (-inf) are never chosen while finite ones remain, and get probability 0 when a row has
    fewer than k finite ones; a row of -inf only gives NaN probabilities, as the softmax does."""
    torch.manual_seed(V + 2)
    n, k = 6, 20
    x = torch.randn(n, V) * 3
    x[:3][torch.rand(3, V) < 0.7] = -torch.inf
    x[3, 5:] = -torch.inf  # 5 finite entries
    x[4, :-3] = -torch.inf  # 3 finite entries, at the end (the tail group, when W does not divide V)
    x[5] = -torch.inf
    for width in (None, 256):
        assert _check(x[:3], k, width)["exact"] == 3
        probs, ids = _two_stage(x[3:], k, width)
        for r, finite in ((0, set(range(5))), (1, {V - 3, V - 2, V - 1})):
            got = ids[r].tolist()
            assert finite <= set(got) and len(set(got)) == k and all(0 <= i < V for i in got)
            torch.testing.assert_close(probs[r, :], torch.softmax(x[3 + r], -1)[ids[r]], rtol=1e-5, atol=0)
            assert (probs[r] > 0).sum() == len(finite)
        assert torch.isnan(probs[2]).all() and torch.isnan(_old(x[5:], k).values).all()
        assert ((ids[2] >= 0) & (ids[2] < V)).all()


def test_group_widths_fill_the_gpu_for_one_row():
    assert group_width(163840) == 1024 and 163840 // 1024 == 160
    assert group_width(151936) == 1024
    assert group_width(32000) == 256
    assert all(256 <= group_width(v) <= 1024 and group_width(v) & (group_width(v) - 1) == 0 for v in VOCABS)


@pytest.mark.parametrize("V", (1000, 163840))
def test_writes_into_strided_views(V):
    """The step tap passes ``[n, k]`` slices of its ``[steps, ROWS, k]`` buffers, and a k below theirs."""
    torch.manual_seed(3)
    x = torch.randn(5, V)
    probs, ids = torch.zeros(2, 8, 10), torch.full((2, 8, 10), -1, dtype=torch.int64)
    softmax_topk(x, 6, out=(probs[1, :5, :6], ids[1, :5, :6]))
    want = _old(x, 6)
    for r in range(5):
        assert set(ids[1, r, :6].tolist()) == set(want.indices[r].tolist())
    torch.testing.assert_close(probs[1, :5, :6].sort(-1).values, want.values.sort(-1).values, rtol=1e-4, atol=0)
    assert (ids[0] == -1).all() and (ids[1, 5:] == -1).all() and (ids[1, :, 6:] == -1).all()
    assert (probs[0] == 0).all() and (probs[1, :, 6:] == 0).all()


def test_few_rows_take_the_two_stages_and_more_the_softmax_then_topk():
    """``softmax_topk`` by the rows it is given: below ``SOFTMAX_ROWS`` the two stages, from there the old path itself
    (faster there on a GPU: bench/gpu_softmax_topk.py)."""
    torch.manual_seed(4)
    for n in (1, SOFTMAX_ROWS - 1, SOFTMAX_ROWS, 64):
        x = torch.randn(n, 163840) * 3
        probs, ids = softmax_topk(x, 8)
        if n < SOFTMAX_ROWS:
            want = _two_stage(x, 8)
            assert torch.equal(ids, want[1]) and torch.equal(probs, want[0])
        else:
            want = _old(x, 8)
            assert torch.equal(ids, want.indices) and torch.equal(probs, want.values)
