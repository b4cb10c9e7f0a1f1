"""What ingest refuses beyond the wire schema (``wire_schema``), each with the field it names:

- a time more than ``FUTURE_SLACK_S`` ahead of the dashboard's clock (the schema bounds times to
  2000..2100; a tracer's clock a day fast is broken, and a far-future run would head the runs list);
- in the free-form JSON values (``run.server_args``, ``run.tracer_config``, ``run.facts``,
  ``findings[].evidence``): nesting deeper than ``MAX_JSON_DEPTH``, a NUL in a key or string, an
  integer outside 64 bits;
- what a tracer does not own: ``run.source`` "bundle" is written by import alone.

The schema itself already refuses server-owned statuses (``pruning``), unknown engines and severities,
non-finite times, integers outside their column, unsafe ids and NUL in typed strings. An imported
bundle's records get the same checks (``check_run``, ``check_records``: ``bundle.reader``), named by
member and line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
    latest = latest_time(now)
    _check_time(batch.sent_at, "sent_at", latest)
    run = batch.run
    if run is not None:
        if run.source != "tracer":
            raise Refused("run.source", f"{run.source!r} is written by `draftscope import` only; a "
                                        "tracer sends \"tracer\"")
        check_run(run, "run", latest)
    for key in _TIMED:
        check_records(key, getattr(batch, key), lambda i, sub, key=key: f"{key}[{i}].{sub}", latest)


def latest_time(now: float | None = None) -> float:
    """The latest time ingest takes: ``now`` (the dashboard's clock) plus ``FUTURE_SLACK_S``."""
    return (time.time() if now is None else now) + FUTURE_SLACK_S


def check_run(run: Any, field: str, latest: float) -> None:
    """A run record's times and free-form JSON (``field``: what to call it); its ``source`` is the
    caller's to check (a tracer sends "tracer", an import writes "bundle")."""
    _check_time(run.started_at, f"{field}.started_at", latest)
    _check_time(run.ended_at, f"{field}.ended_at", latest)
    for name in ("server_args", "tracer_config", "facts"):
        check_json(getattr(run, name), f"{field}.{name}")


def check_records(key: str, records: list, field: Callable[[int, str], str], latest: float) -> None:
    """The records of a batch's ``key`` list (``steps``, ``findings``, ...): their times, a health
    record's gaps, a finding's evidence; ``field(i, name)`` names field ``name`` of record ``i``. The
    time fields are compared by their maximum first: most batches have none to name."""
    names = _TIMED[key]
    if key not in ("health", "findings") and max(
            (t for r in records for name in names if (t := getattr(r, name)) is not None), default=0.0) <= latest:
        return
    for i, record in enumerate(records):
        for name in names:
            _check_time(getattr(record, name), field(i, name), latest)
        if key == "health":
            for j, gap in enumerate(record.gaps or ()):
                for k, t in enumerate(gap):
                    _check_time(t, field(i, f"gaps[{j}][{k}]"), latest)
        elif key == "findings":
            check_json(record.evidence, field(i, "evidence"))


def _check_time(value: float | None, field: str, latest: float) -> None:
    if value is not None and value > latest:
        raise Refused(field, f"{value!r} is more than a day ahead of the dashboard's clock "
                             f"({time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(latest - FUTURE_SLACK_S))} "
                             "UTC); send unix seconds from a clock that is set")


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
