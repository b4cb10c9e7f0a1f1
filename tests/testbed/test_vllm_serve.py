"""The vLLM GPU kit runner's record checks (``testbed/gpu/vllm_serve.py``), on trace files written here: two
servers' traces of the same prompts compared record by record with requests matched by arrival (vLLM names its
requests itself), and one trace summarised (accepts per position, widths, totals beside vLLM's)."""

from __future__ import annotations

import json
from pathlib import Path


from testbed.gpu.vllm_serve import MODE_ENV, MODES, compare_records, trace_summary

STATS = {"l2_mean": 3.0, "l2_max": 4.0, "mean": 0.1, "std": 1.0, "absmax": 5.0}


def _write(path: Path, rids: list, accept: dict = None) -> Path:
    """A trace of two requests (arrived in ``rids`` order), two verify steps each, a sample per step."""
    accept = accept or {}
    requests, steps, samples = [], [], []
    for i, rid in enumerate(rids):
        requests.append({"rid": rid, "started_at": 100.0 + i, "sampled": True, "traced_verify_ct": 2,
                         "traced_accepted_drafts": 3, "traced_proposed_drafts": 6, "spec_verify_ct": 2,
                         "spec_accepted_drafts": 3, "spec_proposed_drafts": 6})
        for step in range(2):
            n = accept.get((i, step), 2 + step)
            steps.append({"rid": rid, "step_index": step, "drafted_tokens": [1, 2, 3], "accept_len": n,
                          "accept_flags": [p <= n - 1 for p in range(1, 4)], "bonus_token": 7,
                          "target_topk": [[[1, 0.9]], [[2, 0.8]], [[3, 0.7]]]})
            samples.append({"rid": rid, "step_index": step, "point": "target.aux[0]", "phase": "verify", "width": 128,
                            "rows": 4, "shape": [4, 128], **STATS})
    batch = {"run": {"run_id": "r", "engine": "vllm"}, "requests": requests, "steps": steps, "samples": samples,
             "health": [{"errors": {}, "drops": {}}]}
    path.write_text(json.dumps(batch) + "\n" + json.dumps({"run": {"status": "ended", "ended_at": 200.0}}) + "\n")
    return path


def test_records_compare_across_servers_by_arrival_order(tmp_path):
    eager = _write(tmp_path / "eager.jsonl", ["cmpl-a-0", "cmpl-b-0"])
    graphs = _write(tmp_path / "graphs.jsonl", ["cmpl-x-0", "cmpl-y-0"])
    assert compare_records(eager, graphs) == {"equal": True, "steps": [4, 4], "differences": []}
    other = _write(tmp_path / "other.jsonl", ["cmpl-x-0", "cmpl-y-0"], accept={(1, 0): 4})
    got = compare_records(eager, other)
    assert not got["equal"] and got["differences"][0].startswith("step ('r1', 0): accept_len 2 != 4"), got


def test_a_trace_summary_counts_accepts_per_position_and_totals(tmp_path):
    path = _write(tmp_path / "t.jsonl", ["a", "b"], accept={(0, 0): 1})
    s = trace_summary(path, {"vllm:spec_decode_num_drafts": 4, "vllm:spec_decode_num_accepted_tokens": 6,
                             "vllm:spec_decode_num_draft_tokens": 12})
    assert (s["verify_steps"], s["accepted_per_position"]) == (4, [3, 2, 0])
    assert s["widths"] == {"target.aux[0]@verify": [128]}
    assert s["totals"] == {"traced": [4, 6, 12], "vllm_requests": [4, 6, 12], "vllm_metrics": [4, 6, 12],
                           "equal": True}
    assert not trace_summary(path, {"vllm:spec_decode_num_drafts": 5})["totals"]["equal"]


def test_graphs_sync_is_graphs_under_sync_debug():
    assert MODES["graphs-sync"] == MODES["graphs"] and MODE_ENV["graphs-sync"] == {"DRAFTSCOPE_SYNC_DEBUG": "1"}


def test_the_kimi_width_throughput_says_why_it_did_not_run(tmp_path):
    """Three Kimi-width servers need an H200, two an H100: on a smaller GPU (or without the models) the phase records
    why, saved."""
    from testbed.gpu import vllm_throughput

    saved = []
    for models, gpu_bytes, names, why in (
            ({"dest": str(tmp_path)}, 80 * 2**30, ("no-tracer", "1/16", "every"), "3 Kimi-width servers need 108 GiB"),
            ({"dest": str(tmp_path)}, 64 * 2**30, ("no-tracer", "every"), "this GPU has 64 GiB"),
            ({"error": "kimi_models exit code 1"}, 141 * 2**30, ("no-tracer", "every"), "exit code 1")):
        results: dict = {}
        vllm_throughput.kimi_phase(tmp_path, tmp_path, models, 0.0, results, lambda: saved.append(1), gpu_bytes,
                                   names)
        assert why in results["vllm_throughput"]["error"], results
    assert len(saved) == 3


def test_kimi_width_servers_share_the_gpu_among_those_started(tmp_path):
    from testbed.gpu import vllm_throughput

    def share(servers: int) -> str:
        args = vllm_throughput.kimi_command(tmp_path, 8000, servers)
        return args[len(args) - 1 - args[::-1].index("--gpu-memory-utilization") + 1]  # the last one counts

    assert (share(3), share(2)) == ("0.28", "0.42")
    assert [s.name for s in vllm_throughput.specs(tmp_path, tmp_path, [], ("no-tracer", "every"))] == \
        ["no-tracer", "every"]
