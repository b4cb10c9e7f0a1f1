"""The device-side summariser on CPU tensors, against plain float64 references."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftscope_tracer.device.summarize import Summarizer

K, H = 3, 64


def _ref_chunk(values: list[float]) -> dict:
    """Float64 loop reference for one row of one chunk (finite values only)."""
    n = len(values)
    mean = sum(values) / n
    return {"l2": math.sqrt(sum(v * v for v in values)), "mean": mean,
            "std": math.sqrt(sum((v - mean) ** 2 for v in values) / n),
            "absmax": max(abs(v) for v in values)}


def _hidden(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # Pre-norm residual streams: large magnitudes, a per-chunk offset, a few outliers.
    x = torch.randn(n, K * H, generator=g) * 40 + torch.arange(K).repeat_interleave(H) * 25.0
    x[:, 5] *= 30
    return x.to(torch.bfloat16)


def test_chunk_statistics_match_float64_reference():
    hidden = _hidden(10)
    rows = torch.tensor([7, 2, -1, 2, 9, -1], dtype=torch.int64)
    summ = Summarizer(max_rows=6, width=K * H, chunk_width=H)
    summary = summ.summarize(hidden, rows, tag="step-3").result()

    assert summary.tag == "step-3"
    assert [r.row for r in summary.rows] == [7, 2, 2, 9]  # padding left out, repeats kept
    for r in summary.rows:
        for c, got in enumerate(r.chunks):
            ref = _ref_chunk(hidden[r.row, c * H:(c + 1) * H].double().tolist())
            for key in ("l2", "mean", "std", "absmax"):
                assert getattr(got, key) == pytest.approx(ref[key], rel=1e-5, abs=1e-4), (r.row, c, key)
            assert (got.nan_count, got.inf_count, got.width) == (0, 0, H)


def test_sample_aggregates_rows_like_one_flat_tensor():
    hidden = _hidden(8, seed=1)
    summary = Summarizer(max_rows=4, width=K * H, chunk_width=H).summarize(
        hidden, torch.tensor([4, 5, 6, 7])).result()
    rec = summary.sample(chunk=1, rows=[0, 1, 2])
    block = hidden[4:7, H:2 * H].double()
    norms = block.norm(dim=1)
    assert rec["rows"] == 3 and rec["width"] == H
    assert rec["mean"] == pytest.approx(block.mean().item(), rel=1e-5)
    assert rec["std"] == pytest.approx(block.std(correction=0).item(), rel=1e-5)
    assert rec["l2_mean"] == pytest.approx(norms.mean().item(), rel=1e-5)
    assert rec["l2_max"] == pytest.approx(norms.max().item(), rel=1e-5)
    assert rec["absmax"] == pytest.approx(block.abs().max().item(), rel=1e-6)
    with pytest.raises(ValueError, match="at least one row"):
        summary.sample(chunk=0, rows=[])


def test_nan_and_inf_are_counted_per_chunk():
    hidden = _hidden(4, seed=2).float()
    hidden[1, 3] = hidden[1, 9] = math.nan           # chunk 0: 2 NaN
    hidden[1, H + 1] = math.inf                      # chunk 1: +inf and -inf
    hidden[1, H + 2] = -math.inf
    hidden[1, 2 * H] = math.nan                      # chunk 2: 1 NaN, 1 inf
    hidden[1, 2 * H + 7] = math.inf
    summary = Summarizer(max_rows=2, width=K * H, chunk_width=H).summarize(
        hidden, torch.tensor([1, 0])).result()
    bad, good = summary.rows
    assert [(c.nan_count, c.inf_count) for c in bad.chunks] == [(2, 0), (0, 2), (1, 1)]
    assert all((c.nan_count, c.inf_count) == (0, 0) for c in good.chunks)
    assert math.isnan(bad.chunks[0].mean) and bad.chunks[1].absmax == math.inf
    rec = summary.sample(chunk=1)
    assert (rec["nan_count"], rec["inf_count"], rec["mean"], rec["absmax"]) == (0, 2, None, None)
    assert summary.sample(chunk=1, rows=[1])["mean"] == pytest.approx(good.chunks[1].mean)


def _check_topk(logits: torch.Tensor, rows: list[int], k: int, block=None, exact_ids=True, backend="auto"):
    n, vocab = logits.shape
    summ = Summarizer(max_rows=len(rows), width=H, vocab_size=vocab, topk=k, block=block, backend=backend)
    summary = summ.summarize(torch.zeros(n, H), torch.tensor(rows), logits).result()
    for r in summary.rows:
        probs = torch.softmax(logits[r.row].double(), dim=-1)
        ref = torch.topk(logits[r.row], k)
        ids = [i for i, _ in r.topk]
        got_logits = logits[r.row, ids]
        assert torch.equal(got_logits, ref.values), "top-k values differ from torch.topk"
        if exact_ids:
            assert ids == ref.indices.tolist()
        assert len(set(ids)) == k
        for i, p in r.topk:
            assert p == pytest.approx(probs[i].item(), rel=1e-4)
    return summary


def test_two_stage_topk_matches_torch_topk_on_random_rows():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 4096, generator=g) * 5
    summary = _check_topk(logits, [0, 5, 2, -1], k=8, block=128)
    assert len(summary.rows) == 3


def test_topk_when_all_winners_sit_in_one_block():
    logits = torch.randn(2, 4096, generator=torch.Generator().manual_seed(4))
    logits[0, 1024:1032] = torch.arange(8, dtype=torch.float32) + 50   # all top-8 in block 8 of 128 wide
    logits[1, 4095] = 99.0                                             # max in the last element
    _check_topk(logits, [0, 1], k=8, block=128)


def test_topk_with_many_equal_values_returns_equal_values():
    logits = torch.zeros(2, 1024)
    logits[1, ::3] = 2.0                                               # 342 tied maxima
    summary = _check_topk(logits, [0, 1], k=8, block=64, exact_ids=False)
    assert all(p == pytest.approx(1 / 1024) for _, p in summary.rows[0].topk)
    assert all(i % 3 == 0 for i, _ in summary.rows[1].topk)


def test_topk_vocab_not_a_multiple_of_the_block():
    logits = torch.randn(3, 1001, generator=torch.Generator().manual_seed(5)) * 3
    logits[2, 1000] = 40.0                                             # max in the padded last block
    _check_topk(logits, [2, 0, 1], k=8, block=128)
    _check_topk(logits, [1], k=8)                                      # default block choice


def test_ring_reuse_is_counted_as_drops_not_blocking():
    hidden, rows = _hidden(2).float(), torch.tensor([0, 1])
    summ = Summarizer(max_rows=2, width=K * H, chunk_width=H, ring_size=2)
    first = summ.summarize(hidden, rows, tag=1)
    second = summ.summarize(hidden * 2, rows, tag=2)
    assert summ.summarize(hidden, rows) is None and summ.drops == 1   # both slots unread
    assert first.result().tag == 1
    third = summ.summarize(hidden * 3, rows, tag=3)                    # reuses first's slot
    assert third is not None and summ.drops == 1 and summ.launches == 3
    # second's slot was not overwritten by the third launch
    assert second.result().rows[0].chunks[0].mean == pytest.approx(2 * first.result().rows[0].chunks[0].mean)
    assert third.result().rows[0].chunks[0].mean == pytest.approx(3 * first.result().rows[0].chunks[0].mean)
    assert summ.publish(tag="again").result().tag == "again"          # slot of a read result is free
    unread = summ.summarize(hidden, rows)
    unread.release()
    unread.release()
    with pytest.raises(RuntimeError, match="released"):
        unread.result()
    assert summ.summarize(hidden, rows) is not None and summ.summarize(hidden, rows) is not None


@pytest.mark.parametrize("call, message", [
    (lambda s: s.summarize(torch.zeros(3, 2 * H), torch.tensor([0, 1])), r"hidden must be \[n>0, 192\]"),
    (lambda s: s.summarize(torch.zeros(3, K * H), torch.tensor([0, 1], dtype=torch.int32)), "rows must be int64"),
    (lambda s: s.summarize(torch.zeros(3, K * H), torch.tensor([0])), r"rows must be int64 \[2\]"),
    (lambda s: s.summarize(torch.zeros(3, K * H), torch.tensor([0, 1])), r"logits must be \[3, 100\], got None"),
    (lambda s: s.summarize(torch.zeros(3, K * H), torch.tensor([0, 1]), torch.zeros(5, 100)),
     r"logits must be \[3, 100\], got \[5, 100\]"),
    (lambda s: s.summarize(torch.zeros(3, K * H), torch.tensor([0, 1]), torch.zeros(3, 100, dtype=torch.float64)),
     "logits must be float32, bfloat16 or float16, got torch.float64"),
    (lambda s: s.summarize(torch.zeros(3, K * H), torch.tensor([0, 1]), torch.zeros(0, 100),
                           logit_rows=torch.tensor([0, 1])), r"logits must be \[n>0, 100\]"),
    (lambda s: s.summarize(torch.zeros(3, K * H), torch.tensor([0, 1]), torch.zeros(5, 100),
                           logit_rows=torch.tensor([4, 1], dtype=torch.int32)), r"logit_rows must be int64 \[2\]"),
    (lambda s: s.summarize(torch.zeros(3, K * H), torch.tensor([0, 1]), torch.zeros(5, 100),
                           logit_rows=torch.tensor([4])), r"logit_rows must be int64 \[2\] \(-1 where rows is\)"),
    (lambda s: s.summarize(torch.zeros(3, K * H), torch.tensor([0, 1]), torch.zeros(5, 100),
                           logit_rows=torch.tensor([[4, 1]])), r"logit_rows must be int64 \[2\]"),
])
def test_bad_inputs_name_what_is_wrong(call, message):
    summ = Summarizer(max_rows=2, width=K * H, chunk_width=H, vocab_size=100)
    with pytest.raises(ValueError, match=message):
        call(summ)
    assert summ.summarize(torch.zeros(3, K * H), torch.tensor([0, 1]), torch.zeros(3, 100)) is not None
    assert summ.summarize(torch.zeros(3, K * H), torch.tensor([0, 1]), torch.zeros(5, 100, dtype=torch.bfloat16),
                          logit_rows=torch.tensor([4, 1])) is not None
    with pytest.raises(ValueError, match="logit_rows given but the Summarizer was built without vocab_size"):
        Summarizer(max_rows=2, width=K * H, chunk_width=H).summarize(torch.zeros(3, K * H), torch.tensor([0, 1]),
                                                                      logit_rows=torch.tensor([0, 1]))


def test_bad_layout_is_refused():
    with pytest.raises(ValueError, match="chunk_width dividing width"):
        Summarizer(max_rows=2, width=100, chunk_width=30)
    with pytest.raises(ValueError, match="topk=8 must be between"):
        Summarizer(max_rows=2, width=4, vocab_size=5)


def test_triton_failure_falls_back_to_torch_and_is_counted():
    pytest.importorskip("triton")
    hidden, logits, rows = _hidden(3).float(), torch.randn(3, 500), torch.tensor([2, 0])
    # Triton cannot launch on CPU tensors outside its interpreter: the launch must still succeed.
    summ = Summarizer(max_rows=2, width=K * H, chunk_width=H, vocab_size=500, backend="triton")
    assert summ.backend == "triton"
    got = summ.summarize(hidden, rows, logits).result()
    assert (summ.backend, summ.fallbacks) == ("torch", 1) and summ.fallback_error
    want = Summarizer(max_rows=2, width=K * H, chunk_width=H, vocab_size=500, backend="torch").summarize(
        hidden, rows, logits).result()
    assert got.rows == want.rows
    summ.summarize(hidden, rows, logits).result()
    assert summ.fallbacks == 1                                          # disabled once, not retried


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend must be"):
        Summarizer(max_rows=2, width=4, backend="cuda")


def _assert_same(a, b, rel=1e-5):
    """Two decoded summaries agree: rows, ids exactly, statistics and probabilities to ``rel``."""
    assert [r.row for r in a.rows] == [r.row for r in b.rows]
    for ra, rb in zip(a.rows, b.rows):
        for ca, cb in zip(ra.chunks, rb.chunks):
            assert (ca.nan_count, ca.inf_count) == (cb.nan_count, cb.inf_count)
            for key in ("l2", "mean", "std", "absmax"):
                x, y = getattr(ca, key), getattr(cb, key)
                assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=rel, abs=1e-4), (ra.row, key)
        if ra.topk is not None:
            assert [i for i, _ in ra.topk] == [i for i, _ in rb.topk]
            assert [p for _, p in ra.topk] == pytest.approx([p for _, p in rb.topk], rel=rel)


def _triton_matches_torch() -> None:
    """Run under TRITON_INTERPRET=1: the Triton kernels (on CPU) against the torch path and float64."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    hidden = _hidden(10)
    logits = torch.randn(10, 3001, generator=torch.Generator().manual_seed(6)) * 3
    logits[2, 3000] = 40.0                                              # max in the padded last block
    rows = torch.tensor([7, 2, -1, 2, 9, -1])
    summ = {b: Summarizer(max_rows=6, width=K * H, chunk_width=H, vocab_size=3001, block=256, backend=b)
            for b in ("triton", "torch")}
    got, want = (summ[b].summarize(hidden, rows, logits, tag=b).result() for b in ("triton", "torch"))
    _assert_same(got, want)
    # a second launch of the same layout: each row's block tickets were reset by the first one's last block
    _assert_same(summ["triton"].summarize(hidden, rows.flip(0), logits).result(),
                 summ["torch"].summarize(hidden, rows.flip(0), logits).result())
    # publish's copy kernel (on CUDA where the ring is mapped; forced here) copies the device buffer out whole
    summ["triton"]._paths.copy_kernel = True
    summ["triton"].compute(hidden, rows, logits)
    _assert_same(summ["triton"].publish().result(), want)
    # padding rows after a launch that used them: marked -1 again, so a launch of one row reads one row
    one = summ["triton"].summarize(hidden, torch.tensor([3, -1, -1, -1, -1, -1]), logits).result()
    assert [r.row for r in one.rows] == [3]
    _assert_same(one, summ["torch"].summarize(hidden, torch.tensor([3, -1, -1, -1, -1, -1]), logits).result())
    for r in got.rows:
        for c, st in enumerate(r.chunks):
            ref = _ref_chunk(hidden[r.row, c * H:(c + 1) * H].double().tolist())
            assert st.l2 == pytest.approx(ref["l2"], rel=1e-5) and st.std == pytest.approx(ref["std"], rel=1e-5)

    bad = hidden.float()
    bad[1, 3] = bad[1, 2 * H] = math.nan
    bad[1, H + 1], bad[1, H + 2], bad[1, 2 * H + 7] = math.inf, -math.inf, math.inf
    got, want = (Summarizer(max_rows=2, width=K * H, chunk_width=H, backend=b).summarize(
        bad, torch.tensor([1, 0])).result() for b in ("triton", "torch"))
    _assert_same(got, want)
    assert [(c.nan_count, c.inf_count) for c in got.rows[0].chunks] == [(1, 0), (0, 2), (1, 1)]

    wide = torch.randn(2, 9000, generator=torch.Generator().manual_seed(7))   # chunk wider than one pass
    got, want = (Summarizer(max_rows=1, width=9000, backend=b).summarize(wide, torch.tensor([1])).result()
                 for b in ("triton", "torch"))
    _assert_same(got, want)

    lg = torch.randn(2, 4096, generator=torch.Generator().manual_seed(4))
    lg[0, 1024:1032] = torch.arange(8, dtype=torch.float32) + 50       # all top-8 in one block
    lg[1, 4095] = 99.0
    _check_topk(lg, [0, 1], k=8, block=128, backend="triton")
    _check_topk(lg, [1, 0], k=8, backend="triton")                      # default block
    _gathered_ints_match("triton")
    _logit_rows_match("triton")
    ties = torch.zeros(2, 1024)
    ties[1, ::3] = 2.0
    summary = _check_topk(ties, [0, 1], k=8, block=64, exact_ids=False, backend="triton")
    assert [i for i, _ in summary.rows[0].topk] == list(range(8))         # ties: smallest ids first
    assert [i for i, _ in summary.rows[1].topk] == list(range(0, 24, 3))


def _in_the_interpreter(check: str) -> None:
    """Run ``check`` (a function of this module) in a fresh process under ``TRITON_INTERPRET=1``: the interpreter is
    chosen when Triton is imported."""
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", f"import tests.tracer.test_summarize as t; t.{check}()"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_triton_kernels_match_torch_path_in_the_interpreter():
    _in_the_interpreter("_triton_matches_torch")


def _triton_split_rows_match() -> None:
    """Run under TRITON_INTERPRET=1: the summary kernel's split rows (hidden chunks in several slices, logits in
    chunks of groups ranked by their maxima) against float64 and torch.topk, where the ranking could go wrong."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    width = 3000                                                         # three slices of 1000 under a 1024 cap
    hidden = torch.randn(4, 2 * width, generator=torch.Generator().manual_seed(8)) * 20
    hidden[1, 2500] = math.nan                                          # chunk 0, last slice
    hidden[1, width + 1999] = math.inf                                  # chunk 1, middle slice
    hidden[2, width + 2999] = -7e4                                      # the absmax in chunk 1's last column
    logits = torch.randn(4, 2000, generator=torch.Generator().manual_seed(9))
    logits[0, 100:108] = 9.0                                            # tied winners: smallest ids first
    logits[0, 40] = 9.0
    logits[1, :] = -math.inf
    logits[1, [1999, 7, 1500]] = torch.tensor([3.0, 2.0, 1.0])           # three finite values, the rest -inf
    logits[2, 37:45] = torch.arange(8, dtype=torch.float32) + 20        # winners across two groups of 32
    logits[3, 1024:1536] = 5.0                                           # more tied maxima than groups picked
    rows = torch.tensor([0, 1, 2, 3, -1])
    summ = {b: Summarizer(max_rows=5, width=2 * width, chunk_width=width, vocab_size=2000, block=512, backend=b)
            for b in ("triton", "torch")}
    summ["triton"].triton_tuning.update(hidden_slice=1024, group=16)
    got, want = (summ[b].summarize(hidden, rows, logits).result() for b in ("triton", "torch"))
    assert [(c.nan_count, c.inf_count) for c in got.rows[1].chunks] == [(1, 0), (0, 1)]
    assert got.rows[2].chunks[1].absmax == 7e4
    for r in got.rows:
        for c, st in enumerate(r.chunks):
            if r.row != 1:
                ref = _ref_chunk(hidden[r.row, c * width:(c + 1) * width].double().tolist())
                for key in ("l2", "mean", "std", "absmax"):
                    assert getattr(st, key) == pytest.approx(ref[key], rel=1e-5), (r.row, c, key)
    for r in (got.rows[0], got.rows[2], got.rows[3]):
        probs = torch.softmax(logits[r.row].double(), -1)
        row = logits[r.row].tolist()
        assert [i for i, _ in r.topk] == sorted(range(2000), key=lambda i: (-row[i], i))[:8], r.row
        assert [p for _, p in r.topk] == pytest.approx([probs[i].item() for i, _ in r.topk], rel=1e-5)
    assert [i for i, _ in got.rows[0].topk] == [40, 100, 101, 102, 103, 104, 105, 106]
    assert [i for i, _ in got.rows[3].topk] == list(range(1024, 1032))
    assert [i for i, _ in got.rows[1].topk[:3]] == [1999, 7, 1500] and [p for _, p in got.rows[1].topk[3:]] == [0] * 5
    assert got.rows[1].topk[0][1] == pytest.approx(1 / (1 + math.exp(-1) + math.exp(-2)), rel=1e-6)
    for a, b in zip(got.rows, want.rows):                               # the statistics equal the torch path's
        assert [(c.nan_count, c.inf_count) for c in a.chunks] == [(c.nan_count, c.inf_count) for c in b.chunks]
        assert [c.absmax for c in a.chunks] == pytest.approx([c.absmax for c in b.chunks], nan_ok=True)

    small = torch.randn(3, 10, generator=torch.Generator().manual_seed(10))  # top-9 of 10, 5 of 10: k not a power of 2
    for k in (9, 5):
        got = Summarizer(max_rows=3, width=H, vocab_size=10, topk=k, backend="triton").summarize(
            torch.zeros(3, H), torch.tensor([2, 0, 1]), small).result()
        for r in got.rows:
            assert [i for i, _ in r.topk] == torch.topk(small[r.row], k).indices.tolist()


def test_split_rows_and_ranked_groups_match_references_in_the_interpreter():
    _in_the_interpreter("_triton_split_rows_match")


def _triton_row_merge_ranks_groups() -> None:
    """Run under TRITON_INTERPRET=1: each logits chunk hands on its best groups (by their maxima), and the row's last
    program ranks them across chunks and then their columns; torch.topk's order (value, then smaller id) whichever
    chunk and group the winners sit in, for k of and not of a power of 2, one chunk with fewer candidates than the
    ranking takes, and +-inf."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    vocab = 2000                                                         # 8 chunks of 256, groups of 16
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(11))
    tied = [1990, 1500, 700, 300, 299, 5, 1024, 1025, 1800, 260, 33]     # 11 tied in 10 groups of 7 chunks
    logits[0, tied] = 7.0
    logits[1, :] = -3.0                                                  # a tied row but for a few higher values
    logits[1, [1999, 1998, 16, 17, 18, 1040, 1041]] = torch.tensor([4.0, 4.0, 2.0, 4.0, 2.0, 4.0, 3.0])
    logits[2, 256:272] = torch.arange(16, dtype=torch.float32) + 30     # one group holds every winner
    logits[2, 1700] = 44.5                                               # but one, in another chunk
    logits[3, [3, 600, 1999]] = math.inf                                 # +inf ranks first, by id
    logits[3, 1000:1100] = -math.inf
    logits[4, :] = -math.inf
    logits[4, 1777] = 0.0                                                # one finite value
    logits[5, ::7] = 6.0                                                 # tied maxima in every group
    for k in (8, 5, 1):
        summ = {b: Summarizer(max_rows=6, width=H, vocab_size=vocab, topk=k, block=256, backend=b)
                for b in ("triton", "torch")}
        summ["triton"].triton_tuning.update(group=16)
        got, want = (summ[b].summarize(torch.zeros(6, H), torch.arange(6), logits).result() for b in ("triton", "torch"))
        for r, w in zip(got.rows, want.rows):
            row = logits[r.row].tolist()
            assert [i for i, _ in r.topk] == sorted(range(vocab), key=lambda i: (-row[i], i))[:k], (k, r.row)
            if r.row != 3:                                               # +inf: every probability NaN, in both paths
                assert [p for _, p in r.topk] == pytest.approx([p for _, p in w.topk], rel=1e-5), (k, r.row)
        assert all(math.isnan(p) for _, p in got.rows[3].topk) and all(math.isnan(p) for _, p in want.rows[3].topk)
    assert [i for i, _ in got.rows[0].topk] == [5]
    top = Summarizer(max_rows=6, width=H, vocab_size=vocab, block=256, backend="triton").summarize(
        torch.zeros(6, H), torch.arange(6), logits).result()
    assert [i for i, _ in top.rows[0].topk] == [5, 33, 260, 299, 300, 700, 1024, 1025]
    assert [i for i, _ in top.rows[1].topk] == [17, 1040, 1998, 1999, 1041, 16, 18, 0]
    assert [i for i, _ in top.rows[2].topk] == [271, 1700, 270, 269, 268, 267, 266, 265]
    assert [i for i, _ in top.rows[3].topk][:3] == [3, 600, 1999]
    assert [i for i, _ in top.rows[4].topk] == [1777, 0, 1, 2, 3, 4, 5, 6] and top.rows[4].topk[0][1] == 1.0
    small = torch.full((2, 10), -math.inf)                             # one chunk, 5 candidates for 8 places
    small[1, 9] = 1.0
    got = Summarizer(max_rows=2, width=H, vocab_size=10, topk=5, backend="triton").summarize(
        torch.zeros(2, H), torch.arange(2), small).result()
    assert [[i for i, _ in r.topk] for r in got.rows] == [[0, 1, 2, 3, 4], [9, 0, 1, 2, 3]]


def test_row_merge_ranks_groups_across_chunks_in_the_interpreter():
    _in_the_interpreter("_triton_row_merge_ranks_groups")


def _word_copy_copies_every_word() -> None:
    """Run under TRITON_INTERPRET=1: ``WordCopy`` (the step tap's read, a ring slot's copy-out) writes every word of
    its buffer, over a partial last block, and nothing past it."""
    from draftscope_tracer.device.summary_triton import WordCopy

    assert os.environ.get("TRITON_INTERPRET") == "1"
    words = 2 * WordCopy.BLOCK + 3
    src = torch.randint(0, 256, (words * 8,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    copy = WordCopy(src)
    for _ in range(2):  # the interpreter has no compiled kernel to plan: each copy goes through the JITFunction
        dst = torch.zeros(words * 8 + 16, dtype=torch.uint8)
        copy(dst, dst.data_ptr())
        assert torch.equal(dst[:words * 8], src) and not dst[words * 8:].any()


def test_word_copy_copies_every_word_in_the_interpreter():
    _in_the_interpreter("_word_copy_copies_every_word")


def _gathered_ints_match(backend: str) -> None:
    """A verify's token ids read at the summary's rows (``gather``): what indexing on the host gives, -1 for
    padding rows, from int32 and int64 tensors alike."""
    N, bs = 4, 5
    draft = torch.arange(100, 100 + bs * N, dtype=torch.int64)
    target = torch.arange(200, 200 + bs * N, dtype=torch.int32)
    seq = torch.tensor([31, 32, 33, 34, 35], dtype=torch.int64)
    acc = torch.tensor([1, 2, 3, 4, 1], dtype=torch.int32)
    hidden = _hidden(bs * N)[:, :H]
    logits = torch.randn(bs * N, 300, generator=torch.Generator().manual_seed(3))
    rows = torch.tensor([4, 5, 6, 7, 16, 17, 18, 19, -1, -1])
    summ = Summarizer(max_rows=10, width=H, vocab_size=300, backend=backend, gather=True)
    got = summ.summarize(hidden, rows, logits, ints=(draft, target, seq, acc, N)).result().ints
    want = [[int(draft[r]), int(target[r]), int(seq[r // N]), int(acc[r // N])] for r in rows[:8].tolist()]
    assert got == want


def _logit_rows_match(backend: str) -> None:
    """Logits read in place at rows of their own (``logit_rows``: more logits rows than hidden rows, in another
    order, -1 where ``rows`` pads), in float32, bfloat16 or float16, summarise exactly as today's launch on those
    rows gathered and made float32 first (the casts to float32 are exact): for a vocabulary a multiple of the
    block and one that is not, twice (the second launch reuses the first's compiled kernel and scratch)."""
    hidden = _hidden(6)
    rows = torch.tensor([4, 0, -1, 5, 2, 2, -1])
    at = torch.tensor([9, 3, -1, 0, 10, 10, -1])
    for vocab in (3001, 2048):
        logits = torch.randn(11, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
        logits[9, vocab - 1] = 40.0                                      # max in the last column
        summ = Summarizer(max_rows=7, width=K * H, chunk_width=H, vocab_size=vocab, block=256, backend=backend)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            lg = logits.to(dtype)
            gathered = torch.zeros(6, vocab)
            gathered[rows[rows >= 0]] = lg[at[at >= 0]].float()
            want = summ.summarize(hidden, rows, gathered).result()
            for _ in range(2):
                got = summ.summarize(hidden, rows, lg, logit_rows=at).result()
                assert got.rows == want.rows, (backend, vocab, dtype)
            assert [i for i, _ in got.rows[0].topk][0] == int(lg[9].float().argmax()) == vocab - 1
    assert summ.backend == backend and summ.fallbacks == 0


def test_logits_are_read_in_place_at_rows_of_their_own():
    _logit_rows_match("torch")


def test_a_verify_summary_gathers_its_token_ids():
    _gathered_ints_match("torch")
    with pytest.raises(ValueError, match="ints missing"):
        Summarizer(max_rows=2, width=H, vocab_size=300, gather=True).summarize(
            _hidden(2)[:, :H], torch.tensor([0, 1]), torch.randn(2, 300))


def test_ring_slots_give_kernels_their_fields_at_one_alignment():
    """A kernel writes a slot through ``Ring.outputs``: each field's address is its view's, and sits at the same
    16-byte alignment in every slot (Triton compiles a kernel for the alignment it first saw)."""
    from draftscope_tracer.device.summary_ring import Layout, Ring

    layout = Layout(8, K, 100, 8, gather=True)
    ring = Ring(layout, 5, torch.device("cpu"), H)
    first = ring.outputs(0)
    for slot in range(5):
        out, views = ring.outputs(slot), ring.views(slot)
        assert out.views is views
        assert out.head == tuple(views[n].data_ptr() for n in ("rows", "sums", "absmax"))
        assert out.topk == (views["topk_p"].data_ptr(), views["topk_id"].data_ptr())
        assert out.ints == views["ints"].data_ptr()
        assert [a % 16 for a in (*out.head, *out.topk, out.ints)] == \
            [a % 16 for a in (*first.head, *first.topk, first.ints)]
    assert Ring(layout, 2, torch.device("cpu"), H, direct=False).outputs(0) is None
    assert Layout(8, K, None, 8).outputs(torch.zeros(Layout(8, K, None, 8).nbytes, dtype=torch.uint8)).topk is None


def test_a_launch_plan_is_keyed_by_everything_its_arguments_come_from():
    """``Summaries._plan_key``: a launch reuses a plan only for the same tensors (address, shape, strides, dtype),
    rows, logits rows and chunk width; logits of any dtype are read as they are, so every launch can be planned."""
    from draftscope_tracer.device.summaries import Summaries

    key = Summaries._plan_key
    h, lg = torch.zeros(8, 2 * H), torch.zeros(8, 50)
    ints = (torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int32), torch.zeros(2), torch.zeros(2), 4)
    base = key(h, [0, 1], H, lg, ints, None)
    assert base == key(h, range(2), H, lg, ints, None)
    assert key(h, [0, 1], H, lg, ints, [3, 2]) == key(h, [0, 1], H, lg, ints, range(3, 1, -1))
    others = [key(h, [1, 0], H, lg, ints, None), key(h[:4], [0, 1], H, lg, ints, None),
              key(h, [0, 1], 2 * H, lg, ints, None), key(h.view(16, H), [0, 1], H, lg, ints, None),
              key(h.to(torch.bfloat16), [0, 1], H, lg, ints, None), key(h, [0, 1], H, lg[:, :25], ints, None),
              key(h, [0, 1], H, None, ints, None), key(h, [0, 1], H, lg, None, None),
              key(h, [0, 1], H, lg, (*ints[:4], 2), None), key(h, [0, 1], H, lg, (ints[1], ints[0], *ints[2:]), None),
              key(h.t().contiguous().t(), [0, 1], H, lg, ints, None),
              key(h, [0, 1], H, lg.view(torch.int32), ints, None),
              key(h, [0, 1], H, lg, ints, [0, 1]), key(h, [0, 1], H, lg, ints, [3, 2])]
    assert all(k is not None and k != base for k in others)
    assert len(set(others)) == len(others)


@pytest.mark.parametrize("stamps", [False, True])
def test_the_summary_kernel_compiles_for_hopper(stamps):
    """The summary kernel at Kimi-K2.5 widths, built for sm_90 by Triton's own compiler and ptxas (no GPU needed):
    in service, and as bench/gpu_summary_stages.py runs it, where each program reads the SM's clocks (its timer
    and cycle counter) and in service it reads neither."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from draftscope_tracer.device import summary_triton

    path = summary_triton.TritonPath(max_rows=4, num_chunks=3, chunk_width=7168, vocab_size=163_840, topk=8,
                                     block=None, device=torch.device("cpu"), gather=True)
    names = summary_triton._summary_kernel.arg_names
    values = dict(zip(names[-11:], (*path.geometry()[2], True, stamps)))  # BLOCK_HS ... NC_P2, GATHER, STAMPS
    pointers = {"hidden": "*bf16", "logits": "*bf16", "tickets": "*i32", "ia": "*i32", "ib": "*i32", "iseq": "*i32",
                "iacc": "*i32", "sums": "*fp32", "absmax": "*fp32", "hpart": "*fp32", "bmax": "*fp32",
                "bsum": "*fp32", "topk_p": "*fp32"}
    ints = {"rows", "logit_rows", "rows_out", "keys", "topk_id", "ints_out", "stamps"}
    signature = {n: "constexpr" if n in values else pointers.get(n, "*i64" if n in ints else "i32") for n in names}
    source = ASTSource(fn=summary_triton._summary_kernel, signature=signature,
                       constexprs={(names.index(n),): v for n, v in values.items()})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    assert ("%clock64" in ptx, "%globaltimer" in ptx) == (stamps, stamps)
