"""The GPU runner's plumbing on the CPU, with a stand-in server process in place of SGLang: port clashes
restarted on a new port (seven servers at once), the Kimi phase's waves and token-id requests, and the
throughput rounds at several concurrency levels. The outermost boundary (the SGLang server on the H200)
is the only fake: the ``Bed``, its process groups, HTTP and the rounds are the real ones.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from bench import gpu_throughput
from draftscope_tracer.engine.sampling import request_sampled
from testbed.gpu import kimi_models, kimi_phase, profile_summary, throughput
from testbed.gpu.bed import Bed, Spec
from testbed.server import PORT_ATTEMPTS

# Answers /model_info and /generate as SGLang does (token ids in, as many ids out as asked); each launch that
# wins one of the CLASHES slots exits as SGLang does when its port was taken; every request id is logged.
FAKE_SGLANG = r'''
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

args, state = sys.argv[1:], Path(os.environ["FAKE_STATE"])
with open(state / "launches", "a") as f:
    f.write(f"start {time.time()}\n")
for slot in range(int(os.environ.get("FAKE_CLASHES", "0"))):
    try:
        os.close(os.open(state / f"clash-{slot}", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        continue
    print("ERROR:    [Errno 98] error while attempting to bind on address: address already in use", flush=True)
    sys.exit(1)
for slot in range(int(os.environ.get("FAKE_OOMS", "0"))):  # as SGLang ends when its graph capture ran out
    try:
        os.close(os.open(state / f"oom-{slot}", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        continue
    with open(state / "launches", "a") as f:
        f.write(f"oom {time.time()}\n")
    print("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 20.00 MiB.", flush=True)
    sys.exit(-9 % 256)


PHASES = [("Load weight begin. avail mem={:.2f} GB", 77.76, 0),
          ("Load weight end. elapsed=0.24 s, type=DeepseekV3ForCausalLM, avail mem={:.2f} GB, mem usage=22.13 GB.", 55.63, 0),
          ("Load weight end. elapsed=0.29 s, type=LlamaForCausalLMEagle3, avail mem={:.2f} GB, mem usage=4.16 GB.", 51.47, 0),
          ("Memory pool end. avail mem={:.2f} GB", 29.27, 0), ("Memory pool end. avail mem={:.2f} GB", 22.93, 0),
          ("Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8], avail mem={:.2f} GB", 23.82, 0),
          ("Capture draft decode CUDA graph end. elapsed=3.77 s, mem usage=0.06 GB, avail mem={:.2f} GB.", 4.66, 1),
          ("max_total_num_tokens=16384, chunked_prefill_size=8192, context_len=4096, available_gpu_mem={:.2f} GB", 4.43, 1)]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send({"model_path": args[args.index("--model-path") + 1]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/start_profile":  # a trace of num_steps steps of 1 ms: a GEMM, then the summary kernel
            import gzip
            ev = [e for s in range(body["num_steps"]) for e in (
                {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 1000 * s, "dur": 900},
                {"ph": "X", "cat": "kernel", "name": "_logits_block_kernel", "ts": 1000 * s + 920, "dur": 20},
                {"ph": "X", "cat": "python_function", "name": "/s/draftscope_tracer/engine/sglang/plugin.py(1): _around_verify",
                 "ts": 1000 * s + 880, "dur": 90, "tid": 1},
                {"ph": "X", "cat": "python_function", "name": "/s/draftscope_tracer/engine/sglang/probes.py(9): on_verify",
                 "ts": 1000 * s + 900, "dur": 60, "tid": 1},
                {"ph": "X", "cat": "python_function", "name": "/s/draftscope_tracer/transport/relay.py(9): _loop",
                 "ts": 1000 * s, "dur": 999, "tid": 2})]
            Path(body["output_dir"]).mkdir(parents=True, exist_ok=True)
            with gzip.open(Path(body["output_dir"]) / f"{body['profile_id']}-TP-0.trace.json.gz", "wt") as f:
                json.dump({"traceEvents": ev}, f)
            raw = b"Start profiling.\n"  # SGLang answers in plain text
            self.send_response(200)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            return self.wfile.write(raw)
        with open(state / "rids", "a") as f:
            f.write(body["rid"] + "\n")
        n = body["sampling_params"]["max_new_tokens"]
        self.send({"output_ids": list(body["input_ids"][:1]) * n,
                   "meta_info": {"completion_tokens": n, "spec_verify_ct": n, "e2e_latency": 0.01}})

    def send(self, data):
        raw = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


if os.environ.get("FAKE_PHASES"):  # SGLang 0.5.23's start-up lines (a Kimi-shaped server's, alone on an H100);
    took = 1.17 if "DRAFTSCOPE_SAMPLE_RATE" in os.environ else 0.0  # a traced server holds more from its graphs on
    for line, gb, extra in PHASES:
        print(f"[2026-12-07 10:22:38] {line.format(gb - (extra and took))}", flush=True)
ThreadingHTTPServer.request_queue_size = 128  # 64 requests at once, as uvicorn takes them
server = ThreadingHTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), Handler)
with open(state / "launches", "a") as f:
    f.write(f"serve {time.time()}\n")
server.serve_forever()
'''


@pytest.fixture
def bed(tmp_path, monkeypatch):
    fake = tmp_path / "fake_sglang.py"
    fake.write_text(FAKE_SGLANG)
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("FAKE_STATE", str(state))
    return Bed(tmp_path, tmp_path / "work", tracer_site="", server_path="", launcher=(sys.executable, str(fake)))


def specs(tmp_path: Path, n: int) -> list:
    return [Spec(f"s{i}", tmp_path / "target", tmp_path / "draft", ["--dtype", "bfloat16"]) for i in range(n)]


def test_seven_servers_start_although_three_ports_were_taken(bed, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CLASHES", "3")
    state = bed.start_all(specs(tmp_path, 7), timeout_s=60)
    try:
        assert all(s["ok"] for s in state.values()), state
        assert sorted(s["launches"] for s in state.values()) == [1, 1, 1, 1, 2, 2, 2], state
    finally:
        bed.stop_all(state)


def test_a_port_taken_at_every_launch_fails_after_the_attempts(bed, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_CLASHES", str(PORT_ATTEMPTS))
    state = bed.start_all(specs(tmp_path, 1), timeout_s=60)
    bed.stop_all(state)
    (s,) = state.values()
    assert (s["ok"], s["launches"], s["error"]) == (False, PORT_ATTEMPTS, "exited with 1"), s
    assert "address already in use" in s["log_tail"]


def test_a_server_out_of_gpu_memory_beside_others_starts_again_alone(bed, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_OOMS", "1")
    state = bed.start_all(specs(tmp_path, 3), timeout_s=60)
    bed.stop_all(state)
    assert all(s["ok"] for s in state.values()), state
    assert sorted(s["launches"] for s in state.values()) == [1, 1, 2], state
    events = [(e, float(t)) for e, t in map(str.split, (tmp_path / "state" / "launches").read_text().splitlines())]
    assert [e for e, _ in events].count("oom") == 1 and [e for e, _ in events][-2:] == ["start", "serve"], events
    first_serves = [t for e, t in events[:-1] if e == "serve"]
    assert len(first_serves) == 2 and events[-2][1] >= max(first_serves), events  # started again after both were up


def test_out_of_gpu_memory_alone_or_twice_is_a_failure(bed, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_OOMS", "1")
    (alone,) = bed.start_all(specs(tmp_path, 1), timeout_s=60).values()
    assert (alone["ok"], alone["launches"]) == (False, 1) and "CUDA out of memory" in alone["log_tail"], alone
    monkeypatch.setenv("FAKE_OOMS", "99")  # every launch runs out
    state = bed.start_all(specs(tmp_path, 2), timeout_s=60)
    bed.stop_all(state)
    assert [(s["ok"], s["launches"]) for s in state.values()] == [(False, 2)] * 2, state
    assert all("CUDA out of memory" in s["log_tail"] for s in state.values()), state


def test_kimi_memory_starts_each_server_alone_and_reads_its_start_up(bed, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_PHASES", "1")
    out = kimi_phase.run_memory(bed, tmp_path / "models", time.monotonic() + 300)["kimi_memory"]
    assert list(out) == ["no-tracer", "unsampled"] and all(s["ok"] for s in out.values()), out
    events = [line.split()[0] for line in (tmp_path / "state" / "launches").read_text().splitlines()]
    assert events == ["start", "serve", "start", "serve"], events  # one after the other
    assert out["no-tracer"]["phases"] == [
        ["weights DeepseekV3ForCausalLM", 55.63], ["weights LlamaForCausalLMEagle3", 51.47], ["KV pool", 29.27],
        ["KV pool", 22.93], ["draft decode graphs", 4.66], ["ready", 4.43]], out["no-tracer"]
    table = kimi_phase.memory_table(out)
    assert "| KV pool (2) | 22.93 | 22.93 | +0.00 |" in table and "| draft decode graphs | 4.66 | 3.49 | +1.17 |" in table, table
    assert "| ready | 4.43 | 3.26 | +1.17 |" in table, table


def test_kimi_memory_starts_no_server_it_cannot_have_up_in_time(bed, tmp_path):
    out = kimi_phase.run_memory(bed, tmp_path / "models", time.monotonic() + 10)["kimi_memory"]
    assert [s["ok"] for s in out.values()] == [False, False] and "too little" in out["unsampled"]["error"], out
    assert not (tmp_path / "state" / "launches").exists()


def test_kimi_phase_serves_every_scenario_in_waves(bed, tmp_path):
    models = tmp_path / "models"
    kimi_models.make(models, kimi_models.TINY)
    out = kimi_phase.run_traces(bed, models, deadline=time.monotonic() + 600)
    assert set(out["servers"]) == {*kimi_models.SCENARIOS, *kimi_phase.EAGER} and \
        all(s["ok"] for s in out["servers"].values())
    for name, s in out["servers"].items():
        draft = kimi_phase.EAGER.get(name, name)
        assert s["spec"]["draft"] == str(models / draft) and "bfloat16" in s["spec"]["args"], s["spec"]
        assert ("--disable-cuda-graph" in s["spec"]["args"]) == (name in kimi_phase.EAGER), s["spec"]
        assert s["trace"] == str(bed.work / "traces" / f"{name}.jsonl"), s
        got = out["answers"][name]
        assert [a["rid"] for a in got[:4]] == [f"kimi-seq-{i}" for i in range(4)], got
        assert len(got) == 20 and all(a["output_ids"] == kimi_phase.NEW_TOKENS for a in got), got


def test_kimi_phase_starts_no_wave_it_cannot_finish(bed, tmp_path):
    out = kimi_phase.run_traces(bed, tmp_path / "models", deadline=time.monotonic() + 100)
    assert out == {"servers": {}, "answers": {}}


def test_throughput_levels_interleave_the_servers_and_sample_1_in_16(bed, tmp_path):
    state = bed.start_all([Spec(name, tmp_path, tmp_path, []) for name in throughput.SERVERS], timeout_s=60)
    try:
        handles = {name: s["handle"] for name, s in state.items()}
        result = throughput.measure_levels(handles, kimi_phase.prompt, time.monotonic() + 10.0,
                                               levels={"1": (2, 2), "8": (16, 2)})
    finally:
        bed.stop_all(state)
    assert len(result["rounds"]) >= 2 and all(set(r) == {"1", "8"} for r in result["rounds"]), result["rounds"]
    for level in ("1", "8"):
        assert set(result["levels"][level]["median_tokens_per_s"]) == set(throughput.SERVERS)
        assert set(result["levels"][level]["cost_vs_no_tracer"]) == {"1/16", "every"}
    assert "| 8 | every request |" in throughput.levels_table(result)
    rids = (tmp_path / "state" / "rids").read_text().split()
    level8 = [r for r in rids if "-c8-" in r]
    assert len(level8) == 3 * 16 * len(result["rounds"])
    assert sum(request_sampled(r, 1 / 16) for r in level8) == len(level8) // 16


def test_saved_levels_print_again(tmp_path, capsys):
    saved = {"kimi_throughput": {"workload": {"warmup_rounds": 1}, "rounds": [{}, {}],
                                 "levels": {"64": {"median_tokens_per_s": {"no-tracer": 1000.0, "1/16": 990.0},
                                                   "cost_vs_no_tracer": {"1/16": {"median": 0.0101, "low": 0.002,
                                                                                  "high": 0.02}}}}}}
    (tmp_path / "results.json").write_text(json.dumps(saved))
    assert gpu_throughput.main([str(tmp_path / "results.json")]) == 0
    assert "| 64 | 1 in 16 | 990.0 | +1.0% [+0.2, +2.0] | <= 1% |" in capsys.readouterr().out


def test_profile_phase_profiles_each_level_and_summarises_the_traces(bed, tmp_path):
    models = tmp_path / "models"
    kimi_models.make(models, kimi_models.TINY)
    out = kimi_phase.run_profile(bed, models, bed.work, deadline=time.monotonic() + 600)
    ids = [r["profile_id"] for r in out["kimi_profile"]]
    assert ids == ["no-tracer-c1", "every-c1", "no-tracer-c8", "every-c8", "every-c1-stack"], out["kimi_profile"]
    assert all(len(r["answers"]) == r["level"][0] and all(r["answers"]) for r in out["kimi_profile"])
    summary = profile_summary.summarize_runs(out["kimi_profile"])
    every = summary["profiles"]["every-c1"]
    # 40 steps of 1 ms, the last one's trailing 60 us of host after the GPU's last kernel outside the span
    assert (every["steps"], every["busy_us"], every["kernels_us"]["gemm"]) == (40, 920.0, 900.0), every
    assert summary["profiles"]["every-c1-stack"]["ours"] == {  # the relay thread's frames are not the step's
        "engine/sglang/probes.py(9): on_verify": {"host_us": 60.0, "exposed_us": 40.0}}
    assert summary["deltas"]["every-c8"]["busy_us"] == 0.0 and "every-c1-stack" not in summary["deltas"]
    assert "every-c1-stack | 12 |" in profile_summary.table(summary)
