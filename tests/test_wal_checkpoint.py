"""The dashboard leaves WAL checkpoints to a thread of its own: commits do not checkpoint, and the
WAL still stays as small as one batch instead of growing with every batch."""

from __future__ import annotations

import sqlite3
import struct
import uuid
from pathlib import Path

from fastapi.testclient import TestClient

from draftscope.settings import Settings
from draftscope.store import db
from draftscope.web.app import create_app
from tests.fixtures.store import make_batch, run_record, sample_record
from tests.fixtures.wait import until


def _checkpointed(path: Path) -> bool:
    """Every frame of the WAL is copied back into the database: in the WAL index (``-shm``, native
    byte order) the checkpoint's nBackfill (offset 96) has reached the header's mxFrame (offset 16)."""
    shm = Path(f"{path}-shm").read_bytes()
    (max_frame,), (backfilled,) = struct.unpack_from("=I", shm, 16), struct.unpack_from("=I", shm, 96)
    return max_frame > 0 and backfilled == max_frame


def test_the_checkpoint_thread_keeps_the_wal_small(tmp_path) -> None:
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    db.upgrade(url)
    run_id = uuid.uuid4().hex
    with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
        with client.app.state.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
        wal = Path(f"{path}-wal")
        sizes = []
        for i in range(5):
            batch = make_batch(run_id, run=run_record(), samples=[sample_record(i) for _ in range(2000)])
            assert client.post("/api/v1/batches", json=batch).status_code == 200
            sizes.append(wal.stat().st_size)
            until(lambda: _checkpointed(path), "the checkpoint thread copied the WAL back")  # the next
            # writer restarts the WAL
    assert sizes[-1] < 2 * sizes[0], sizes  # five batches without checkpoints: about 5x
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM tensor_samples").fetchone()[0] == 10000
