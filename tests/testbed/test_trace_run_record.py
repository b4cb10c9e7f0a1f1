"""A throughput run's traces stay on the device (too large to come back); what the tracer reserved on the GPU comes
back in results.json, read from each trace's run record (``traces.run_record``, ``kimi_phase.tracing_device``), and
``bench/gpu_throughput.py`` prints it beside each server's GPU memory."""

from __future__ import annotations

from bench import gpu_throughput
from draftscope_tracer.health import Health
from draftscope_tracer.transport.file_sink import FileSink
from draftscope_tracer.transport.writer import Writer
from testbed.gpu import kimi_phase, traces

DEVICE = {"prepared_rows": 256, "layouts": 5, "reserved_bytes": 96 * 2**20, "graphed_recomputes": ["fc"]}


def write_trace(path, facts: dict) -> None:
    """A trace as the tracer's file sink writes it: the run with its facts, then batches of steps, then its close."""
    run = {"engine": "sglang", "engine_version": "0.5.23", "source": "tracer", "status": "running", "started_at": 1.0,
           "facts": facts}
    health = Health()
    w = Writer(FileSink(str(path), health.drop), health, lambda: dict(run), run_id="r1", max_batch_items=2,
               flush_interval_s=0.05, health_interval_s=60)
    for i in range(7):
        w.submit(lambda i=i: {"steps": [{"rid": "a", "step_index": i}]})
    w.close(status="ended")


def test_the_run_record_is_read_with_its_updates_and_the_device_facts_with_it(tmp_path):
    trace = tmp_path / "every.jsonl"
    write_trace(trace, {"tracing": {"device": DEVICE}, "cuda_graph": True})
    run = traces.run_record(trace)
    assert run["status"] == "ended" and run["facts"]["cuda_graph"] is True
    assert kimi_phase.tracing_device(str(trace)) == DEVICE
    assert kimi_phase.tracing_device(None) is None  # the server without the tracer
    assert kimi_phase.tracing_device(str(tmp_path / "missing.jsonl")) is None
    write_trace(tmp_path / "cpu.jsonl", {"tracing": {}})  # a run that built nothing on a GPU
    assert kimi_phase.tracing_device(str(tmp_path / "cpu.jsonl")) is None
    (tmp_path / "cut.jsonl").write_text('{"run": {"facts": {"tracing": {"device"')
    assert kimi_phase.tracing_device(str(tmp_path / "cut.jsonl"))["error"].startswith("JSONDecodeError")


def test_the_throughput_table_ends_with_each_servers_memory_and_what_its_tracer_reserved():
    servers = {"no-tracer": {"gpu_memory_mib": 38262, "tracing_device": None},
               "every": {"gpu_memory_mib": 39460, "tracing_device": DEVICE},
               "1/16": {"gpu_memory_mib": 39460},  # a run from before the device facts came back
               "failed": {"gpu_memory_mib": None}}
    assert gpu_throughput.memory_line(servers) == ("GPU memory by server: no-tracer 38,262 MiB; every 39,460 MiB "
                                                   "(the tracer reserved 96.0 MiB at attach); 1/16 39,460 MiB")
    assert gpu_throughput.memory_line({}) is None
