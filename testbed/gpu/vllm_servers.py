"""One vLLM server of the GPU kit's tiny bed: its command line and environment, what its log says, when its trace
is closed, and what the tracer recorded (``vllm_serve``, ``vllm_kimi`` and ``vllm_throughput`` build on these)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from testbed.gpu import traces
from testbed.server import HOST
from testbed.vllm_server import NUM_SPECULATIVE_TOKENS, SPEC_COUNTERS, VLLMServer

SERVER_ARGS = ["--dtype", "float32", "--attention-backend", "TRITON_ATTN", "--max-model-len", "1024",
               "--max-num-seqs", "8", "--gpu-memory-utilization", "0.15", "--seed", "0", "--shutdown-timeout", "10",
               "--compilation-config", json.dumps({"custom_ops": ["none"]}),
               "--ir-op-priority", json.dumps({"rms_norm": ["native"], "fused_add_rms_norm": ["native"]})]
# graphs-no-async: as graphs without async scheduling (the tracer's other timing), not run unless asked
MODES = {"graphs": [], "eager": ["--enforce-eager"], "graphs-sync": [], "graphs-no-async": ["--no-async-scheduling"]}
MODE_ENV = {"graphs-sync": {"DRAFTSCOPE_SYNC_DEBUG": "1"}}  # every hook body under sync-debug "error"
ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0",  # the tracer hooks Model Runner V1's propose_draft_token_ids
       # the sampler takes FlashInfer's top-k/top-p on CUDA unless told not to, and imports it unguarded
       "VLLM_USE_FLASHINFER_SAMPLER": "0",
       "GPU_TESTBED_COUNT_REPLAYS": "1", "DRAFTSCOPE_SAMPLE_RATE": "1", "PYTHONUNBUFFERED": "1"}
LOG_FACTS = {"standins_called": r"\[vllm _C stand-in\] called (\S+)",
             "stubs_called": r"\[vllm _C stand-in\] STUB CALLED (\S+)",
             "graph_replays": r"\[vllm-gpu-testbed\] graph replays: (\d+)",
             "tracer": r"(draftscope: .*)",
             "sync_errors": r"(draftscope: probe \S+ failed under DRAFTSCOPE_SYNC_DEBUG: .*)",
             "errors": r"(?m)^(?!.*Found ulimit).*?((?:Error|Exception)\b.*)"}  # not vLLM's ulimit warning
CLOSE_TIMEOUT_S = 20  # for the recorder's last batch after SIGTERM
ENDED = re.compile(rb'"ended_at":\s*\d')  # the run's end, in the recorder's last batch


def command(kit: Path, port: int, mode: str, scenario: str | None = None) -> list:
    models = kit / "models"
    draft = models / "scenarios" / scenario if scenario else models / "draft"
    spec = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(models / "target"),
            "--host", HOST, "--port", str(port), "--speculative-config", json.dumps(spec), *SERVER_ARGS, *MODES[mode]]


def log_facts(log: Path) -> dict:
    text = log.read_text(errors="replace") if log.exists() else ""
    facts = {}
    for key, pattern in LOG_FACTS.items():
        found = re.findall(pattern, text)
        facts[key] = max(map(int, found), default=0) if key == "graph_replays" else sorted(set(found))[:40]
    return facts


def wait_closed(trace: Path, timeout: float = CLOSE_TIMEOUT_S) -> bool:
    """Whether the tracer's recorder (its own session: it outlives the server's process group) wrote the run's end
    (``ended_at``) into ``trace`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if trace.exists() and ENDED.search(trace.read_bytes()):
            return True
        time.sleep(0.5)
    return False


def trace_summary(path: Path, counters: dict | None = None) -> dict:
    """What the tracer recorded of one server: requests, verify steps, accepted drafts per drafted position, the
    widths of each sample point, the tracer's errors and drops (a sync-debug failure is an error of its probe),
    and its totals beside vLLM's over the sampled requests (the requests' ``spec_*`` fields; the ``/metrics``
    counters when given and every request was sampled)."""
    t = traces.load(path)
    flags = [s.get("accept_flags") or [] for s in t.steps.values()]
    positions = max(map(len, flags), default=0)
    widths: dict = {}
    for (_, _, point, phase), samples in t.samples.items():
        widths.setdefault(f"{point}@{phase}", set()).update(s.get("width") for s in samples)
    sampled = [r for r in t.requests.values() if r.get("sampled")]  # the tracer counts these only
    sums = lambda *fields: [sum(r.get(f) or 0 for r in sampled) for f in fields]  # noqa: E731
    traced = sums("traced_verify_ct", "traced_accepted_drafts", "traced_proposed_drafts")
    counted = sums("spec_verify_ct", "spec_accepted_drafts", "spec_proposed_drafts")
    out = {**t.summary(), "verify_steps": len(t.steps),
           "accepted_per_position": [sum(1 for f in flags if len(f) > p and f[p]) for p in range(positions)],
           "widths": {k: sorted(v, key=str) for k, v in sorted(widths.items())},
           "totals": {"traced": traced, "vllm_requests": counted}}
    if counters and len(sampled) == len(t.requests):  # /metrics counts every request
        metrics = [counters.get(f"vllm:spec_decode_num_{n}") for n in ("drafts", "accepted_tokens", "draft_tokens")]
        out["totals"]["vllm_metrics"] = metrics
    out["totals"]["equal"] = traced == counted and out["totals"].get("vllm_metrics", traced) == traced
    return out


def start(cmd: list, port: int, log: Path, env: dict) -> VLLMServer:
    """``cmd`` started in a session of its own with ``env`` over this process's, its output (after the command
    line) in ``log``."""
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, **env})
    return VLLMServer(process, f"http://{HOST}:{port}", log)


def await_up(server: VLLMServer, started: float, deadline: float, limit_s: float) -> str | None:
    """Wait until ``server`` answers its health check; why it did not (its exit code, or the time) else None."""
    process = server.process
    while not server.is_healthy():
        if process.poll() is not None or time.monotonic() > min(deadline, started + limit_s):
            return f"exit code {process.poll()}" if process.poll() is not None else "timed out"
        time.sleep(1)
    return None


def spec_counters(server: VLLMServer) -> tuple[dict, float | None]:
    """vLLM's speculative counters from ``/metrics`` and the accept length they give (1 + accepted / drafts)."""
    metrics = server.metrics()
    counters = {name: metrics.get(name + "_total", metrics.get(name)) for name in SPEC_COUNTERS}
    drafts, accepted = counters["vllm:spec_decode_num_drafts"], counters["vllm:spec_decode_num_accepted_tokens"]
    return counters, round(1 + accepted / drafts, 3) if drafts else None
