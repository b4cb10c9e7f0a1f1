"""`docker compose up` (the README's first command): the dashboard comes up healthy, seeded with the
demo traces, on loopback, with ingest guarded by a token.

Needs a Docker engine: the one at DOCKER_HOST or /var/run/docker.sock, else the workplace's
`../shared/tools/docker-here` (no Docker Hub; containers install from ./wheels built on the host).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.store import _free_port

REPO = Path(__file__).resolve().parent.parent
DOCKER_HERE = REPO.parent / "shared" / "tools" / "docker-here"
pytestmark = pytest.mark.compose


def _docker_env() -> dict[str, str]:
    env = dict(os.environ)
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True, env=env).returncode == 0:
        return env
    if not DOCKER_HERE.exists():
        pytest.skip("no Docker engine answers and ../shared/tools/docker-here is not here")
    subprocess.run([str(DOCKER_HERE), "start"], check=True, capture_output=True, text=True)
    exports = subprocess.run([str(DOCKER_HERE), "env"], check=True, capture_output=True, text=True).stdout
    for part in exports.replace("export ", "").split():
        key, _, value = part.partition("=")
        env[key] = value.strip("'\"")
    env["DRAFTSCOPE_PIP_NO_INDEX"] = "1"  # docker-here's containers cannot reach PyPI
    subprocess.run([str(REPO / "scripts" / "wheelhouse")], check=True, capture_output=True, cwd=REPO)
    return env


def _get(url: str, **kw) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, **kw), timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def dashboard():
    env = _docker_env()
    port = _free_port()
    env.update(DRAFTSCOPE_PORT=str(port), COMPOSE_PROJECT_NAME=f"draftscope-test-{port}")
    env.pop("DRAFTSCOPE_INGEST_TOKEN", None)
    compose = ["docker", "compose", "-f", str(REPO / "docker-compose.yml")]
    try:
        subprocess.run([*compose, "up", "-d", "--build", "--wait", "--wait-timeout", "180"],
                       check=True, capture_output=True, text=True, env=env, cwd=REPO)
        logs = subprocess.run([*compose, "logs", "--no-color"], capture_output=True, text=True,
                              env=env, cwd=REPO).stdout
        yield f"http://127.0.0.1:{port}", logs
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"docker compose up failed:\n{exc.stdout}\n{exc.stderr}")
    finally:
        subprocess.run([*compose, "down", "-v"], capture_output=True, env=env, cwd=REPO)


def _demo_run_ids() -> set[str]:
    ids = {json.loads(line)["run_id"] for path in (REPO / "demo").glob("*.jsonl")
           for line in path.read_text().splitlines() if line.strip()}
    assert ids, "demo/ holds no recorded traces (scripts/record-demo makes them)"
    return ids


def test_compose_serves_the_demo_traces(dashboard) -> None:
    url, _ = dashboard
    status, body = _get(f"{url}/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    runs = json.loads(_get(f"{url}/api/v1/runs")[1])
    assert {r["id"] for r in runs} == _demo_run_ids()
    for run in runs:
        status, page = _get(f"{url}/runs/{run['id']}")
        assert status == 200 and b'<section id="findings">' in page


def test_compose_guards_ingest_with_a_printed_token(dashboard) -> None:
    url, logs = dashboard
    token = logs.split("ingest token (send as 'Authorization: Bearer ...'): ", 1)[1].split()[0]
    post = {"data": b"{}", "method": "POST", "headers": {"Content-Type": "application/json"}}
    assert _get(f"{url}/api/v1/batches", **post)[0] == 401
    authorised = {**post, "headers": {**post["headers"], "Authorization": f"Bearer {token}"}}
    assert _get(f"{url}/api/v1/batches", **authorised)[0] == 422  # past the guard, to validation
