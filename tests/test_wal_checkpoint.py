"""The dashboard leaves WAL checkpoints to a thread of its own: commits do not checkpoint, and the
WAL still stays as small as one batch instead of growing with every batch."""

from __future__ import annotations

import sqlite3
import time
import uuid
from pathlib import Path

from fastapi.testclient import TestClient

from draftscope import db
from draftscope.settings import Settings
from draftscope.web import create_app
from tests.fixtures.store import make_batch, run_record, sample_record


def test_the_checkpoint_thread_keeps_the_wal_small(tmp_path) -> None:
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    db.upgrade(url)
    run_id = uuid.uuid4().hex
    with TestClient(create_app(Settings(database_url=url))) as client:
        with client.app.state.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
        wal = Path(f"{path}-wal")
        sizes = []
        for i in range(5):
            batch = make_batch(run_id, run=run_record(), samples=[sample_record(i) for _ in range(2000)])
            assert client.post("/api/v1/batches", json=batch).status_code == 200
            sizes.append(wal.stat().st_size)
            time.sleep(1.2)  # > the checkpoint interval: the next writer restarts the WAL
    assert sizes[-1] < 2 * sizes[0], sizes  # five batches without checkpoints: about 5x
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM tensor_samples").fetchone()[0] == 10000
