"""Checks of a GPU test-bed run: real SGLang 0.5.23 on CUDA (graphs on), traced by the tracer.

The device run (``testbed/gpu/runner.py``, from the kit's ``run.sh``) starts the servers, sends the
requests and then runs these checks over what it recorded (``DRAFTSCOPE_GPU_RUN``: its folder with
``results.json``, ``traces/``, ``logs/``). Elsewhere (CI, a CPU machine) they are skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testbed.gpu import traces
from testbed.gpu.runner import CHECKED_SCENARIOS
from testbed.scenarios import FINDINGS
from tests.gpu.diagnose import diagnose

RUN = os.environ.get("DRAFTSCOPE_GPU_RUN")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not RUN, reason="needs a GPU test-bed run: testbed/gpu/run_device.sh on the H200 sets DRAFTSCOPE_GPU_RUN "
                    "(docs/testbed.md)")]


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads((Path(RUN) / "results.json").read_text())


def checks_ran(results: dict) -> None:
    """Skip a check of the checks phase in a run without it (``--only throughput``, ``--skip checks``)."""
    if "servers" not in results:
        pytest.skip("the checks phase was not run (--only or --skip)")


def server(results: dict, name: str) -> dict:
    checks_ran(results)
    s = results["servers"][name]
    assert s["ok"], f"server {name} did not start: {s.get('error')}\n{s.get('log_tail', '')}"
    return s


def trace(results: dict, name: str) -> traces.Trace:
    return traces.load(server(results, name)["trace"])


def answers(results: dict, name: str) -> list:
    checks_ran(results)
    out = results["answers"][name]
    assert out and not [a for a in out if "error" in a], f"{name}: {out[-1]}"
    return out


def test_graphs_are_replayed_and_eager_is_not(results):
    graphs, eager = server(results, "graphs")["log_facts"], server(results, "eager")["log_facts"]
    assert graphs["graph_replays_at_least"] >= 64 and graphs["cuda_graph_batches"] > 0, graphs
    assert eager["graph_replays_at_least"] == 0 and eager["cuda_graph_batches"] == 0, eager


def test_no_standin_stub_is_ever_called(results):
    for name, s in {**results.get("servers", {}), **results.get("throughput_servers", {})}.items():
        facts = s.get("log_facts", {})
        assert not facts.get("stubs_called"), f"{name} called stand-in stubs: {facts.get('stubs_called')}"


def test_graphs_on_and_off_answer_the_same(results):
    on, off = answers(results, "graphs"), answers(results, "eager")
    assert [(a["rid"], a["text"], a["meta"]["spec_verify_ct"]) for a in on] == \
        [(a["rid"], a["text"], a["meta"]["spec_verify_ct"]) for a in off]


def test_graphs_on_and_off_record_the_same(results):
    """Steps, acceptance, aux and fc samples, target and draft top-k, draft logits samples."""
    on, off = trace(results, "graphs"), trace(results, "eager")
    report = f"graphs on: {on.summary()}\ngraphs off: {off.summary()}"
    assert off.steps and off.samples, report
    assert traces.differences(off, on) == [], report


def test_every_step_has_the_draft_topk_at_every_position(results):
    """Every verify step records the draft's top-k at every drafted position, graphs on and off:
    position 1 recomputed from the draft's output hidden state, positions 2.. from the step tap
    captured into the draft-decode graph (docs/tracer.md "CUDA graphs")."""
    for name in ("graphs", "eager"):
        t = trace(results, name)
        missing = [k for k, s in t.steps.items()
                   if len(s.get("draft_topk") or []) != len(s.get("drafted_tokens") or [])]
        assert t.steps and not missing, \
            f"{name}: {len(missing)} of {len(t.steps)} steps lack the draft top-k at some position " \
            f"({t.summary()['steps_by_draft_topk_positions']})"


def test_the_tracer_prepared_the_servers_draft_on_the_device(results):
    """At attach, on the server's own draft (found through EAGLEWorkerV2's draft worker): the summary layouts
    for its widths, and its recomputes captured as CUDA graphs unless the server runs without them; and the
    draft extend's logits read from its graph's replays (no ``lm_head`` recompute) on the graphs server only."""
    for name, graphed in (("graphs", ["draft logits", "fc"]), ("eager", [])):
        device = trace(results, name).run["facts"]["tracing"].get("device")
        assert device and device["prepared_rows"] >= 8 and device["layouts"] >= 5, (name, device)
        # a captured graph's pool takes new segments; without graphs the buffers may fit segments already cached
        assert device["reserved_bytes"] > 0 if graphed else device["reserved_bytes"] >= 0, (name, device)
        assert device["graphed_recomputes"] == graphed, (name, device)
        # the tap's buffers (a chain: installed on both), and the whole process's PyTorch memory (weights, KV cache)
        assert device["step_tap_reserved_bytes"] >= 0 and device["process_reserved_bytes"] > 0, (name, device)
    assert trace(results, "graphs").last_health()["heartbeats"].get("draft_extend_logits", 0) > 0
    assert "draft_extend_logits" not in trace(results, "eager").last_health()["heartbeats"]


def test_sync_debug_run_has_no_tracer_error_and_samples_every_request(results):
    t = trace(results, "graphs")
    assert t.run["tracer_config"]["sync_debug"] is True
    health = t.last_health()
    assert health.get("errors") == {} and not health.get("disabled_probes"), health
    assert {"verify", "draft", "draft_extend"} <= set(health.get("heartbeats", {})), health
    answered = {a["rid"] for a in answers(results, "graphs")}
    assert answered <= {rid for rid, r in t.requests.items() if r.get("sampled")}, t.requests.keys()


@pytest.mark.parametrize("name", ["graphs", "eager", "tree", *CHECKED_SCENARIOS])
def test_traced_totals_equal_sglang_meta_info(results, name):
    t = trace(results, name)
    assert t.last_health().get("errors") == {}, t.last_health()
    for a in answers(results, name):
        r = t.requests.get(a["rid"])
        assert r is not None, f"{name}: {a['rid']} not recorded"
        assert r["traced_verify_ct"] == r["spec_verify_ct"] == a["meta"]["spec_verify_ct"], r
        assert r["traced_accepted_drafts"] == r["spec_accepted_drafts"], r


def test_tree_drafting_is_traced_node_by_node(results):
    """--speculative-eagle-topk 4, 8 draft tokens, graphs on: each verify step records its 7 drafted tree
    nodes with their parents, the draft's top-k that proposed each one (read inside the draft-decode graph:
    the node's token is among them) and the accepted path (as many nodes as SGLang's accept_len - 1), as
    the CPU bed does (tests/test_tree_drafting.py)."""
    t = trace(results, "tree")
    steps = list(t.steps.values())
    assert steps and all(len(s["drafted_tokens"]) == 7 for s in steps), t.summary()
    assert any(s["accept_len"] > 1 for s in steps), t.summary()
    shaped = [s for s in steps if s.get("tree_parents")]
    assert len(shaped) == len(steps), f"{len(steps) - len(shaped)} of {len(steps)} steps lack the tree's shape"
    for s in shaped:
        assert sum(s["accept_flags"]) == s["accept_len"] - 1, s
        assert all(tok in [i for i, _ in topk][:4] for tok, topk in zip(s["drafted_tokens"], s["draft_topk"])), s
    assert any(p > 0 for s in shaped for p in s["tree_parents"]), "no node below depth 1"


@pytest.mark.parametrize("name", ["healthy", *CHECKED_SCENARIOS])
def test_scenario_findings_match_the_cpu_bed(results, name, tmp_path):
    """The GPU trace, imported into a store, is diagnosed as the CPU bed's is (testbed.scenarios.FINDINGS):
    the runtime rules with the draft and from the trace alone name the runtime cause, the stored
    findings (runtime plus static, as the dashboard shows them) lead with the static one."""
    static_cause, runtime_cause, _ = FINDINGS[name]
    run_name = "graphs" if name == "healthy" else name
    answers(results, run_name)
    kit_models = Path(results["kit"]) / "models"
    draft = kit_models / ("draft" if run_name in ("graphs", "algo-eagle") else f"scenarios/{name}")
    with_draft, from_trace, stored, observation = diagnose(Path(server(results, run_name)["trace"]), draft,
                                                           kit_models / "target", tmp_path / "store.db")
    serious = lambda found: [f for f in found if f.severity in ("error", "warning")]  # noqa: E731
    runtime, alone = serious(with_draft), serious(from_trace)
    report = f"runtime: {[f.rule_id for f in runtime]}, trace alone: {[f.rule_id for f in alone]}, " \
             f"stored: {[(f.rule_id, f.severity) for f in stored or []]}"
    if runtime_cause is None:
        assert not runtime and not alone and not serious(stored or []), report
        assert observation.verify_steps and observation.accepted_drafts, report
        return
    assert runtime and runtime[0].rule_id == runtime_cause, report
    assert alone and alone[0].rule_id == runtime_cause, report
    assert stored and stored[0].rule_id == static_cause, report


def test_throughput_ran_interleaved_for_all_three(results):
    if "throughput" not in results:
        pytest.skip("the throughput phase was not run (--skip throughput)")
    tp = results["throughput"]
    assert "error" not in tp, tp
    assert set(tp["median_tokens_per_s"]) == {"no-tracer", "1/16", "every"}, tp
    assert all(row.keys() == tp["rounds"][0].keys() for row in tp["rounds"]), tp["rounds"]
