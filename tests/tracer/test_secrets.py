"""A real SGLang server started with ``--api-key`` and a value found nowhere else: the value is in no
sink's files, no store, no page and no API answer (one server per sink)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest

from draftscope import db as store_db
from testbed.models import ensure_models
from testbed.server import start_dashboard, start_server
from tests.fixtures.wait import ended, ended_in_file

pytestmark = pytest.mark.sglang


def _files_text(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".log")


def _pages(get, run_id: str) -> str:
    """Every page and API answer about the run, as text (status 200 each)."""
    paths = ["/", f"/runs/{run_id}", "/api/v1/runs", f"/api/v1/runs/{run_id}"]
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
    store = tmp_path / "store" / "store.db"
    store.parent.mkdir()
    store_db.upgrade(f"sqlite:///{store}")
    env = {"DRAFTSCOPE_SAMPLE_RATE": "1", "DRAFTSCOPE_FLUSH_INTERVAL_S": "0.2"}
    with start_dashboard(store, tmp_path / "dashboard.log") as url:
        env.update({"url": {"DRAFTSCOPE_URL": url}, "db": {"DRAFTSCOPE_DB": str(store)},
                    "file": {"DRAFTSCOPE_FILE": str(tmp_path / "store" / "trace.jsonl")}}[sink])
        with start_server(models.target, models.draft, [], tmp_path / "server.log", env=env,
                          api_key=secret) as server:
            for prompt in ("The quick brown fox", "Hello world, this is"):
                server.generate(prompt, max_new_tokens=8)
        if sink == "file":
            ended_in_file(tmp_path / "store" / "trace.jsonl")
        else:
            ended(store)  # the tracer's final flush: every batch is in
        assert secret in (tmp_path / "server.log").read_text()  # the value really was on the command line
        if sink == "file":
            from draftscope.importer import import_files

            engine = store_db.make_engine(f"sqlite:///{store}")
            import_files(engine, [tmp_path / "store" / "trace.jsonl"])
            engine.dispose()

        def get(path):
            import urllib.error
            import urllib.request
            try:
                with urllib.request.urlopen(url + path, timeout=30) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        (run_id, args), = sqlite3.connect(store).execute("select id, server_args from runs").fetchall()
        assert json.loads(args)["speculative_algorithm"] == "EAGLE3"  # server args were recorded
        pages = _pages(get, run_id)
    assert secret not in pages
    assert secret.encode() not in _files_text(tmp_path / "store")
