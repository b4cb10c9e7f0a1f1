"""The fleet's front door on this machine: HAProxy (Debian's package, ``apt-get install haproxy``) run
by ``docker/proxy-entrypoint`` with ``docker/haproxy.cfg``, as compose's ``proxy`` service runs it,
in front of dashboards listening on loopback ports: TLS with the self-signed certificate it makes
(its CA in ``ca_file``), HTTP redirected to HTTPS, a dashboard that fails its ``/healthz`` taken out.
Used by ``bench/fleet_bench.py`` and ``tests/test_fleet.py`` (through tests/fixtures/front_door.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testbed.server import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[1]
HAPROXY_MISSING = "the fleet's front door needs HAProxy on this machine: apt-get install haproxy (scripts/test does)"


@dataclass(frozen=True)
class FrontDoor:
    https_port: int
    http_port: int
    ca_file: Path  # the CA of the certificate it made: SSL_CERT_FILE for the tracer's sink
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"https://localhost:{self.https_port}"


def _healthy(port: int) -> bool:
    """The proxy's own health: at least one dashboard passes its checks."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def front_door(backend_ports: list[int], folder: Path, timeout_s: float = 60.0) -> Iterator[FrontDoor]:
    """HAProxy in front of ``127.0.0.1:<port>`` for each of ``backend_ports``, its certificate, run
    files and log under ``folder``; stopped at the end."""
    if shutil.which("haproxy", path=f"{os.environ.get('PATH', '')}:/usr/sbin") is None:
        raise RuntimeError(HAPROXY_MISSING)
    https, http, health = free_port(), free_port(), free_port()
    env = {**os.environ, "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin",
           "DRAFTSCOPE_PROXY_BACKENDS": " ".join(f"127.0.0.1:{p}" for p in backend_ports),
           "DRAFTSCOPE_PROXY_HTTPS_BIND": f"127.0.0.1:{https}", "DRAFTSCOPE_PROXY_HTTPS_PORT": str(https),
           "DRAFTSCOPE_PROXY_HTTP_BIND": f"127.0.0.1:{http}", "DRAFTSCOPE_PROXY_HEALTH_BIND": f"127.0.0.1:{health}",
           "DRAFTSCOPE_PROXY_TLS_DIR": str(folder / "tls"), "DRAFTSCOPE_PROXY_CERT_DIR": str(folder / "certs"),
           "DRAFTSCOPE_PROXY_RUN_DIR": str(folder / "run"),
           "DRAFTSCOPE_PROXY_CONFIG": str(ROOT / "docker" / "haproxy.cfg")}
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "proxy.log").open("ab") as log:
        process = subprocess.Popen(["sh", str(ROOT / "docker" / "proxy-entrypoint")], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(health, process, timeout_s)
        deadline = time.monotonic() + timeout_s
        while not _healthy(health):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"HAProxy found no healthy dashboard (log: {folder / 'proxy.log'})")
            time.sleep(0.1)
        yield FrontDoor(https, http, folder / "tls" / "ca.pem", process)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
