"""The records of a vLLM engine's verify steps and draft inputs: functions the recorder process runs (no
torch), over the row copies (``stats.RowCopies``) the vLLM hooks queued. Same wire records as SGLang's
(``records.py``); the draft's features reuse :func:`records.features`.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

from draftscope_tracer.stats import merged_stats
from draftscope_tracer.transport.records import sample_record, topk_list
from draftscope_tracer.transport.writer import Records


class VerifyStep(NamedTuple):
    """One sampled request's verify step as vLLM ran it."""

    rid: str
    step: int
    seq_pos: Optional[int]  # its sequence length before the step (the verified token's position)
    drafted: List[int]  # the draft tokens vLLM scheduled (target ids)
    sampled: List[int]  # what the rejection sampler kept: the accepted drafts, then the bonus token
    rows: List[int]  # its rows (positions) in the step's target copies: the verified token, then the drafts
    draft: Optional[tuple] = None  # (the draft's top-k at every draft position, one summary; this request's row
    # there per position)


def verify(steps: List[VerifyStep], target, now: float, H: Optional[int], chunks: int, dtype: Optional[str]) -> Records:
    """A ``StepRecord`` per step (with the target's top-k before each drafted token and the draft's top-k
    that proposed it) and its ``target.aux[i]`` samples (chunk ``i`` of the rows the target ran: the
    verified token and the drafts). ``target``: ``RowCopies`` of the step's rows (aux chunks when ``chunks``,
    the target's top-k), or None."""
    s = target.result() if target is not None else None
    out: Records = {"steps": [], "samples": []}
    for st in steps:
        a = len(st.sampled)
        rec = {"rid": st.rid, "step_index": st.step, "at": now, "seq_pos": st.seq_pos, "drafted_tokens": st.drafted,
               "accept_len": a, "accept_flags": [p <= a - 1 for p in range(1, len(st.drafted) + 1)],
               "bonus_token": st.sampled[-1] if st.sampled else None}
        out["steps"].append(rec)
        if st.draft is not None:  # one summary of every draft position: this request's row at each
            summary, rows = st.draft
            drafted = summary.result().rows
            rec["draft_topk"] = [topk_list(drafted[r].topk) for r in rows][:len(st.drafted)]
        if s is not None and st.rows:
            if s.rows[st.rows[0]].topk is not None:  # the target's distribution over each drafted token
                rec["target_topk"] = [topk_list(s.rows[r].topk) for r in st.rows[:len(st.drafted)]]
            for c in range(chunks):
                out["samples"].append(sample_record(f"target.aux[{c}]", "verify", now, st.rid, st.step,
                                                    [len(st.rows), H], dtype, merged_stats(s, st.rows, [c])))
    return out
