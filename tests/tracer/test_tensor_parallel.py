"""One record stream per run whatever the TP size: the real CPU server with ``--tp-size 2`` (gloo), two
scheduler processes, one recorder, one run, every request and verify step once, and the recording
rank's totals equal SGLang's counters."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from draftscope.store import db as store_db
from testbed.models import ensure_models
from testbed.server import start_server
from tests.fixtures.sglang_server import IDLE_SLEEP, recorders
from tests.fixtures.wait import ended

pytestmark = pytest.mark.sglang
PROMPTS = ["The quick brown fox", "Hello world, this is"]


def test_tp2_records_one_stream(tmp_path):
    models = ensure_models()
    store = tmp_path / "store.db"
    store_db.upgrade(f"sqlite:///{store}")
    cpus = sorted(os.sched_getaffinity(0))
    # SGLang's CPU path binds one core group per rank; without the variable it wants a NUMA node per rank
    env = {"DRAFTSCOPE_DB": str(store), "DRAFTSCOPE_SAMPLE_RATE": "1",
           "SGLANG_CPU_OMP_THREADS_BIND": f"{cpus[0]}|{cpus[-1]}"}
    with start_server(models.target, models.draft, ["--tp-size", "2", *IDLE_SLEEP], tmp_path / "server.log", env=env,
                      timeout=480) as server:
        found = recorders(server.pid)
        outs = [server.generate(p, max_new_tokens=12) for p in PROMPTS]
    ended(store)  # the recorder's final flush
    assert len(found) == 1, found  # only TP rank 0 records
    conn = sqlite3.connect(store)
    (facts, args, status), = conn.execute("select facts, server_args, status from runs").fetchall()
    assert json.loads(facts)["tp_size"] == 2 and json.loads(args)["tp_size"] == 2 and status == "ended"
    assert conn.execute("select count(distinct run_id) from ingest_batches").fetchone() == (1,)
    rows = {r[0]: r[1:] for r in conn.execute(
        "select rid, spec_verify_ct, traced_verify_ct, spec_accepted_drafts, traced_accepted_drafts from requests")}
    assert sorted(rows) == sorted(o["meta_info"]["id"] for o in outs)
    for out in outs:
        m = out["meta_info"]
        assert rows[m["id"]] == (m["spec_verify_ct"], m["spec_verify_ct"], m["spec_num_correct_drafts"],
                                 m["spec_num_correct_drafts"])
    steps = conn.execute("select rid, count(*), count(distinct step_index) from verify_steps group by rid").fetchall()
    assert steps and all(n == distinct == rows[rid][1] for rid, n, distinct in steps)
