"""The hooks' whole per-iteration path on CUDA never waits for the GPU (issue 14: no host sync).

``testbed.gpu.hooks_path.HooksPath`` runs the real ``Tracer`` methods of a sampled decode iteration at
Kimi-K2.5 widths, batch 64, one request in 16 sampled, under ``DRAFTSCOPE_SYNC_DEBUG`` (every hook body
in ``torch.cuda.set_sync_debug_mode("error")``) with about half a second of GPU work queued ahead.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: runs on the H200 through testbed/gpu (docs/testbed.md)")]


@pytest.fixture(scope="module")
def cycles_per_ms():
    from testbed.gpu.hooks_path import gpu_sleep_cycles_per_ms

    return gpu_sleep_cycles_per_ms()


def test_hooks_path_never_synchronises_with_gpu_work_queued_ahead(cycles_per_ms):
    from testbed.gpu.hooks_path import HooksPath

    path = HooksPath(64, sample_every=16, sync_debug=True)
    for _ in range(9):  # warm-up (Triton compiles, ring and pinned blocks), under sync-debug too
        path.iteration()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(cycles_per_ms * 500))  # half a second of GPU work ahead of the hooks
    for _ in range(16):  # steps 9..24 of each sampled request: periodic (every 8th) steps included
        path.iteration()
    gpu_busy = not torch.cuda.current_stream().query()
    report = path.close()
    assert report["errors"] == {} and report["relay_error"] is None, report
    assert report["relay_calls"] >= 16 * 3, report  # verify, draft extend, draft seeds: each iteration
    assert gpu_busy, "the GPU finished its queued work before the hooks did: something on the path waited for it"


def test_the_sync_debug_switch_catches_a_sync(cycles_per_ms):
    """The negative control: a hook body that reads a device value fails its probe under the switch."""
    from testbed.gpu.hooks_path import HooksPath

    path = HooksPath(8, sample_every=1, sync_debug=True)
    torch.cuda._sleep(int(cycles_per_ms * 50))
    path.tracer.guard("verify", lambda: path.result.accept_lens.sum().item())
    report = path.close()
    assert report["errors"] == {"verify": 1}, report
    assert "synchroniz" in report["last_error"]["verify"], report


def test_graphed_recomputes_and_direct_launches_match_eager():
    """The draft's recomputes replayed as CUDA graphs give what the eager path gives (to bf16 rounding: the
    lm_head and fc GEMMs run on 64 / 256 rows in the graph, on the sampled rows eagerly), and a Triton
    kernel launched directly (every launch after the first) writes the same bytes as through its JITFunction."""
    from draftscope_tracer.device import recompute
    from draftscope_tracer.health import Health
    from draftscope_tracer.device.summaries import Summaries
    from testbed.gpu.hooks_path import HooksPath

    path = HooksPath(64, sample_every=16)
    capture, model = path.tracer.capture, path.model
    assert capture.seeds is not None and capture.fc is not None, "the recomputes were not captured"
    eager = Summaries(Health(), topk=8)
    rows = torch.tensor([3, 17, 40, 63], device="cuda")
    seed_h, fc_h = path.next_draft_input.hidden_states, path.result.logits_output.hidden_states
    fc_rows = torch.arange(32, 48, device="cuda")
    graphed_seeds = capture.seeds.launch(seed_h, rows).result()
    logits = recompute.logits(model, seed_h.index_select(0, rows))
    eager_seeds = eager.launch(logits, range(4), logits=logits).result()
    graphed_fc = capture.fc.launch(fc_h, fc_rows).result()
    fc_out = recompute.fc(model, fc_h.index_select(0, fc_rows))
    eager_fc = eager.launch(fc_out, range(16)).result()
    for g, e, n in ((graphed_seeds, eager_seeds, 4), (graphed_fc, eager_fc, 16)):
        for a, b in zip(g.rows[:n], e.rows[:n]):
            assert a.chunks[0].l2 == pytest.approx(b.chunks[0].l2, rel=2e-2)
            assert a.chunks[0].absmax == pytest.approx(b.chunks[0].absmax, rel=2e-2)
            if a.topk is not None:
                # the best draft token (a near tie may swap the first two under bf16 rounding)
                assert a.topk[0][0] in [t for t, _ in b.topk[:3]]
                assert a.topk[0][1] == pytest.approx(b.topk[0][1], rel=5e-2, abs=1e-3)
    path.close()
    # the same launch twice: through the JITFunction (first), then directly
    summaries = Summaries(Health(), topk=8)
    hidden = path.result.logits_output.hidden_states
    target = path.result.logits_output.next_token_logits
    first = summaries.launch(hidden, range(0, 256, 16), chunk_width=7168, logits=target)
    second = summaries.launch(hidden, range(0, 256, 16), chunk_width=7168, logits=target)
    first_bytes, second_bytes = first.__reduce__()[1][1], second.__reduce__()[1][1]
    assert first_bytes == second_bytes
    # a verify's token ids gathered by its summary (int64 and int32 sources) equal indexing on the host
    vi, res, b = path.verify_input, path.result, path.batch
    nodes = list(range(8, 16)) + list(range(200, 204))
    got = summaries.launch(hidden, nodes, chunk_width=7168, logits=target,
                           ints=(vi.draft_token, res.next_token_ids, b.seq_lens, res.accept_lens, 4)).result().ints
    host = [t.tolist() for t in (vi.draft_token, res.next_token_ids, b.seq_lens, res.accept_lens)]
    assert got[:len(nodes)] == [[host[0][r], host[1][r], host[2][r // 4], host[3][r // 4]] for r in nodes]
    # in the order records.verify reads them: the same as the pinned host copy (HostInts) gives
    from draftscope_tracer.device.devicecopy import HostInts
    from draftscope_tracer.transport.records import GatheredInts

    at = [2, 50]
    nodes = [i * 4 + p for i in at for p in range(4)]
    pending = summaries.launch(hidden, nodes, chunk_width=7168, logits=target,
                               ints=(vi.draft_token, res.next_token_ids, b.seq_lens, res.accept_lens, 4))
    copied = HostInts([(vi.draft_token, nodes), (res.next_token_ids, nodes), (b.seq_lens, at), (res.accept_lens, at)])
    assert GatheredInts(pending, 2, 4).result() == copied.result()


def test_kernels_write_summaries_straight_into_pinned_slots(monkeypatch):
    """On the H200 the ring is pinned memory the device addresses: the Triton kernel writes each launch into its
    slot (no copy), through its JITFunction and then directly, and the bytes equal the same launches computed
    into the device buffer and copied (``direct=False``)."""
    from draftscope_tracer.device.summarize import Summarizer
    from draftscope_tracer.device.summary_ring import Pending

    hidden = torch.randn(64, 3 * 7168, dtype=torch.bfloat16, device="cuda")
    logits = torch.randn(64, 163_840, device="cuda") * 4
    rows = torch.tensor([3, 17, 40, 63] + [-1] * 12, device="cuda")
    direct, copied = (Summarizer(max_rows=16, width=3 * 7168, chunk_width=7168, vocab_size=163_840, device="cuda",
                                 direct=d) for d in (True, False))
    assert direct._ring.outputs(0) is not None and copied._ring.outputs(0) is None
    copies = []  # the direct Summarizer's launches issued with a copy from its device buffer
    issue = Pending.issue
    monkeypatch.setattr(Pending, "issue", lambda p, copy_from=None: (
        copies.append(p) if copy_from is not None and p._ring is direct._ring else None) or issue(p, copy_from))
    for _ in range(3):  # the first launch compiles through the JITFunction, the others launch directly
        got, want = direct.summarize(hidden, rows, logits), copied.summarize(hidden, rows, logits)
        assert got.__reduce__()[1][1] == want.__reduce__()[1][1]
    assert copies == [] and direct.fallbacks == copied.fallbacks == 0


def test_the_step_tap_is_read_by_a_kernel_into_its_pinned_slots():
    """The draft hook's read of the step tap (positions 2..) is a copy kernel into the tap's mapped pinned slot
    (compiled at install, then launched directly), not ``Tensor.copy_``, and brings the tap's bytes each time."""
    from testbed.gpu.hooks_path import HooksPath

    path = HooksPath(8, sample_every=1)
    tap = path.tracer.capture.step_tap
    assert tap._copy is not None, "the step tap reads by Tensor.copy_: its slots are not mapped, or the kernel failed"
    for _ in range(3):
        tap._buf.copy_(torch.randint(0, 256, tap._buf.shape, dtype=torch.uint8, device="cuda"))
        steps = tap.read(1)
        torch.cuda.synchronize()
        assert torch.equal(steps._host, tap._buf.cpu())
        steps.release(read=True)
    assert tap._copy is not None and tap._copy._plans, "the reads did not go through the direct launch"
    path.close()


def test_reserved_counts_what_a_stretch_reserved_even_where_the_cache_is_emptied_in_it():
    """The run's ``reserved_bytes`` is the difference of ``devicecopy.reserved`` over attach, where each graph capture
    empties PyTorch's cache: that must not read as memory given back (it read -3.4 GB on the Kimi bed)."""
    from draftscope_tracer.device import devicecopy

    mib = 2**20
    cached = torch.empty(256 * mib, dtype=torch.uint8, device="cuda")
    del cached  # a block the cache holds, as the engine's are at attach
    before, total = devicecopy.reserved("cuda"), torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() < total  # the reserved total did drop: the case this guards
    # more than every free block the cache still holds (partly used segments of earlier tests keep theirs), so that
    # the allocator must reserve it from CUDA (in 2 MiB steps)
    size = -(-(torch.cuda.memory_reserved() - torch.cuda.memory_allocated() + 64 * mib) // (2 * mib)) * 2 * mib
    kept = torch.empty(size, dtype=torch.uint8, device="cuda")
    assert size <= devicecopy.reserved("cuda") - before < size + 256 * mib, kept.shape


def test_a_launch_repeated_on_the_same_buffers_is_planned_and_reads_their_new_values():
    """The hooks' launches repeat on the same buffers every decode iteration: the second one on the same
    tensors and rows goes through its plan (no checks, no argument work), and reads what the buffers hold then."""
    from draftscope_tracer.device.summaries import Summaries
    from draftscope_tracer.health import Health

    summaries = Summaries(Health(), topk=8)
    hidden = torch.randn(64, 3 * 7168, dtype=torch.bfloat16, device="cuda")
    logits = torch.randn(64, 163_840, device="cuda") * 4
    rows = [3, 17, 40, 63]
    first = summaries.launch(hidden, rows, chunk_width=7168, logits=logits).result()  # through the JITFunction
    summaries.launch(hidden, rows, chunk_width=7168, logits=logits).result()  # direct: leaves its plan
    assert len(summaries._plans) == 1
    (summ, plan, *_), = summaries._plans.values()
    calls = []
    summ.launch_plan = lambda p, tag=None, f=summ.launch_plan: calls.append(p) or f(p, tag)
    hidden.mul_(2)
    logits[:, 5] = 1e4  # token 5 now wins every row
    again = summaries.launch(hidden, rows, chunk_width=7168, logits=logits).result()
    assert calls == [plan]
    for a, b in zip(again.rows[:4], first.rows[:4]):
        assert a.row == b.row and a.chunks[1].l2 == pytest.approx(2 * b.chunks[1].l2, rel=1e-3)
        assert a.topk[0] == (5, pytest.approx(1.0))


def test_bf16_logits_are_read_in_place_at_their_own_rows_through_the_plan():
    """The vLLM target's launch: bf16 logits of more rows than the hidden states read at rows of their own
    (``logit_rows``, another order), through the JITFunction, then directly (the plan reads the logits rows' index
    tensor), give what the same rows gathered and made float32 give (the same statistics and ids; probabilities to
    1e-6: the kernel compiled for bf16 loads may sum a softmax denominator in another order), and read what the
    logits hold at each launch."""
    from draftscope_tracer.device.summaries import Summaries
    from draftscope_tracer.health import Health

    summaries = Summaries(Health(), topk=8)
    hidden = torch.randn(64, 3 * 7168, dtype=torch.bfloat16, device="cuda")
    logits = (torch.randn(256, 163_840, device="cuda") * 4).to(torch.bfloat16)
    rows, at = [3, 17, 40, 63], [200, 7, 131, 64]
    gathered = torch.zeros(64, 163_840, device="cuda")
    gathered[rows] = logits[at].float()
    want = summaries.launch(hidden, rows, chunk_width=7168, logits=gathered).result()
    # through the JITFunction (a new variant: bf16 logits), then directly (leaves its plan), then through the plan
    got = [summaries.launch(hidden, rows, chunk_width=7168, logits=logits, logit_rows=at).result() for _ in range(2)]
    (summ, plan, *_), = summaries._plans.values()
    calls = []
    summ.launch_plan = lambda p, tag=None, f=summ.launch_plan: calls.append(p) or f(p, tag)
    got.append(summaries.launch(hidden, rows, chunk_width=7168, logits=logits, logit_rows=at).result())
    assert calls == [plan] and summ.fallbacks == 0
    for g in got:
        _assert_same_rows(g.rows[:4], want.rows[:4])
    logits[200, 5] = 1e4  # token 5 now wins the first row
    again = summaries.launch(hidden, rows, chunk_width=7168, logits=logits, logit_rows=at).result()
    assert calls == [plan, plan]
    assert again.rows[0].topk[0] == (5, pytest.approx(1.0))
    _assert_same_rows(again.rows[1:4], want.rows[1:4])


def _assert_same_rows(a: list, b: list) -> None:
    """Rows, statistics and top-k ids equal; top-k probabilities to 1e-6."""
    assert [(r.row, r.chunks, [i for i, _ in r.topk]) for r in a] == [(r.row, r.chunks, [i for i, _ in r.topk])
                                                                       for r in b]
    assert [p for r in a for _, p in r.topk] == pytest.approx([p for r in b for _, p in r.topk], rel=1e-6)
