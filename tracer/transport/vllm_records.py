"""The records of a vLLM engine's verify steps and draft inputs: functions the recorder process runs (no
torch), over the row copies (``stats.RowCopies``) the vLLM hooks queued. Same wire records as SGLang's
(``records.py``); the draft's features reuse :func:`records.features`.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

from draftscope_tracer.stats import merged_stats
from draftscope_tracer.transport.records import sample_record
from draftscope_tracer.transport.writer import Records


class VerifyStep(NamedTuple):
    """One sampled request's verify step as vLLM ran it."""

    rid: str
    step: int
    seq_pos: Optional[int]  # its sequence length before the step (the verified token's position)
    drafted: List[int]  # the draft tokens vLLM scheduled (target ids)
    sampled: List[int]  # what the rejection sampler kept: the accepted drafts, then the bonus token
    aux_rows: List[int]  # its rows (positions) in the step's aux copies; [] without aux hidden states


def verify(steps: List[VerifyStep], aux, now: float, H: Optional[int], chunks: int, dtype: Optional[str]) -> Records:
    """A ``StepRecord`` per step and its ``target.aux[i]`` samples (chunk ``i`` of the rows the target ran:
    the verified token and the drafts) from ``aux`` (``RowCopies`` of the step's aux rows, or None)."""
    s = aux.result() if aux is not None else None
    out: Records = {"steps": [], "samples": []}
    for st in steps:
        a = len(st.sampled)
        out["steps"].append({"rid": st.rid, "step_index": st.step, "at": now, "seq_pos": st.seq_pos,
                             "drafted_tokens": st.drafted, "accept_len": a,
                             "accept_flags": [p <= a - 1 for p in range(1, len(st.drafted) + 1)],
                             "bonus_token": st.sampled[-1] if st.sampled else None})
        if s is not None and st.aux_rows:
            for c in range(chunks):
                out["samples"].append(sample_record(f"target.aux[{c}]", "verify", now, st.rid, st.step,
                                                    [len(st.aux_rows), H], dtype, merged_stats(s, st.aux_rows, [c])))
    return out
