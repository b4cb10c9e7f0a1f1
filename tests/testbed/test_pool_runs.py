"""Several saved GPU throughput runs pooled into one levels table (``bench/gpu_throughput.py --pool``)."""

import json
import statistics
from pathlib import Path

from bench import gpu_throughput
from testbed.gpu.throughput import pool_runs, summarize_rounds

RUNS = Path(__file__).resolve().parents[2] / "bench" / "gpu_runs"
ONE_IN_16 = [RUNS / "2026-12-06-vllm-kimi-1in16-a.json", RUNS / "2026-12-06-vllm-kimi-1in16-b.json"]


def _phase(path: Path) -> dict:
    return json.loads(path.read_text())["vllm_throughput"]


def test_each_runs_warm_up_is_dropped_and_the_rest_pooled():
    runs = [_phase(p) for p in ONE_IN_16]
    pooled = pool_runs(runs)
    measured = [r for run in runs for r in run["rounds"][run["workload"]["warmup_rounds"]:]]
    assert pooled["rounds"] == measured and len(measured) == 17
    for level in ("1", "8", "64"):
        costs = [r[level]["no-tracer"] / r[level]["1/16"] - 1 for r in measured]
        cost = pooled["levels"][level]["cost_vs_no_tracer"]["1/16"]
        assert cost["median"] == round(statistics.median(costs), 4)
        assert cost["low"] <= cost["median"] <= cost["high"]
        assert pooled["levels"][level]["median_tokens_per_s"]["no-tracer"] == round(
            statistics.median(r[level]["no-tracer"] for r in measured), 1)


def test_runs_that_differ_widen_the_interval_rather_than_narrow_it():
    """Two runs whose costs sit apart: the pooled interval reaches both runs' medians (runs resampled whole)."""
    base = _phase(ONE_IN_16[0])
    shifted = json.loads(json.dumps(base))
    for r in shifted["rounds"]:
        r["8"]["1/16"] *= 0.9  # this run's tracer 11% slower
    cost = pool_runs([base, shifted])["levels"]["8"]["cost_vs_no_tracer"]["1/16"]
    each = [summarize_rounds(run["rounds"], run["levels"])["levels"]["8"]["cost_vs_no_tracer"]["1/16"]["median"]
            for run in (base, shifted)]
    assert each[1] - each[0] > 0.1
    assert cost["low"] <= each[0] and cost["high"] >= each[1]  # rounds resampled as one pool reach neither


def test_the_pooled_table_is_printed(capsys):
    assert gpu_throughput.main(["--pool", *map(str, ONE_IN_16)]) == 0
    printed = capsys.readouterr().out
    assert "| 64 | 1 in 16 |" in printed and "(17 measured rounds from 2 runs" in printed


def test_runs_of_no_common_phase_are_refused(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"kimi_throughput": {"error": "not run"}}))
    assert gpu_throughput.main(["--pool", str(ONE_IN_16[0]), str(other)]) == 1
    assert "no levels phase" in capsys.readouterr().err
