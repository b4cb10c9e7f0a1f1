"""Per-request accounting, on the scheduler thread: the tracer's own totals from ``accept_lens`` and
the ``RequestRecord`` of a finished request (SGLang's counters beside the tracer's)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from draftscope_tracer.engine.sampling import step_sampled

Totals = Dict[str, List[int]]  # rid -> [verify steps, accepted drafts, proposed drafts]


class Sampled:
    """The sampled, unfinished requests and the verify steps each has seen (``live``), and which of their
    rows a hook records: the state the tracer and its probes share on the scheduler thread."""

    def __init__(self, step_stride: int):
        self.live: Dict[str, int] = {}
        self.step_stride = step_stride

    def rows_of(self, reqs, back: int = 0) -> List[tuple]:
        """``(row, rid, step)`` of the sampled requests in ``reqs`` whose step ``count - back`` is recorded."""
        live, stride = self.live, self.step_stride
        # one comprehension over the batch (most requests are not sampled), then the few sampled ones
        found = [(i, r.rid) for i, r in enumerate(reqs) if r.rid in live]
        return [(i, rid, live[rid] - back) for i, rid in found
                if live[rid] - back >= 0 and step_sampled(live[rid] - back, stride)]


def count(totals: Totals, accept_lens: Sequence[int], live_reqs, num_draft_tokens: Optional[int]) -> None:
    """One verify step and ``accept_len - 1`` accepted drafts for each request live before the result."""
    proposed = (num_draft_tokens or 1) - 1
    for i, r in live_reqs:
        t = totals.get(r.rid)
        if t is None:
            t = totals[r.rid] = [0, 0, 0]
        t[0] += 1
        t[1] += accept_lens[i] - 1
        t[2] += proposed


def _finish_reason(req) -> Optional[str]:
    reason = getattr(req, "finished_reason", None)
    try:
        return None if reason is None else reason.to_json().get("type")
    except Exception:
        return None


def finished_record(req, sampled: bool, traced: List[int], started_at: Optional[float],
                    num_draft_tokens: Optional[int], now: Optional[float] = None) -> Tuple[Dict[str, Any], Optional[str]]:
    """(the ``RequestRecord`` of ``req``, a message when the tracer's totals differ from SGLang's)."""
    ct = int(getattr(req, "spec_verify_ct", 0))
    accepted = int(getattr(req, "spec_num_correct_drafts", 0))
    info = {"rid": req.rid, "sampled": sampled,
            "prompt_len": len(req.origin_input_ids), "output_len": len(req.output_ids),
            "started_at": started_at, "finished_at": time.time() if now is None else now,
            "finish_reason": _finish_reason(req), "spec_verify_ct": ct, "spec_accepted_drafts": accepted,
            "spec_proposed_drafts": ct * (num_draft_tokens - 1) if num_draft_tokens else None,
            "traced_verify_ct": traced[0], "traced_accepted_drafts": traced[1],
            "traced_proposed_drafts": traced[2] if num_draft_tokens else None}
    mismatch = None
    if (traced[0], traced[1]) != (ct, accepted):
        mismatch = f"{req.rid}: traced {traced[0]} steps / {traced[1]} accepted, SGLang {ct} / {accepted}"
    return {k: v for k, v in info.items() if v is not None}, mismatch
