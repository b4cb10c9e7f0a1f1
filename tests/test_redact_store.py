"""Secrets in server arguments and the tracer's config stay out of the pages, the API and bundles: a
batch from an old tracer (the whole ``vars(server_args)``, a credentialed ``DRAFTSCOPE_URL``) is
filtered at ingest, and a run stored before the filter at read time."""

from __future__ import annotations

import io
import uuid
import zipfile

import sqlalchemy as sa

from draftscope.store import db, models
from tests.fixtures.store import make_batch, run_record

SECRET = "ds-secret-zq7x0c93"  # no run of 4 hex digits: a random run id cannot contain it
# What a 0.5.23 tracer stored as vars(server_args): private keys only, the fields in _raw_input.
OLD_VARS = {"_launch_command": f"--model-path /m/t --api-key {SECRET} --speculative-algorithm EAGLE3",
            "_raw_input": {"model_path": "/m/t", "api_key": SECRET, "admin_api_key": SECRET,
                           "ssl_keyfile_password": SECRET, "watermark_key": SECRET,
                           "speculative_algorithm": "EAGLE3", "tp_size": 1},
            "_resolved_overrides": [["spec", {"speculative_num_steps": 3}]]}


OLD_CONFIG = {"url": "https://alice:s3cret-zq7x@dash.example:8177/?token=tok-zq7x", "ingest_token": "tok-zq7x",
              "step_stride": 1, "api_key": SECRET}


def _everything(client, run_id: str) -> str:
    """Every page, JSON and CSV twin and API answer about the run, and its bundle's members."""
    pages = [client.get(f"/runs/{run_id}"), client.get(f"/api/v1/runs/{run_id}"), client.get("/"),
             client.get("/api/v1/runs"), client.get(f"/runs/{run_id}.json"), client.get("/runs.json"),
             client.get("/runs.csv"), client.get(f"/runs/{run_id}/findings.csv"),
             client.get(f"/runs/{run_id}/spec.csv"), client.get(f"/runs/{run_id}/requests.csv"),
             client.get(f"/runs/{run_id}/bundle.zip")]
    assert all(p.status_code == 200 for p in pages), [p.status_code for p in pages]
    with zipfile.ZipFile(io.BytesIO(pages.pop().content)) as bundle:
        members = [bundle.read(name).decode() for name in bundle.namelist()]
    return "".join(p.text for p in pages) + "".join(members)


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


def _stored_by_an_old_dashboard(client, store_url: str, **values) -> str:
    """A run ingested now, then its columns overwritten with ``values`` as an old dashboard stored them."""
    run_id = uuid.uuid4().hex
    assert client.post("/api/v1/batches", json=make_batch(run_id, run=run_record())).status_code == 200
    engine = db.make_engine(store_url)
    with engine.begin() as conn:
        conn.execute(models.Run.__table__.update().where(models.Run.__table__.c.id == run_id).values(**values))
    engine.dispose()
    return run_id


def test_run_stored_before_the_filter_shows_no_secret(client, store_url):
    run_id = _stored_by_an_old_dashboard(client, store_url, server_args=OLD_VARS)
    text = _everything(client, run_id)
    assert SECRET not in text and "_launch_command" not in text
    assert "speculative_num_steps" in client.get(f"/api/v1/runs/{run_id}").json()["run"]["server_args"]


def _stored_config(store_url: str, run_id: str) -> dict:
    engine = db.make_engine(store_url)
    with engine.connect() as conn:
        stored = conn.execute(sa.select(models.Run.__table__.c.tracer_config)
                              .where(models.Run.__table__.c.id == run_id)).scalar_one()
    engine.dispose()
    return stored


def test_credentials_in_an_old_tracers_config_are_filtered_at_ingest(client, store_url):
    run_id = uuid.uuid4().hex
    batch = make_batch(run_id, run=run_record(tracer_config=OLD_CONFIG))
    assert client.post("/api/v1/batches", json=batch).status_code == 200
    assert _stored_config(store_url, run_id) == {"url": "https://dash.example:8177", "ingest_token": True,
                                                 "step_stride": 1}


def test_a_credentialed_config_stored_before_the_filter_shows_none(client, store_url):
    run_id = _stored_by_an_old_dashboard(client, store_url, tracer_config=OLD_CONFIG)
    text = _everything(client, run_id)
    assert "alice" not in text and "zq7x" not in text
    assert client.get(f"/api/v1/runs/{run_id}").json()["run"]["tracer_config"]["url"] == \
        "https://dash.example:8177"


# Credentials in values, whatever their names: a URL's userinfo, credential query parameters, a bearer token.
USER, PASSWORD, TOKEN, SIGNATURE, BEARER = "u-7c1d", "pw-7c1d", "tok-7c1d", "sig-7c1d", "Ab9-bearer-7c1d"
HUB_URL = f"https://{USER}:{PASSWORD}@hub.example/drafts/x?revision=main&token={TOKEN}"
CREDENTIALED = {
    "server_args": {"model_path": "/m/t", "served_model_name": HUB_URL,
                    "speculative_draft_model_path": f"s3://bucket/d?X-Amz-Signature={SIGNATURE}&X-Amz-Date=1"},
    "draft_path": HUB_URL,
    "facts": {"start_error": {"type": "HTTPError", "message": f"401 for {HUB_URL}: Authorization: Bearer {BEARER}"},
              "draft": {"path": HUB_URL, "config": {"hub": f"https://hub.example/?api_key={TOKEN}"}}},
}
FINDING = {"rule_id": "draft-weights-not-loaded", "severity": "error",
           "message": f"could not read {HUB_URL}", "fix": f"set a token, not ?access_token={TOKEN}",
           "evidence": {"url": f"https://hub.example/x?sig={SIGNATURE}", "header": f"Bearer {BEARER}"}}
SECRETS = (USER, PASSWORD, TOKEN, SIGNATURE, BEARER)


def _stored_text(store_url: str) -> str:
    """Every stored run and finding, as the database holds them."""
    engine = db.make_engine(store_url)
    with engine.connect() as conn:
        rows = [conn.execute(sa.select(t)).all() for t in (models.Run.__table__, models.Finding.__table__)]
    engine.dispose()
    return repr(rows)


def test_credentials_in_any_recorded_value_are_scrubbed_at_ingest(client, store_url):
    run_id = uuid.uuid4().hex
    batch = make_batch(run_id, run=run_record(**CREDENTIALED), findings=[FINDING])
    assert client.post("/api/v1/batches", json=batch).status_code == 200
    stored = _stored_text(store_url)
    assert not [s for s in SECRETS if s in stored]
    assert "https://<redacted>@hub.example/drafts/x?revision=main&token=<redacted>" in stored  # kept, scrubbed
    assert "X-Amz-Signature=<redacted>&X-Amz-Date=1" in stored and "Bearer <redacted>" in stored
    everything = _everything(client, run_id)
    assert not [s for s in SECRETS if s in everything]
    assert "hub.example/drafts/x" in everything


def test_credentials_stored_before_the_scrub_show_nowhere(client, store_url):
    run_id = _stored_by_an_old_dashboard(client, store_url, **CREDENTIALED)
    engine = db.make_engine(store_url)
    with engine.begin() as conn:
        conn.execute(models.Finding.__table__.insert().values(run_id=run_id, **FINDING))  # as a tracer sent it
    engine.dispose()
    assert HUB_URL in _stored_text(store_url)  # as an old dashboard stored it
    everything = _everything(client, run_id)
    assert not [s for s in SECRETS if s in everything]
    assert "could not read https://<redacted>@hub.example" in everything


