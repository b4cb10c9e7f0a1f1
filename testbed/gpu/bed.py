"""Servers of the GPU test bed, started at once: what the runner's phases (``testbed/gpu/runner.py``,
``testbed/gpu/kimi_phase.py``) launch and stop, and what each server's log says about its run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.server import HOST, PORT_ATTEMPTS, ServerHandle, free_port, log_tail, port_taken

START_TIMEOUT_S = 240
SGLANG = (sys.executable, "-m", "sglang.launch_server")


@dataclass
class Spec:
    name: str
    target: Path
    draft: Path
    args: list  # after the model paths, host and port: a scenario's own --speculative-algorithm comes last
    tracer: dict = field(default_factory=dict)  # DRAFTSCOPE_* (empty: the plugin is not on the path)


def gpu_out_of_memory(log_path: Path) -> bool:
    """Whether an exited server's log says CUDA ran out of memory (torch's ``CUDA out of memory``)."""
    return "cuda out of memory" in Path(log_path).read_text(errors="replace").lower()


class Bed:
    """Servers started at once from ``Spec``s, each in its own process group, traced into ``work/traces``
    and logged into ``work/logs``; ``launcher`` is the command before the server's arguments. An engine's bed
    overrides ``command``, ``handle`` and ``facts``; ``env`` is set for every server."""

    env: dict = {}

    def __init__(self, kit: Path, work: Path, tracer_site: str, server_path: str, launcher: tuple = SGLANG):
        self.kit, self.work, self.tracer_site, self.server_path = kit, work, tracer_site, server_path
        self.launcher = launcher
        for sub in ("traces", "logs"):
            (work / sub).mkdir(parents=True, exist_ok=True)

    def slug(self, name: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]", "-", name)

    def command(self, spec: Spec, port: int) -> list:
        return [*self.launcher, "--model-path", str(spec.target), "--speculative-draft-model-path", str(spec.draft),
                "--host", HOST, "--port", str(port), *spec.args]

    def handle(self, spec: Spec, process: subprocess.Popen, url: str, log: Path) -> ServerHandle:
        return ServerHandle(process, url, log)

    def facts(self, log: Path) -> dict:
        return log_facts(log)

    def start(self, spec: Spec) -> tuple:
        """Launch one server on a free port (not waiting); returns (handle, trace path or None)."""
        port = free_port()
        args = self.command(spec, port)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTSCOPE_")}
        env.update(self.env)
        paths = self.server_path.split(os.pathsep)  # the stand-ins first, then the installed wheels
        trace = None
        if spec.tracer:
            trace = self.work / "traces" / f"{self.slug(spec.name)}.jsonl"
            trace.unlink(missing_ok=True)  # a restart on a new port starts a fresh trace
            env.update(spec.tracer, DRAFTSCOPE_FILE=str(trace), DRAFTSCOPE_FLUSH_INTERVAL_S="0.2",
                       DRAFTSCOPE_MODELS_ROOT=str(self.work))  # paths recorded as kimi-models/..., traces/...
            paths.insert(1, self.tracer_site)
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        log = self.work / "logs" / f"{self.slug(spec.name)}.log"
        with open(log, "w") as f:
            f.write("$ " + " ".join(args) + "\n")
            f.flush()
            process = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self.handle(spec, process, f"http://{HOST}:{port}", log), trace

    def start_all(self, specs: list, timeout_s: float = START_TIMEOUT_S) -> dict:
        """Start every server at once; wait until each answers ``/model_info`` (or failed). A server whose
        port another process took first (``testbed.server.port_taken``) is restarted on a new port, up to
        ``PORT_ATTEMPTS`` launches in all. One that ran out of GPU memory beside the others (start-up peaks
        coincide: two Kimi-shaped servers fit an H100 once up, not always while both capture their graphs) is
        started once more, alone, when the others have settled."""
        t0 = time.monotonic()
        started = {s.name: (s, *self.start(s)) for s in specs}
        launches = dict.fromkeys(started, 1)
        state, crowded, again = {}, set(), set()  # out of GPU memory beside the others; started again alone
        while len(state) < len(started) and time.monotonic() - t0 < timeout_s:
            for name in sorted(crowded):
                if all(n in state for n in started if n not in crowded):
                    crowded.discard(name)
                    again.add(name)
                    launches[name] += 1
                    started[name] = (started[name][0], *self.start(started[name][0]))
                    print(f"[runner] server {name}: out of GPU memory beside another start, started again alone",
                          flush=True)
                    break  # one at a time
            for name, (spec, handle, trace) in started.items():
                if name in state or name in crowded:
                    continue
                if handle.process.poll() is not None:
                    if port_taken(handle.log_path) and launches[name] < PORT_ATTEMPTS:
                        handle.stop()  # what is left of its process group
                        launches[name] += 1
                        started[name] = (spec, *self.start(spec))
                        print(f"[runner] server {name}: its port was taken, restarted on a new one", flush=True)
                        continue
                    if len(started) > 1 and name not in again and gpu_out_of_memory(handle.log_path):
                        handle.stop()
                        crowded.add(name)
                        continue
                    state[name] = {"ok": False, "error": f"exited with {handle.process.returncode}",
                                   "log_tail": log_tail(handle.log_path, 30)}
                elif handle.is_healthy():
                    state[name] = {"ok": True, "start_s": round(time.monotonic() - t0, 1)}
            time.sleep(0.5)
        for name, (spec, handle, trace) in started.items():
            state.setdefault(name, {"ok": False, "error": f"not healthy after {timeout_s:.0f} s",
                                    "log_tail": log_tail(handle.log_path, 30)})
            state[name].update(name=name, launches=launches[name], handle=handle, trace=str(trace) if trace else None,
                               spec={"target": str(spec.target), "draft": str(spec.draft), "args": spec.args,
                                     "tracer": spec.tracer})
            print(f"[runner] server {name}: {'healthy' if state[name]['ok'] else state[name]['error']}", flush=True)
        return state

    def stop_all(self, state: dict) -> None:
        """Stop every server at once (each waits for its own shutdown), then read their logs."""
        stops = [threading.Thread(target=s.pop("handle").stop) for s in state.values()]
        [t.start() for t in stops]
        [t.join() for t in stops]
        for s in state.values():  # what the log says about the run
            s["log_facts"] = self.facts(Path(self.work / "logs" / f"{self.slug(s['name'])}.log"))


def log_facts(log: Path) -> dict:
    text = log.read_text(errors="replace") if log.exists() else ""
    replays = [int(n) for n in re.findall(r"graph replays: (\d+)", text)]
    return {"graph_replays_at_least": max(replays, default=0),
            "cuda_graph_batches": len(re.findall(r"cuda graph: True", text)),
            "eager_batches": len(re.findall(r"cuda graph: False", text)),
            "standins_called": sorted(set(re.findall(r"\[sgl_kernel stand-in\] called (\S+)", text))),
            "stubs_called": sorted(set(re.findall(r"STUB CALLED (\S+)", text))),
            "jit_refused": sorted(set(re.findall(r"refused JIT module '([^']+)'", text))),
            "jit_standins": sorted(set(re.findall(r"JIT module '([^']+)' -> pure-PyTorch stand-in", text))),
            "tracer_lines": [ln[:400] for ln in text.splitlines() if "draftscope" in ln][:40],
            "tracebacks": text.count("Traceback")}
