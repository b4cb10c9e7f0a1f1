"""Verify steps that lost their top-k, and why, from the tracer's drop counters.

A step record keeps its tokens and acceptance whatever happens; its top-k tables come from summary
launches the tracer may drop. The summary ring holds a fixed number of unread launches per tensor
layout: a launch past it is dropped and counted as ``summary_ring_full``, taking the step's target
top-k (the verify launch) or the draft's at position 1 (the draft-logits launch). The step tap reads
the draft's positions 2.. for at most 16 sampled requests per batch; the others are counted as
``draft_tap_full``. A tree draft (``--speculative-eagle-topk`` > 1) records position 1 only: that
is not a loss.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from draftscope import models

_STEPS = models.VerifyStep.__table__
# part of a step's top-k -> (what the page calls it, the drop counter that loses it, why)
PARTS = {
    "target": ("the target's top-k", "summary_ring_full",
               "the summary ring was full, so the verify step's summary launch was dropped"),
    "draft_first": ("the draft's top-k at position 1", "summary_ring_full",
                    "the summary ring was full, so the draft-logits launch was dropped"),
    "draft_later": ("the draft's top-k at positions 2..", "draft_tap_full",
                    "more than 16 sampled requests shared the batch; the step tap reads 16"),
}
REQUESTS_LISTED = 20


def later_positions_read(facts: dict[str, Any] | None) -> bool:
    """The tracer reads positions 2.. of a chain draft of more than one step (``StepTap``)."""
    facts = facts or {}
    return facts.get("spec_topk") == 1 and (facts.get("spec_num_steps") or 0) > 1


def step_gaps(step: dict[str, Any], facts: dict[str, Any] | None) -> list[str]:
    """The PARTS this stored step lacks."""
    gaps = [] if step.get("target_topk") is not None else ["target"]
    draft, drafted = step.get("draft_topk"), len(step.get("drafted_tokens") or [])
    if drafted and not (draft and draft[0]):
        gaps.append("draft_first")
    if drafted > 1 and later_positions_read(facts) and not (draft and len(draft) >= drafted and all(draft[1:])):
        gaps.append("draft_later")
    return gaps


def _null(column: sa.Column) -> sa.ColumnElement:
    """SQL NULL or a JSON null (a JSON column stores None as ``null``)."""
    return sa.or_(column.is_(None), sa.cast(column, sa.Text) == "null")


def run_gaps(conn: sa.Connection, run_id: str, health: dict[str, Any] | None,
             facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """How many stored steps of which requests lack which top-k, with the drop counts that explain
    them; None when the latest health record counts no such drop (then none was lost that way)."""
    drops = (health or {}).get("drops") or {}
    ring, tap = drops.get("summary_ring_full") or 0, (drops.get("draft_tap_full") or 0)
    if not ring and not tap:
        return None
    draft = sa.cast(_STEPS.c.draft_topk, sa.Text)
    lost = {"target": _null(_STEPS.c.target_topk) if ring else sa.false(),
            "draft_first": sa.or_(_null(_STEPS.c.draft_topk), draft.like("[[]%")) if ring else sa.false(),
            "draft_later": sa.case((_null(_STEPS.c.draft_topk), True),
                                   else_=sa.func.json_array_length(_STEPS.c.draft_topk)
                                   < sa.func.json_array_length(_STEPS.c.drafted_tokens))
            if tap and later_positions_read(facts) else sa.false()}
    counts = [sa.func.sum(sa.case((cond, 1), else_=0)) for cond in lost.values()]
    rows = conn.execute(sa.select(_STEPS.c.rid, sa.func.count(), *counts)
                        .where(_STEPS.c.run_id == run_id, sa.or_(*lost.values()))
                        .group_by(_STEPS.c.rid).order_by(sa.func.count().desc(), _STEPS.c.rid)).all()
    parts = []
    for i, key in enumerate(PARTS):
        what, counter, why = PARTS[key]
        steps = sum(int(r[2 + i] or 0) for r in rows)
        if steps:
            parts.append({"part": key, "what": what, "steps": steps, "why": why, "counter": counter,
                          "drops": drops.get(counter) or 0})
    return {"steps": sum(r[1] for r in rows), "requests": len(rows), "parts": parts,
            "listed": [{"rid": r[0], "steps": r[1]} for r in rows[:REQUESTS_LISTED]],
            "drops": {"summary_ring_full": ring, "draft_tap_full": tap}}
