"""Checks of the GPU runner's ``kimi`` phase: the seed's failure at full width, in bf16 with CUDA graphs.

The device run (``bash .cache/gpu-kit/run.sh --only kimi``; ``testbed/gpu/kimi_phase.py``) serves a
``DeepseekV3ForCausalLM`` with Kimi-K2.5's widths and the EAGLE-3 drafts of ``testbed.gpu.kimi_models``
on the real SGLang 0.5.23 server, traced, then runs these checks over what it recorded
(``DRAFTSCOPE_GPU_RUN``: its folder with ``results.json``, ``traces/``, ``logs/``, ``kimi-models/``).
Elsewhere they are skipped. Random weights accept (nearly) nothing, so the acceptance findings
(``ACCEPTANCE``, stated as expected) are left out: what must match the CPU bed
(``testbed.scenarios.FINDINGS``) is every plumbing finding.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from draftscope.findings.runtime import ACCEPTANCE

from testbed.gpu import kimi_models, traces
from tests.gpu.diagnose import diagnose
from testbed.gpu.kimi_phase import crashes
from testbed.scenarios import FINDINGS

RUN = os.environ.get("DRAFTSCOPE_GPU_RUN")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not RUN, reason="needs a GPU test-bed run of the kimi phase: testbed/gpu/run_device.sh --only kimi on the H200 "
                    "sets DRAFTSCOPE_GPU_RUN (docs/testbed.md)")]
NAMES = list(kimi_models.SCENARIOS)


@pytest.fixture(scope="module")
def results() -> dict:
    out = json.loads((Path(RUN) / "results.json").read_text())
    assert "kimi" in out, f"the kimi phase did not run: {out.get('kimi_models')}"
    return out


def server(results: dict, name: str) -> dict:
    s = results["kimi"]["servers"].get(name)
    assert s and s["ok"], f"server {name} did not start: {s and s.get('error')}\n{s and s.get('log_tail', '')}"
    return s


def answers(results: dict, name: str) -> list:
    out = results["kimi"]["answers"].get(name) or []
    if not crashes(name):
        assert len(out) == 20 and not [a for a in out if "error" in a], f"{name}: {out[-1:] or 'no answers'}"
    return [a for a in out if "error" not in a]


def plumbing(found) -> list:
    return [f for f in found or [] if f.severity in ("error", "warning") and f.rule_id not in ACCEPTANCE]


@pytest.mark.parametrize("name", NAMES)
def test_kimi_findings_match_the_cpu_bed(results, name, tmp_path):
    """Each full-width trace, imported into a store, gets the CPU bed's plumbing diagnosis: the runtime rules
    (with the draft, and from the trace alone) name the runtime cause first, the stored findings the static one;
    the healthy draft gets no plumbing finding at all."""
    static_cause, runtime_cause, _ = FINDINGS[kimi_models.SCENARIOS[name][1]]
    answers(results, name)
    models = Path(results["kimi_models"]["dest"])
    runtime, alone, stored, observation = diagnose(Path(server(results, name)["trace"]), models / name,
                                                   models / "target", tmp_path / "store.db")
    report = f"runtime: {[(f.rule_id, f.severity) for f in runtime]}, trace alone: {[f.rule_id for f in alone]}, " \
             f"stored: {[(f.rule_id, f.severity) for f in stored or []]}, draft.input widths " \
             f"{observation.draft_input_widths}, verify steps {observation.verify_steps}"
    if runtime_cause is None:
        assert not plumbing(runtime) and not plumbing(alone) and not plumbing(stored), report
        assert observation.verify_steps and observation.draft_input_widths, report
        return
    assert plumbing(runtime) and plumbing(runtime)[0].rule_id == runtime_cause, report
    assert plumbing(alone) and plumbing(alone)[0].rule_id == runtime_cause, report
    assert plumbing(stored) and plumbing(stored)[0].rule_id == static_cause, report


def test_the_seed_reads_7168_instead_of_21504(results, tmp_path):
    """aux capture off at Kimi's widths: the draft receives 7168-wide hidden states, fc (21504 in) is skipped."""
    models = Path(results["kimi_models"]["dest"])
    runtime, alone, _, observation = diagnose(Path(server(results, "kimi-aux-off")["trace"]),
                                              models / "kimi-aux-off", models / "target", tmp_path / "store.db")
    for found in (runtime, alone):
        first = plumbing(found)[0]
        assert (first.rule_id, "7168 instead of 21504" in first.message) == ("fc-bypassed", True), first.message
    assert observation.fc_out_samples == 0, observation


@pytest.mark.parametrize("name", NAMES)
def test_kimi_widths_are_the_facts(results, name):
    t = traces.load(server(results, name)["trace"])
    target, draft = t.run["facts"]["target"], t.run["facts"]["draft"]
    assert (target["architecture"], target["hidden_size"], target["num_layers"], target["vocab_size"]) == \
        ("DeepseekV3ForCausalLM", 7168, 61, 163840), target
    assert (draft["fc_in_features"], draft["lm_head_rows"]) == (21504, 32000), draft


@pytest.mark.parametrize("name", [n for n in NAMES if not crashes(n)])
def test_kimi_hidden_states_are_bf16_at_their_width(results, name):
    t = traces.load(server(results, name)["trace"])
    hidden = [s for k, v in t.samples.items() if k[2] == "draft.input" or k[2].startswith("target.aux") for s in v]
    assert hidden and {s["dtype"] for s in hidden} == {"bfloat16"}, t.summary()
    widths = {s["width"] for k, v in t.samples.items() if k[2] == "draft.input" and k[3] != "draft_decode" for s in v}
    assert widths == ({7168} if name == "kimi-aux-off" else {21504}), (widths, t.summary())


def test_kimi_graphs_on_and_off_record_the_same(results):
    """The healthy draft with CUDA graphs on and off (``kimi_phase.EAGER``), its four requests sent one at a
    time (a graph batch of 1 is not padded): the same steps, acceptance, top-k and samples, to bf16 rounding
    (``traces.BF16``: the two paths run different GEMM kernels, and random weights' near-uniform draft logits
    tie, so a near tie may draft another token). The same comparison tells the aux-off draft's run apart."""
    on = traces.only(traces.load(server(results, "kimi-healthy")["trace"]), "kimi-seq-")
    off = traces.only(traces.load(server(results, "kimi-healthy-eager")["trace"]), "kimi-seq-")
    facts = server(results, "kimi-healthy-eager")["log_facts"]
    assert facts["cuda_graph_batches"] == 0 and facts["eager_batches"] > 0, facts
    assert len(off.requests) == 4 and off.steps and off.samples, off.summary()
    assert traces.differences(off, on, tol=traces.BF16) == [], f"graphs on: {on.summary()}\ngraphs off: {off.summary()}"
    assert traces.ties(off, on, traces.BF16) <= len(on.steps) // 20, "near ties are rare, not the rule"
    aux_off = traces.only(traces.load(server(results, "kimi-aux-off")["trace"]), "kimi-seq-")
    assert len(traces.differences(aux_off, on, limit=1000, tol=traces.BF16)) > len(on.steps), \
        "the comparison did not tell a broken draft's run from the healthy one"


@pytest.mark.parametrize("name", [n for n in NAMES if not crashes(n)])
def test_kimi_graphs_are_replayed_with_the_standin(results, name):
    facts = server(results, name)["log_facts"]
    assert facts["graph_replays_at_least"] >= 64 and facts["cuda_graph_batches"] > 0, facts
    assert facts["jit_standins"] == ["dsv3_fused_a_gemm"] and not facts["stubs_called"], facts


@pytest.mark.parametrize("name", [n for n in NAMES if not crashes(n)])
def test_kimi_traced_totals_equal_sglang_meta_info_without_drops(results, name):
    """Every request sampled at full width: every answer recorded with SGLang's own counts, no tracer error,
    and nothing dropped (no ``summary_ring_full``)."""
    t = traces.load(server(results, name)["trace"])
    health = t.last_health()
    assert health.get("errors") == {} and not health.get("disabled_probes"), health
    assert not health.get("drops"), health
    for a in answers(results, name):
        r = t.requests.get(a["rid"])
        assert r is not None and r.get("sampled"), f"{name}: {a['rid']} not recorded as sampled"
        assert r["traced_verify_ct"] == r["spec_verify_ct"] == a["meta"]["spec_verify_ct"], r
