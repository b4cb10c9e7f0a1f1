"""CPU tensors are copied in the hook and reduced in the recorder (host_rows); the results equal the device
summariser's, also after crossing to the recorder by pickle."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from draftscope_tracer.health import Health
from draftscope_tracer.device.host_reduce import host_rows
from draftscope_tracer.stats import DeviceBytes, RowCopies
from draftscope_tracer.device.summaries import Summaries
from draftscope_tracer.device.summarize import Summarizer


def _adversarial_hidden() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    h = torch.randn(12, 3 * 16, generator=g) * 4
    h[2, 3] = h[2, 5] = math.nan  # chunk 0 of row 2: two NaN
    h[2, 17] = math.inf           # chunk 1: +inf and -inf
    h[2, 18] = -math.inf
    h[5, 40] = math.inf           # chunk 2 of row 5: one inf
    return h


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-5, abs=1e-6)


def test_host_rows_equal_the_summarizer_torch_path():
    h = _adversarial_hidden()
    logits = torch.randn(12, 300, generator=torch.Generator().manual_seed(8)) * 3
    rows = [5, 2, 0, 11]
    host = pickle.loads(pickle.dumps(host_rows(h, rows, chunk_width=16, logits=logits, topk=5))).result()
    launched = Summarizer(max_rows=8, width=48, chunk_width=16, vocab_size=300, topk=5).summarize(
        h, torch.tensor(rows + [-1] * 4), logits)
    crossed = pickle.loads(pickle.dumps(launched))  # a device launch crosses as its bytes, decoded there
    assert isinstance(crossed, DeviceBytes)
    dev = crossed.result()
    assert [r.row for r in host.rows] == [r.row for r in dev.rows] == rows
    for hr, dr in zip(host.rows, dev.rows):
        assert [i for i, _ in hr.topk] == [i for i, _ in dr.topk]
        assert all(_same(p, q) for (_, p), (_, q) in zip(hr.topk, dr.topk))
        for hc, dc in zip(hr.chunks, dr.chunks):
            assert (hc.nan_count, hc.inf_count, hc.width) == (dc.nan_count, dc.inf_count, dc.width)
            for field in ("l2", "mean", "std", "absmax"):
                assert _same(getattr(hc, field), getattr(dc, field)), (hr.row, field)
    assert [(c.nan_count, c.inf_count) for c in host.rows[1].chunks] == [(2, 0), (0, 2), (0, 0)]


def test_host_rows_copy_the_rows_at_launch():
    """SGLang reuses its buffers: what was launched is what is summarised, whatever happens later."""
    h = torch.ones(4, 8)
    pending = host_rows(h, torch.tensor([1, 3]), chunk_width=8, logits=None, topk=8)
    h.fill_(100.0)
    s = pending.result()
    assert [c.mean for r in s.rows for c in r.chunks] == [1.0, 1.0] and s.rows[0].topk is None
    assert pending.result() is s


def test_released_host_rows_refuse_to_be_read():
    pending = host_rows(torch.ones(2, 4), [0], chunk_width=4, logits=None, topk=1)
    pending.release()
    with pytest.raises(RuntimeError, match="released"):
        pending.result()
    with pytest.raises(RuntimeError, match="released"):  # nor sent to the recorder
        pickle.dumps(pending)


def test_bf16_rows_and_draft_logits_that_are_the_hidden_tensor():
    logits = (torch.randn(3, 40, generator=torch.Generator().manual_seed(9)) * 2).to(torch.bfloat16)
    s = host_rows(logits, [2], chunk_width=40, logits=logits, topk=3).result()
    probs = torch.softmax(logits[2].float(), -1).tolist()
    best = sorted(range(40), key=lambda i: (-probs[i], i))[:3]  # bf16 has ties: best first, then by id
    assert [i for i, _ in s.rows[0].topk] == best
    assert [p for _, p in s.rows[0].topk] == pytest.approx([probs[i] for i in best], rel=1e-6)
    assert s.rows[0].chunks[0].mean == pytest.approx(logits[2].float().mean().item(), rel=1e-6)


@pytest.mark.parametrize("reduce, kind", [("auto", RowCopies), ("device", None)])
def test_summaries_choose_where_cpu_tensors_are_reduced(reduce, kind):
    out = Summaries(Health(), topk=4, reduce=reduce).launch(torch.randn(6, 8), [1, 2])
    assert isinstance(out, RowCopies) if kind else not isinstance(out, RowCopies)
    assert [r.row for r in out.result().rows] == [1, 2]


@pytest.mark.parametrize("reduce", ["auto", "device"])
def test_summaries_read_logits_at_rows_of_their_own(reduce):
    """``Summaries.launch(..., logit_rows=...)``: the logits (bf16, more rows than hidden) are read at each row's own
    logits row, on the host (``host_rows``) as through the Summarizer, and give what the rows gathered and made
    float32 give; a logits-only launch (hidden = logits) reads its rows of them, as the vLLM hooks' aux-less one."""
    h = torch.randn(12, 3 * 16, generator=torch.Generator().manual_seed(10))
    logits = (torch.randn(20, 300, generator=torch.Generator().manual_seed(9)) * 3).to(torch.bfloat16)
    rows, at = [5, 2, 0, 11], [17, 3, 19, 0]
    s = Summaries(Health(), topk=4, reduce=reduce)
    got = s.launch(h, rows, chunk_width=16, logits=logits, logit_rows=at).result()
    gathered = torch.zeros(12, 300)
    gathered[rows] = logits[at].float()
    want = s.launch(h, rows, chunk_width=16, logits=gathered).result()
    assert [r.row for r in got.rows] == rows and got.rows == want.rows
    alone = s.launch(logits, at, chunk_width=300, logits=logits, stats=False).result()
    assert [r.topk for r in alone.rows] == [r.topk for r in got.rows]


def test_unknown_reduce_mode_is_refused():
    with pytest.raises(ValueError, match="reduce must be one of"):
        Summaries(Health(), topk=4, reduce="gpu")


def test_top_k_only_rows_carry_no_statistics():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 1.0, 0.0, 0.0]])
    s = host_rows(logits, [0, 1], chunk_width=4, logits=logits, topk=2, stats=False).result()
    assert [r.chunks for r in s.rows] == [[], []]
    assert [[i for i, _ in r.topk] for r in s.rows] == [[1, 3], [0, 1]]  # ties: smaller id first
