"""The vLLM kit's throughput phase (``testbed/gpu/vllm_throughput.py``) on the CPU, with a stand-in server process in
place of vLLM's OpenAI server: three servers started together, only the traced ones with the tracer on their path,
interleaved rounds saved as they end, exactly 1 in 16 requests sampled by the id the tracer sees, and the table
printed again from the saved run. vLLM itself on the GPU is the only fake (the dry run parses the real command line:
tests/testbed/test_vllm_kit.py)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from bench import gpu_throughput
from draftscope_tracer.engine.sampling import request_sampled
from testbed.gpu import vllm_throughput

# Answers /health and /v1/completions as vLLM does (max_tokens ids); logs each request's id, the PYTHONPATH and
# environment it was started with; writes a closed trace where the tracer would (DRAFTSCOPE_FILE).
FAKE_VLLM = r'''
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

args, state = sys.argv[1:], Path(os.environ["FAKE_STATE"])
name = Path(os.environ.get("DRAFTSCOPE_FILE", "no-tracer")).stem
(state / f"{name}.env").write_text(json.dumps({k: os.environ.get(k) for k in
                                              ("PYTHONPATH", "DRAFTSCOPE_SAMPLE_RATE", "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION")}))
if "DRAFTSCOPE_FILE" in os.environ:
    Path(os.environ["DRAFTSCOPE_FILE"]).write_text(json.dumps({"run": {"ended_at": 1.0}, "health": []}) + "\n")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send({})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(state / f"{name}.rids", "a") as f:
            f.write(body["request_id"] + "\n")
        self.send({"choices": [{"text": "", "token_ids": [7] * body["max_tokens"]}]})

    def send(self, data):  # HTTP/1.0: the body ends where the connection closes
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps(data).encode())

    def log_message(self, *args):
        pass


ThreadingHTTPServer.request_queue_size = 128
ThreadingHTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler).serve_forever()
'''


@pytest.fixture(scope="module")
def phase_run(tmp_path_factory):
    """One run of the phase for the module's tests: (its results, the summaries saved after each round, the
    fake servers' state folder)."""
    tmp = tmp_path_factory.mktemp("vllm_throughput")
    fake, state = tmp / "fake_vllm.py", tmp / "state"
    fake.write_text(FAKE_VLLM)
    state.mkdir()
    bed = vllm_throughput.VLLMBed(tmp, tmp / "work", "/tracer-site", "/standins:/site",
                                  lambda port: [sys.executable, str(fake), "--port", str(port)])
    saved = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAKE_STATE", str(state))
        out = vllm_throughput.run(bed, vllm_throughput.specs(tmp, tmp, ["--max-num-seqs", "64"]),
                                  time.monotonic() + 6.0, saved.append, levels={"1": (2, 3), "8": (16, 3)})
    return out, saved, state


def test_three_servers_interleaved_rounds_saved_as_they_end(phase_run):
    out, saved, state = phase_run
    result = out["vllm_throughput"]
    assert len(result["rounds"]) >= 2 and len(saved) == len(result["rounds"]), result
    assert saved[-1]["levels"] == result["levels"] and result["stopped"] is None
    for level in ("1", "8"):
        assert set(result["levels"][level]["cost_vs_no_tracer"]) == {"1/16", "every"}
    servers = out["vllm_throughput_servers"]
    assert all(s["ok"] and "handle" not in s for s in servers.values()), servers
    assert servers["no-tracer"]["trace"] is None and servers["every"]["records"]["requests"] == 0
    assert servers["1/16"]["trace_closed"] is True
    assert set(out["vllm_throughput_plugins"]) == {"no-tracer", "traced"}  # what each path's Python finds


def test_only_the_traced_servers_have_the_tracer_on_their_path(phase_run):
    _, _, state = phase_run
    env = {p.stem: json.loads(p.read_text()) for p in state.glob("*.env")}
    assert env["no-tracer"]["PYTHONPATH"] == "/standins:/site" and env["no-tracer"]["DRAFTSCOPE_SAMPLE_RATE"] is None
    assert env["1-16"]["PYTHONPATH"] == env["every"]["PYTHONPATH"] == "/standins:/tracer-site:/site"
    assert (env["1-16"]["DRAFTSCOPE_SAMPLE_RATE"], env["every"]["DRAFTSCOPE_SAMPLE_RATE"]) == ("1/16", "1")
    assert {e["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] for e in env.values()} == {"1"}


def test_exactly_1_in_16_sampled_by_the_id_vllm_gives_the_tracer(phase_run):
    out, _, state = phase_run
    rids = (state / "1-16.rids").read_text().split()
    level8 = [r for r in rids if "-c8-" in r]
    assert len(level8) == 16 * len(out["vllm_throughput"]["rounds"])
    seen = [f"cmpl-{r}-0" for r in level8]  # vLLM's OpenAI server, request id randomization off
    assert sum(request_sampled(r, 1 / 16) for r in seen) == len(level8) // 16


def test_the_saved_run_prints_its_table(phase_run, tmp_path, capsys):
    out, _, _ = phase_run
    (tmp_path / "results.json").write_text(json.dumps(out, default=str))
    assert gpu_throughput.main([str(tmp_path / "results.json")]) == 0
    printed = capsys.readouterr().out
    assert "| 64 |" not in printed and "| 8 | every request |" in printed and "| 1 | 1 in 16 |" in printed


def test_a_tracer_installed_outside_pythonpath_is_refused():
    """This venv has draftscope installed (editable): a server without the tracer would still load its plugin."""
    with pytest.raises(RuntimeError, match="installed outside"):
        vllm_throughput.tracer_paths()
