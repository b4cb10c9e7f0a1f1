"""Unit tests of the tracer's runtime: config, sampling, writer, sinks (real SQLite store, real HTTP)."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from draftscope.store import db as store_db
from draftscope.store.ingest import BatchWriter
from draftscope_tracer.config import ConfigError, OPTIONS, TracerConfig
from draftscope_tracer.engine.sampling import request_fraction, request_sampled, step_sampled
from draftscope_tracer.health import Health
from draftscope_tracer.redact import public_url, redact_tracer_config
from draftscope_tracer.transport import wire
from draftscope_tracer.transport.http_sink import HttpSink
from draftscope_tracer.transport.sqlite_sink import SqliteSink, StoreNotReady
from draftscope_tracer.transport.writer import Writer
from tests.fixtures.wait import until

RUN = {"engine": "sglang", "engine_version": "0.5.23", "source": "tracer", "status": "running",
       "started_at": 1.0, "facts": {"a": 1}}


# -- config -----------------------------------------------------------------------------------------
def test_config_dormant_without_a_sink_and_kill_switch_wins():
    assert TracerConfig.from_env({}) is None
    assert TracerConfig.from_env({"DRAFTSCOPE_URL": "http://x", "DRAFTSCOPE_DISABLE": "1"}) is None
    c = TracerConfig.from_env({"DRAFTSCOPE_DB": "/tmp/x.db"})
    assert c.sample_rate == 1 / 16 and c.topk == 8 and c.step_stride == 1


@pytest.mark.parametrize("env, needle", [
    ({"DRAFTSCOPE_URL": "localhost:8177"}, "must start with http"),
    ({"DRAFTSCOPE_DB": "x", "DRAFTSCOPE_SAMPLE_RATE": "2"}, "DRAFTSCOPE_SAMPLE_RATE"),
    ({"DRAFTSCOPE_DB": "x", "DRAFTSCOPE_SAMPLE_RATE": "often"}, "is not a number"),
    ({"DRAFTSCOPE_DB": "x", "DRAFTSCOPE_TOPK": "0"}, "DRAFTSCOPE_TOPK"),
    ({"DRAFTSCOPE_DB": "x", "DRAFTSCOPE_REDUCE": "gpu"}, "DRAFTSCOPE_REDUCE='gpu' must be one of: auto, device"),
])
def test_config_bad_values_name_the_variable(env, needle):
    with pytest.raises(ConfigError, match=needle):
        TracerConfig.from_env(env)


def test_public_config_is_allow_listed_and_holds_no_credential():
    c = TracerConfig.from_env({"DRAFTSCOPE_URL": "https://alice:s3cret@dash.example:8177/base/?token=abc#x",
                               "DRAFTSCOPE_INGEST_TOKEN": "ingest-s3cret", "DRAFTSCOPE_FAULT": "b,a"})
    public = c.public()
    assert set(public) == {f.name for f in dataclasses.fields(TracerConfig)}  # a new field needs a decision
    assert public["url"] == c.safe_url == "https://dash.example:8177/base"
    assert public["ingest_token"] is True and public["fault"] == ["a", "b"]
    assert not re.search("alice|s3cret|abc", json.dumps(public))
    paths = TracerConfig(db="/var/lib/ds/store.db", file="/tmp/trace.jsonl").public()
    assert (paths["db"], paths["file"], paths["url"], paths["ingest_token"]) == \
        ("/var/lib/ds/store.db", "/tmp/trace.jsonl", None, False)


@pytest.mark.parametrize("url, shown", [
    ("http://127.0.0.1:8177", "http://127.0.0.1:8177"),
    ("http://u:p@[::1]:9/x/?k=v", "http://[::1]:9/x"),
    ("https://token@host", "https://host"),
    ("http://h:notaport/", ""),
    ("not a url", ""),
])
def test_public_url_keeps_scheme_host_port_path(url, shown):
    assert public_url(url) == shown


def test_a_stored_config_is_reduced_on_read():
    stored = {"url": "https://alice:s3cret@h/?token=abc", "ingest_token": "tok", "api_key": "k",
              "step_stride": 2, "topk": "8"}
    assert redact_tracer_config(stored) == {"url": "https://h", "ingest_token": True, "step_stride": 2,
                                            "topk": None}


def test_every_option_is_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "tracer.md").read_text()
    assert set(OPTIONS) <= set(re.findall(r"DRAFTSCOPE_[A-Z_]+", doc))


# -- sampling ---------------------------------------------------------------------------------------
FRACTIONS = ("import json, sys; from draftscope_tracer.engine.sampling import request_fraction; "
             "print(json.dumps([request_fraction(r) for r in json.loads(sys.argv[1])]))")


def test_sampling_is_stable_and_near_the_rate():
    rids = [f"req-{i}" for i in range(4000)]
    # Every rank decides alone: two fresh processes with different str hash seeds pick the same requests.
    some = [*rids[:200], "", "é-ü-请求", "\ud800-lone-surrogate", "x" * 5000]
    seen = [json.loads(subprocess.run([sys.executable, "-c", FRACTIONS, json.dumps(some)], check=True, text=True,
                                      capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout)
            for seed in ("1", "2")]
    assert seen[0] == seen[1] == [request_fraction(r) for r in some]
    assert len(set(seen[0])) == len(some) and all(0 <= f < 1 for f in seen[0])
    share = sum(request_sampled(r, 1 / 16) for r in rids) / len(rids)
    assert 0.045 < share < 0.08
    assert all(request_sampled(r, 1.0) for r in rids[:50]) and not any(request_sampled(r, 0.0) for r in rids[:50])
    assert [step_sampled(s, 3) for s in range(5)] == [True, False, False, True, False]


# -- writer -----------------------------------------------------------------------------------------
class ListSink:
    def __init__(self, fail: bool = False):
        self.batches, self.fail, self.closed = [], fail, False

    def send(self, batch):
        if self.fail:
            raise OSError("disk on fire")
        self.batches.append(json.loads(json.dumps(batch)))

    def close(self):
        self.closed = True


def _writer(sink, health, **kw):
    kw = {"max_queue_items": 64, "max_batch_items": 4, "flush_interval_s": 0.05, "health_interval_s": 60, **kw}
    return Writer(sink, health, lambda: dict(RUN), run_id="r1", **kw)


def test_writer_batches_sends_run_first_and_final_run_ended():
    sink, health = ListSink(), Health()
    w = _writer(sink, health)
    for i in range(10):
        assert w.submit(lambda i=i: {"health": [], "steps": [{"rid": "a", "step_index": i}]})
    w.close()
    steps = [s["step_index"] for b in sink.batches for s in b["steps"]]
    assert steps == list(range(10))
    assert sink.batches[0]["run"]["status"] == "running"
    assert sink.batches[-1]["run"]["status"] == "ended" and sink.batches[-1]["run"]["ended_at"]
    assert all(b["run"] is None for b in sink.batches[1:-1])
    assert sink.closed and sink.batches[-1]["health"]
    assert not w.submit(lambda: None) and health.drops["shutdown"] == 1


def test_writer_flushes_on_interval():
    sink = ListSink()
    w = _writer(sink, Health(), max_batch_items=1000)
    w.submit(lambda: {"steps": [{"rid": "a"}]})
    deadline = time.time() + 5
    while not any(b["steps"] for b in sink.batches) and time.time() < deadline:
        time.sleep(0.02)
    assert any(b["steps"] for b in sink.batches)
    w.close()


def test_rows_that_keep_arriving_wait_for_their_batch():
    """Each job queued while the writer sleeps wakes it, yet the rows it built wait: the batch goes out
    full (``max_batch_items``) or at the end of its window, not at each wake-up."""
    sink = ListSink()
    w = _writer(sink, Health(), max_batch_items=4, flush_interval_s=3600)
    until(lambda: sink.batches, "the run and the first health record went out")
    for i in range(3):
        assert w.submit(lambda i=i: {"steps": [{"rid": "a", "step_index": i}]})
        until(lambda i=i: w._pending_n == i + 1, f"the writer built job {i}'s row")
    assert not any(b["steps"] for b in sink.batches)
    w.submit(lambda: {"steps": [{"rid": "a", "step_index": 3}]})
    until(lambda: any(b["steps"] for b in sink.batches), "the full batch went out")
    assert [[s["step_index"] for s in b["steps"]] for b in sink.batches if b["steps"]] == [[0, 1, 2, 3]]
    w.close()


class WakeupSink(ListSink):
    """Notes, with each batch, how many passes the writer's thread had made when it sent it."""
    writer = None

    def send(self, batch):
        super().send(batch)
        self.batches[-1]["wakeups"] = None if self.writer is None else self.writer.wakeups


def heartbeats(batches: list) -> list:
    """The batches after the last one with steps that carry nothing but a health record."""
    last = max(i for i, b in enumerate(batches) if b["steps"])
    return [b for b in batches[last + 1:] if len(b["health"]) == 1
            and not any(b[k] for k in wire.RECORD_TABLES if k != "health")]


def test_an_idle_writer_sleeps_until_its_next_health_record():
    """Idle, the writer's thread wakes once per health record (what keeps the run live on the dashboard)
    and for nothing else: a thread that polled would pass several times between two of them."""
    sink = WakeupSink()
    w = sink.writer = _writer(sink, Health(), health_interval_s=0.25)
    w.submit(lambda: {"steps": [{"rid": "a"}]})  # some work first; then nothing
    until(lambda: any(b["steps"] for b in sink.batches) and len(heartbeats(sink.batches)) >= 4,
          "four health records went out after the step")
    counts = [b["wakeups"] for b in heartbeats(sink.batches)]
    assert [b - a for a, b in zip(counts, counts[1:])] == [1] * (len(counts) - 1), counts
    w.close()
    assert sink.batches[-1]["run"]["status"] == "ended"


def test_submit_never_blocks_and_counts_queue_full():
    taken, gate = threading.Event(), threading.Event()
    sink, health = ListSink(), Health()
    w = _writer(sink, health, max_queue_items=2)
    w.submit(lambda: taken.set() or gate.wait(5) and None)  # occupies the writer thread
    assert taken.wait(10), "the writer thread never took the first job"
    results = [w.submit(lambda: None) for _ in range(5)]
    assert results[:2] == [True, True] and results[2:] == [False, False, False]
    assert health.drops["queue_full"] == 3
    gate.set()
    w.close()


def test_sink_and_job_errors_are_counted_not_raised():
    sink, health = ListSink(fail=True), Health()
    w = _writer(sink, health)
    w.submit(lambda: 1 / 0)
    w.submit(lambda: {"steps": [{"rid": "a"}]})
    w.close()
    assert health.errors["job.build"] == 1 and health.drops["build_error"] == 1
    assert health.drops["sink_error"] >= 1 and health.errors["sink"] >= 1


def test_probe_disables_itself_after_failures_in_a_row():
    health = Health(failure_limit=3)
    assert [health.failed("verify", RuntimeError("x")) for _ in range(3)] == [False, False, True]
    assert health.is_disabled("verify") and health.snapshot(0)["disabled_probes"] == ["verify"]


# -- SQLite sink into a store built by the app's migrations --------------------------------------------
def _batch(i: int, run=RUN, **records):
    return {"schema_version": 1, "batch_id": f"b{i}", "run_id": "run-1", "sent_at": 2.0, "run": run,
            "requests": [], "steps": [], "samples": [], "health": [], "findings": [], **records}


def test_sqlite_sink_writes_into_migrated_store(tmp_path):
    path = tmp_path / "s.db"
    store_db.upgrade(f"sqlite:///{path}")
    sink = SqliteSink(str(path))
    sink.send(_batch(0, requests=[{"rid": "a", "sampled": True, "spec_verify_ct": 3}],
                     steps=[{"rid": "a", "step_index": 0, "at": 1.0, "drafted_tokens": [5, 6, 7],
                             "accept_len": 2, "accept_flags": [True, False, False]}],
                     samples=[{"point": "draft.input", "phase": "prefill", "at": 1.0, "shape": [4, 384],
                               "dtype": "float32", "width": 384, "rows": 4, "l2_mean": 1.5}],
                     health=[{"at": 1.0, "drops": {"queue_full": 1}, "errors": {}, "heartbeats": {"verify": 3},
                              "disabled_probes": []}]))
    sink.send(_batch(1, run={**RUN, "status": "ended", "facts": {"b": 2}},
                     requests=[{"rid": "a", "traced_verify_ct": 3, "spec_verify_ct": None}]))
    sink.close()
    c = sqlite3.connect(path)
    assert c.execute("select status, facts from runs").fetchone() == ("ended", json.dumps({"a": 1, "b": 2}, separators=(",", ":")))
    assert c.execute("select rid, sampled, spec_verify_ct, traced_verify_ct from requests").fetchall() == [("a", 1, 3, 3)]
    assert json.loads(c.execute("select accept_flags from verify_steps").fetchone()[0]) == [True, False, False]
    assert c.execute("select width, l2_mean from tensor_samples").fetchone() == (384, 1.5)
    assert c.execute("select count(*) from ingest_batches").fetchone() == (2,)


def test_sqlite_sink_keeps_a_crashed_run_crashed(tmp_path):
    """vLLM's worker marks the run crashed; the engine core's tracer, closing later, ends its part ``ended``:
    the run stays crashed at the crash's time, as the dashboard's ingest keeps it."""
    path = tmp_path / "s.db"
    store_db.upgrade(f"sqlite:///{path}")
    sink = SqliteSink(str(path))
    for i, (status, ended_at) in enumerate((("running", None), ("crashed", 50.0), ("ended", 60.0), ("running", None))):
        sink.send(_batch(i, run={**RUN, "status": status, "ended_at": ended_at}))
    sink.close()
    assert sqlite3.connect(path).execute("select status, ended_at from runs").fetchone() == ("crashed", 50.0)


def test_sqlite_sink_refuses_missing_or_unmigrated_store(tmp_path):
    with pytest.raises(StoreNotReady, match="draftscope db upgrade --db sqlite:///"):
        SqliteSink(str(tmp_path / "missing.db"))
    sqlite3.connect(tmp_path / "empty.db").close()
    with pytest.raises(StoreNotReady, match="not a migrated draftscope store"):
        SqliteSink(str(tmp_path / "empty.db"))


def test_sqlite_sink_refuses_a_store_an_older_draftscope_migrated(tmp_path):
    """A store upgraded by an older dashboard lacks the columns newer records fill: named, with the fix,
    before a batch fails."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store_db.upgrade(url, revision="0004_gaps")
    with pytest.raises(StoreNotReady, match=r"older draftscope \(it lacks requests.prompt_key, "
                       r"verify_steps.run_key, verify_steps.tree_parents, tensor_samples.run_key\).*db upgrade"):
        SqliteSink(str(tmp_path / "old.db"))
    store_db.upgrade(url)
    SqliteSink(str(tmp_path / "old.db"))


# -- HTTP sink: retries on 5xx, buffers while down, bearer token --------------------------------------
class _Ingest(BaseHTTPRequestHandler):
    answers: list = []
    seen: list = []
    paths: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        code = self.answers.pop(0) if self.answers else 200
        type(self).seen.append((code, body["batch_id"], self.headers.get("Authorization")))
        type(self).paths.append(self.path)
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *a):
        pass


@pytest.fixture
def ingest_server():
    _Ingest.answers, _Ingest.seen, _Ingest.paths = [], [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ingest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_sink_retries_5xx_in_order_with_token(ingest_server):
    _server, url = ingest_server
    _Ingest.answers = [503]
    drops = []
    sink = HttpSink(url, lambda r, n, _batch: drops.append((r, n)), token="s3cret", backoff_s=0.01)
    sink.send(_batch(0))
    sink.send(_batch(1, run=None))  # before the backoff expires: buffered
    time.sleep(0.05)
    sink.send(_batch(2, run=None))
    sink.close()
    assert [b for code, b, _ in _Ingest.seen if code == 200] == ["b0", "b1", "b2"]
    assert _Ingest.seen[0][0] == 503 and all(t == "Bearer s3cret" for _, _, t in _Ingest.seen)
    assert drops == []


def test_http_sink_sends_url_credentials_as_basic_auth_and_shows_none(ingest_server, caplog):
    _server, url = ingest_server
    _Ingest.answers = [400]
    host = url.removeprefix("http://")
    sink = HttpSink(f"http://alice:s%40cret@{host}/base/?token=abc", lambda r, n, batch: None)
    with caplog.at_level(logging.INFO, "draftscope.tracer"):
        sink.send(_batch(0))
        sink.send(_batch(1, run=None))
    assert _Ingest.paths == ["/base/api/v1/batches?token=abc"] * 2
    assert _Ingest.seen[1][2] == "Basic " + base64.b64encode(b"alice:s@cret").decode()
    assert sink.name == f"the HTTP sink ({url}/base/api/v1/batches)"
    assert caplog.records and not re.search("alice|cret|abc", caplog.text)
    HttpSink(f"http://alice:pw@{host}", lambda r, n, batch: None, token="t").send(_batch(2))
    assert _Ingest.seen[2][2] == "Bearer t"  # the ingest token wins


def test_http_sink_outage_is_said_once_and_its_end_too(ingest_server, caplog):
    _server, url = ingest_server
    _Ingest.answers = [503, 503, 503]
    sink = HttpSink(url, lambda r, n, _batch: None, backoff_s=0.01)
    with caplog.at_level(logging.INFO, "draftscope.tracer"):
        for i in range(6):
            sink.send(_batch(i, run=RUN if i == 0 else None))
            time.sleep(0.03)
    lines = [r.getMessage() for r in caplog.records if r.name == "draftscope.tracer"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"draftscope: the HTTP sink ({url}/api/v1/batches) failed: HTTP 503;")
    assert "works again after" in lines[1] and "(3 failures, 0 records dropped)" in lines[1]


def test_http_sink_dashboard_down_buffers_bounded_and_keeps_run(ingest_server):
    server, url = ingest_server
    server.shutdown()
    server.server_close()
    drops = []
    sink = HttpSink(url, lambda r, n, _batch: drops.append(r), max_buffered_batches=2, backoff_s=0.01, timeout_s=0.5)
    for i in range(4):
        sink.send(_batch(i, run=RUN if i == 0 else None, steps=[{"rid": "a"}]))
        time.sleep(0.02)
    assert drops == ["sink_error", "sink_error"]
    assert sink._buffer[0]["run"] == RUN  # the evicted first batch handed its run record on
    sink.close(deadline_s=0.1)
    assert drops.count("shutdown") == 2


def test_topk_probabilities_that_are_not_finite_become_null():
    """Uninitialised draft weights give NaN probabilities; the batch must still be valid JSON."""
    from draftscope_tracer.transport.records import topk_list
    from draftscope_tracer.transport.wire import to_json

    top = topk_list([(2, float("nan")), (0, 0.5)], id_map=[10, 11, 12])
    assert json.loads(to_json({"target_topk": [top]})) == {"target_topk": [[[12, None], [10, 0.5]]]}


def test_sqlite_sink_writes_what_the_dashboard_ingest_writes(tmp_path):
    """The tracer's one-statement-per-table insert and the ingest API's executemany give the same rows,
    on every real batch of the demo traces (upserts, JSON columns, nulls and booleans included)."""
    demo = Path(__file__).resolve().parents[2] / "demo"
    stores = {}
    for name in ("sink", "ingest"):
        path = tmp_path / f"{name}.db"
        store_db.upgrade(f"sqlite:///{path}")
        stores[name] = path
    sink, writer = SqliteSink(str(stores["sink"])), BatchWriter(store_db.make_engine(f"sqlite:///{stores['ingest']}"))
    batches = [line for f in sorted(demo.glob("*.jsonl")) for line in f.read_bytes().splitlines() if line.strip()]
    for line in batches:
        sink.send(json.loads(line))
        writer.write(line)
    sink.close()
    writer.engine.dispose()
    for table in wire.TABLE_COLUMNS:
        cols = ", ".join(wire.TABLE_COLUMNS[table])
        got, want = ([tuple(json.loads(v) if c in wire.JSON_COLUMNS and v is not None else v
                            for c, v in zip(wire.TABLE_COLUMNS[table], row))
                      for row in sqlite3.connect(stores[name]).execute(f"select {cols} from {table} order by id")]
                     for name in ("sink", "ingest"))
        assert got == want, table
    assert len(batches) >= 6 and sqlite3.connect(stores["sink"]).execute(
        "select count(*) from verify_steps").fetchone()[0] > 100
