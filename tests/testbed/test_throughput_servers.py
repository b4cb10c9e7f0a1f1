"""The GPU runners' ``--throughput-servers`` / ``--kimi-throughput-servers``: which servers a throughput phase starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from draftscope_tracer.config import TracerConfig
from draftscope_tracer.engine.sampling import request_sampled

from testbed.gpu import kimi_phase, throughput

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("servers", ["every", "no-tracer", "no-tracer,every,sometimes"])
def test_throughput_servers_need_the_baseline_and_one_more(servers):
    with pytest.raises(ValueError, match="no-tracer among them"):
        throughput.servers(servers)
    assert throughput.servers("no-tracer,every") == ("no-tracer", "every")


def test_the_unsampled_server_is_asked_for_by_name_and_samples_nothing():
    assert "unsampled" not in throughput.SERVERS
    assert throughput.servers("no-tracer,unsampled") == ("no-tracer", "unsampled")
    config = TracerConfig.from_env({"DRAFTSCOPE_FILE": "t.jsonl", **throughput.CONFIGS["unsampled"]})
    picked = [throughput.request_id(f"kt0-c8-{j}", j % 16 == 0) for j in range(32)]
    assert not any(request_sampled(rid, config.sample_rate) for rid in picked)
    assert sum(request_sampled(rid, 1 / 16) for rid in picked) == 2


def test_a_second_server_without_the_tracer_is_measured_against_the_first():
    """The A/A run: what the bed reads between two identical servers, in the same table as a traced server's cost."""
    assert "no-tracer-b" not in throughput.SERVERS and throughput.CONFIGS["no-tracer-b"] == {}
    assert throughput.servers("no-tracer,no-tracer-b") == ("no-tracer", "no-tracer-b")
    specs = kimi_phase.throughput_specs(Path("models"), ("no-tracer", "no-tracer-b"))
    assert [(s.name, s.tracer) for s in specs] == [("no-tracer", {}), ("no-tracer-b", {})]
    rounds = [{"1": {"no-tracer": 100.0, "no-tracer-b": 100.0 / (1 + d)}} for d in (0.0, 0.01, -0.01, 0.02, 0.0)]
    result = throughput.summarize_rounds(rounds, {"1": (16, 16)}, warmup_rounds=1)
    assert result["levels"]["1"]["cost_vs_no_tracer"]["no-tracer-b"]["median"] == pytest.approx(0.005), result
    table = throughput.levels_table(result)
    assert "| 1 | no tracer, a second server | " in table and "+0.5% [" in table, table


def test_the_kimi_phase_starts_the_servers_asked_for():
    specs = kimi_phase.throughput_specs(Path("models"), ("no-tracer", "unsampled"))
    assert [(s.name, s.tracer) for s in specs] == [("no-tracer", {}), ("unsampled", {"DRAFTSCOPE_SAMPLE_RATE": "0"})]
    assert [s.name for s in kimi_phase.throughput_specs(Path("models"))] == list(throughput.SERVERS)


def test_the_sglang_runner_refuses_servers_without_the_baseline():
    p = subprocess.run([sys.executable, "-m", "testbed.gpu.runner", "--kit", "k", "--work", "w", "--tracer-site", "t",
                        "--server-path", "s", "--kimi-throughput-servers", "every,unsampled"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no-tracer among them" in p.stderr, p.stderr[-2000:]


def test_the_vllm_runner_refuses_a_level_it_does_not_know():
    p = subprocess.run([sys.executable, "-m", "testbed.gpu.vllm_serve", "--kit", "k", "--work", "w", "--throughput",
                        "--throughput-levels", "64,32"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--throughput-levels '64,32'" in p.stderr, p.stderr[-2000:]
