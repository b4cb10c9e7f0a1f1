"""`docker compose --profile fleet up`: two dashboard processes on the profile's PostgreSQL behind its
proxy, fed by its simulated tracers (recorded traces replayed through the tracer's ``HttpSink``).

Through the proxy: every tracer's run appears and fills, the replays of the aux-off recording carry
their finding, and each run's findings are stored once while both processes keep refreshing it;
the proxy's report shows that both processes answered the tracers' batches; ingest without the
token is refused. Engine, wheels and images: the ``docker`` fixture (tests/fixtures/compose.py);
the project is taken down with its volumes, also when a check fails.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from tests.fixtures.compose import Docker
from tests.fixtures.wait import until

pytestmark = pytest.mark.compose
TRACERS = 4  # the profile's default (DRAFTSCOPE_FLEET_TRACERS): replays of healthy, aux-off, healthy, aux-off
REFILL = 100  # requests per run at ~3-4/s: ~30 s, some 15 refreshes by each process (2 s debounce)
ANSWERED = re.compile(r"(\S+) answered ([^;]+)")  # a fleet_proxy report: "BACKEND answered N METHOD, ...; ..."


@pytest.fixture(scope="module")
def fleet(docker):
    docker.wheels(live=False)
    for ports, project in docker.up("fleet"):
        yield f"http://127.0.0.1:{ports['DRAFTSCOPE_FLEET_PORT']}", project


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read()


def _runs(url: str) -> dict[str, dict]:
    return {r["id"]: r for r in json.loads(_get(f"{url}/api/v1/runs"))}


def _rules(url: str, run_id: str) -> list[str]:
    return sorted(f["rule_id"] for f in json.loads(_get(f"{url}/api/v1/runs/{run_id}"))["findings"])


def _expected(run: dict) -> list[str]:
    return ["fc-bypassed"] if "aux-off" in run["draft_path"] else []


def _posts_answered(docker: Docker, project: str) -> dict[str, int]:
    """The POSTs each dashboard answered through the proxy, by its latest report."""
    logs = docker.compose(project, "--profile", "fleet", "logs", "--no-color", "proxy").stdout
    reports = [line for line in logs.splitlines() if "fleet_proxy:" in line]
    return {backend: sum(int(n) for n, method in (a.split() for a in answered.split(", ")) if method == "POST")
            for backend, answered in ANSWERED.findall(reports[-1] if reports else "")}


def test_fleet_fills_through_the_proxy(fleet, docker) -> None:
    url, project = fleet

    def diagnosed() -> dict[str, dict] | None:
        runs = _runs(url)
        ready = len(runs) == TRACERS and all(r["requests_count"] > 0 and r["findings_count"] == len(_expected(r))
                                             for r in runs.values())
        return runs if ready else None

    runs = until(diagnosed, f"{TRACERS} runs filling, the aux-off ones diagnosed", timeout_s=300, every_s=1)
    assert sorted(_expected(r) for r in runs.values()) == [[], [], ["fc-bypassed"], ["fc-bypassed"]]

    # both processes refresh every live run (their polls see each new batch): REFILL requests later,
    # each run still holds each finding once
    until(lambda: all(r["requests_count"] >= runs[i]["requests_count"] + REFILL for i, r in _runs(url).items()),
          f"{REFILL} more requests in every run", timeout_s=300, every_s=1)
    assert {i: _rules(url, i) for i in runs} == {i: _expected(r) for i, r in runs.items()}

    def both_answered() -> dict[str, int] | None:
        posts = _posts_answered(docker, project)
        return posts if set(posts) == {"dashboard-a:8177", "dashboard-b:8177"} and all(posts.values()) else None

    until(both_answered, "the proxy's report of POSTs answered by both dashboards", every_s=1)

    run_id = next(iter(runs))
    assert b'id="diagnosis"' in _get(f"{url}/runs/{run_id}")
    post = urllib.request.Request(f"{url}/api/v1/batches", data=b"{}", method="POST",
                                  headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(post, timeout=30)
    assert refused.value.code == 401
