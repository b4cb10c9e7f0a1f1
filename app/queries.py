"""Read queries behind the pages and the JSON API."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from draftscope import models

_RUNS = models.Run.__table__
_COUNTED = {"requests": models.Request, "steps": models.VerifyStep,
            "samples": models.TensorSample, "findings": models.Finding}
RUN_LIST_COLUMNS = ("id", "engine", "engine_version", "source", "status", "started_at", "ended_at",
                    "algorithm", "target_path", "draft_path")


def list_runs(conn: sa.Connection, limit: int = 200) -> list[dict[str, Any]]:
    """The newest runs first, each with its record counts (requests, steps, samples, findings)."""
    counts = [
        sa.select(sa.func.count()).select_from(model.__table__)
        .where(model.__table__.c.run_id == _RUNS.c.id).scalar_subquery().label(f"{name}_count")
        for name, model in _COUNTED.items()
    ]
    query = (sa.select(*(_RUNS.c[c] for c in RUN_LIST_COLUMNS), *counts)
             .order_by(_RUNS.c.started_at.desc()).limit(limit))
    return [dict(row) for row in conn.execute(query).mappings()]
