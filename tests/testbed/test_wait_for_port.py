"""``testbed.server.wait_for_port``: returns once the port listens, says so when the process died first or
the time ran out."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from testbed.server import HOST, wait_for_port


@pytest.fixture
def idle_process() -> Iterator[subprocess.Popen]:
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def bound() -> Iterator[socket.socket]:
    """A socket bound to a port of its own, not yet listening (connections are refused)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        yield s


def test_returns_once_the_port_listens(idle_process, bound) -> None:
    bound.listen()
    wait_for_port(bound.getsockname()[1], idle_process, timeout=10)


def test_a_process_that_exits_first_is_said(bound) -> None:
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    with pytest.raises(RuntimeError, match="exited with code 3 before listening"):
        wait_for_port(bound.getsockname()[1], process, timeout=10)


def test_the_timeout_is_said(idle_process, bound) -> None:
    with pytest.raises(RuntimeError, match="not listening on port .* after 0.3 s"):
        wait_for_port(bound.getsockname()[1], idle_process, timeout=0.3)
