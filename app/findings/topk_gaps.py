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
SERIES = "steps.topk_lost"  # run_stat_bins series: key "part|rid", n steps (draftscope.store.stats)


def later_positions_read(facts: dict[str, Any] | None) -> bool:
    """The tracer reads positions 2.. of a chain draft of more than one step (``StepTap``)."""
    facts = facts or {}
    return facts.get("spec_topk") == 1 and (facts.get("spec_num_steps") or 0) > 1


def step_gaps(step: dict[str, Any], facts: dict[str, Any] | None) -> list[str]:
    """The PARTS this stored step lacks (as ``lost_conditions`` counts them)."""
    gaps = [] if step.get("target_topk") is not None else ["target"]
    draft, drafted = step.get("draft_topk"), len(step.get("drafted_tokens") or [])
    if drafted and not (draft and draft[0]):
        gaps.append("draft_first")
    if drafted > 1 and later_positions_read(facts) and not (draft and len(draft) >= drafted):
        gaps.append("draft_later")
    return gaps


def _null(column: sa.Column) -> sa.ColumnElement:
    """SQL NULL or a JSON null (a JSON column stores None as ``null``)."""
    return sa.or_(column.is_(None), sa.cast(column, sa.Text) == "null")


def lost_conditions(steps: sa.Table) -> dict[str, sa.ColumnElement]:
    """SQL conditions on verify_steps rows, per PARTS key, plus ``any`` (any part) and
    ``any_but_later`` (target or position 1: the count that holds when positions 2.. are not read).
    ``stats`` folds their counts per request into run_stat_bins (SERIES) as steps arrive."""
    drafted = sa.func.json_array_length(steps.c.drafted_tokens)
    no_draft = _null(steps.c.draft_topk)
    target = _null(steps.c.target_topk)
    first = sa.or_(no_draft, sa.cast(steps.c.draft_topk, sa.Text).like("[[]%"))
    later = sa.case((no_draft, drafted > 1), else_=sa.func.json_array_length(steps.c.draft_topk) < drafted)
    return {"target": target, "draft_first": first, "draft_later": later,
            "any": sa.or_(target, first, later), "any_but_later": sa.or_(target, first)}


def run_gaps(bins: list[dict[str, Any]], health: dict[str, Any] | None,
             facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """How many stored steps of which requests lack which top-k, with the drop counts that explain
    them, from the run's SERIES bins (key ``part|rid``); None when the latest health record counts
    no such drop (then none was lost that way)."""
    drops = (health or {}).get("drops") or {}
    counted = {k: drops.get(k) or 0 for k in ("summary_ring_full", "draft_tap_full")}
    if not any(counted.values()):
        return None
    later = later_positions_read(facts)
    total_key = "any" if later else "any_but_later"
    per_part: dict[str, int] = {}
    per_rid: dict[str, int] = {}
    for b in bins:
        part, _, rid = b["key"].partition("|")
        if part == total_key:
            per_rid[rid] = per_rid.get(rid, 0) + b["n"]
        elif part in PARTS and (later or part != "draft_later"):
            per_part[part] = per_part.get(part, 0) + b["n"]
    parts = [{"part": key, "what": what, "steps": per_part[key], "why": why, "counter": counter,
              "drops": counted[counter]}
             for key, (what, counter, why) in PARTS.items() if per_part.get(key)]
    ranked = sorted(per_rid.items(), key=lambda kv: (-kv[1], kv[0]))
    return {"steps": sum(per_rid.values()), "requests": len(per_rid), "parts": parts,
            "listed": [{"rid": rid, "steps": n} for rid, n in ranked[:REQUESTS_LISTED]],
            "drops": counted}
