"""A full disk under the real SGLang server's SQLite sink (a 2 MB tmpfs): SGLang answers as before,
SGLang's log says what failed (the real error, once), and when delivery works again; the run ends
``ended`` with its drops counted."""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing

import pytest

from draftscope.store import db as store_db
from testbed.models import ensure_models
from testbed.server import start_server
from tests.fixtures.sglang_server import IDLE_SLEEP
from tests.fixtures.wait import ended, until
from tests.fixtures.disk import fill

pytestmark = pytest.mark.sglang
PROMPTS = ["The quick brown fox", "Once upon a time there was", "Hello world, this is", "A B C D"]


def test_full_disk_is_said_in_sglangs_log_and_the_run_ends(tiny_disk, tmp_path):
    models = ensure_models()
    store = tiny_disk / "store.db"
    store_db.upgrade(f"sqlite:///{store}")
    log = tmp_path / "server.log"
    env = {"DRAFTSCOPE_DB": str(store), "DRAFTSCOPE_SAMPLE_RATE": "1", "DRAFTSCOPE_FLUSH_INTERVAL_S": "0.2"}
    with start_server(models.target, models.draft, IDLE_SLEEP, log, env=env) as server:
        first = server.generate(PROMPTS[0], max_new_tokens=8)
        until(lambda: _stored(store, first), "the first request is stored before the disk fills")
        filler = fill(tiny_disk)
        # Until a write needs a new block: SQLite reuses its WAL file's space, so the first
        # batches after the disk fills may still fit (how many depends on the WAL's size by then).
        full = []
        while len(full) < 24 and not _failed_lines(log):
            full.append(server.generate(PROMPTS[1 + len(full) % 3], max_new_tokens=48))
            until(lambda: _failed_lines(log) or _stored(store, full[-1]), "the request is stored or its failure said")
        os.remove(filler)
        after = server.generate(PROMPTS[0], max_new_tokens=8)
    assert ended(store) == "ended"  # the recorder's final flush
    until(lambda: "works again after" in log.read_text(), "the sink says it works again")
    assert all(out["text"] for out in full)  # SGLang kept answering
    text = log.read_text()
    failed = _failed_lines(log)
    assert len(failed) == 1 and "OperationalError: database or disk is full" in failed[0], failed
    assert "WARNING" in failed[0] and "no transaction is active" not in text
    conn = sqlite3.connect(store)
    assert conn.execute("select status from runs").fetchone() == ("ended",)
    drops = json.loads(conn.execute("select drops from tracer_health order by at desc limit 1").fetchone()[0])
    assert drops.get("sink_error", 0) > 0
    assert conn.execute("select count(*) from requests where rid = ?", (after["meta_info"]["id"],)).fetchone() == (1,)


def _stored(store, answer: dict) -> bool:
    with closing(sqlite3.connect(store, timeout=30)) as conn:
        return conn.execute("select count(*) from requests where rid = ?", (answer["meta_info"]["id"],)).fetchone() == (1,)


def _failed_lines(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if ") failed: " in line and "SQLite sink" in line]
