"""refresh_run on a real migrated store: the observation from the run's aggregates, findings rows replaced."""

from __future__ import annotations

import time
import uuid

from sqlmodel import Session, select

from draftscope.store import db, models
from draftscope.store.analyze import refresh_run
from draftscope.store.stats import observation
from tests.spec_fixtures import tiny_draft_config, tiny_target, tiny_weights, write_draft
from tests.test_findings_runtime import HEALTHY_FACTS


def _store_run(session, run_id, facts, widths, flags, server_args=None):
    run = models.Run(id=run_id, engine="sglang", engine_version="0.5.23", source="tracer",
                     status="ended", started_at=time.time(), algorithm=facts["algorithm"],
                     facts=facts, server_args=server_args or {})
    session.add(run)
    session.flush()
    now = time.time()
    for phase, width in widths:
        session.add(models.TensorSample(run_key=run.key, point="draft.input", phase=phase, at=now,
                                        shape=[4, width], dtype="float32", width=width, rows=4))
    for i in range(3):
        session.add(models.TensorSample(run_key=run.key, point=f"target.aux[{i}]", phase="prefill",
                                        at=now, shape=[4, 128], dtype="float32", width=128, rows=4,
                                        l2_mean=10.0 + i))
    for step, f in enumerate(flags):
        session.add(models.VerifyStep(run_key=run.key, rid="r0", step_index=step, at=now, seq_pos=20 + step,
                                      drafted_tokens=[1, 2, 3], accept_len=1 + sum(f), accept_flags=f))
    session.add(models.TracerHealth(run_id=run_id, at=now, drops={}, errors={},
                                    heartbeats={"verify": len(flags), "draft": len(flags)},
                                    disabled_probes=[]))
    session.add(models.Finding(run_id=run_id, rule_id="stale", severity="error", message="old",
                               source="runtime"))
    session.commit()


def test_analyze_aux_off_run(store_url, tmp_path):
    engine = db.make_engine(store_url)
    tiny_target(tmp_path / "t")
    off = {"eagle_aux_hidden_state_layer_ids": [1, 4, 6], "use_aux_hidden_state": False}
    write_draft(tmp_path / "d", tiny_draft_config(eagle_config=off), tiny_weights())
    facts = {**HEALTHY_FACTS,
             "target": {**HEALTHY_FACTS["target"], "path": str(tmp_path / "t"),
                        "capture_aux_hidden_states": False, "layers_to_capture": []},
             "draft": {**HEALTHY_FACTS["draft"], "path": str(tmp_path / "d")}}
    run_id = uuid.uuid4().hex
    with Session(engine) as session:
        _store_run(session, run_id, facts, [("prefill", 128), ("draft_decode", 128)],
                   [[False, False, False]] * 30)
    found = refresh_run(engine, run_id)
    with engine.connect() as conn:
        obs = observation(conn, run_id, facts)
    assert obs.draft_input_widths == {"prefill": [128], "draft_decode": [128]}
    assert (obs.verify_steps, obs.proposed_drafts, obs.accepted_drafts) == (30, 90, 0)
    assert obs.aux_l2_mean == {0: 10.0, 1: 11.0, 2: 12.0} and obs.max_seq_pos == 49
    assert obs.max_seq_pos_at == ("r0", 29) and obs.heartbeats == {"verify": 30, "draft": 30}
    with Session(engine) as session:
        rows = session.exec(select(models.Finding).where(models.Finding.run_id == run_id)).all()
    assert [f.rule_id for f in found] == ["fc-bypassed"] and found[0].source == "static"
    assert [(r.rule_id, r.source) for r in rows] == [("fc-bypassed", "static")]


def test_analyze_healthy_collapse_is_quality(store_url):
    engine = db.make_engine(store_url)
    run_id = uuid.uuid4().hex
    with Session(engine) as session:
        _store_run(session, run_id, HEALTHY_FACTS, [("prefill", 384), ("draft_decode", 128)],
                   [[False, False, False]] * 30)
    found = refresh_run(engine, run_id)
    again = refresh_run(engine, run_id)
    with Session(engine) as session:
        rows = session.exec(select(models.Finding).where(models.Finding.run_id == run_id)).all()
    assert [f.rule_id for f in found] == ["acceptance-collapse-quality"] == [f.rule_id for f in again]
    assert [r.rule_id for r in rows] == ["acceptance-collapse-quality"]
    first_ids = [r.id for r in rows]
    refresh_run(engine, run_id)  # an unchanged diagnosis keeps its rows (ids, times)
    with Session(engine) as session:
        assert [r.id for r in session.exec(select(models.Finding)
                                           .where(models.Finding.run_id == run_id)).all()] == first_ids
