"""``GET /healthz``: is the dashboard up, is its store at this draftscope's schema, and is the work it
does in the background (summary refresh, WAL checkpoints, retention) succeeding.

Answers, in this order:

- ``unavailable`` (503): the store cannot be read;
- ``schema_behind`` (503): the store's revision is not this draftscope's head;
- ``degraded`` (200): the dashboard serves, but background work fails (a full disk: summaries are not
  written and pages say they are stale); ``problems`` says what, since when and why;
- ``ok`` (200).

``degraded`` answers 200 so that a load balancer keeps a dashboard that can still serve what is stored;
a monitor alerts on ``status``. The answer carries no run id, path or credential (it needs no token).
"""

from __future__ import annotations

from typing import Any

from alembic.runtime.migration import MigrationContext

from draftscope.store import db


def health(state: Any) -> tuple[dict[str, Any], int]:
    """The ``/healthz`` body and status code for the app whose ``app.state`` is ``state``."""
    head = db.head_revision()
    try:
        with state.engine.connect() as conn:
            revision = MigrationContext.configure(conn).get_current_revision()
    except Exception as exc:  # noqa: BLE001 - any failure to read is the answer
        return {"status": "unavailable", "head_revision": head,
                "problems": [f"The store cannot be read ({db.failure_reason(exc)})."]}, 503
    problems = background_problems(state)
    body: dict[str, Any] = {"db_revision": revision, "head_revision": head, "problems": problems,
                            "errors": background_errors(state)}
    if revision != head:
        return {"status": "schema_behind", **body}, 503
    return {"status": "degraded" if problems else "ok", **body}, 200


def background_problems(state: Any) -> list[str]:
    """A sentence for each background job that fails now, or whose thread has stopped."""
    refresher = state.refresher
    checkpointer = getattr(state, "checkpointer", None)
    retainer = getattr(state, "retainer", None)
    problems = [refresher.problem(), checkpointer and checkpointer.problem(), retainer and retainer.problem()]
    for name, job in (("summary refresh", refresher), ("WAL checkpoint", checkpointer)):
        if job is not None and not job.alive():
            problems.append(f"The {name} thread has stopped.")
    return [p for p in problems if p]


def background_errors(state: Any) -> dict[str, int]:
    """Failures counted since start, per background job (each retried; ``problems`` says which fail now)."""
    jobs = {"refresh": state.refresher, "wal_checkpoint": getattr(state, "checkpointer", None),
            "retention": getattr(state, "retainer", None)}
    return {name: job.errors for name, job in jobs.items() if job is not None}
