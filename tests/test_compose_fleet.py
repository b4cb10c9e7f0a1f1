"""`docker compose --profile fleet up`: two dashboard processes on the profile's PostgreSQL behind its
HTTPS front door (HAProxy, docker/haproxy.cfg), fed by its simulated tracers (recorded traces replayed
through the tracer's ``HttpSink``, over HTTPS through the proxy, trusting the CA it made).

Through the proxy: every tracer's run appears and fills, the replays of the aux-off recording carry
their finding, and each run's findings are stored once while both processes keep refreshing it; the
proxy's log shows that both dashboards answered the tracers' batches; ingest without the token is
refused. HTTP is redirected to HTTPS, whose certificate is the self-signed one made at first start
(said so in the log). The dashboards believe the proxy's X-Forwarded-Proto (a login through it gets a
``Secure`` cookie) and nobody else's. One dashboard killed (SIGKILL) is taken out by the proxy's
health checks, reads keep answering and the runs keep filling, it is taken back once started again,
and when the tracers stop every request each sent is stored, none dropped. Engine, wheels and images:
the ``docker`` fixture (tests/fixtures/compose.py); the project is taken down with its volumes, also
when a check fails.
"""

from __future__ import annotations

import json
import re
import secrets
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

import pytest

from draftscope.web.access import COOKIE
from tests.fixtures.compose import Docker
from tests.fixtures.wait import until

pytestmark = pytest.mark.compose
TRACERS = 4  # the profile's default (DRAFTSCOPE_FLEET_TRACERS): replays of healthy, aux-off, healthy, aux-off
REFILL = 100  # requests per run at ~3-4/s: ~30 s, some 15 refreshes by each process (2 s debounce)
READ_TOKEN = secrets.token_urlsafe(24)  # reads need it: logging in shows whether the cookie is Secure
ANSWERED = re.compile(r' dashboards/(\S+) .*"POST /api/v1/batches ')  # an HAProxy httplog line
TRACER_DONE = re.compile(r"tracer (\d+) \(\S+\): (\d+) requests, \d+ rows sent; drops (\{.*\})")


@dataclass(frozen=True)
class Fleet:
    url: str  # https://127.0.0.1:<DRAFTSCOPE_FLEET_PORT>
    http_port: int
    project: str
    tls: ssl.SSLContext  # trusts the CA the proxy made at first start


@pytest.fixture(scope="module")
def fleet(docker):
    docker.wheels(live=False)
    for ports, project in docker.up("fleet", env={"DRAFTSCOPE_READ_TOKEN": READ_TOKEN}):
        ca = docker.compose(project, "--profile", "fleet", "exec", "-T", "proxy", "cat", "/tls/ca.pem").stdout
        yield Fleet(f"https://127.0.0.1:{ports['DRAFTSCOPE_FLEET_PORT']}", ports["DRAFTSCOPE_FLEET_HTTP_PORT"],
                    project, ssl.create_default_context(cadata=ca))


def _open(fleet: Fleet, path: str, **kwargs):
    request = urllib.request.Request(f"{fleet.url}{path}", **kwargs)
    request.add_header("Authorization", f"Bearer {READ_TOKEN}")
    return urllib.request.urlopen(request, timeout=30, context=fleet.tls)


def _get(fleet: Fleet, path: str) -> bytes:
    with _open(fleet, path) as resp:
        return resp.read()


def _runs(fleet: Fleet) -> dict[str, dict]:
    return {r["id"]: r for r in json.loads(_get(fleet, "/api/v1/runs"))}


def _rules(fleet: Fleet, run_id: str) -> list[str]:
    return sorted(f["rule_id"] for f in json.loads(_get(fleet, f"/api/v1/runs/{run_id}"))["findings"])


def _expected(run: dict) -> list[str]:
    return ["fc-bypassed"] if "aux-off" in run["draft_path"] else []


def _logs(docker: Docker, fleet: Fleet, service: str) -> str:
    return docker.compose(fleet.project, "--profile", "fleet", "logs", "--no-color", service).stdout


def _posts_answered(docker: Docker, fleet: Fleet) -> dict[str, int]:
    """The tracers' POSTs each dashboard answered, by the proxy's log."""
    answered: dict[str, int] = {}
    for server in ANSWERED.findall(_logs(docker, fleet, "proxy")):
        answered[server] = answered.get(server, 0) + 1
    return answered


def _filled(fleet: Fleet, since: dict[str, dict], more: int) -> bool:
    return all(r["requests_count"] >= since[i]["requests_count"] + more for i, r in _runs(fleet).items())


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_fleet_fills_through_the_proxy(fleet, docker) -> None:
    def diagnosed() -> dict[str, dict] | None:
        runs = _runs(fleet)
        ready = len(runs) == TRACERS and all(r["requests_count"] > 0 and r["findings_count"] == len(_expected(r))
                                             for r in runs.values())
        return runs if ready else None

    runs = until(diagnosed, f"{TRACERS} runs filling, the aux-off ones diagnosed", timeout_s=300, every_s=1)
    assert sorted(_expected(r) for r in runs.values()) == [[], [], ["fc-bypassed"], ["fc-bypassed"]]

    # both processes refresh every live run (their polls see each new batch): REFILL requests later,
    # each run still holds each finding once
    until(lambda: _filled(fleet, runs, REFILL), f"{REFILL} more requests in every run", timeout_s=300, every_s=1)
    assert {i: _rules(fleet, i) for i in runs} == {i: _expected(r) for i, r in runs.items()}

    def both_answered() -> dict[str, int] | None:
        posts = _posts_answered(docker, fleet)
        return posts if set(posts) == {"dashboard-a:8177", "dashboard-b:8177"} else None

    until(both_answered, "the proxy's log of POSTs answered by both dashboards", every_s=1)

    run_id = next(iter(runs))
    assert b'id="diagnosis"' in _get(fleet, f"/runs/{run_id}")
    post = urllib.request.Request(f"{fleet.url}/api/v1/batches", data=b"{}", method="POST",
                                  headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(post, timeout=30, context=fleet.tls)
    assert refused.value.code == 401


def test_http_is_redirected_to_https_served_with_the_certificate_made_at_first_start(fleet, docker) -> None:
    plain = urllib.request.build_opener(_NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as redirect:
        plain.open(f"http://127.0.0.1:{fleet.http_port}/api/v1/runs?limit=5", timeout=30)
    assert redirect.value.code == 308
    assert redirect.value.headers["Location"] == f"{fleet.url}/api/v1/runs?limit=5"

    assert "no certificate made yet: made a SELF-SIGNED one" in _logs(docker, fleet, "proxy")
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # not a public CA's
        urllib.request.urlopen(f"{fleet.url}/healthz", timeout=30)
    with urllib.request.urlopen(f"{fleet.url}/healthz", timeout=30, context=fleet.tls) as resp:
        assert json.loads(resp.read())["status"] == "ok"


def test_the_dashboards_believe_the_proxys_headers_and_nobody_elses(fleet, docker) -> None:
    form = urllib.parse.urlencode({"token": READ_TOKEN, "next": "/"}).encode()
    login = urllib.request.Request(f"{fleet.url}/login", data=form, method="POST",
                                   headers={"Content-Type": "application/x-www-form-urlencoded",
                                            "Origin": fleet.url})
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=fleet.tls))
    with pytest.raises(urllib.error.HTTPError) as through_proxy:
        opener.open(login, timeout=30)
    assert through_proxy.value.code == 303
    cookie = through_proxy.value.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "secure" in cookie.lower().split("; ")

    # the same login from inside a dashboard's container, on loopback, claiming HTTPS: not believed
    forged = f"""
import urllib.error, urllib.request
class Stay(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k): return None
req = urllib.request.Request("http://127.0.0.1:8177/login", data={form!r}, method="POST", headers={{
    "Content-Type": "application/x-www-form-urlencoded", "Origin": "http://127.0.0.1:8177",
    "X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}})
try:
    urllib.request.build_opener(Stay).open(req, timeout=30)
except urllib.error.HTTPError as e:
    print(e.code, e.headers["Set-Cookie"])
"""
    inside = docker.compose(fleet.project, "--profile", "fleet", "exec", "-T", "dashboard-a", "python3", "-c", forged)
    code, _, cookie = inside.stdout.strip().partition(" ")
    assert code == "303" and cookie.startswith(f"{COOKIE}="), inside.stdout
    assert "secure" not in cookie.lower().split("; "), inside.stdout
    assert "believed from" in _logs(docker, fleet, "dashboard-a")

    # the proxy passes the client's Host on: one the dashboards do not answer to is refused
    with pytest.raises(urllib.error.HTTPError) as foreign:
        _open(fleet, "/api/v1/runs", headers={"Host": "rebound.example"})
    assert foreign.value.code == 400


def test_a_dashboard_killed_is_taken_out_and_nothing_is_lost(fleet, docker) -> None:
    """Last in this module: it stops the tracers."""
    runs = until(lambda: r if len(r := _runs(fleet)) == TRACERS else None, f"{TRACERS} runs", timeout_s=300)
    proxy_log = lambda: _logs(docker, fleet, "proxy")  # noqa: E731
    docker.compose(fleet.project, "--profile", "fleet", "kill", "-s", "SIGKILL", "dashboard-a")
    until(lambda: "dashboards/dashboard-a:8177 is DOWN" in proxy_log(), "the proxy taking dashboard-a out",
          timeout_s=60, every_s=0.5)
    for _ in range(20):  # every read answered: none goes to the dead one
        assert json.loads(_get(fleet, "/api/v1/runs"))
    until(lambda: _filled(fleet, runs, 20), "20 more requests in every run with dashboard-a down",
          timeout_s=300, every_s=1)

    docker.compose(fleet.project, "--profile", "fleet", "start", "dashboard-a")
    until(lambda: "dashboards/dashboard-a:8177 is UP" in proxy_log(), "the proxy taking dashboard-a back",
          timeout_s=120, every_s=0.5)
    posts = _posts_answered(docker, fleet).get("dashboard-a:8177", 0)
    until(lambda: _posts_answered(docker, fleet).get("dashboard-a:8177", 0) > posts,
          "dashboard-a answering batches again",
          timeout_s=60, every_s=0.5)

    # the tracers end their runs, delivering what they still hold; each says what it sent and dropped
    docker.compose(fleet.project, "--profile", "fleet", "stop", "-t", "120", "tracers")
    done = {int(i): (int(n), drops) for i, n, drops in TRACER_DONE.findall(_logs(docker, fleet, "tracers"))}
    assert sorted(done) == list(range(TRACERS)) and all(drops == "{}" for _, drops in done.values()), done
    hosts = {i: json.loads(_get(fleet, f"/api/v1/runs/{i}"))["run"]["host"] for i in runs}  # "<hostname>-<tracer>"
    stored = {int(hosts[i].rpartition("-")[2]): r for i, r in _runs(fleet).items()}
    assert {i: (r["requests_count"], r["status"]) for i, r in stored.items()} == \
        {i: (n, "ended") for i, (n, _) in done.items()}
