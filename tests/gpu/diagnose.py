"""A GPU trace diagnosed as the dashboard diagnoses it: imported into a fresh store, refreshed, and the
runtime rules run on its observation (the GPU bed's and the Kimi-shaped phase's checks)."""

from __future__ import annotations

from pathlib import Path


def diagnose(trace: Path, draft: Path, target: Path, store: Path) -> tuple:
    """(runtime findings with the draft read from disk, from the trace alone, stored by refresh_run, the
    observation) of ``trace`` imported into a fresh store, as the dashboard diagnoses it."""
    import sqlalchemy as sa

    from draftscope.findings import runtime_findings
    from draftscope.spec import read_draft, read_target
    from draftscope.store import db, models
    from draftscope.store.analyze import refresh_run
    from draftscope.store.importer import import_files
    from draftscope.store.stats import observation as run_observation

    url = f"sqlite:///{store}"
    db.upgrade(url)
    engine = db.make_engine(url)
    try:
        import_files(engine, [trace])
        with engine.connect() as conn:
            run_id = conn.execute(sa.select(models.Run.id)).scalar_one()
        stored = refresh_run(engine, run_id)
        with engine.connect() as conn:
            facts = conn.execute(sa.select(models.Run.facts).where(models.Run.id == run_id)).scalar()
            observation = run_observation(conn, run_id, facts)
    finally:
        engine.dispose()
    spec = read_draft(draft, target_layers=read_target(target).num_layers)
    return runtime_findings(spec, observation), runtime_findings(None, observation), stored, observation
