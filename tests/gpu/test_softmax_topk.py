"""softmax_topk on CUDA (the step tap's top-k inside SGLang's draft-decode graphs): the softmax-then-topk it
replaced, ties included (both fill a tie at the k-th value with the lowest ids on CUDA); a graph's replay
writes what an eager run writes; no host sync. Its GPU time against the old path: ``bench/gpu_softmax_topk.py``."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: runs on the H200 through testbed/gpu (docs/testbed.md)")]


def _old(x: torch.Tensor, k: int, out=None):
    return torch.topk(torch.softmax(x.float(), dim=-1), k, dim=-1, out=out)


def _rows(kind: str, n: int, V: int, dtype: torch.dtype) -> torch.Tensor:
    if kind == "random":
        x = torch.randn(n, V, device="cuda") * 4
    elif kind == "integer":  # ties everywhere, at the k-th value too
        x = torch.randint(-3, 4, (n, V), device="cuda").float()
    else:  # masked
        x = torch.randn(n, V, device="cuda") * 4
        x[torch.rand(n, V, device="cuda") < 0.7] = -torch.inf
    return x.to(dtype)


@pytest.mark.parametrize("V", (163840, 151936, 32000 + 7, 4096))
@pytest.mark.parametrize("n", (1, 64))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("kind", ("random", "integer", "masked"))
def test_the_same_entries_as_softmax_then_topk(V, n, dtype, kind):
    from draftscope_tracer.device.softmax_topk import softmax_topk

    torch.manual_seed(V + n)
    x = _rows(kind, n, V, dtype)
    for k in (1, 8, 20):
        probs, ids = softmax_topk(x, k)
        want = _old(x, k)
        assert probs.shape == ids.shape == (n, k)
        for r in range(n):
            assert set(ids[r].tolist()) == set(want.indices[r].tolist()), (k, r)
        exact = torch.softmax(x.double(), dim=-1).gather(1, ids).float()
        torch.testing.assert_close(probs, exact, rtol=1e-5, atol=1e-30)
        torch.testing.assert_close(probs.sort(-1).values, want.values.sort(-1).values, rtol=1e-4, atol=1e-30)


def _graphed(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up off the capture, as SGLang does
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


@pytest.mark.parametrize("n", (1, 4, 64))  # the two stages below 8 rows, the softmax then topk from there
@pytest.mark.parametrize("V", (163840, 151936))
def test_a_graph_replay_writes_what_an_eager_run_writes_and_nothing_syncs(V, n):
    from draftscope_tracer.device.softmax_topk import softmax_topk

    torch.manual_seed(0)
    logits = torch.randn(n, V, device="cuda", dtype=torch.bfloat16)
    rows = torch.zeros(n, dtype=torch.int64, device="cuda")
    probs, ids = torch.zeros(n, 20, device="cuda"), torch.zeros(n, 20, dtype=torch.int64, device="cuda")

    def write():
        softmax_topk(logits.index_select(0, rows.clamp(0, logits.shape[0] - 1)), 20, out=(probs, ids))

    graph = _graphed(write)
    for kind in ("random", "integer", "masked"):
        logits.copy_(_rows(kind, n, V, torch.bfloat16))
        rows.copy_(torch.randperm(n, device="cuda"))
        graph.replay()
        got = probs.clone(), ids.clone()
        torch.cuda.set_sync_debug_mode("error")
        try:
            write()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert torch.equal(got[1].sort(-1).values, ids.sort(-1).values), kind
        assert torch.equal(got[0].sort(-1).values, probs.sort(-1).values), kind
        want = _old(logits.index_select(0, rows), 20)
        assert all(set(ids[r].tolist()) == set(want.indices[r].tolist()) for r in range(n)), kind
