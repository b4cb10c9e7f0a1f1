"""Runtime rules over Observations shaped like the tracer's facts for each real scenario."""

from __future__ import annotations

import copy

import pytest

from draftscope.findings import Observation, runtime_findings
from draftscope.spec import read_draft
from tests.spec_fixtures import tiny_draft_config, tiny_weights, write_draft

HEALTHY_FACTS = {
    "sglang_version": "0.5.23", "algorithm": "EAGLE3", "spec_num_steps": 3,
    "target": {"path": "/t", "architecture": "LlamaForCausalLM", "num_layers": 8, "hidden_size": 128,
               "vocab_size": 1024, "eagle3_capture_supported": True, "capture_aux_hidden_states": True,
               "layers_to_capture": [2, 5, 7]},
    "draft": {"path": "/d", "architecture": "LlamaForCausalLMEagle3", "hidden_size": 128,
              "embed_width": 128, "fc_in_features": 384, "lm_head_rows": 256,
              "config_draft_vocab_size": 256, "lm_head_shared_with_target": False,
              "max_position_embeddings": 4096,
              "hot_token_id": {"present": True, "size": 256, "max_id": 510, "min_id": 0,
                               "in_target_vocab": True, "equals_d2t_plus_arange": True},
              "weights": {"checked": 13, "matched": 13, "mismatched": [], "not_in_checkpoint": [],
                          "checkpoint_keys_unused": [], "nonfinite": []}}}


TRACING = {"worker_class": "EAGLEWorkerV2", "draft_worker_class": "EagleDraftWorker", "algorithm": "EAGLE3",
           "covered": True, "hooks_not_applied": [], "hooks_not_reached": [],
           "expected_to_fire": ["prefill", "draft", "verify", "draft_extend", "finish"]}
UNCOVERED = {"worker_class": "MultiLayerEagleWorkerV2", "draft_worker_class": "MultiLayerEagleDraftWorker",
             "algorithm": "EAGLE", "covered": False, "hooks_not_applied": [],
             "hooks_not_reached": ["draft", "draft_extend", "prefill", "verify"], "expected_to_fire": ["finish"]}


def healthy(**changes) -> Observation:
    obs = Observation(facts=copy.deepcopy(HEALTHY_FACTS),
                      draft_input_widths={"prefill": [384], "draft_extend": [384], "draft_decode": [128]},
                      aux_widths={0: 128, 1: 128, 2: 128}, verify_steps=40, accepted_drafts=70,
                      proposed_drafts=120, heartbeats={"verify": 40, "draft": 40}, max_seq_pos=300,
                      max_seq_pos_at=("r0", 39))
    for key, value in changes.items():
        setattr(obs, key, value)
    return obs


@pytest.fixture
def spec(tmp_path):
    write_draft(tmp_path / "d", tiny_draft_config(), tiny_weights())
    return read_draft(tmp_path / "d", target_layers=8)


def test_healthy_run_is_silent(spec):
    assert runtime_findings(spec, healthy()) == []
    assert runtime_findings(None, healthy()) == []


def _facts(**paths):
    facts = copy.deepcopy(HEALTHY_FACTS)
    for path, value in paths.items():
        node = facts
        *parents, leaf = path.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return facts


@pytest.mark.parametrize("obs, expected", [
    (healthy(facts=_facts(algorithm="EAGLE", draft__lm_head_shared_with_target=True),
             draft_input_widths={"prefill": [128]}), "eagle-algorithm-with-eagle3-draft"),
    (healthy(facts=_facts(target__capture_aux_hidden_states=False, target__layers_to_capture=[]),
             draft_input_widths={"prefill": [128], "draft_extend": [128]}), "fc-bypassed"),
    (healthy(facts=_facts(target__layers_to_capture=[1, 4, 8]),
             draft_input_widths={"prefill": [256]}), "aux-count-short"),
    (healthy(facts=_facts(target__layers_to_capture=[3, 5, 6])), "captured-layers-differ"),
    (healthy(facts=_facts(draft__fc_in_features=384), draft_input_widths={"prefill": [200]}),
     "aux-width-mismatch"),
    (healthy(facts=_facts(draft__weights={"not_in_checkpoint": ["model.fc.weight"], "nonfinite": []}),
             draft_logits_nonfinite=512), "draft-weights-not-loaded"),
    (healthy(facts=_facts(draft__weights={"checkpoint_keys_unused": ["x.fc.weight"]})),
     "checkpoint-keys-ignored"),
    (healthy(facts=_facts(draft__hot_token_id={"present": True, "max_id": 1530,
                                                "in_target_vocab": False})), "d2t-not-offsets"),
    (healthy(facts=_facts(draft__lm_head_rows=200)), "draft-vocab-lm-head-mismatch"),
    (healthy(max_seq_pos=5000, max_seq_pos_at=("r1", 77)), "position-beyond-draft-max"),
    (healthy(heartbeats={"verify": 40, "draft": 0}), "hooks-starved"),
    (healthy(facts=_facts(tracing=TRACING), heartbeats={"verify": 40, "draft": 40}), "hooks-starved"),
    (healthy(facts=_facts(tracing=TRACING), heartbeats={}, verify_steps=0, sampled_verify_ct=9),
     "hooks-starved"),
    (healthy(facts=_facts(tracing={**TRACING, "hooks_not_applied": ["verify"]})), "hooks-not-applied"),
    (healthy(facts=_facts(tracing=UNCOVERED), heartbeats={}, verify_steps=0), "worker-not-traced"),
    (healthy(accepted_drafts=3, proposed_drafts=120), "acceptance-collapse-quality"),
])
def test_rule_fires(spec, obs, expected):
    found = runtime_findings(spec, obs)
    assert found and found[0].rule_id == expected, [f.rule_id for f in found]
    assert found[0].source == "runtime" and found[0].fix


def test_every_expected_hook_fired_is_silent(spec):
    beats = {name: 40 for name in TRACING["expected_to_fire"]}
    assert runtime_findings(spec, healthy(facts=_facts(tracing=TRACING), heartbeats=beats)) == []


def test_uncovered_worker_is_named(spec):
    found = runtime_findings(None, healthy(facts=_facts(tracing=UNCOVERED), heartbeats={}, verify_steps=0))
    assert found[0].message.startswith("this server runs MultiLayerEagleWorkerV2: draftscope traces nothing of it")


def test_collapse_is_not_quality_when_plumbing_is_broken(spec):
    obs = healthy(accepted_drafts=0, proposed_drafts=120,
                  draft_input_widths={"prefill": [128], "draft_extend": [128]},
                  facts=_facts(target__capture_aux_hidden_states=False))
    assert [f.rule_id for f in runtime_findings(spec, obs)] == ["fc-bypassed"]


def test_position_first_step(spec):
    f = runtime_findings(spec, healthy(max_seq_pos=5000, max_seq_pos_at=("r1", 77)))[0]
    assert f.first_step == 77 and f.evidence["rid"] == "r1"


def test_captured_layers_differ_from_the_recorded_draft_config_alone():
    """With the draft directory unreadable here, the config the tracer recorded names the trained layers."""
    config = {"architectures": ["LlamaForCausalLMEagle3"], "eagle_aux_hidden_state_layer_ids": [1, 4, 6]}
    same = healthy(facts=_facts(draft__config={**config, "eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [1, 4, 6]}}))
    assert runtime_findings(None, same) == []
    fallback = healthy(facts=_facts(draft__config=config, target__layers_to_capture=[2, 4, 5]))
    [finding] = runtime_findings(None, fallback)
    assert finding.rule_id == "captured-layers-differ"
    assert "output of layers [1, 3, 4]" in finding.message and "trained on [1, 4, 6]" in finding.message
