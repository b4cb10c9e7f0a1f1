"""The page bench's store builders at a tiny size, on SQLite and PostgreSQL: requests filled through
BatchWriter and copied in SQL (``--copies``) make a store whose counts and pages are those of the whole run;
a kept PostgreSQL cluster restarts (``--drop-caches``) and starts again from its folder (``--store``)."""

import argparse
import importlib.util
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from draftscope.store import db
from testbed.postgres import create_database, postgres_cluster, restart_cluster
from testbed.server import REPO_ROOT
from tests.fixtures.store import NO_POSTGRES, settle

spec = importlib.util.spec_from_file_location("page_bench", REPO_ROOT / "bench" / "page_bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_copies_in_sql_make_the_whole_run(store_url, make_client):
    args = argparse.Namespace(requests=6, copies=3, steps_per_request=50, requests_per_batch=2)
    run_id = uuid.uuid4().hex
    bench.fill(store_url, run_id, args)  # 2 requests, 100 steps
    bench.copy_fill(store_url, run_id, args.copies)  # 2 copies of them
    engine = db.make_engine(store_url)
    with engine.connect() as conn:
        rids = conn.exec_driver_sql(f"SELECT rid FROM requests WHERE run_id = '{run_id}' ORDER BY rid").scalars().all()
        steps = conn.exec_driver_sql("SELECT count(*), count(DISTINCT rid), min(step_index), max(step_index) "
                                     "FROM verify_steps").one()
        samples = conn.exec_driver_sql("SELECT count(*), count(DISTINCT rid) FROM tensor_samples").one()
        keys = conn.exec_driver_sql("SELECT DISTINCT run_key FROM verify_steps UNION "
                                    "SELECT DISTINCT run_key FROM tensor_samples").scalars().all()
        batches = conn.exec_driver_sql("SELECT count(*), sum(step_rows) FROM ingest_batches").one()
    engine.dispose()
    assert rids == [f"req-{i:05d}" for i in range(6)]
    assert tuple(steps) == (300, 6, 0, 49) and tuple(samples) == (600, 6) and len(keys) == 1
    assert tuple(batches) == (4, 300)  # the run's record, one batch of steps and its 2 copies

    client = make_client()
    settle(client)
    run = client.get(f"/api/v1/runs/{run_id}").json()
    assert run["summary"]["acceptance"]["verify_steps"] == 300
    pages = ["/", f"/runs/{run_id}", f"/runs/{run_id}/requests?sort=accept_length&desc=true&offset=2",
             f"/runs/{run_id}/requests/req-00005", f"/compare?a={run_id}&b={run_id}", "/metrics", "/api/v1/runs"]
    for page in pages:
        assert client.get(page).status_code == 200, page
    assert "req-00005" in client.get(f"/runs/{run_id}/requests?sort=rid&desc=true").text


@pytest.mark.postgres
def test_a_kept_cluster_restarts_and_starts_again_from_its_folder():
    if NO_POSTGRES:
        pytest.skip("DRAFTSCOPE_TEST_NO_POSTGRES=1: PostgreSQL tests deselected on request")
    root = Path(tempfile.mkdtemp(prefix="draftscope-kept-pg-"))  # postgres may not enter pytest's tmp_path
    try:
        with postgres_cluster(root) as base:
            url = create_database(base, "kept")
            engine = sa.create_engine(url, pool_pre_ping=True)  # its connection goes with the restart
            with engine.begin() as conn:
                conn.exec_driver_sql("CREATE TABLE t AS SELECT 42 AS x")
            stopped = []
            restart_cluster(root, between=lambda: stopped.append((root / "data" / "postmaster.pid").exists()))
            with engine.connect() as conn:  # the same port, a new server
                assert conn.exec_driver_sql("SELECT x FROM t").scalar_one() == 42
            engine.dispose()
            assert stopped == [False]
        assert (root / "data").is_dir()
        with postgres_cluster(root) as base:
            engine = sa.create_engine(f"{base}/kept")
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT x FROM t").scalar_one() == 42
            engine.dispose()
    finally:
        shutil.rmtree(root, ignore_errors=True)
