"""StepTap on CPU tensors: what the draft-decode loop's steps write, read back per sampled row."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

from draftscope_tracer.device import steptap
from draftscope_tracer.device.steptap import StepTap

STEPS, BS, V = 3, 5, 40


class _Mode:
    def __init__(self, decode: bool):
        self.decode = decode

    def is_decode(self) -> bool:
        return self.decode


def _worker(logits_per_step):
    """A draft worker whose loop runs ``STEPS - 1`` decode forwards, returning ``logits_per_step`` in turn."""
    worker = SimpleNamespace(speculative_num_steps=STEPS, speculative_num_draft_tokens=STEPS + 1, topk=1, device="cpu")
    state = {"step": 0}

    def forward(forward_batch):
        decode = forward_batch.forward_mode.is_decode()
        logits = logits_per_step[state["step"]] if decode else torch.zeros(BS, V)
        state["step"] += decode
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits))

    def draft_forward(forward_batch):
        state["step"] = 0
        for _ in range(STEPS - 1):
            worker.draft_runner.forward(forward_batch)

    worker.draft_runner, worker.draft_forward = SimpleNamespace(forward=forward), draft_forward
    return worker


def _guard(errors):
    def guard(probe, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - the tracer's guard counts, never raises
            errors.append((probe, exc))
    return guard


def test_each_step_top_k_at_the_selected_rows():
    torch.manual_seed(0)
    logits = [torch.randn(BS, V) for _ in range(STEPS - 1)]
    errors = []
    w = _worker(logits)
    tap = StepTap(w, 3, _guard(errors))
    assert tap.select([4, 1]) == 2
    w.draft_forward(SimpleNamespace(forward_mode=_Mode(True)))
    got = pickle.loads(pickle.dumps(tap.read(2))).result().positions
    assert not errors and len(got) == STEPS - 1
    for step, lg in enumerate(logits):
        for j, row in enumerate([4, 1]):
            probs = torch.softmax(lg[row], -1)
            want = torch.topk(probs, 3)
            assert [i for i, _ in got[step][j]] == want.indices.tolist()
            # the probabilities of the chosen entries only (softmax_topk), to float32 rounding
            assert [p for _, p in got[step][j]] == pytest.approx(want.values.tolist(), rel=1e-5)


def test_only_draft_decode_forwards_count_and_an_unarmed_loop_writes_nothing():
    logits = [torch.zeros(BS, V) for _ in range(STEPS - 1)]
    logits[0][2, 7] = 9.0
    w = _worker(logits)
    tap = StepTap(w, 2, _guard([]))
    w.draft_forward(SimpleNamespace(forward_mode=_Mode(True)))  # not selected: no work, buffers untouched
    assert (tap.ids == -1).all()
    tap.select([2])
    w.draft_runner.forward(SimpleNamespace(forward_mode=_Mode(False)))  # a draft extend: not a step
    w.draft_forward(SimpleNamespace(forward_mode=_Mode(True)))
    assert tap.read(1).result().positions[0][0][0][0] == 7


def test_more_rows_than_the_tap_holds_are_cut():
    w = _worker([torch.zeros(BS, V)])
    tap = StepTap(w, 2, _guard([]))
    assert tap.select(list(range(steptap.ROWS + 3))) == steptap.ROWS


def test_rows_left_from_a_larger_batch_are_clamped_to_the_batch():
    """A draft-decode graph replays for every batch of its size, armed or not, with whatever the row buffer
    holds: rows of an earlier, larger batch must not index past this one's logits (on a GPU that is a
    device-side assert, which kills the server; seen on the H200 with the Kimi-shaped server at 1 in 16)."""
    errors = []
    w = _worker([torch.randn(2, V) for _ in range(STEPS - 1)])  # this batch: 2 requests
    tap = StepTap(w, 3, _guard(errors))
    assert tap.select([4]) == 1  # row 4 of an earlier batch of 5
    w.draft_forward(SimpleNamespace(forward_mode=_Mode(True)))
    assert errors == []
    assert len(tap.read(1).result().positions) == STEPS - 1


def _tree_worker(logits_per_step, outputs, branches: int):
    """A tree-drafting worker (``branches`` rows per request in each draft forward) whose ``draft_forward``
    returns ``outputs`` = (parent_list, top_scores_index) as SGLang's does, first."""
    worker = SimpleNamespace(speculative_num_steps=STEPS, speculative_num_draft_tokens=outputs[1].shape[1] + 1,
                             topk=branches, device="cpu")
    state = {"step": 0}

    def forward(forward_batch):
        logits = logits_per_step[state["step"]]
        state["step"] += 1
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits))

    def draft_forward(forward_batch):
        state["step"] = 0
        for _ in range(STEPS - 1):
            worker.draft_runner.forward(forward_batch)
        return (*outputs, None, None)

    worker.draft_runner, worker.draft_forward = SimpleNamespace(forward=forward), draft_forward
    return worker


def test_a_tree_reads_every_branch_row_and_the_chosen_nodes_of_each_selected_request():
    """topk 2: request r's branches are rows 2r, 2r+1 of each draft forward; the read also holds each selected
    request's top_scores_index and parent_list, the ints records.draft_tree turns into nodes."""
    torch.manual_seed(1)
    bs, b = 3, 2
    logits = [torch.randn(bs * b, V) for _ in range(STEPS - 1)]
    parents = torch.tensor([[-1, 0, 1, 2, 5], [-1, 0, 1, 3, 4], [-1, 0, 1, 2, 3]])
    chosen = torch.tensor([[0, 2, 6], [1, 4, 8], [0, 1, 3]])
    errors = []
    w = _tree_worker(logits, (parents, chosen), b)
    tap = StepTap(w, 3, _guard(errors))
    assert tap.requests == steptap.ROWS // b
    assert tap.select([2, 0]) == 2
    w.draft_forward(SimpleNamespace(forward_mode=_Mode(True)))
    got = pickle.loads(pickle.dumps(tap.read(2))).result()
    assert not errors and got.branches == b
    assert got.tree == [chosen[2].tolist() + parents[2].tolist(), chosen[0].tolist() + parents[0].tolist()]
    for step, lg in enumerate(logits):
        for j, req in enumerate([2, 0]):
            for branch in range(b):
                want = torch.topk(torch.softmax(lg[req * b + branch], -1), 3)
                assert [i for i, _ in got.positions[step][j * b + branch]] == want.indices.tolist()


def test_a_tree_draft_forward_unselected_writes_nothing():
    w = _tree_worker([torch.randn(2, V)] * (STEPS - 1), (torch.zeros(1, 5, dtype=torch.long),
                                                         torch.ones(1, 3, dtype=torch.long)), 2)
    tap = StepTap(w, 2, _guard([]))
    w.draft_forward(SimpleNamespace(forward_mode=_Mode(True)))
    assert (tap.tree == 0).all() and (tap.ids == -1).all()


def test_a_small_batch_reads_only_its_own_rows():
    """A graph captured for a batch of 2 gathers 2 rows, not ``ROWS``: the tap's always-on cost follows the
    batch (the slots past it keep what they held and are never read)."""
    w = _worker([torch.randn(2, V) for _ in range(STEPS - 1)])
    tap = StepTap(w, 3, _guard([]))
    tap.select([1])
    w.draft_forward(SimpleNamespace(forward_mode=_Mode(True)))
    assert (tap.ids[:, 2:] == -1).all() and (tap.ids[:, :2] >= 0).all()
    assert len(tap.read(1).result().positions[0]) == 1


def test_a_kimi_wide_vocabulary_reads_the_softmax_top_k():
    """At 163,840 logits (Kimi-K2.5's draft) the top-k takes two stages (softmax_topk): the same entries as the
    softmax then topk of before, bf16 logits included (their top 12 distinct: CPU topk's choice among ties at
    the k-th value is not specified, see test_softmax_topk.py)."""
    torch.manual_seed(2)
    for dtype in (torch.float32, torch.bfloat16):
        logits = [torch.randn(BS, 163840) * 4 for _ in range(STEPS - 1)]
        for lg in logits:
            for row in range(BS):
                lg[row, torch.randperm(163840)[:12]] = 20 + torch.arange(12) * 0.5  # above the rest, exact in bf16
        logits = [lg.to(dtype) for lg in logits]
        errors = []
        w = _worker(logits)
        tap = StepTap(w, 8, _guard(errors))
        tap.select([3, 0])
        w.draft_forward(SimpleNamespace(forward_mode=_Mode(True)))
        got = tap.read(2).result().positions
        assert not errors and len(got) == STEPS - 1
        for step, lg in enumerate(logits):
            for j, row in enumerate([3, 0]):
                want = torch.topk(torch.softmax(lg[row].float(), -1), 8)
                assert len(got[step][j]) == 8
                assert {i for i, _ in got[step][j]} == set(want.indices.tolist())
                assert sorted(p for _, p in got[step][j]) == pytest.approx(sorted(want.values.tolist()), rel=1e-4)


def test_no_rows_selected_sets_the_buffer_back_to_unused_and_does_not_arm():
    """Unused slots hold -1 (the summary kernel skips them); selecting no rows puts them all back, so the draft
    graphs' replays read nothing while no request is sampled, and the eager loop does no work."""
    logits = [torch.randn(BS, V) for _ in range(STEPS - 1)]
    w = _worker(logits)
    tap = StepTap(w, 2, _guard([]))
    assert (tap.rows == -1).all()
    assert tap.select([3, 1]) == 2 and tap.armed and tap.rows[:3].tolist() == [3, 1, -1]
    tap.read(2).release()
    assert tap.select([]) == 0 and not tap.armed and (tap.rows == -1).all()
    assert tap.select([]) == 0 and not tap.armed  # already unused: no copy
    w.draft_forward(SimpleNamespace(forward_mode=_Mode(True)))
    assert (tap.ids == -1).all()  # not armed: nothing written


def _kernel_reads_the_selected_rows() -> None:
    """Run under TRITON_INTERPRET=1: the tap's top-k by the summary kernel (``TapTopk``) gives the softmax top-k
    of the selected rows, best first; a replay with no row selected writes nothing; logits it was not compiled
    for take ``softmax_topk``."""
    import os

    from draftscope_tracer.device.tap_topk import TapTopk

    assert os.environ.get("TRITON_INTERPRET") == "1"
    torch.manual_seed(3)
    logits = [torch.randn(BS, V) * 3 for _ in range(STEPS - 1)]
    w = _worker(logits)
    tap = StepTap(w, 3, _guard([]))
    assert tap._topk is None  # a CPU: softmax_topk, unless told otherwise as here
    tap._topk = TapTopk(tap.rows, V, 3, backend="triton", into=tap.step_outputs())
    assert (tap.rows == -1).all(), "compiling its variants must leave the row buffer as it was"
    assert tap._topk.takes(logits[0]) and not tap._topk.takes(logits[0].to(torch.bfloat16))
    assert len(tap._topk._into) == STEPS - 1  # every step's buffers written by the kernel itself
    own = tap._topk._summary.device_views
    before = own["topk_p"].clone(), own["topk_id"].clone()
    assert tap.select([4, 1]) == 2
    w.draft_forward(SimpleNamespace(forward_mode=_Mode(True)))
    assert torch.equal(own["topk_p"], before[0]) and torch.equal(own["topk_id"], before[1]), \
        "the step's top-k went through the Summarizer's own buffer (a copy), not straight into the tap's"
    got = tap.read(2).result().positions
    for step, lg in enumerate(logits):
        for j, row in enumerate([4, 1]):
            want = torch.topk(torch.softmax(lg[row], -1), 3)
            assert [i for i, _ in got[step][j]] == want.indices.tolist()
            assert [p for _, p in got[step][j]] == pytest.approx(want.values.tolist(), rel=1e-5)
    tap.select([])
    tap._write(0, torch.randn(BS, V))  # a graph's replay with nothing selected: every slot skipped
    assert (tap._topk._summary.device_views["rows"] == -1).all()
    tap.select([2])
    bf16 = torch.randn(BS, V).to(torch.bfloat16)
    tap._write(1, bf16)  # not a compiled variant: softmax_topk (its entries in no particular order)
    assert set(tap.ids[1, 0].tolist()) == set(torch.topk(bf16[2].float(), 3).indices.tolist())


def test_the_summary_kernel_reads_the_selected_rows_in_the_interpreter():
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", "import tests.tracer.test_steptap as t; t._kernel_reads_the_selected_rows()"],
                          cwd=root, env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
