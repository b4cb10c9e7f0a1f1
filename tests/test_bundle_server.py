"""Trace bundles of a real traced run: the aux-off scenario of the CPU test bed, served by SGLang with
``--api-key`` and asked a prompt holding a unique marker.

Round trip into a fresh store (SQLite and PostgreSQL): the same JSON twins of the run and its
requests, the same findings. Privacy: neither the API key nor the marker is in any member; the
generated text only with ``--include-text``. Also through the CLI and the dashboard's routes.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sqlite3
import uuid
import zipfile
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from tokenizers import Tokenizer
from typer.testing import CliRunner

from draftscope.bundle.export import export_bundle
from draftscope.bundle.loader import store_bundle
from draftscope.bundle.reader import read_bundle
from draftscope.cli.app import app as cli
from draftscope.settings import Settings
from draftscope.store import db
from draftscope.store.analyze import refresh_run
from draftscope.store.ingest import BatchWriter
from draftscope.web.app import create_app
from testbed import scenarios
from testbed.server import start_server
from tests.fixtures.sglang_server import IDLE_SLEEP, PROBE_WITHOUT_GENERATION
from tests.fixtures.wait import ended, until

pytestmark = pytest.mark.sglang
PROMPTS = ("The quick brown fox", "Hello world, this is", "Once upon a time")
DISTINCT_CHARS = 8  # a generated text this long is not in a bundle by coincidence (a shorter one may be)


@dataclass(frozen=True)
class Traced:
    url: str  # the tracer's SQLite store
    run_id: str
    secret: str  # the server's --api-key
    marker: str  # in one prompt
    outputs: dict[str, dict]  # rid -> the server's answer (text, output_ids)
    models_root: Path  # holds the target and the aux-off draft


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> Traced:
    root = tmp_path_factory.mktemp("bundle-run")
    prepared = scenarios.prepare("aux-off")
    store = root / "trace.db"
    url = f"sqlite:///{store}"
    db.upgrade(url)
    secret, marker = f"ds-key-{uuid.uuid4().hex}", f"ds-marker-{uuid.uuid4().hex}"
    env = {**PROBE_WITHOUT_GENERATION, "DRAFTSCOPE_DB": str(store), "DRAFTSCOPE_SAMPLE_RATE": "1",
           "DRAFTSCOPE_FLUSH_INTERVAL_S": "0.2"}
    with start_server(prepared.target_dir, prepared.draft_dir, [*prepared.server_args, *IDLE_SLEEP],
                      root / "server.log", env=env, api_key=secret) as server:
        # 32 tokens: with 12, the random-marker prompts' answers decoded to 5 characters at most in one run,
        # and test_default_bundle_holds_no_secret_no_prompt_no_text had no text of DISTINCT_CHARS to look for
        answers = [server.generate(f"{prompt} {marker}", max_new_tokens=32) for prompt in PROMPTS]
        # every request's records stored before the stop: what the bundle holds does not hang on how fast a
        # loaded machine relays the last steps while SGLang shuts down
        until(lambda: _recorded(url, [a["meta_info"]["id"] for a in answers]), "every answered request is stored")
    status = ended(url)  # the recorder's final flush (it runs in a session of its own) is in the store
    log = (root / "server.log").read_text()
    assert status == "ended", [line for line in log.splitlines() if "draftscope" in line][-20:]
    assert secret in log  # it was on SGLang's command line
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            run_id = conn.execute(sa.text("SELECT id FROM runs")).scalar_one()
        refresh_run(engine, run_id)  # what the dashboard does when a run's batches arrive
    finally:
        engine.dispose()
    return Traced(url, run_id, secret, marker, {a["meta_info"]["id"]: a for a in answers},
                  prepared.draft_dir.parent.parent)


def _recorded(url: str, rids: list[str]) -> bool:
    """Each of ``rids`` is finished in the tracer's SQLite store with every verify step it counted."""
    path = sa.make_url(url).database
    with closing(sqlite3.connect(path, timeout=30)) as conn:
        done = conn.execute(
            "SELECT r.rid FROM requests r WHERE r.finished_at IS NOT NULL AND r.traced_verify_ct = "
            "(SELECT count(*) FROM verify_steps s JOIN runs ON runs.key = s.run_key "
            " WHERE runs.id = r.run_id AND s.rid = r.rid)").fetchall()
    return set(rids) <= {rid for (rid,) in done}


def _export(url: str, run_id: str, **options) -> bytes:
    engine = db.make_engine(url)
    try:
        out = io.BytesIO()
        export_bundle(engine, run_id, out, **options)
        return out.getvalue()
    finally:
        engine.dispose()


def _unzipped(bundle: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(bundle)) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def _twins(url: str, run_id: str) -> tuple[dict, dict]:
    """The run's JSON twin (findings without row id and time, and without the times data arrived
    in this store) and each request's JSON twin."""
    with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1") as client:
        run = client.get(f"/api/v1/runs/{run_id}").json()
        requests = {r["rid"]: client.get(f"/api/v1/runs/{run_id}/requests/{r['rid']}").json()
                    for r in run["requests"]}
    run.pop("last_batch_at")  # when data arrived in this store, not a property of the run
    imported = run.pop("imported")
    assert imported is None or imported["origin"] == "aux-off.zip"
    state = run["run"].pop("state")  # the run's state in this store: an imported run reads "imported"
    assert (state == "imported") == (imported is not None), state
    run["summary"].pop("updated_at")
    summary = run.pop("summary_state")  # this store's bookkeeping: the batches as they arrived here
    assert not summary["behind"], summary
    run["findings"] = sorted(({k: v for k, v in f.items() if k not in ("id", "at")}
                              for f in run["findings"]), key=json.dumps)
    return _rounded(run), _rounded(requests)


def _rounded(value):
    """Floats to 12 significant digits: PostgreSQL's AVG is exact (numeric, then float8), SQLite's
    a float division, so the two may differ in the last bit."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _rows(url: str, table: str) -> list:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY 1")).all()
    finally:
        engine.dispose()


def test_round_trip_gives_the_same_run_and_findings(traced, store_url, monkeypatch) -> None:
    """Exported with the models' folder as the home directory, so that the bundle's paths read
    ``~/...`` and the importing side cannot open them: its findings come from the manifest's
    feature spec, as on a maintainer's machine."""
    home = str(traced.models_root)
    monkeypatch.setenv("HOME", home)
    bundle = _export(traced.url, traced.run_id)
    engine = db.make_engine(store_url)
    try:
        result = store_bundle(BatchWriter(engine), read_bundle(io.BytesIO(bundle)), "aux-off.zip")
    finally:
        engine.dispose()
    assert result.status == "imported"
    source_run, source_requests = _twins(traced.url, traced.run_id)
    expected = json.loads(orjson.dumps(source_run).decode().replace(home + "/", "~/"))
    expected["run"]["source"] = "bundle"
    expected["run"]["tracer_config"].pop("ingest_token", None)  # a secret-shaped name
    imported_run, imported_requests = _twins(store_url, traced.run_id)
    assert "~/scenarios/" in imported_run["run"]["draft_path"]
    assert "fc-bypassed" in [f["rule_id"] for f in imported_run["findings"]]
    assert imported_run == expected
    assert len(imported_requests) == len(PROMPTS) and imported_requests == source_requests


def test_default_bundle_holds_no_secret_no_prompt_no_text(traced) -> None:
    members = _unzipped(_export(traced.url, traced.run_id))
    assert "text.jsonl" not in members
    manifest = json.loads(members["manifest.json"])
    assert manifest["server_args"]["speculative_algorithm"] == "EAGLE3"
    assert manifest["versions"]["torch"] and manifest["feature_spec"]["draft"]["k"] == 3
    texts = [a["text"].encode() for a in traced.outputs.values() if len(a["text"].strip()) >= DISTINCT_CHARS]
    assert texts, f"no generated text of {DISTINCT_CHARS}+ characters to look for: {traced.outputs}"
    for name, data in members.items():
        assert traced.secret.encode() not in data, name
        assert traced.marker.encode() not in data, name
        for text in texts:
            assert text not in data, (name, text)


def test_include_text_adds_the_generated_text(traced) -> None:
    members = _unzipped(_export(traced.url, traced.run_id, include_text=True))
    lines = [json.loads(line) for line in members["text.jsonl"].splitlines()]
    assert sorted(line["rid"] for line in lines) == sorted(traced.outputs)
    tokenizer = Tokenizer.from_file(str(traced.models_root / "target" / "tokenizer.json"))
    for line in lines:
        # the tokens the verify steps emitted: all but the first (the prefill's), and at most a
        # step's worth more than SGLang kept (it cuts at max_new_tokens)
        generated = traced.outputs[line["rid"]]["output_ids"]
        assert line["token_ids"][:len(generated) - 1] == generated[1:]
        assert len(generated) - 1 <= len(line["token_ids"]) < len(generated) - 1 + 4
        assert line["text"] == tokenizer.decode(line["token_ids"], skip_special_tokens=True)
    everything = b"".join(members.values())
    assert traced.secret.encode() not in everything
    assert traced.marker.encode() not in everything  # the tracer never records the prompt


def test_a_bundle_from_an_old_store_holding_secrets_holds_none(traced, tmp_path) -> None:
    """A store written before the tracer's allow-list: SGLang's whole ``vars(server_args)``, and
    secret-shaped names in the facts and the tracer config."""
    old = tmp_path / "old.db"
    shutil.copy(sa.make_url(traced.url).database, old)
    secret = traced.secret
    server_args = {"_launch_command": f"--model-path /m --api-key {secret}", "api_key": secret,
                   "admin_api_key": secret, "ssl_keyfile_password": secret,
                   "_raw_input": {"api_key": secret, "speculative_algorithm": "EAGLE3"},
                   "speculative_algorithm": "EAGLE3"}
    with sqlite3.connect(old) as conn:
        (facts, config), = conn.execute("SELECT facts, tracer_config FROM runs").fetchall()
        facts, config = json.loads(facts), json.loads(config)
        facts["draft"]["config"]["hf_token"] = secret
        config["ingest_token"] = secret
        conn.execute("UPDATE runs SET server_args = ?, facts = ?, tracer_config = ?",
                     (json.dumps(server_args), json.dumps(facts), json.dumps(config)))
    members = _unzipped(_export(f"sqlite:///{old}", traced.run_id))
    assert all(secret.encode() not in data for data in members.values())
    assert json.loads(members["manifest.json"])["server_args"] == {"speculative_algorithm": "EAGLE3"}


def test_cli_export_and_import(traced, store_url, tmp_path) -> None:
    runner, bundle = CliRunner(), tmp_path / "aux-off.zip"
    rid = sorted(traced.outputs)[0]
    exported = runner.invoke(cli, ["export", traced.run_id, "--db", traced.url, "-o", str(bundle),
                                   "--requests", rid])
    assert exported.exit_code == 0, exported.output
    assert f"wrote {bundle}" in exported.output and "1 requests" in exported.output
    first = runner.invoke(cli, ["import", str(bundle), "--db", store_url])
    again = runner.invoke(cli, ["import", str(bundle), "--db", store_url])
    assert first.exit_code == 0 and f"imported run {traced.run_id}" in first.output
    assert again.exit_code == 0 and "already imported" in again.output
    assert [row.rid for row in _rows(store_url, "requests")] == [rid]
    missing = runner.invoke(cli, ["export", "no-such-run", "--db", traced.url, "-o", str(bundle)])
    assert missing.exit_code == 1 and "No run 'no-such-run' is stored" in missing.output


def test_download_and_upload_through_the_dashboard(traced, store_url) -> None:
    def rows(url: str) -> list:
        return [_rows(url, t) for t in ("runs", "requests", "verify_steps", "tensor_samples",
                                        "findings", "ingest_batches")]

    rid = sorted(traced.outputs)[0]
    before = rows(traced.url)
    with TestClient(create_app(Settings(database_url=traced.url)), base_url="http://127.0.0.1") as source:
        whole = source.get(f"/runs/{traced.run_id}/bundle.zip")
        one = source.get(f"/runs/{traced.run_id}/requests/{rid}/bundle.zip")
    assert rows(traced.url) == before  # exporting only reads
    assert whole.status_code == one.status_code == 200
    assert whole.headers["content-type"] == "application/zip"
    assert json.loads(_unzipped(one.content)["manifest.json"])["counts"]["requests"] == 1
    with TestClient(create_app(Settings(database_url=store_url)), base_url="http://127.0.0.1") as target:
        bad = target.post("/import", files={"bundle": ("x.zip", whole.content[:999], "application/zip")},
                          headers={"HX-Request": "true"})
        assert bad.status_code == 200 and "Not a readable zip archive" in bad.text
        assert "<html" not in bad.text  # the result block alone, shown inline
        good = target.post("/import", files={"bundle": ("aux-off.zip", whole.content, "application/zip")})
        assert good.status_code == 200 and f"/runs/{traced.run_id}" in good.text
        page = target.get(f"/runs/{traced.run_id}")
        assert page.status_code == 200 and "fc-bypassed" in page.text
        twin = target.get(f"/api/v1/runs/{traced.run_id}").json()
    assert twin["run"]["source"] == "bundle" and twin["imported"]["origin"] == "upload aux-off.zip"
    assert twin["imported"]["sha256"] == hashlib.sha256(whole.content).hexdigest()
