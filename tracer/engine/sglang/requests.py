"""Per-request accounting, on the scheduler thread: the tracer's own totals from ``accept_lens`` and
the ``RequestRecord`` of a finished request (SGLang's counters beside the tracer's)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from draftscope_tracer.engine.prompt_key import prompt_key
from draftscope_tracer.engine.sampling import step_sampled

Totals = Dict[str, List[int]]  # rid -> [verify steps, accepted drafts, proposed drafts]
# Points that describe the draft's wiring rather than each step's input are recorded at every
# PERIODIC_STEPS-th step: draft.input in draft_decode (the draft's own hidden state), draft.logits
# statistics, draft.fc.out in draft_extend (its recompute is a GEMM), and draft.input in draft_extend when it
# is the verify's target.aux rows (recorded every step).
PERIODIC_STEPS = 8


class Sampled:
    """The sampled, unfinished requests and the verify steps each has seen (``live``), and which of their
    rows a hook records: the state the tracer and its probes share on the scheduler thread.

    Which rows of a batch are sampled is worked out once per batch composition (:meth:`found`): the next hooks,
    and the next iterations while the same requests run in the same order, compare the batch's list with the
    one kept (element by element, at C speed) instead of asking every request again. Any change to which requests
    are sampled (:meth:`admit`, :meth:`finish`) forgets it. The rows a hook records (:meth:`rows_of`) are kept the
    same way until the next verify step is counted (:meth:`step`)."""

    def __init__(self, step_stride: int):
        self.live: Dict[str, int] = {}
        self.step_stride = step_stride
        self._batch: list = []  # the requests (a copy of the batch's list) whose sampled rows are ``_rows``
        self._rows: Optional[List[tuple]] = None  # [(row, rid), ...]; None: worked out at the next call
        self._recorded: Dict[int, List[tuple]] = {}  # back -> rows_of(``_batch``, back) at the counters now

    def admit(self, rid: str) -> None:
        self.live[rid] = 0
        self._rows = None
        self._recorded = {}

    def finish(self, rid: str) -> bool:
        """Forget ``rid``; whether it was sampled."""
        self._rows = None
        self._recorded = {}
        return self.live.pop(rid, None) is not None

    def step(self, reqs) -> None:
        """One more verify step for each sampled request in ``reqs``: what :meth:`rows_of` returned at ``back``
        before is what it returns at ``back + 1`` now."""
        live = self.live
        for _, rid in self.found(reqs):
            live[rid] += 1
        now = self._recorded.get(0)
        self._recorded = {} if now is None else {1: now}

    def found(self, reqs) -> List[tuple]:
        """``(row, rid)`` of the sampled requests in ``reqs``: one pass over the batch when its requests or the
        sampled ones changed since the last call, else the rows found then."""
        rows = self._rows
        if rows is not None and reqs == self._batch:
            return rows
        live = self.live
        rows = self._rows = [(i, r.rid) for i, r in enumerate(reqs) if r.rid in live]
        self._batch = list(reqs)
        self._recorded = {}
        return rows

    def counted_rows(self, reqs) -> List[tuple]:
        """``(row, rid)`` of the sampled requests in ``reqs`` that are neither finished nor retracted: those whose
        verify step a result counts (only the sampled requests are asked)."""
        if not self.live:
            return []
        return [(i, rid) for i, rid in self.found(reqs) if not (reqs[i].finished() or reqs[i].is_retracted)]

    def rows_of(self, reqs, back: int = 0) -> List[tuple]:
        """``(row, rid, step)`` of the sampled requests in ``reqs`` whose step ``count - back`` is recorded (a list
        the caller does not change)."""
        out = self._recorded.get(back)
        if out is not None and reqs == self._batch:
            return out
        live, stride, found = self.live, self.step_stride, self.found(reqs)
        if stride == 1:  # the default: every step
            out = [(i, rid, live[rid] - back) for i, rid in found if live[rid] >= back]
        else:
            out = [(i, rid, live[rid] - back) for i, rid in found
                   if live[rid] - back >= 0 and step_sampled(live[rid] - back, stride)]
        self._recorded[back] = out
        return out


def count(totals: Totals, accept_lens: Sequence[int], rows, num_draft_tokens: Optional[int]) -> None:
    """One verify step and ``accept_len - 1`` accepted drafts for each ``(row, rid)`` live before the result."""
    proposed = (num_draft_tokens or 1) - 1
    for i, rid in rows:
        t = totals.get(rid)
        if t is None:
            t = totals[rid] = [0, 0, 0]
        t[0] += 1
        t[1] += accept_lens[i] - 1
        t[2] += proposed


def _finish_reason(req) -> Optional[str]:
    reason = getattr(req, "finished_reason", None)
    try:
        return None if reason is None else reason.to_json().get("type")
    except Exception:
        return None


def finished_record(req, sampled: bool, traced: Optional[List[int]], started_at: Optional[float],
                    num_draft_tokens: Optional[int],
                    now: Optional[float] = None) -> Tuple[Dict[str, Any], Optional[str]]:
    """(the ``RequestRecord`` of ``req``, a message when the tracer's totals differ from SGLang's). ``traced``:
    the tracer's own totals, counted for sampled requests only (None: none, and no ``traced_*`` fields)."""
    ct = int(getattr(req, "spec_verify_ct", 0))
    accepted = int(getattr(req, "spec_num_correct_drafts", 0))
    info = {"rid": req.rid, "sampled": sampled,
            "prompt_len": len(req.origin_input_ids), "prompt_key": prompt_key(req.origin_input_ids),
            "output_len": len(req.output_ids),
            "started_at": started_at, "finished_at": time.time() if now is None else now,
            "finish_reason": _finish_reason(req), "spec_verify_ct": ct, "spec_accepted_drafts": accepted,
            "spec_proposed_drafts": ct * (num_draft_tokens - 1) if num_draft_tokens else None}
    mismatch = None
    if traced is not None:
        info.update(traced_verify_ct=traced[0], traced_accepted_drafts=traced[1],
                    traced_proposed_drafts=traced[2] if num_draft_tokens else None)
        if (traced[0], traced[1]) != (ct, accepted):
            mismatch = f"{req.rid}: traced {traced[0]} steps / {traced[1]} accepted, SGLang {ct} / {accepted}"
    return {k: v for k, v in info.items() if v is not None}, mismatch
