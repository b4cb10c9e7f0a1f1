"""The draftscope CLI through typer's CliRunner (and one real `serve` in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftscope.cli.app import app
from draftscope.store import db
from testbed.server import start_dashboard

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def test_serve_refuses_a_non_loopback_host_without_token(sqlite_url, monkeypatch) -> None:
    monkeypatch.delenv("DRAFTSCOPE_INGEST_TOKEN", raising=False)
    result = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--db", sqlite_url, "--upgrade"])
    assert result.exit_code == 2
    assert "Refusing to listen on 0.0.0.0" in result.output
    assert "DRAFTSCOPE_INGEST_TOKEN" in result.output
    assert db.current_revision(sqlite_url) is None  # refused before touching the store


def test_serve_refuses_a_non_loopback_host_without_read_token(sqlite_url, monkeypatch) -> None:
    monkeypatch.setenv("DRAFTSCOPE_INGEST_TOKEN", "ingest-secret-7d41c2e9")
    monkeypatch.delenv("DRAFTSCOPE_READ_TOKEN", raising=False)
    monkeypatch.delenv("DRAFTSCOPE_ALLOW_ANONYMOUS_READS", raising=False)
    result = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--db", sqlite_url, "--upgrade"])
    assert result.exit_code == 2
    assert "Refusing to listen on 0.0.0.0 without a read token" in result.output
    assert all(fix in result.output for fix in ("DRAFTSCOPE_READ_TOKEN", "--read-token", "--allow-anonymous-reads"))
    assert db.current_revision(sqlite_url) is None  # refused before touching the store


@pytest.mark.parametrize("flags, said", [
    (["--read-token", "read-secret-93be07aa"], None),
    (["--allow-anonymous-reads"], "reads are open to anyone who reaches 0.0.0.0:8177"),
])
def test_serve_on_a_non_loopback_host_passes_with_a_read_token_or_when_told(sqlite_url, monkeypatch,
                                                                          flags, said) -> None:
    monkeypatch.setenv("DRAFTSCOPE_INGEST_TOKEN", "ingest-secret-7d41c2e9")
    monkeypatch.delenv("DRAFTSCOPE_READ_TOKEN", raising=False)
    result = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--db", sqlite_url, *flags])
    assert result.exit_code == 2 and "no draftscope schema" in result.output  # past the access checks
    assert "Refusing" not in result.output
    assert said is None or said in result.output


@pytest.mark.parametrize("published, refused", [("127.0.0.1", False), ("0.0.0.0", True), ("", True)])
def test_the_images_entry_point_opens_reads_only_when_published_on_loopback(sqlite_url, published,
                                                                           refused) -> None:
    """docker/dashboard-entrypoint before the image's own ``serve --host 0.0.0.0`` (compose passes
    where it published the port as DRAFTSCOPE_PUBLISHED_ON)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSCOPE_")}
    env |= {"DRAFTSCOPE_INGEST_TOKEN": "ingest-secret-7d41c2e9", "DRAFTSCOPE_PUBLISHED_ON": published}
    done = subprocess.run(["sh", str(REPO / "docker" / "dashboard-entrypoint"), sys.executable, "-m",
                           "draftscope", "serve", "--host", "0.0.0.0", "--db", sqlite_url],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    if refused:
        assert "Refusing to listen on 0.0.0.0 without a read token" in done.stderr
    else:  # past the access checks, to the (missing) store
        assert "reads need no token" in done.stdout and "no draftscope schema" in done.stderr


@pytest.mark.parametrize("variable, flags", [
    ("DRAFTSCOPE_INGEST_TOKEN", []),
    ("DRAFTSCOPE_READ_TOKEN", ["--read-token", "x"]),
])
def test_serve_refuses_a_short_token_and_suggests_auto(sqlite_url, monkeypatch, variable, flags) -> None:
    monkeypatch.setenv("DRAFTSCOPE_INGEST_TOKEN", "x" if variable == "DRAFTSCOPE_INGEST_TOKEN" else "auto")
    monkeypatch.delenv("DRAFTSCOPE_READ_TOKEN", raising=False)
    result = runner.invoke(app, ["serve", "--db", sqlite_url, "--upgrade", *flags])
    assert result.exit_code == 2
    assert f"{variable} is 1 characters: a token needs at least 16" in result.output
    assert "'auto'" in result.output
    assert db.current_revision(sqlite_url) is None  # refused before touching the store


def test_serve_on_every_address_says_which_host_names_it_answers(sqlite_url, monkeypatch) -> None:
    monkeypatch.setenv("DRAFTSCOPE_INGEST_TOKEN", "auto")
    monkeypatch.setenv("DRAFTSCOPE_READ_TOKEN", "auto")
    monkeypatch.setenv("DRAFTSCOPE_ALLOWED_HOSTS", "ignored.example")  # the flag replaces the variable
    db.upgrade(sqlite_url)
    import uvicorn
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: None)  # the outermost edge: no socket
    result = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--db", sqlite_url,
                                 "--allowed-host", "dash.example.com", "--allowed-host", "10.0.0.5"])
    assert result.exit_code == 0, result.output
    assert "answers to the host names 127.0.0.1, localhost, ::1, dash.example.com, 10.0.0.5 " in result.output
    assert "ignored.example" not in result.output


def test_serve_refuses_a_url_for_an_allowed_host(sqlite_url) -> None:
    result = runner.invoke(app, ["serve", "--db", sqlite_url, "--allowed-host", "https://dash.example.com/"])
    assert result.exit_code == 2
    assert "DRAFTSCOPE_ALLOWED_HOSTS: 'https://dash.example.com/' is not a host name" in result.output


def test_serve_refuses_one_token_for_reads_and_ingest(sqlite_url, monkeypatch) -> None:
    monkeypatch.setenv("DRAFTSCOPE_INGEST_TOKEN", "same-secret-for-both-0f")
    result = runner.invoke(app, ["serve", "--db", sqlite_url, "--read-token", "same-secret-for-both-0f"])
    assert result.exit_code == 2
    assert "DRAFTSCOPE_READ_TOKEN must differ from DRAFTSCOPE_INGEST_TOKEN" in result.output


def test_serve_on_a_missing_db_exits_2_with_the_fix(sqlite_url) -> None:
    result = runner.invoke(app, ["serve", "--db", sqlite_url])
    assert result.exit_code == 2
    assert sqlite_url in result.output and "no draftscope schema" in result.output
    assert f"draftscope db upgrade --db '{sqlite_url}'" in result.output


def test_serve_on_an_old_db_names_both_revisions(sqlite_url) -> None:
    db.upgrade(sqlite_url)
    engine = db.make_engine(sqlite_url)
    with engine.begin() as conn:  # a revision this draftscope does not have (e.g. an older one)
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0000_older'")
    engine.dispose()
    result = runner.invoke(app, ["serve", "--db", sqlite_url])
    assert result.exit_code == 2
    assert "0000_older" in result.output and db.head_revision() in result.output
    assert "draftscope db upgrade" in result.output


def test_db_upgrade_then_current(sqlite_url) -> None:
    assert runner.invoke(app, ["db", "current", "--db", sqlite_url]).exit_code == 2
    upgraded = runner.invoke(app, ["db", "upgrade", "--db", sqlite_url])
    assert upgraded.exit_code == 0, upgraded.output
    current = runner.invoke(app, ["db", "current", "--db", sqlite_url])
    assert current.exit_code == 0 and f"revision {db.head_revision()}" in current.output


def test_serve_upgrade_starts_a_working_dashboard(sqlite_url, tmp_path) -> None:
    main = (sys.executable, "-c", "from draftscope.cli.main import main; main()")
    with start_dashboard(sqlite_url, tmp_path / "serve.log", command=main, args=["--upgrade"]) as url:
        with urllib.request.urlopen(f"{url}/healthz", timeout=10) as resp:
            health = json.load(resp)
    assert health == {"status": "ok", "db_revision": db.head_revision(), "head_revision": db.head_revision(),
                      "problems": [], "errors": {"refresh": 0, "wal_checkpoint": 0}}


def test_serve_names_the_address_to_open() -> None:
    from draftscope.cli.app import open_url
    from draftscope.settings import Settings

    assert open_url(Settings(host="0.0.0.0", port=9001)) == "http://127.0.0.1:9001/"
    assert open_url(Settings(host="127.0.0.1", port=9001)) == "http://127.0.0.1:9001/"
    assert open_url(Settings(host="0.0.0.0", public_url="http://127.0.0.1:18177/")) == "http://127.0.0.1:18177/"


def test_every_setting_is_documented_in_the_readme() -> None:
    from draftscope.settings import Settings

    readme = (REPO / "README.md").read_text()
    missing = [f"DRAFTSCOPE_{name.upper()}" for name in Settings.model_fields
               if f"`DRAFTSCOPE_{name.upper()}" not in readme]
    assert missing == [], f"settings the README does not name: {missing}"
