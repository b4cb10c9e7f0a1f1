"""A real SGLang server started with ``--api-key`` and a value found nowhere else: the value is in no
sink's files, no store, no page, no API answer, no JSON or CSV twin and no bundle (one server per sink).
The HTTP sink's ``DRAFTSCOPE_URL`` carries ``user:password@`` and a token in its query too, and an
allow-listed server argument holds a URL with credentials (``--speculative-draft-model-revision``: an
allow-listed string SGLang only passes on to the Hugging Face loaders, which ignore it for a local
draft; a model or draft path must load, and ``--served-model-name`` may hold no colon): none is found
either, and the argument is recorded with its credentials scrubbed."""

from __future__ import annotations

import io
import json
import sqlite3
import urllib.error
import urllib.request
import uuid
import zipfile
from pathlib import Path

import pytest

from draftscope.store import db as store_db
from testbed.models import ensure_models
from testbed.server import start_dashboard, start_server
from tests.fixtures.sglang_server import IDLE_SLEEP
from tests.fixtures.wait import ended, ended_in_file

pytestmark = pytest.mark.sglang


def _files_text(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".log")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _bundle(base: str, run_id: str) -> bytes:
    """Every member of the run's bundle as the dashboard exports it, uncompressed."""
    status, body = _get(f"{base}/runs/{run_id}/bundle.zip")
    assert status == 200, status
    with zipfile.ZipFile(io.BytesIO(body)) as bundle:
        return b"".join(bundle.read(name) for name in bundle.namelist())


def _pages(get, run_id: str) -> str:
    """Every page and API answer about the run, as text (status 200 each)."""
    paths = ["/", f"/runs/{run_id}", "/api/v1/runs", f"/api/v1/runs/{run_id}", "/runs.json", "/runs.csv",
             f"/runs/{run_id}.json", f"/runs/{run_id}/findings.csv", f"/runs/{run_id}/spec.csv",
             f"/runs/{run_id}/requests.csv"]
    texts = []
    for path in paths:
        status, text = get(path)
        assert status == 200, (path, status)
        texts.append(text)
    for req in json.loads(texts[3])["requests"]:
        for path in (f"/runs/{run_id}/requests/{req['rid']}", f"/api/v1/runs/{run_id}/requests/{req['rid']}"):
            status, text = get(path)
            assert status == 200, (path, status)
            texts.append(text)
    return "".join(texts)


@pytest.mark.parametrize("sink", ["url", "db", "file"])
def test_api_key_is_found_nowhere(sink, tmp_path):
    models = ensure_models()
    secret = f"ds-{uuid.uuid4().hex}"
    password, query_token = f"pw-{uuid.uuid4().hex}", f"qt-{uuid.uuid4().hex}"
    hub_user, hub_password, hub_token = (f"{k}-{uuid.uuid4().hex}" for k in ("hu", "hp", "ht"))
    hub_url = f"https://{hub_user}:{hub_password}@hub.example/x?token={hub_token}"
    store = tmp_path / "store" / "store.db"
    store.parent.mkdir()
    store_db.upgrade(f"sqlite:///{store}")
    env = {"DRAFTSCOPE_SAMPLE_RATE": "1", "DRAFTSCOPE_FLUSH_INTERVAL_S": "0.2"}
    with start_dashboard(store, tmp_path / "dashboard.log") as url:
        credentialed = url.replace("http://", f"http://alice:{password}@") + f"/?token={query_token}"
        env.update({"url": {"DRAFTSCOPE_URL": credentialed}, "db": {"DRAFTSCOPE_DB": str(store)},
                    "file": {"DRAFTSCOPE_FILE": str(tmp_path / "store" / "trace.jsonl")}}[sink])
        with start_server(models.target, models.draft, ["--speculative-draft-model-revision", hub_url, *IDLE_SLEEP],
                          tmp_path / "server.log", env=env, api_key=secret) as server:
            for prompt in ("The quick brown fox", "Hello world, this is"):
                server.generate(prompt, max_new_tokens=8)
        if sink == "file":
            ended_in_file(tmp_path / "store" / "trace.jsonl")
        else:
            ended(store)  # the tracer's final flush: every batch is in
        assert secret in (tmp_path / "server.log").read_text()  # the value really was on the command line
        if sink == "file":
            from draftscope.store.importer import import_files

            engine = store_db.make_engine(f"sqlite:///{store}")
            import_files(engine, [tmp_path / "store" / "trace.jsonl"])
            engine.dispose()

        def get(path):
            status, body = _get(url + path)
            return status, body.decode()

        (run_id, args, config), = sqlite3.connect(store).execute(
            "select id, server_args, tracer_config from runs").fetchall()
        assert json.loads(args)["speculative_algorithm"] == "EAGLE3"  # server args were recorded
        assert json.loads(args)["speculative_draft_model_revision"] == \
            "https://<redacted>@hub.example/x?token=<redacted>"
        if sink == "url":  # the tracer config was recorded, its URL without credentials
            assert json.loads(config)["url"] == url
        pages = _pages(get, run_id)
        bundle = _bundle(url, run_id)
    stored = _files_text(tmp_path / "store")
    for value in (secret, password, query_token, hub_user, hub_password, hub_token):
        assert value not in pages and value.encode() not in bundle and value.encode() not in stored
