"""The feature spec an imported bundle carried (its manifest's ``feature_spec``), for the pages and
the findings of a run whose draft and target directories are not readable here."""

from __future__ import annotations

import sqlalchemy as sa

from draftscope.spec import DraftFeatureSpec, TargetSpec, VocabMapCheck
from draftscope.store.tables import IMPORTS


def imported_spec(conn: sa.Connection, run_id: str) -> tuple[DraftFeatureSpec, TargetSpec] | None:
    """(draft spec, target spec) from the manifest of the bundle ``run_id`` was imported from; None
    for a traced run, or a bundle made where the models were not readable."""
    manifest = conn.execute(sa.select(IMPORTS.c.manifest).where(IMPORTS.c.run_id == run_id)).scalar()
    spec = (manifest or {}).get("feature_spec") or {}
    if not spec.get("draft") or not spec.get("target"):
        return None
    draft = dict(spec["draft"], vocab_map=VocabMapCheck(**spec["draft"]["vocab_map"]))
    return DraftFeatureSpec(**draft), TargetSpec(**spec["target"])
