"""What ingest refuses beyond the wire schema (``wire_schema``), each with the field it names:

- a time more than ``FUTURE_SLACK_S`` ahead of the dashboard's clock (the schema bounds times to
  2000..2100; a tracer's clock a day fast is broken, and a far-future run would head the runs list);
- in the free-form JSON values (``run.server_args``, ``run.tracer_config``, ``run.facts``,
  ``findings[].evidence``): nesting deeper than ``MAX_JSON_DEPTH``, a NUL in a key or string, an
  integer outside 64 bits;
- what a tracer does not own: ``run.source`` "bundle" is written by import alone.

The schema itself already refuses server-owned statuses (``pruning``), unknown engines and severities,
non-finite times, integers outside their column, unsafe ids and NUL in typed strings.
"""

from __future__ import annotations

import time
from typing import Any

from draftscope.store.wire_schema import INT8

FUTURE_SLACK_S = 86_400.0
MAX_JSON_DEPTH = 32
_TIMED = {"requests": ("started_at", "finished_at"), "steps": ("at",), "samples": ("at",),
          "health": ("at",), "findings": ("at",)}


class Refused(ValueError):
    """A value ingest does not store; ``field`` is its path in the batch (``steps[3].at``)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def check_batch(batch: Any, now: float | None = None) -> None:
    """Raise Refused for the first value of ``batch`` (a decoded ``FastBatch``) ingest does not take."""
    latest = (time.time() if now is None else now) + FUTURE_SLACK_S
    _check_times(batch, latest)
    run = batch.run
    if run is not None:
        if run.source != "tracer":
            raise Refused("run.source", f"{run.source!r} is written by `draftscope import` only; a "
                                        "tracer sends \"tracer\"")
        for name in ("server_args", "tracer_config", "facts"):
            check_json(getattr(run, name), f"run.{name}")
    for i, finding in enumerate(batch.findings):
        check_json(finding.evidence, f"findings[{i}].evidence")


def _check_times(batch: Any, latest: float) -> None:
    def check(value: float | None, field: str) -> None:
        if value is not None and value > latest:
            raise Refused(field, f"{value!r} is more than a day ahead of the dashboard's clock "
                                 f"({time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(latest - FUTURE_SLACK_S))} "
                                 "UTC); send unix seconds from a clock that is set")

    check(batch.sent_at, "sent_at")
    if batch.run is not None:
        check(batch.run.started_at, "run.started_at")
        check(batch.run.ended_at, "run.ended_at")
    for key, fields in _TIMED.items():
        records = getattr(batch, key)
        for name in fields:
            if max((t for r in records if (t := getattr(r, name)) is not None), default=0.0) > latest:
                for i, record in enumerate(records):
                    check(getattr(record, name), f"{key}[{i}].{name}")
    for i, health in enumerate(batch.health):
        for j, gap in enumerate(health.gaps or ()):
            for k, t in enumerate(gap):
                check(t, f"health[{i}].gaps[{j}][{k}]")


def check_json(value: Any, field: str, depth: int = 0) -> None:
    """Refuse a JSON value nested deeper than ``MAX_JSON_DEPTH``, with a NUL in a key or string, or
    an integer outside 64 bits (the store's JSON is written by orjson, which has no bigger ones)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise Refused(field, "holds a NUL character; PostgreSQL cannot store one")
    elif isinstance(value, bool) or value is None or isinstance(value, float):
        return
    elif isinstance(value, int):
        if not INT8[0] <= value <= INT8[1]:
            raise Refused(field, f"integer {value} does not fit in 64 bits")
    elif depth >= MAX_JSON_DEPTH:
        raise Refused(field, f"nests deeper than {MAX_JSON_DEPTH} levels")
    elif isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in key:
                raise Refused(field, "has a key holding a NUL character; PostgreSQL cannot store one")
            check_json(item, f"{field}.{key[:40]}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_json(item, f"{field}[{i}]", depth + 1)
