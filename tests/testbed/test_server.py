"""The CPU SGLang test bed end to end: real `sglang.launch_server` with EAGLE-3.

SGLang's CPU kernels are the pure-PyTorch stand-ins in `testbed/cpu_standins/` here; on a GPU,
SGLang's own kernels run. Server starts are costly (~30 s of CPU each), so they are kept few.
"""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

import testbed.server
from draftscope.store import db
from testbed.server import ServerStartError, server_env, start_dashboard, start_server, venv_python

PROMPTS = ["Hello world, the quick brown fox", "The tiny model"]


def group_gone(pgid: int, wait: float = 5.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.sglang
def test_standins_keep_intel_amx_in_every_process(tmp_path):
    """The sitecustomize hook overrides `has_amx` in the launched process and in spawned children,
    while SGLang's layer-level AMX probe stays False (native torch layers)."""
    code = (
        "import multiprocessing as mp\n"
        "def probe(q):\n"
        "    from sglang.srt.runtime_context import get_platform\n"
        "    from sglang.srt.utils import cpu_has_amx_support\n"
        "    q.put((get_platform().has_amx, cpu_has_amx_support()))\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn'); q = ctx.Queue(); p = ctx.Process(target=probe, args=(q,))\n"
        "    p.start(); print(q.get(timeout=120)); p.join()\n"
    )
    script = tmp_path / "probe_amx.py"
    script.write_text(code)
    result = subprocess.run([str(venv_python()), str(script)], env=server_env(None), capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "(True, False)"


@pytest.mark.sglang
@pytest.mark.scenario("healthy")
def test_healthy_scenario_serves_with_eagle3(sglang_server):
    server = sglang_server("healthy")
    out = server.generate(PROMPTS[0], 16)
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 16 and len(out["output_ids"]) == 16
    assert meta["spec_verify_ct"] > 0 and meta["spec_num_proposed_drafts"] > 0


def test_a_port_taken_before_the_dashboard_binds_it_is_retried(monkeypatch, tmp_path):
    """``free_port`` closes its probe socket, so another process can bind the port before the server
    does (seen in CI: "address already in use", exit code 3). uvicorn exits on the taken port and the
    start moves to a new one: ``on_a_free_port``, which ``start_server`` shares (SGLang binds through
    uvicorn too, and writes the same message, after a whole start: ~25 s of CPU a try)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real, first = testbed.server.free_port, [taken.getsockname()[1]]
    monkeypatch.setattr(testbed.server, "free_port", lambda: first.pop() if first else real())
    store = tmp_path / "store.db"
    db.upgrade(f"sqlite:///{store}")
    try:
        with start_dashboard(store, tmp_path / "dashboard.log") as url:
            assert not url.endswith(f":{taken.getsockname()[1]}") and not first
            with urllib.request.urlopen(url + "/healthz", timeout=10) as response:
                assert json.load(response)["status"] == "ok"
    finally:
        taken.close()


def test_unknown_scenario_is_a_clear_error(sglang_server):
    with pytest.raises(Exception, match="no-such-scenario"):
        sglang_server("no-such-scenario")


def test_missing_venv_says_to_run_build_venv(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTSCOPE_VENV", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="scripts/build-venv"):
        start_server(tmp_path, None, [], tmp_path / "never.log")


@pytest.fixture
def started(monkeypatch):
    """The processes `start_server` launches during the test."""
    processes = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        processes.append(real_popen(*args, **kwargs))
        return processes[-1]

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    return processes


@pytest.mark.sglang
def test_server_that_exits_reports_its_log_and_leaves_nothing(tmp_path, started):
    with pytest.raises(ServerStartError, match="exited with code") as failure:
        start_server(tmp_path, None, ["--dtype", "no-such-dtype"], tmp_path / "bad.log")
    assert "no-such-dtype" in str(failure.value)  # argparse's complaint, from the log tail
    assert group_gone(started[0].pid), "the server's process group outlived the failed start"


@pytest.mark.sglang
def test_server_past_its_deadline_is_killed_with_its_group(tmp_path, started):
    with pytest.raises(ServerStartError, match="not healthy after 3 s") as failure:
        start_server(tmp_path, None, [], tmp_path / "slow.log", timeout=3)
    assert "Last lines of" in str(failure.value)
    assert group_gone(started[0].pid), "the server's process group outlived the failed start"


@pytest.mark.sglang
def test_server_interrupted_while_starting_is_killed_with_its_group(tmp_path, started):
    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)  # as Ctrl-C would, 2 s into the start
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            start_server(tmp_path, None, [], tmp_path / "interrupted.log", timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert group_gone(started[0].pid), "the server's process group outlived the interrupted start"
