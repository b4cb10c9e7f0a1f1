"""Start a real SGLang 0.5.23 server on the CPU (the test bed) and talk to it.

The server runs SGLang's own scheduler, EAGLE worker and model classes; only SGLang's CPU kernel
build, which is not on PyPI, is replaced by the pure-PyTorch stand-ins in `testbed/cpu_standins/`
(put first on the server's `PYTHONPATH` here and nowhere else). On a GPU, SGLang's own kernels run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence, TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent
CPU_STANDINS = REPO_ROOT / "testbed" / "cpu_standins"
HOST = "127.0.0.1"

CPU_ARGS = [
    "--device", "cpu",
    "--dtype", "float32",
    "--attention-backend", "intel_amx",
    "--disable-cuda-graph",
    "--skip-server-warmup",
    "--max-total-tokens", "4096",
    "--max-running-requests", "4",
]
CONCURRENT_REQUESTS = 4  # generate_many's requests in flight: CPU_ARGS' --max-running-requests
EAGLE3_ARGS = [
    "--speculative-algorithm", "EAGLE3",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its log tail."""


def log_tail(log_path: str | os.PathLike, lines: int = 40) -> str:
    """The last `lines` lines of a log file ('' when it does not exist)."""
    try:
        with open(log_path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except FileNotFoundError:
        return ""


def venv_python() -> Path:
    """The test bed's Python: `$DRAFTSCOPE_VENV/bin/python`, default `.venv/` in the repository."""
    venv = Path(os.environ.get("DRAFTSCOPE_VENV") or REPO_ROOT / ".venv")
    python = venv / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(
            f"no Python at {python}: build the test bed venv with `scripts/build-venv {venv}` "
            "(or point DRAFTSCOPE_VENV at an existing one)"
        )
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    """Return once something accepts connections on ``HOST:port``; ``RuntimeError`` if ``process`` exits
    first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"exited with code {process.returncode} before listening on port {port}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"not listening on port {port} after {timeout:g} s") from None
            time.sleep(0.2)


NO_CRASH_PAUSE = ("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH")


def server_command(python, target_dir, draft_dir, extra_args: list[str], port: int) -> list[str]:
    """The `sglang.launch_server` command line; `extra_args` come last, so they override."""
    args = [str(python), "-m", "sglang.launch_server", "--model-path", str(target_dir),
            "--host", HOST, "--port", str(port), *CPU_ARGS]
    if draft_dir is not None:
        args += [*EAGLE3_ARGS, "--speculative-draft-model-path", str(draft_dir)]
    return args + list(extra_args)


def server_env(env: dict | None) -> dict:
    """The environment the server runs in: the CPU engine switch and the stand-ins first on the path."""
    merged = {**os.environ, **(env or {})}
    path = [str(CPU_STANDINS), str(REPO_ROOT)]
    if merged.get("PYTHONPATH"):
        path.append(merged["PYTHONPATH"])
    merged.update(SGLANG_USE_CPU_ENGINE="1", TORCHDYNAMO_DISABLE="1", PYTHONPATH=os.pathsep.join(path))
    # A SIGTERM to the group ends the scheduler by signal, which SGLang handles as a crash: 5 s of pause
    # before its (GPU) crash diagnostics at every stop. Off, so a crash kills the scheduler's tree at once
    # and the servers that crash also show the tracer's crash record needs no such pause.
    for name in NO_CRASH_PAUSE:
        merged.setdefault(name, "0")
    return merged


class ServerHandle:
    """A running server in its own process group; `stop()` (or leaving `with`) ends the group.
    ``failed``: a request got no answer (the server may be dying: a scenario that crashes it)."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path, api_key: str | None = None):
        self.process = process
        self.url = url
        self.log_path = log_path
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.failed = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def generate(self, text: str | list[int], max_new_tokens: int = 16, rid: str | None = None, **sampling) -> dict:
        """`POST /generate` of a text, or of token ids (a `--skip-tokenizer-init` server); greedy unless
        `sampling` says otherwise; SGLang picks the request id unless `rid` is given. Returns the JSON
        (with `meta_info`)."""
        params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, **sampling}
        body = {"text" if isinstance(text, str) else "input_ids": text, "sampling_params": params,
                **({"rid": rid} if rid else {})}
        return self._post("/generate", body)

    def generate_many(self, texts: Sequence[str | list[int]], max_new_tokens: int = 16, *,
                      return_failures: bool = False, **sampling) -> list:
        """`generate` of each of ``texts``, sent side by side (``CONCURRENT_REQUESTS`` at a time: the
        server runs that many at once), the answers in the order of ``texts``. On the CPU test bed a
        decode step of the tiny model is mostly Python, so a batch costs about what one request does.
        With ``return_failures`` a request that got no answer (a scenario that crashes the server) gives
        its exception in its place; otherwise the first such exception is raised.
        A batched row's logits differ from a lone request's in the last digits (~3e-6 on the test bed):
        compare exact numbers only between requests sent the same way."""
        def one(text):
            try:
                return self.generate(text, max_new_tokens, **sampling)
            except (RuntimeError, OSError) as e:
                if not return_failures:
                    raise
                return e

        with ThreadPoolExecutor(CONCURRENT_REQUESTS) as pool:
            return list(pool.map(one, texts))

    def get(self, path: str, timeout: float = 10.0) -> dict:
        request = urllib.request.Request(self.url + path, headers=self.headers)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def _post(self, path: str, body: dict, timeout: float = 120.0) -> dict:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **self.headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except OSError as e:  # HTTPError and URLError included
            self.failed = True
            if not isinstance(e, urllib.error.HTTPError):
                raise
            raise RuntimeError(
                f"POST {path} -> HTTP {e.code}: {e.read().decode(errors='replace')[:2000]}\n"
                f"server log tail ({self.log_path}):\n{log_tail(self.log_path)}"
            ) from e

    def flush_cache(self) -> None:
        """Empty SGLang's prefix (radix) cache: prompts served before are computed in full again,
        as on a server just started. Raises when SGLang refuses (requests still running)."""
        request = urllib.request.Request(self.url + "/flush_cache", data=b"", headers=self.headers, method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()

    def is_healthy(self) -> bool:
        """`/model_info` answers: the server is up. (`/health` would run a one-token generation,
        making the probe the server's first request, which some scenarios crash on.)"""
        try:
            request = urllib.request.Request(self.url + "/model_info", headers=self.headers)
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def pause(self) -> None:
        """SIGSTOP the process group: an idle scheduler polls and costs a good part of a core. The
        tracer's recorder runs in a session of its own (outside the tree) and keeps flushing."""
        _signal_group(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        _signal_group(self.process.pid, signal.SIGCONT)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the process group (resumed, were it paused), wait, then SIGKILL it. Safe to call
        twice."""
        try:
            pgid = os.getpgid(self.process.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            _signal_group(pgid, signal.SIGTERM)
            _signal_group(pgid, signal.SIGCONT)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _group_alive(pgid):
                self.process.poll()
                time.sleep(0.2)
            _signal_group(pgid, signal.SIGKILL)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate_main(self, timeout: float = 60.0) -> int | None:
        """SIGTERM SGLang's main process alone, as ``docker stop`` and Kubernetes do (SGLang drains, asks its
        schedulers to exit, then ends its children); its exit code, or None if it is still running after
        ``timeout`` (``stop()`` then ends the group)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


RECORDER = "draftscope_tracer.transport.recorder"


def server_processes(pid: int) -> list:
    """The live processes of the server under ``pid`` (``psutil.Process``): its tree, then the tracer's
    recorders a process of that tree started. A recorder leaves the tree as it starts (so that SGLang's
    kill of the scheduler's descendants cannot cut its flush short); ``--scheduler PID`` in its command
    line names the process that started it."""
    import psutil

    def live(p: psutil.Process) -> bool:  # not a zombie, e.g. a recorder's launcher its relay has not reaped
        with contextlib.suppress(psutil.Error):
            return p.status() != psutil.STATUS_ZOMBIE
        return False

    root = psutil.Process(pid)
    tree = [p for p in [root, *root.children(recursive=True)] if live(p)]
    starters = {str(p.pid) for p in tree}
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        started_by = cmd[cmd.index("--scheduler") + 1] if RECORDER in cmd and "--scheduler" in cmd[:-1] else None
        if started_by in starters and p not in tree and live(p):
            tree.append(p)
    return tree


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


PORT_ATTEMPTS = 3
T = TypeVar("T")


class PortTaken(Exception):
    """Another process bound the free port between ``free_port`` and the server's own bind."""


def port_taken(log_path: Path) -> bool:
    """Whether an exited server's log says a port it binds was taken (``[Errno 98] address already in use``
    from uvicorn, ``Address already in use`` from ZMQ or a socket)."""
    return "address already in use" in Path(log_path).read_text(errors="replace").lower()


def start_server(
    target_dir,
    draft_dir,
    extra_args: list[str],
    log_path,
    env: dict | Callable[[int], dict] | None = None,
    python: str | None = None,
    timeout: float = 240.0,
    api_key: str | None = None,
) -> ServerHandle:
    """Start `sglang.launch_server` for `target_dir` (plus an EAGLE-3 `draft_dir`, or None for no
    speculation) on a free local port and wait until it answers `/model_info`. With `api_key` the
    server gets `--api-key` and the handle sends it with every request. `env` may be a function of the
    port: each attempt's own environment (e.g. a fresh tracer store, so an attempt that lost its port
    leaves no run where the next one writes).

    Raises `ServerStartError` with the log tail if the process exits or `timeout` seconds pass
    (and then leaves no process behind). A port another process took before the server bound it
    is retried on a new one (``PORT_ATTEMPTS`` in all).
    """
    python = Path(python) if python else venv_python()
    for name, path in (("target", target_dir), ("draft", draft_dir)):
        if path is not None and not Path(path).is_dir():
            raise FileNotFoundError(f"{name} model directory {path} does not exist")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    return on_a_free_port(lambda port: _start(python, target_dir, draft_dir, extra_args, log_path, env, timeout,
                                              api_key, port), log_path)


def on_a_free_port(start: Callable[[int], T], log_path: Path) -> T:
    """``start(port)`` on a ``free_port``; a start that raises :class:`PortTaken` (its process exited on a
    port another one bound first) is tried again on a new port, ``PORT_ATTEMPTS`` in all. SGLang and
    ``draftscope serve`` both bind through uvicorn, whose ``address already in use`` ``port_taken`` reads."""
    for _ in range(PORT_ATTEMPTS):
        try:
            return start(free_port())
        except PortTaken:
            continue
    raise ServerStartError(_failure(f"the port was taken {PORT_ATTEMPTS} times in a row", log_path))


def _start(python: Path, target_dir, draft_dir, extra_args: list[str], log_path: Path, env,
           timeout: float, api_key: str | None, port: int) -> ServerHandle:
    extra_args = [*extra_args, "--api-key", api_key] if api_key else extra_args
    env = env(port) if callable(env) else env
    command = server_command(python, target_dir, draft_dir, extra_args, port)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=server_env(env),
            cwd=REPO_ROOT, start_new_session=True,
        )
    handle = ServerHandle(process, f"http://{HOST}:{port}", log_path, api_key)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if process.poll() is not None:
                if port_taken(log_path):
                    raise PortTaken(port)
                raise ServerStartError(_failure(f"the server exited with code {process.returncode}", log_path))
            if handle.is_healthy():
                return handle
            if time.monotonic() > deadline:
                raise ServerStartError(_failure(f"the server was not healthy after {timeout:.0f} s", log_path))
            time.sleep(0.5)
    except BaseException:  # a start error, or Ctrl-C while waiting: leave no process behind
        handle.stop()
        raise


DRAFTSCOPE = (sys.executable, "-m", "draftscope")


@contextlib.contextmanager
def start_dashboard(store: Path | str, log_path: Path, timeout: float = 60.0, *,
                    command: Sequence[str] = DRAFTSCOPE, args: Sequence[str] = (), **popen):
    """A real ``draftscope serve`` (``command``: another install's) on ``store`` (a migrated SQLite
    file, or a database URL), with more ``args``; yields its URL once ``/healthz`` answers and stops
    its process group on exit. A port another process took first is retried on a new one."""
    db = str(store) if "://" in str(store) else f"sqlite:///{store}"

    def start(port: int) -> tuple[subprocess.Popen, str]:
        with open(log_path, "w") as log:
            process = subprocess.Popen([*command, "serve", "--db", db, "--port", str(port), *args], stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True, **popen)
        url = f"http://{HOST}:{port}"
        try:
            _wait_answers(url + "/healthz", process, log_path, timeout)
        except BaseException:
            _end_group(process)
            raise
        return process, url

    process, url = on_a_free_port(start, Path(log_path))
    try:
        yield url
    finally:
        _end_group(process)


def _wait_answers(url: str, process: subprocess.Popen, log_path: Path, timeout: float) -> None:
    """Until ``url`` answers (any HTTP status); PortTaken when the process exits on a taken port."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if process.poll() is not None and port_taken(log_path):
                raise PortTaken(url) from None
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"draftscope serve did not answer at {url}:\n{log_tail(log_path)}") from None
            time.sleep(0.3)


def _end_group(process: subprocess.Popen) -> None:
    _signal_group(process.pid, signal.SIGTERM)
    process.wait(10)


def _failure(what: str, log_path: Path) -> str:
    return f"SGLang server failed to start: {what}. Last lines of {log_path}:\n{log_tail(log_path)}"
