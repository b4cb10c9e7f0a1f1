"""The requests one vLLM process has seen: which are sampled (and their verify steps), the tracer's own totals of
the sampled ones (counted by the model runner's hook, as on SGLang) and vLLM's (counted by its scheduler's), the
draft's top-k waiting for the verify that judges it, and the finished requests' records (the store merges a
request's two records when the scheduler and the runner are two processes)."""

from __future__ import annotations

import time
from itertools import compress, filterfalse
from typing import Any, Dict, Iterable, List, Optional, Tuple

from draftscope_tracer.engine.prompt_key import prompt_key
from draftscope_tracer.engine.sampling import request_sampled
from draftscope_tracer.health import Health
from draftscope_tracer.transport import records
from draftscope_tracer.transport.outbox import Transport


class Requests:
    """Per-request state, touched by the hooks' thread only; finished requests' records go to ``transport``."""

    def __init__(self, transport: Transport, health: Health):
        self.transport, self.health = transport, health
        self.sampled: Dict[str, int] = {}  # sampled, unfinished request -> verify steps seen
        self.first_seen: Dict[str, float] = {}
        self.traced: Dict[str, List[int]] = {}  # sampled rid -> [verify steps, accepted drafts, proposed drafts]
        self.counted: Dict[str, List[int]] = {}  # the same, as vLLM's scheduler counts them
        self.proposed: Dict[str, tuple] = {}  # sampled rid -> the draft's top-k of its next drafts (copies, row)

    def see(self, rids: List[str], now: float, rate: float) -> List[int]:
        """The requests of an engine step (sampled or not, decided the first time each is seen): the batch indices
        of the sampled ones."""
        first_seen, sampled = self.first_seen, self.sampled
        for rid in list(filterfalse(first_seen.__contains__, rids)):  # each rid tested in C, not in a Python loop
            first_seen[rid] = now
            if request_sampled(rid, rate):
                sampled[rid] = 0
        return list(compress(range(len(rids)), map(sampled.__contains__, rids)))

    def count_traced(self, steps: Iterable[Tuple[str, List[int], int]]) -> None:
        """One verify step per ``(rid, accepted, drafts)`` as the runner saw it: ``accepted`` the kept ids (the bonus
        token last) of ``drafts``."""
        traced = self.traced
        for rid, accepted, drafts in steps:
            totals = traced.get(rid)
            if totals is None:
                traced[rid] = [1, len(accepted) - 1, drafts]
            else:
                totals[0] += 1
                totals[1] += len(accepted) - 1
                totals[2] += drafts

    def count_vllm(self, a: Dict[str, Any]) -> None:
        """vLLM counts one request's verify step here (``make_spec_decoding_stats``: what ``/metrics`` adds up)."""
        rid, drafts = a["request_id"], a["num_draft_tokens"]
        if drafts:
            drafts -= (a.get("num_invalid_spec_tokens") or {}).get(rid, 0)
            totals = self.counted.setdefault(rid, [0, 0, 0])
            totals[0] += 1
            totals[1] += a["num_accepted_tokens"]
            totals[2] += drafts

    def finished(self, request) -> None:
        """vLLM's record of a finished request, with the tracer's totals when the runner is in this process."""
        rid = request.request_id
        counted = self.counted.pop(rid, [0, 0, 0])
        self.first_seen.pop(rid, None)
        record = {"rid": rid, "prompt_len": request.num_prompt_tokens,
                  "prompt_key": prompt_key(request.prompt_token_ids or []), "output_len": request.num_output_tokens,
                  "started_at": getattr(request, "arrival_time", None), "finished_at": time.time(),
                  "finish_reason": _finish_reason(request),
                  "spec_verify_ct": counted[0], "spec_accepted_drafts": counted[1], "spec_proposed_drafts": counted[2]}
        self.proposed.pop(rid, None)
        traced = self.traced.pop(rid, None)
        if traced is not None or rid in self.sampled:
            traced = traced or [0, 0, 0]
            record.update(sampled=self.sampled.pop(rid, None) is not None, traced_verify_ct=traced[0],
                          traced_accepted_drafts=traced[1], traced_proposed_drafts=traced[2])
            if traced != counted:
                self.health.failed("totals_mismatch", RuntimeError(f"{rid}: traced {traced}, vLLM {counted}"))
        self.transport.submit("finish", records.finished, [{k: v for k, v in record.items() if v is not None}])

    def report_traced(self, rids: List[str]) -> None:
        """The tracer's side of these requests' records (the store merges it with the scheduler's)."""
        out = []
        for rid in rids:
            traced = self.traced.pop(rid, [0, 0, 0])
            self.first_seen.pop(rid, None)
            self.proposed.pop(rid, None)
            record = {"rid": rid, "sampled": self.sampled.pop(rid, None) is not None}
            if record["sampled"]:  # the tracer counts sampled requests only
                record.update(traced_verify_ct=traced[0], traced_accepted_drafts=traced[1],
                              traced_proposed_drafts=traced[2])
            out.append(record)
        if out:
            self.transport.submit("finish", records.finished, out)


def _finish_reason(request) -> Optional[str]:
    reason = request.get_finished_reason()
    return None if reason is None else str(getattr(reason, "name", reason)).lower()
