"""The compose `live` and `vllm` profiles: two real EAGLE-3 servers on the CPU, traced into the
dashboard, and a small load generator that keeps both busy.

DRAFTSCOPE_LIVE_ENGINE picks the engine: `sglang` (profile `live`: SGLang 0.5.23 with the test bed's
pure-PyTorch stand-ins for SGLang's CPU kernel build; on a GPU SGLang's own kernels run) or `vllm`
(profile `vllm`: vLLM 0.32's own CPU build, stock). The servers are the test bed's (tiny models built
into the image): one healthy draft and one broken (DRAFTSCOPE_LIVE_BROKEN, default aux-off). The tracer,
installed from the wheel, reports to DRAFTSCOPE_URL. The load generator sends one request at a time to
each server in turn, one every DRAFTSCOPE_LIVE_INTERVAL_S, at most DRAFTSCOPE_LIVE_MAX_REQUESTS in all,
then leaves the servers idle. A server that dies (some broken scenarios crash at their first request)
is started again, at most three times: each start is a new run.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed import scenarios  # noqa: E402
from testbed.server import ServerHandle, ServerStartError, log_tail, start_server  # noqa: E402
from testbed.texts import DEMO_PROMPTS  # noqa: E402
from testbed.vllm_server import start_vllm_server  # noqa: E402

NEW_TOKENS = 16
RESTARTS = 3
ENGINES = ("sglang", "vllm")
LOGS = Path("/tmp/draftscope-live")


# a server still starting is waited for: on a busy or small machine vLLM on CPU took over 300 s to start
START_TIMEOUT_S = 900.0


def say(message: str) -> None:
    print(f"live: {message}", flush=True)


def start(engine: str, name: str) -> ServerHandle:
    prepared = scenarios.prepare(name)
    log_path = LOGS / f"{engine}-{name}.log"
    if engine == "vllm":
        say(f"starting vLLM for {name}")
        server = start_vllm_server(prepared.target_dir, prepared.draft_dir, log_path, timeout=START_TIMEOUT_S,
                                   python=sys.executable)
    else:
        say(f"starting SGLang for {name} ({' '.join(prepared.server_args) or 'default EAGLE3 flags'})")
        # The readiness probe must not generate: a crashing scenario would die on it, not on a request.
        env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
        server = start_server(prepared.target_dir, prepared.draft_dir, prepared.server_args, log_path, env=env,
                              timeout=START_TIMEOUT_S, python=sys.executable)
    say(f"{name} serving at {server.url} (log {server.log_path})")
    return server


def ask(engine: str, server: ServerHandle, prompt: str) -> None:
    if engine == "vllm":
        server.complete(prompt, NEW_TOKENS)
    else:
        server.generate(prompt, NEW_TOKENS)


def main() -> int:
    engine = os.environ.get("DRAFTSCOPE_LIVE_ENGINE", "sglang")
    if engine not in ENGINES:
        say(f"DRAFTSCOPE_LIVE_ENGINE={engine!r} is not an engine; choose from {list(ENGINES)}")
        return 2
    broken = os.environ.get("DRAFTSCOPE_LIVE_BROKEN", "aux-off")
    if broken not in scenarios.SCENARIOS or broken == "healthy":
        say(f"DRAFTSCOPE_LIVE_BROKEN={broken!r} is not a broken scenario; choose from "
            f"{sorted(set(scenarios.SCENARIOS) - {'healthy'})}")
        return 2
    max_requests = int(os.environ.get("DRAFTSCOPE_LIVE_MAX_REQUESTS", "2000"))
    interval_s = float(os.environ.get("DRAFTSCOPE_LIVE_INTERVAL_S", "0.5"))
    servers = {name: start(engine, name) for name in ("healthy", broken)}
    restarts = dict.fromkeys(servers, 0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leaves through `finally`: servers stop
    say(f"sending requests to both; open {os.environ.get('DRAFTSCOPE_PUBLIC_URL', 'the dashboard')}")
    try:
        sent = dict.fromkeys(servers, 0)
        turns = zip(itertools.cycle(servers), itertools.cycle(DEMO_PROMPTS))
        for count, (name, prompt) in enumerate(turns, start=1):
            if count > max_requests:
                say(f"{max_requests} requests sent; the servers stay up, idle")
                signal.pause()
            server = servers[name]
            if server.process.poll() is not None:
                if restarts[name] == RESTARTS:
                    continue
                say(f"{name} exited ({server.process.returncode}); log tail:\n{log_tail(server.log_path, 15)}")
                restarts[name] += 1
                servers[name] = server = start(engine, name)
            try:
                ask(engine, server, prompt)
                sent[name] += 1
            except (RuntimeError, OSError) as exc:
                say(f"{name}: request failed: {str(exc).splitlines()[0][:160]}")
            if count % 20 == 0:
                say(", ".join(f"{n} {k} requests" for n, k in sent.items()))
            time.sleep(interval_s)
    finally:
        for server in servers.values():
            server.stop()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ServerStartError as exc:
        say(str(exc))
        sys.exit(1)
