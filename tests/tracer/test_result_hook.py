"""The result-processing hook (``plugin._around_finish``) with the real ``Tracer``: the tracer's own totals
are counted for sampled requests only, and each finished request is reported once, though overlap
scheduling hands it to the next result too. SGLang's batch and requests are the outermost edge
(stand-ins with the fields the hook reads)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.engine.sglang import plugin
from draftscope_tracer.engine.sglang.tracer import Tracer


class Req:
    def __init__(self, rid: str):
        self.rid, self.is_retracted, self.finished_reason = rid, False, None
        self.origin_input_ids, self.output_ids = [1, 2, 3], []
        self.spec_verify_ct = self.spec_num_correct_drafts = 0

    def finished(self) -> bool:
        return self.finished_reason is not None


class Decode:
    def is_decode(self) -> bool:
        return True


class Writer:
    def __init__(self):
        self.calls = []

    def submit(self, call) -> bool:
        self.calls.append(call)
        return True


def test_totals_are_the_sampled_requests_and_each_finish_is_reported_once(monkeypatch):
    t = Tracer(TracerConfig(file="/dev/null", sample_rate=1 / 16), "0.5.23")
    t.recording, t.num_draft_tokens = True, 4
    t.transport.writer = writer = Writer()
    monkeypatch.setattr(plugin.PLUGIN, "tracer", t)
    reqs = [Req(f"r{i}") for i in range(4)]
    t.sampled.admit("r1")
    batch = SimpleNamespace(reqs=reqs, forward_mode=Decode())

    def result(accept_lens, finishing=()):
        """One decode result: SGLang's counters move for every live request, then some finish."""
        def process(scheduler, batch, result):
            for r, a in zip(batch.reqs, accept_lens):
                if not r.finished():
                    r.spec_verify_ct += 1
                    r.spec_num_correct_drafts += a - 1
                    r.output_ids.append(0)
            for i in finishing:
                batch.reqs[i].finished_reason = SimpleNamespace(to_json=lambda: {"type": "length"})
        plugin._around_finish(process, None, batch, SimpleNamespace(accept_lens=torch.tensor(accept_lens)))

    result([2, 3, 1, 4])
    result([1, 2, 2, 1], finishing=[2])
    result([4, 1, 3, 2], finishing=[1])  # r2 is still in the batch, finished: not reported again
    result([1, 1, 1, 1], finishing=[0, 3])  # r1 too
    records = [r for c in writer.calls for r in c.known()["requests"]]
    assert [r["rid"] for r in records] == ["r2", "r1", "r0", "r3"]
    by_rid = {r["rid"]: r for r in records}
    # the sampled request: the tracer's own count of its three verify steps equals SGLang's
    r1 = by_rid["r1"]
    assert r1["sampled"] and (r1["traced_verify_ct"], r1["traced_accepted_drafts"]) == (3, 2 + 1 + 0) \
        == (r1["spec_verify_ct"], r1["spec_accepted_drafts"])
    # unsampled ones: SGLang's counters only, the hooks counted nothing for them
    assert all("traced_verify_ct" not in by_rid[rid] and by_rid[rid]["spec_verify_ct"] > 0
               for rid in ("r0", "r2", "r3"))
    assert t.totals == {} and t.health.errors == {}
