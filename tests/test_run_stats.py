"""Run aggregates folded on arrival (draftscope.store.stats) and the queries the pages read them with.

Batches go through the ingest path (BatchWriter), aggregates through refresh_run, on SQLite and
PostgreSQL; folding in several steps must give what one fold over everything gives.
"""

from __future__ import annotations

import time
import uuid

import orjson
import pytest
import sqlalchemy as sa

from draftscope.store import db, models, queries
from draftscope.store.analyze import refresh_run
from draftscope.store.ingest import BatchWriter
from tests.fixtures.store import make_batch, run_record, sample_record, step_record

T0 = 1_700_000_000.25  # quarter seconds: bucket edges never fall on a sample time


def _steps(rid: str, n: int, start: int, at0: float) -> list[dict]:
    """Verify steps with 3 drafted positions; step i accepts i % 4 drafts, seq_pos grows 37 per step."""
    return [step_record(rid, i, at=at0 + 5.0 * i, seq_pos=37 * i, accept_len=1 + i % 4,
                        accept_flags=[p < i % 4 for p in range(3)]) for i in range(start, start + n)]


def _samples(n: int, start: int, at0: float) -> list[dict]:
    points = ["draft.input", "target.aux[0]", "target.aux[1]", "draft.fc.out", "draft.logits.topk"]
    return [sample_record(i, point=points[i % 5], phase=("prefill", "draft_decode")[i % 2],
                          width=(384, 128)[i % 2], at=at0 + 3.0 * i, l2_mean=float(i % 7))
            for i in range(start, start + n)]


REQUESTS = [
    {"rid": "r0", "sampled": True, "output_len": 40, "started_at": T0 + 3, "finish_reason": "stop",
     "spec_verify_ct": 20, "spec_accepted_drafts": 19, "spec_proposed_drafts": 60,
     "traced_verify_ct": 20, "traced_accepted_drafts": 19, "traced_proposed_drafts": 60},
    {"rid": "r1", "sampled": True, "output_len": 30, "started_at": T0 + 1, "finish_reason": "length",
     "spec_verify_ct": 10, "spec_accepted_drafts": 19, "spec_proposed_drafts": 30,
     "traced_verify_ct": 9, "traced_accepted_drafts": 17, "traced_proposed_drafts": 27},
    {"rid": "r2", "sampled": False, "output_len": 11, "started_at": T0 + 2, "finish_reason": "stop",
     "spec_verify_ct": 5, "spec_accepted_drafts": 5, "spec_proposed_drafts": 15},
]


def _send(writer: BatchWriter, run_id: str, **records) -> None:
    body = make_batch(run_id, run=run_record(started_at=T0 - 1), **records)
    assert writer.write(orjson.dumps(body)).status == "stored"


@pytest.fixture
def engine(store_url):
    engine = db.make_engine(store_url)
    yield engine
    engine.dispose()


def _stored_run(engine) -> str:
    """A run sent in four batches, folded after each one."""
    writer, run_id = BatchWriter(engine), uuid.uuid4().hex
    _send(writer, run_id, requests=REQUESTS[:1], steps=_steps("r0", 20, 0, T0),
          samples=_samples(50, 0, T0))
    refresh_run(engine, run_id)
    _send(writer, run_id, requests=REQUESTS[1:], steps=_steps("r1", 9, 0, T0 + 100))
    refresh_run(engine, run_id)
    # 2,000 s later and 10,000 positions further: the time and position bins must widen
    _send(writer, run_id, steps=_steps("r0", 30, 20, T0 + 2000), samples=_samples(300, 50, T0 + 500))
    refresh_run(engine, run_id)
    _send(writer, run_id, requests=[{"rid": "r0", "output_len": 41}])
    refresh_run(engine, run_id)
    return run_id


def test_folding_in_steps_equals_one_fold(engine) -> None:
    run_id = _stored_run(engine)
    with engine.connect() as conn:
        stepwise = queries.run_summary(conn, run_id)
    with engine.begin() as conn:
        for model in (models.RunStatBin, models.RunStats):
            table = model.__table__
            conn.execute(table.delete().where(table.c.run_id == run_id))
    refresh_run(engine, run_id)
    with engine.connect() as conn:
        once = queries.run_summary(conn, run_id)
    stepwise.pop("updated_at"), once.pop("updated_at")
    assert stepwise == once
    assert len(once["over_time"]) <= queries.MAX_TIME_BINS and len(once["by_seq_pos"]) <= queries.MAX_SEQ_BINS


def test_summary_counts_what_was_sent(engine) -> None:
    run_id = _stored_run(engine)
    with engine.connect() as conn:
        summary = queries.run_summary(conn, run_id)
    steps = _steps("r0", 50, 0, T0) + _steps("r1", 9, 0, T0 + 100)
    flags = [s["accept_flags"] for s in steps]
    acc = summary["acceptance"]
    assert acc["verify_steps"] == 59 and acc["proposed"] == 3 * 59
    assert acc["accepted"] == sum(map(sum, flags))
    assert acc["traced_accept_length"] == pytest.approx(1 + acc["accepted"] / 59)
    for p in acc["per_position"]:
        assert p["accepted"] == sum(f[p["position"] - 1] for f in flags) and p["proposed"] == 59
    assert acc["sglang"] == {"verify_ct": 35, "accepted": 43, "proposed": 105, "output_len": 82,
                             "accept_length": pytest.approx(82 / 35)}
    rec = acc["reconcile"]
    assert rec["prefill_tokens"] == 3 and rec["unexplained_tokens"] == 82 - (43 + 35 + 3)
    assert rec["sglang_accept_length_without_prefill"] == pytest.approx(79 / 35)
    assert rec["sampled_requests"] == 2 and rec["sampled_output_len"] == 71
    assert rec["traced_counters"] == {"verify_ct": 29, "accepted": 36, "proposed": 87}
    assert rec["incomplete_requests"] == 1 and rec["steps_not_sampled"] == 0
    assert sum(b["steps"] for b in summary["over_time"]) == 59
    assert sum(b["steps"] for b in summary["by_seq_pos"]) == 59
    assert summary["by_seq_pos"][-1]["lo"] <= 37 * 49 < summary["by_seq_pos"][-1]["hi"]
    assert summary["over_time"][0]["t0"] <= T0 and summary["over_time"][-1]["t1"] > T0 + 5 * 49 + 2000
    samples = _samples(350, 0, T0)
    assert summary["counts"] == {p: sum(s["point"] == p for s in samples) for p in
                                 {s["point"] for s in samples}}
    assert summary["widths"]["draft.input"] == {"prefill": {"384": 35}, "draft_decode": {"128": 35}}
    aux = summary["norms"]["target.aux[0]"]
    l2 = [s["l2_mean"] for s in samples if s["point"] == "target.aux[0]"]
    assert sum(b["n"] for b in aux) == len(l2)
    assert min(b["l2_min"] for b in aux) == min(l2) and max(b["l2_max"] for b in aux) == max(l2)
    assert sum(b["n"] * b["l2_mean"] for b in aux) == pytest.approx(sum(l2))
    assert set(summary["norms"]) == {"target.aux[0]", "target.aux[1]", "draft.fc.out"}


def test_list_runs_triage_columns_sorts_and_filters(engine) -> None:
    run_id = _stored_run(engine)
    writer, other = BatchWriter(engine), uuid.uuid4().hex
    _send(writer, other, findings=[{"rule_id": "fc-bypassed", "severity": "error", "message": "m"},
                                   {"rule_id": "hooks-starved", "severity": "warning", "message": "m"}])
    refresh_run(engine, other)
    with engine.connect() as conn:
        runs = {r["id"]: r for r in queries.list_runs(conn)}
        assert runs[other]["worst_severity"] == "error" and runs[other]["worst_rule_id"] == "fc-bypassed"
        assert runs[other]["live"] and runs[other]["state"] == "live"
        assert runs[other]["mean_accept_length"] is None and runs[other]["per_position"] == []
        mine = runs[run_id]
        assert mine["requests_count"] == 3 and mine["steps_count"] == 59 and mine["samples_count"] == 350
        assert mine["sglang_accept_length"] == pytest.approx(82 / 35)
        assert len(mine["per_position"]) == 3 and mine["per_position"][0] > mine["per_position"][2]
        by_severity = [r["id"] for r in queries.list_runs(conn, sort="worst_severity")]
        assert by_severity.index(other) < by_severity.index(run_id)
        assert [r["id"] for r in queries.list_runs(conn, q=run_id[:10].upper())] == [run_id]
        assert other in [r["id"] for r in queries.list_runs(conn, status="live")]
        assert other not in [r["id"] for r in queries.list_runs(conn, status="ended")]
        with pytest.raises(queries.BadQuery, match="started_at"):
            queries.list_runs(conn, sort="nope; DROP TABLE runs")
        conn.execute(models.IngestBatch.__table__.update().values(received_at=time.time() - 3600))
        assert queries.list_runs(conn, q=other)[0]["state"] == "stalled"
        conn.rollback()


def test_requests_page_filters_sorts_and_pages(engine) -> None:
    run_id = _stored_run(engine)
    with engine.begin() as conn:
        conn.execute(models.Finding.__table__.insert().values(
            run_id=run_id, rule_id="position-beyond-draft-max", severity="warning", message="m",
            source="runtime", rid="r1"))
    with engine.connect() as conn:
        rows, total = queries.run_requests_page(conn, run_id)
        assert total == 3 and [r["rid"] for r in rows] == ["r1", "r2", "r0"]
        r1 = rows[0]
        assert r1["mismatches"] == ["verify_ct", "accepted_drafts", "proposed_drafts"]
        assert r1["sampled_steps"] == 9 and r1["finding_rules"] == ["position-beyond-draft-max"]
        assert r1["traced_accept_length"] == pytest.approx(sum(1 + i % 4 for i in range(9)) / 9)
        rows, _ = queries.run_requests_page(conn, run_id, sort="accept_length", desc=True, limit=2)
        assert [r["rid"] for r in rows] == ["r1", "r2"]  # 30/10, 11/5 (then r0: 41/20)
        assert queries.run_requests_page(conn, run_id, accept_min=2.1, accept_max=2.5)[0][0]["rid"] == "r2"
        assert [r["rid"] for r in queries.run_requests_page(conn, run_id, status="incomplete")[0]] == ["r1"]
        assert queries.run_requests_page(conn, run_id, status="length")[1] == 1
        assert [r["rid"] for r in queries.run_requests_page(
            conn, run_id, finding="position-beyond-draft-max")[0]] == ["r1"]
        assert queries.run_requests_page(conn, run_id, finding="any")[1] == 1
        page, total = queries.run_requests_page(conn, run_id, offset=1, limit=1)
        assert total == 3 and [r["rid"] for r in page] == ["r2"]
        with pytest.raises(queries.BadQuery, match="accept_length"):
            queries.run_requests_page(conn, run_id, sort="id")


def test_a_second_refresh_folds_nothing_twice(engine) -> None:
    run_id = _stored_run(engine)
    with engine.connect() as conn:
        before = queries.run_summary(conn, run_id)
    writer = BatchWriter(engine)
    _send(writer, run_id, steps=_steps("r1", 5, 9, T0 + 2100))
    from draftscope.store import stats

    assert stats.update_run_stats(engine, run_id) and stats.update_run_stats(engine, run_id)
    with engine.connect() as conn:
        after = queries.run_summary(conn, run_id)
        assert after["acceptance"]["verify_steps"] == before["acceptance"]["verify_steps"] + 5
        batches = conn.execute(sa.select(sa.func.count()).select_from(models.IngestBatch.__table__)
                               .where(models.IngestBatch.run_id == run_id)).scalar_one()
        assert stats.get_stats(conn, run_id)["batches_seen"] == batches


def test_a_new_runs_first_fold_reads_its_steps_by_key_beside_a_large_run(engine) -> None:
    # The fold names the run by its key's value: PostgreSQL plans by it. Named by a subquery on runs, the
    # key was unknown at planning, and beside one large run (the only key in the table's statistics) every
    # new run's first fold scanned the whole table (~9 s a run at 10M steps).
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's planner")
    from draftscope.store import stats

    writer, big, new = BatchWriter(engine), uuid.uuid4().hex, uuid.uuid4().hex
    for k in range(4):
        _send(writer, big, steps=_steps(f"r{k}", 500, 0, T0))
    with engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE verify_steps")
        conn.commit()
    _send(writer, new, steps=_steps("r0", 5, 0, T0))
    with engine.connect() as conn:
        hi = conn.execute(sa.select(sa.func.max(models.VerifyStep.id))).scalar_one()
        query = sa.select(sa.func.count()).where(*stats._Fold(conn, new, stats._load(conn, new), hi, 0).step_where)
        sql = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {sql}").scalars())
        assert conn.execute(query).scalar_one() == 5
    assert "uq_verify_steps_run_rid_step" in plan and "Seq Scan" not in plan, plan


def test_a_small_runs_export_and_deletion_read_its_rows_by_key_beside_a_large_run(engine) -> None:
    # As the fold: a bundle's export and retention's chunked deletes name the run by its key's value, so
    # PostgreSQL reads a small run's rows through the run_key index, not the whole table the large run fills.
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's planner")
    from draftscope.bundle import export
    from draftscope.store.tables import STEPS, key_of, of_run

    writer, big, small = BatchWriter(engine), uuid.uuid4().hex, uuid.uuid4().hex
    for k in range(4):
        _send(writer, big, steps=_steps(f"r{k}", 500, 0, T0))
    with engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE verify_steps")
        conn.commit()
    _send(writer, small, steps=_steps("r0", 5, 0, T0))
    with engine.connect() as conn:
        key = key_of(conn, small)
        chunk = STEPS.c.id.in_(sa.select(STEPS.c.id).where(of_run(STEPS, small, key)).limit(1000))  # retention's
        for where in (export._where("verify_steps", small, key, None), [chunk]):
            query = sa.select(sa.func.count()).select_from(STEPS).where(*where)
            sql = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
            plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {sql}").scalars())
            assert conn.execute(query).scalar_one() == 5
            assert "Seq Scan on verify_steps" not in plan, plan
    assert export.count_records(engine, small) == 5  # its steps: no request or sample was sent
