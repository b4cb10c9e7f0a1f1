"""Credentials out of every free-text value the dashboard stores, shows or bundles.

The tracer scrubs what it records (``draftscope_tracer.redact.scrub``: URL userinfo, credential-like
query parameters, ``Authorization``/``Bearer`` values); an older tracer, a hand-written batch or an
imported bundle may not have. So the same scrub runs again here: at ingest on a batch's free text
(``redact_batch``, before anything is stored), and on the way out of the store for rows written
before it (``redact_row``: run records in ``queries.safe_run``, findings, the runs list, bundles).
"""

from __future__ import annotations

from typing import Any

import msgspec

from draftscope_tracer.redact import scrub

__all__ = ["redact_batch", "redact_row", "scrub"]

FINDING_TEXT = ("message", "fix", "evidence")  # a finding's free text (its rule id and severity are names)


def redact_batch(batch: Any) -> Any:
    """``batch`` (a parsed ``FastBatch``) with credentials scrubbed from its free text: every string of
    its run record (server args, facts with their error messages, paths, tracer config) and of its
    findings. Requests, steps, samples and health hold ids, numbers and probe names only."""
    changes: dict[str, Any] = {}
    if batch.run is not None:
        changes["run"] = _scrubbed(batch.run, None)
    if batch.findings:
        changes["findings"] = [_scrubbed(f, FINDING_TEXT) for f in batch.findings]
    return msgspec.structs.replace(batch, **changes) if changes else batch


def _scrubbed(record: msgspec.Struct, fields: tuple[str, ...] | None) -> msgspec.Struct:
    """``record`` with ``scrub`` applied to its text fields (``fields``; None: all of them)."""
    names = fields if fields is not None else [f.name for f in msgspec.structs.fields(record)]
    changed = {}
    for name in names:
        value = getattr(record, name)
        if isinstance(value, (str, dict, list)):
            clean = scrub(value)
            if clean != value:
                changed[name] = clean
    return msgspec.structs.replace(record, **changed) if changed else record


def redact_row(row: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """``row`` (a stored row as a dict) with ``scrub`` applied to the values of ``fields`` it holds."""
    return {**row, **{k: scrub(row[k]) for k in fields if row.get(k) is not None}}
