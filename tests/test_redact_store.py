"""Secrets in server arguments stay out of the pages and the API: a batch from an old tracer (the
whole ``vars(server_args)``) is filtered at ingest, and a run stored before the filter at read time."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from draftscope import db, models
from tests.fixtures.store import make_batch, run_record

SECRET = "ds-secret-5b7e0c93"
# What a 0.5.23 tracer stored as vars(server_args): private keys only, the fields in _raw_input.
OLD_VARS = {"_launch_command": f"--model-path /m/t --api-key {SECRET} --speculative-algorithm EAGLE3",
            "_raw_input": {"model_path": "/m/t", "api_key": SECRET, "admin_api_key": SECRET,
                           "ssl_keyfile_password": SECRET, "watermark_key": SECRET,
                           "speculative_algorithm": "EAGLE3", "tp_size": 1},
            "_resolved_overrides": [["spec", {"speculative_num_steps": 3}]]}


def _everything(client, run_id: str) -> str:
    pages = [client.get(f"/runs/{run_id}"), client.get(f"/api/v1/runs/{run_id}"), client.get("/"),
             client.get("/api/v1/runs")]
    assert all(p.status_code == 200 for p in pages), [p.status_code for p in pages]
    return "".join(p.text for p in pages)


def test_old_tracer_batch_is_filtered_at_ingest(client, store_url):
    run_id = uuid.uuid4().hex
    response = client.post("/api/v1/batches", json=make_batch(run_id, run=run_record(server_args=OLD_VARS)))
    assert response.status_code == 200, response.text
    engine = db.make_engine(store_url)
    with engine.connect() as conn:
        stored = conn.execute(sa.select(models.Run.__table__.c.server_args)
                              .where(models.Run.__table__.c.id == run_id)).scalar_one()
    engine.dispose()
    assert SECRET not in str(stored)
    assert stored == {"model_path": "/m/t", "speculative_algorithm": "EAGLE3", "tp_size": 1,
                      "speculative_num_steps": 3}
    assert SECRET not in _everything(client, run_id)


def test_run_stored_before_the_filter_shows_no_secret(client, store_url):
    run_id = uuid.uuid4().hex
    assert client.post("/api/v1/batches", json=make_batch(run_id, run=run_record())).status_code == 200
    engine = db.make_engine(store_url)
    with engine.begin() as conn:  # as an old dashboard wrote it
        conn.execute(models.Run.__table__.update().where(models.Run.__table__.c.id == run_id)
                     .values(server_args=OLD_VARS))
    engine.dispose()
    text = _everything(client, run_id)
    assert SECRET not in text and "_launch_command" not in text
    assert "speculative_num_steps" in client.get(f"/api/v1/runs/{run_id}").json()["run"]["server_args"]
