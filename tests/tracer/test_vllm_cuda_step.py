"""The vLLM step hooks' CUDA branch (``engine/vllm/cuda_step.py``), run on CPU tensors: its rows worked out from
vLLM's CPU metadata, the records it queues (read back as the recorder reads them), the tracer's totals against
vLLM's, and async scheduling's discarded step. ``tests/gpu/test_vllm_hooks_path.py`` runs the same path on CUDA
under sync-debug."""

from __future__ import annotations

import json

import pytest
import torch

from draftscope_tracer.device.devicecopy import HostInts
from draftscope_tracer.engine.vllm import step_ids
from draftscope_tracer.engine.vllm.step_layout import Pick, draft_input_rows, logit_rows, step_rows
from testbed.gpu.vllm_hooks_path import VllmStepPath

K = 3


def test_rows_come_from_the_cpu_metadata_alone():
    """A batch of a verify (4 rows), a prompt chunk (40 rows) and a verify: each request's first row, its drafts'
    place in draft_token_ids, and the draft input's rows (a prompt's last rows only)."""
    rows = step_rows(["a", "b", "c"], {"a": 4, "b": 40, "c": 4}, [3, 0, 3])
    assert [(r.rid, r.start, r.tokens, r.drafts, r.draft_offset) for r in rows] == \
        [("a", 0, 4, 3, 0), ("b", 4, 40, 0, 3), ("c", 44, 4, 3, 3)]
    qsl = [0, 4, 44, 48]
    picks = [Pick(0, "a", 5, "draft_extend"), Pick(1, "b", 0, "prefill"), Pick(2, "c", 2, "draft_extend")]
    assert draft_input_rows(qsl, picks) == [range(0, 4), range(12, 44), range(44, 48)]
    assert draft_input_rows(qsl, picks, prompt_rows=8) == [range(0, 4), range(36, 44), range(44, 48)]
    assert step_rows(["a"], {"a": 7}, None)[0].drafts == 0  # a prompt-only step has no spec metadata


def test_verify_rows_match_the_logits_rows_vllms_sampler_reads():
    """vLLM 0.32's own example (``GPUModelRunner._calc_spec_decode_metadata``): a verify's rows of the target's input
    are its last d + 1 and its rows of the logits follow each other, d + 1 per request (a prompt chunk's one)."""
    cu_scheduled, drafts = [4, 104, 107, 207, 209], [3, 0, 2, 0, 1]
    logits_indices = [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]  # vLLM's, for these
    tokens = [b - a for a, b in zip([0, *cu_scheduled], cu_scheduled)]
    rows = step_rows(list("abcde"), dict(zip("abcde", tokens)), drafts)
    assert [logits_indices[i] for r in rows for i in r.logits] == [i for r in rows for i in r.verified]
    assert logit_rows(list("abcde"), drafts) == len(logits_indices)
    assert step_rows(list("abcde"), dict(zip("abcde", tokens)), drafts, only=[2, 4]) == [rows[2], rows[4]]
    assert [list(r.verified) for r in rows if r.drafts] == [[0, 1, 2, 3], [104, 105, 106], [207, 208]]


@pytest.mark.parametrize("reduce", ["auto", "device"])
def test_the_targets_top_k_is_read_from_the_logits_vllm_sampled(reduce):
    """The target's logits are not computed again: the runner's compute_logits is called once per step (vLLM's own,
    for the sampler) and the records' target top-k is the held logits' at each verify's rows (copied on the host, or
    read in place by the Summarizer: ``reduce="device"``, its torch path on CPU tensors)."""
    path = VllmStepPath(3, device="cpu", k=K, vocab=64)
    path.tracer.steps.cuda.summaries.summaries.reduce = reduce
    calls, compute = [], path.runner.model.compute_logits
    path.runner.model.compute_logits = lambda h: calls.append(h.shape[0]) or compute(h)
    path.step(num_drafts=[K, 0, K])  # req-1 runs a decode step without drafts: one row of logits
    path.step(num_drafts=[K, K, 0])
    assert path.tracer.logits is None  # not held past the step's sample_tokens
    report = path.close()
    assert report["errors"] == {} and report["relay_error"] is None, report
    assert calls == [2 * (K + 1) + 1] * 2
    logits = compute(path.hidden_states)  # the stand-in's logits of every row
    first = {("req-0", 0): 0, ("req-2", 0): K + 2, ("req-0", 1): 0, ("req-1", 0): K + 1}  # each verify's first row
    steps = {(s["rid"], s["step_index"]): s for s in _records(path, "verify")}
    assert sorted(steps) == sorted(first)
    for key, row in first.items():
        assert [k[0][0] for k in steps[key]["target_topk"]] == \
            logits[row:row + K].argmax(-1).tolist(), key


@pytest.mark.parametrize("reduce", ["auto", "device"])
@pytest.mark.parametrize("aux", [0, 2])
def test_the_target_summary_reads_the_held_logits_or_computes_them_at_the_verify_rows(reduce, aux):
    """``CudaSummaries.target`` with and without aux hidden states: the held logits (bf16, as a bf16 model's) read at
    the verify's logits rows; a step without them has ``compute_logits`` run on the verify rows only. Either gives
    each verify row's top-k of its own logits."""
    from types import SimpleNamespace

    from draftscope_tracer.engine.vllm.cuda_summaries import CudaSummaries
    from draftscope_tracer.health import Health

    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(12, 16, generator=g).to(torch.bfloat16)
    head = torch.randn(16, 40, generator=g).to(torch.bfloat16)
    calls = []
    runner = SimpleNamespace(model=SimpleNamespace(compute_logits=lambda h: calls.append(h.shape[0]) or h @ head))
    a = {"hidden_states": hidden, "aux_hidden_states": [hidden * (i + 1) for i in range(aux)]}
    rows, logit_at = [9, 10, 11, 2], [6, 7, 8, 1]  # the sampler's logits: fewer rows than the hidden states
    held = (hidden @ head)[[0, 2, 3, 4, 5, 6, 9, 10, 11]]
    summaries = CudaSummaries(Health(), topk=3)
    summaries.summaries.reduce = reduce
    want = torch.softmax((hidden @ head)[rows].float(), -1).topk(3)
    for logits in (held, None):
        summary, layout, in_place = summaries.target(runner, a, rows, logits, logit_at, held.shape[0])
        assert not in_place  # no joined tensor given: gathered from each aux tensor
        s = summary.result()
        assert [[i for i, _ in r.topk] for r in s.rows] == want.indices.tolist()
        assert [p for r in s.rows for _, p in r.topk] == pytest.approx(want.values.flatten().tolist(), rel=1e-5)
        assert layout == ((16, aux, "bfloat16") if aux else (None, 0, None))
        if aux:
            assert [len(r.chunks) for r in s.rows] == [aux] * len(rows)
    assert calls == [len(rows)]  # only without held logits, on the verify rows


def test_the_verify_rows_are_read_from_the_drafters_input_where_vllm_joined_them_row_for_row():
    """vLLM's padded drafter batch receives the aux hidden states joined row for row: the verify rows' summary reads
    them there, at the target's rows (no gather of its own); without padding (``disable_padded_drafter_batch``) it
    gathers them from each aux tensor. The records are the same."""
    got = {}
    for padded in (True, False):
        path = VllmStepPath(3, device="cpu", k=K, padded=padded)
        summaries, read = path.tracer.steps.cuda.summaries.summaries, []
        launch = summaries.launch

        def spy(hidden, rows, launch=launch, read=read, **kw):
            if kw.get("logit_rows") is not None:  # the verify rows'
                read.append(list(rows))
            return launch(hidden, rows, **kw)

        summaries.launch = spy
        for _ in range(2):  # req-1 without drafts: its row is not a verify row
            path.step(sampled=[[5, 6, -1, -1], [7, -1, -1, -1], [1, 2, 3, 4]], num_drafts=[K, 0, K],
                      drafts=[[5, 1, 2], [], [7, 8, 9]])
        report = path.close()
        assert report["errors"] == {} and report["relay_error"] is None, report
        assert read == [[0, 1, 2, 3, 5, 6, 7, 8] if padded else list(range(2 * (K + 1)))] * 2
        got[padded] = [{kind: [{k: v for k, v in r.items() if k != "at"} for r in recs[kind]] for kind in recs}
                       for p, recs in path.relay.records() if p == "verify"]
    assert got[True] == got[False]
    assert sum(len(recs["steps"]) for recs in got[True]) == 4
    assert any(r["point"].startswith("target.aux") for recs in got[True] for r in recs["samples"])


@pytest.mark.parametrize("reduce", ["auto", "device"])
def test_a_decode_steps_draft_input_and_verify_rows_share_one_launch(reduce):
    """In vLLM's padded batch the draft receives the verify rows themselves (the aux hidden states joined row for
    row): a decode step summarises them once, for the verify records and the draft input's, which read the same
    values as two launches would (the unpadded batch: the verify rows gathered, the draft's input launched on its
    own). Every slot of their ring comes back."""
    got = {}
    for padded in (True, False):
        path = VllmStepPath(3, device="cpu", k=K, padded=padded)
        summaries, launched = path.tracer.steps.cuda.summaries.summaries, []
        summaries.reduce = reduce
        launch = summaries.launch

        def spy(hidden, rows, launch=launch, **kw):
            launched.append("verify" if kw.get("logit_rows") is not None else
                            "draft input" if hidden.shape[-1] == 3 * path.hidden and kw.get("logits") is None else
                            "other")
            return launch(hidden, rows, **kw)

        summaries.launch = spy
        for _ in range(3):
            path.step()
        report = path.close()
        assert report["errors"] == {} and report["relay_error"] is None and report["drops"] == {}, report
        per_step = len(launched) // 3
        assert launched.count("verify") == 3
        assert launched.count("draft input") == (0 if padded else 3), launched
        got[padded] = [(p, {kind: [{k: v for k, v in r.items() if k != "at"} for r in recs[kind]] for kind in recs})
                       for p, recs in path.relay.records() if p in ("verify", "draft")]
        assert per_step >= 2
        if reduce == "device":  # the aux rows' launches went through a Summarizer's ring: every slot came back
            rings = [summ._ring for key, summ in summaries._by_shape.items() if key[0] == 3 * path.hidden]
            assert rings and all(not any(ring._busy) for ring in rings)
    assert got[True] == got[False]
    inputs = [r for p, recs in got[True] if p == "draft" for r in recs["samples"] if r["point"] == "draft.input"]
    assert len(inputs) == 3 * 3  # each request's draft input at each step


def _records(path, probe):
    return [r for p, recs in path.relay.records() if p == probe for r in recs.get("steps" if probe == "verify"
                                                                                   else "requests", [])]


@pytest.mark.parametrize("whole_positions", [step_ids.WHOLE_POSITIONS, 0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_records_read_the_devices_ids_not_the_schedulers_placeholders(dtype, whole_positions, monkeypatch):
    """Two steps of two requests. The scheduler's drafts are async scheduling's -1 placeholders; the records
    carry the drafts of draft_token_ids, the sampler's kept ids, each verified token's position, the target's
    top-k at every drafted position and, from the second step on, the draft's top-k of the step before (bf16
    logits, as a bf16 model's, gathered as they are). The positions copied whole with the ids, or (a step's
    positions over ``WHOLE_POSITIONS``: 0 here) the verifies' rows gathered first."""
    monkeypatch.setattr(step_ids, "WHOLE_POSITIONS", whole_positions)
    path = VllmStepPath(2, device="cpu", k=K, dtype=dtype)
    path.step(sampled=[[5, 6, -1, -1], [7, 8, 9, 10]], drafts=[[5, 1, 2], [7, 8, 9]])
    path.step(sampled=[[1, -1, -1, -1], [2, 3, -1, -1]], drafts=[[9, 9, 9], [2, 4, 4]])
    report = path.close()
    assert report["errors"] == {} and report["relay_error"] is None, report
    steps = {(s["rid"], s["step_index"]): s for s in _records(path, "verify")}
    assert sorted(steps) == [("req-0", 0), ("req-0", 1), ("req-1", 0), ("req-1", 1)]
    got = {key: (s["drafted_tokens"], s["accept_len"], s["accept_flags"], s["bonus_token"], s["seq_pos"])
           for key, s in steps.items()}
    assert got == {("req-0", 0): ([5, 1, 2], 2, [True, False, False], 6, 10),
                   ("req-1", 0): ([7, 8, 9], 4, [True, True, True], 10, 13),
                   ("req-0", 1): ([9, 9, 9], 1, [False, False, False], 1, 14),
                   ("req-1", 1): ([2, 4, 4], 2, [True, False, False], 3, 17)}
    assert all(len(s["target_topk"]) == K for s in steps.values())
    assert [("draft_topk" in steps[(r, i)]) for r in ("req-0", "req-1") for i in (0, 1)] == [False, True, False, True]
    assert all(len(steps[(r, 1)]["draft_topk"]) == K for r in ("req-0", "req-1"))
    # every request's totals (verify steps, accepted drafts, proposed drafts), reported at close
    totals = {r["rid"]: (r["traced_verify_ct"], r["traced_accepted_drafts"], r["traced_proposed_drafts"])
              for r in _records(path, "finish")}
    assert totals == {"req-0": (2, 1, 6), "req-1": (2, 4, 6)}


def test_totals_match_vllms_at_a_requests_end():
    path = VllmStepPath(2, device="cpu", k=K)
    path.step(sampled=[[5, 6, -1, -1], [7, -1, -1, -1]])
    path.step(sampled=[[1, 2, 3, -1], [2, 3, -1, -1]])
    path.finish("req-0", [1, 2])  # what vLLM's scheduler counted for it
    path.finish("req-1", [0, 0])  # one accepted draft fewer than the tracer saw
    report = path.close()
    assert report["errors"] == {"totals_mismatch": 1}, report
    assert "req-1: traced [2, 1, 6], vLLM [2, 0, 6]" in report["last_error"]["totals_mismatch"]
    ends = {r["rid"]: r for r in _records(path, "finish")}
    assert (ends["req-0"]["traced_accepted_drafts"], ends["req-0"]["spec_accepted_drafts"]) == (3, 3)


@pytest.mark.parametrize("in_flight", [True, False])
def test_async_schedulings_discarded_step_is_left_out(monkeypatch, in_flight):
    """Async scheduling: step 1 runs req-0 again after its last step (0), before the scheduler read step 0's output;
    vLLM discards it and counts one verify step for req-0. Whether step 1's copy is still in flight when the
    scheduler frees req-0 (its event not done: ``HostInts.ready`` False) or done (a GPU a step ahead of the host:
    read by the drain the freeing runs), req-0's totals and records stop at step 0; req-1's go on."""
    path = VllmStepPath(2, device="cpu", k=K)
    held, copy, ready = set(), step_ids.copy, HostInts.ready
    monkeypatch.setattr(HostInts, "ready", lambda self: id(self) not in held and ready(self))
    path.step(sampled=[[5, 6, -1, -1], [7, -1, -1, -1]])
    if in_flight:
        monkeypatch.setattr(step_ids, "copy", lambda *a: _held(copy(*a), held))
    path.step(sampled=[[1, 2, 3, 4], [2, 3, -1, -1]])  # step 0's ids are read here (its drain)
    path.finish("req-0", [1])  # the scheduler read step 0's output: step 1 was issued, maybe done
    held.clear()
    report = path.close()
    assert report["errors"] == {}, report  # req-0's totals equal vLLM's: the discarded step is not counted
    steps = sorted((s["rid"], s["step_index"]) for s in _records(path, "verify"))
    assert steps == [("req-0", 0), ("req-1", 0), ("req-1", 1)]
    ends = {r["rid"]: r for r in _records(path, "finish")}
    assert (ends["req-0"]["traced_verify_ct"], ends["req-1"]["traced_verify_ct"]) == (1, 2)


def _held(copied: tuple, in_flight: set) -> tuple:
    in_flight.add(id(copied[0]))
    return copied


def test_unsampled_requests_are_neither_counted_nor_recorded():
    """One request in two sampled (by its id's hash): the sampled ones' totals are counted and their steps recorded;
    an unsampled request costs the step nothing but its sampling decision (its totals are vLLM's, as on SGLang)."""
    path = VllmStepPath(8, device="cpu", k=K, sample_every=2)
    for _ in range(2):
        path.step()
    report = path.close()
    assert report["errors"] == {}, report
    ends = {r["rid"]: r for r in _records(path, "finish")}  # at close: the open requests the tracer counted
    assert 0 < len(ends) < 8 and all(r["sampled"] for r in ends.values()), ends
    assert {s["rid"] for s in _records(path, "verify")} == set(ends)
    assert all(r["traced_verify_ct"] == 2 for r in ends.values())
    assert not path.tracer.requests.traced  # reported


def _vllm_config(device: str):
    """vLLM's config as the tracer reads it at attach (what it cannot read it records as None)."""
    from types import SimpleNamespace

    spec = SimpleNamespace(method="eagle3", num_speculative_tokens=K, model="draft")
    return SimpleNamespace(device_config=SimpleNamespace(device_type=device), speculative_config=spec,
                           model_config=SimpleNamespace(model="target"))


@pytest.mark.parametrize("device,traced", [("cuda", True), ("cpu", True), ("xpu", False)])
def test_vllm_on_cuda_is_traced_and_other_devices_are_declined(monkeypatch, caplog, device, traced):
    """The engine core's side attaches on CUDA as on a CPU (the old "not traced yet" guard is gone); a device the
    tracer does not know gets one log line and no recorder."""
    import logging

    from draftscope_tracer.config import TracerConfig
    from draftscope_tracer.engine.vllm.tracer import VLLMTracer

    t = VLLMTracer(TracerConfig(file="/dev/null"), "0.32.0", "run")
    monkeypatch.setattr(t.core, "start_recording", lambda: True)  # the recorder process: not started here
    with caplog.at_level(logging.WARNING, logger="draftscope.tracer"):
        assert t.attach(["verify"], vllm_config=_vllm_config(device)) is traced
    assert ("is not traced" in caplog.text) is not traced
    assert (t.core.run.get("facts", {}).get("spec_num_steps") == K) is traced


def test_a_cuda_worker_that_fails_to_start_leaves_a_crashed_run(tmp_path):
    from types import SimpleNamespace

    from draftscope_tracer.config import TracerConfig
    from draftscope_tracer.engine.vllm.tracer import VLLMTracer

    sink = tmp_path / "trace.jsonl"
    t = VLLMTracer(TracerConfig(file=str(sink)), "0.32.0", "run")
    runner = SimpleNamespace(device=SimpleNamespace(type="cuda"), vllm_config=_vllm_config("cuda"))
    t.start_failed(runner, ValueError("There is no module or parameter named 'draft_model'"))
    [batch] = [json.loads(line) for line in sink.read_text().splitlines()]
    assert batch["run"]["status"] == "crashed"
    assert batch["run"]["facts"]["start_error"]["type"] == "ValueError"


def test_a_draft_launch_two_requests_share_is_freed_only_when_neither_needs_it():
    """Step 0's draft top-k is one launch for both requests. At step 1 req-0 verifies its drafts (its record will
    read that launch) while vLLM runs req-1 without drafts (trimmed at its length limit), so req-1's claim on the
    launch is given up when the draft runs again. The launch must stay readable for req-0's record: freed early,
    the record cannot be built (``verify.build``, on the H100 at 64 concurrent requests)."""
    path = VllmStepPath(2, device="cpu", k=K)
    path.step()
    path.step(num_drafts=[K, 0])
    path.step()
    report = path.close()
    assert report["errors"] == {} and report["relay_error"] is None, report
    steps = {(s["rid"], s["step_index"]): s for s in _records(path, "verify")}
    assert sorted(steps) == [("req-0", 0), ("req-0", 1), ("req-0", 2), ("req-1", 0), ("req-1", 1)]
    # req-0's step 1 read the shared launch; req-1's verify at engine step 2 reads what the draft proposed at step 1
    assert len(steps[("req-0", 1)]["draft_topk"]) == K and len(steps[("req-1", 1)]["draft_topk"]) == K
