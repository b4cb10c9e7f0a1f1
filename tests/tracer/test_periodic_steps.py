"""The periodic points (``draft.fc.out`` in draft extend, ``draft.logits`` statistics, ``draft.input`` in draft
decode) at every 8th step of each sampled request, counted so that requests admitted at different iterations
share those steps: the draft's ``fc`` recompute, whose cost on a GPU is reading its weights (21504 x 7168 in bf16,
~300 MB at Kimi-K2.5's widths), then runs once for all of them, not once per request.

One decode iteration at a time through the SGLang plugin's own hooks with the real tracer
(``testbed.gpu.hooks_path.HooksPath``), on CPU tensors, the relay's records decoded as the recorder does."""

from __future__ import annotations

from collections import defaultdict

from draftscope_tracer.engine.sglang.requests import PERIODIC_STEPS, Sampled
from testbed.gpu.hooks_path import HooksPath

ADMITTED = {0: "req-0", 3: "req-2", 5: "req-4", 6: "req-6"}  # iteration -> the request sampled from then on
ITERATIONS = 32


def test_requests_admitted_apart_share_their_periodic_steps():
    s = Sampled(step_stride=1)
    periodic_at = defaultdict(list)  # rid -> iterations where its step was periodic
    for it in range(ITERATIONS):
        if it in ADMITTED:
            s.admit(ADMITTED[it])
        s.iterations += 1
        for rid in s.live:
            if s.periodic(rid, s.live[rid]):
                periodic_at[rid].append(it)
            s.live[rid] += 1
    assert len({tuple(at[-2:]) for at in periodic_at.values()}) == 1, periodic_at  # the same iterations
    for rid, at in periodic_at.items():  # each request's own every 8th step
        assert [b - a for a, b in zip(at, at[1:])] == [PERIODIC_STEPS] * (len(at) - 1), (rid, at)


def test_the_fc_recompute_runs_once_for_every_request_admitted_apart():
    path = HooksPath(8, sample_every=2, device="cpu", graphs=False)
    path.relay.keep = True
    t = path.tracer
    t.sampled.live.clear()
    rows_per_recompute = []
    path.model.model.fc.register_forward_hook(lambda module, args, out: rows_per_recompute.append(args[0].shape[0]))
    try:
        for it in range(ITERATIONS):
            if it in ADMITTED:
                t.sampled.admit(ADMITTED[it])
            path.iteration()
    finally:
        health = path.close()
    assert health["errors"] == {} and health["drops"] == {} and health["relay_error"] is None
    # four requests at four phases would recompute at 4 of every 8 iterations; aligned, once per 8 with all rows
    assert 3 <= len(rows_per_recompute) <= ITERATIONS // PERIODIC_STEPS + 1, rows_per_recompute
    assert rows_per_recompute[-1] == 4 * 4  # 4 requests x N = 4 draft-extend rows
    fc_steps = defaultdict(list)
    for probe, records in path.relay.records():
        for sample in records.get("samples", []):
            if sample["point"] == "draft.fc.out" and sample["phase"] == "draft_extend":
                fc_steps[sample["rid"]].append(sample["step_index"])
    assert set(fc_steps) == set(ADMITTED.values())
    for rid, steps in fc_steps.items():
        assert [b - a for a, b in zip(steps, steps[1:])] == [PERIODIC_STEPS] * (len(steps) - 1), (rid, steps)
