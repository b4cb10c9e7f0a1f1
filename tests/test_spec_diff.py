"""Trained vs served and the runtime rules on Kimi-K2.5- and Llama-shaped facts: the layer-id
convention behind each verdict, random weights, and the fc-bypassed wording at full width."""

from __future__ import annotations

import copy

import pytest

from draftscope.findings import Observation, runtime_findings
from draftscope.spec import expect_sglang, read_draft, read_target
from draftscope.spec.describe import describe_spec
from draftscope.spec.diff import DEPENDS, MISMATCH, OK, combine, spec_diff
from tests.spec_fixtures import kimi_pair, tiny_draft_config

SPECFORGE_TRAINING = "target_model_path: moonshotai/Kimi-K2.5\ndraft_model_config: d.json\nttt_length: 7\n"
# The seed: ids [20, 40, 60] on a 61-layer DeepSeek-V3 target, which SGLang's DeepSeek path uses
# as-is (first id not 1): layers_to_capture [20, 40, 60] = hidden_states[20, 40, 60].
SEED_VERDICTS = ("under SpecForge's convention these ids mean hidden_states[21, 41, 61] and SGLang's "
                 "DeepSeek path feeds hidden_states[20, 40, 60]: off by one (one layer shallower); "
                 "under speculators' they match")


def facts(arch: str, layers: int, hidden: int, ids: list[int], captured: list[int], **config) -> dict:
    draft_config = {**tiny_draft_config(hidden=hidden, ids=ids), **config}
    return {"algorithm": "EAGLE3", "spec_topk": 1, "spec_num_steps": 3,
            "target": {"architecture": arch, "num_layers": layers, "hidden_size": hidden,
                       "vocab_size": 163840, "capture_aux_hidden_states": True,
                       "layers_to_capture": captured},
            "draft": {"architecture": "LlamaForCausalLMEagle3", "hidden_size": hidden, "embed_width": hidden,
                      "fc_in_features": 3 * hidden, "config": draft_config}}


def kimi(ids=(20, 40, 60), captured=(20, 40, 60), **config) -> dict:
    return facts("DeepseekV3ForCausalLM", 61, 7168, list(ids), list(captured), **config)


def llama(ids=(1, 4, 6), captured=(2, 5, 7), **config) -> dict:
    return facts("LlamaForCausalLM", 8, 128, list(ids), list(captured), **config)


def layers_row(f: dict, server_args: dict | None = None):
    return next(r for r in spec_diff({"facts": f, "server_args": server_args or {}}, {}) if r.key == "layers")


HEALTHY_WIDTHS = {"widths": {**{f"target.aux[{i}]": {"verify": {"7168": 8}} for i in range(3)},
                             "draft.input": {"prefill": {"21504": 4}, "draft_extend": {"21504": 8}},
                             "draft.fc.out": {"prefill": {"7168": 4}}}}


def observe(f: dict, width: int | None = None, **fields) -> Observation:
    width = width or f["draft"]["fc_in_features"]
    return Observation(facts=f, draft_input_widths={"prefill": [width], "draft_extend": [width]}, **fields)


# --- the layer-id convention -----------------------------------------------------------------------

def test_seed_ids_without_a_trainer_give_both_verdicts_and_no_mismatch():
    row = layers_row(kimi())
    assert row.state == DEPENDS and row.note == SEED_VERDICTS
    assert "hidden_states[21, 41, 61] under SpecForge's convention" in row.trained
    assert "hidden_states[20, 40, 60] under speculators' convention" in row.trained
    assert row.served == ("SGLang's DeepSeek path captures the input of layers [20, 40, 60] = "
                          "hidden_states[20, 40, 60]")
    [finding] = runtime_findings(None, observe(kimi()))
    assert (finding.rule_id, finding.severity) == ("aux-convention-ambiguous", "info")
    assert SEED_VERDICTS in finding.message
    assert [r["matches_engine"] for r in finding.evidence["readings"]] == [False, True]


def test_seed_ids_trained_by_speculators_match():
    f = kimi(speculators_version="0.3.0")
    row = layers_row(f)
    assert row.state == OK and row.note == ""
    assert "speculators' convention (id j = hidden_states[j]" in row.trained
    assert runtime_findings(None, observe(f)) == []


def test_seed_ids_trained_by_specforge_are_off_by_one(tmp_path):
    draft, target_dir = kimi_pair(tmp_path)
    (draft / "training_config.yaml").write_text(SPECFORGE_TRAINING)
    target = read_target(target_dir)
    spec = read_draft(draft, target_layers=61)
    f = kimi()
    f["target"]["architecture"] = target.architecture  # KimiK25: DeepSeek's capture rule
    [finding] = runtime_findings(spec, observe(f))
    assert (finding.rule_id, finding.severity) == ("captured-layers-differ", "error")
    assert "SpecForge's convention: id j = output of layer j = hidden_states[j+1]" in finding.message
    assert ("these ids mean hidden_states[21, 41, 61] and SGLang's DeepSeek path feeds "
            "hidden_states[20, 40, 60]: off by one") in finding.message
    # On the page: the checkpoint read here settles what the recorded config alone could not.
    rows = {r.key: r for r in combine(describe_spec(spec, target, expect_sglang(spec, target)),
                                      spec_diff({"facts": f}, {}))}
    assert rows["layers"].state == MISMATCH


def test_seed_ids_without_a_trainer_on_the_combined_table(tmp_path):
    draft, target_dir = kimi_pair(tmp_path)
    target = read_target(target_dir)
    spec = read_draft(draft, target_layers=61)
    f = kimi()
    f["target"]["architecture"] = target.architecture
    rows = {r.key: r for r in combine(describe_spec(spec, target, expect_sglang(spec, target)),
                                      spec_diff({"facts": f}, HEALTHY_WIDTHS))}
    assert rows["layers"].state == DEPENDS and rows["aux_ids_engine"].state == DEPENDS
    assert "off by one" in rows["layers"].note and rows["layers"].note.count("under SpecForge's") == 1
    assert not [k for k, r in rows.items() if r.state == MISMATCH]


@pytest.mark.parametrize("config, state", [({}, OK), ({"speculators_version": "0.3.0"}, MISMATCH)])
def test_specforge_ids_on_deepseek(config, state):
    """First id 1: SGLang's DeepSeek path adds 1 (SpecForge's reading); speculators' ids would be
    one layer shallower than what it feeds."""
    f = kimi(ids=(1, 29, 57), captured=(2, 30, 58), **config)
    row = layers_row(f)
    assert row.state == state
    found = runtime_findings(None, observe(f))
    if state == OK:
        assert "SpecForge's convention" in row.trained and found == []
    else:
        assert ("under speculators' convention these ids mean hidden_states[1, 29, 57] and SGLang's "
                "DeepSeek path feeds hidden_states[2, 30, 58]: off by one (one layer deeper)") in row.note
        assert [f.rule_id for f in found] == ["captured-layers-differ"]


@pytest.mark.parametrize("ids, captured, config, state", [
    ((1, 4, 6), (2, 5, 7), {}, OK),  # SpecForge's ids, +1 by SGLang: the healthy test bed
    ((1, 4, 6), (3, 5, 6), {}, MISMATCH),  # something else captured
    ((2, 4, 6), (3, 5, 7), {}, OK),  # no trainer, but Llama reads ids as SpecForge does: settled
    ((2, 4, 6), (3, 5, 7), {"speculators_version": "0.3.0"}, MISMATCH),  # speculators' ids +1: one deeper
])
def test_llama_target_keeps_its_verdicts(ids, captured, config, state):
    f = llama(ids, captured, **config)
    row = layers_row(f)
    assert row.state == state
    assert "ambiguous" not in str(runtime_findings(None, observe(f)))
    found = [x.rule_id for x in runtime_findings(None, observe(f))]
    assert found == ([] if state == OK else ["captured-layers-differ"])
    if config:
        assert "Llama-family path feeds hidden_states[3, 5, 7]: off by one (one layer deeper)" in row.note


# --- random weights ----------------------------------------------------------------------------------

def zero_acceptance(f: dict, server_args: dict, width: int | None = None) -> list:
    obs = observe(f, width, server_args=server_args, verify_steps=40, proposed_drafts=120,
                  accepted_drafts=0, draft_logits_samples=40)
    return runtime_findings(None, obs)


def test_random_target_weights_make_zero_acceptance_expected():
    f = kimi(speculators_version="0.3.0")
    assert [x.rule_id for x in zero_acceptance(f, {})] == ["acceptance-zero-finite-logits"]
    found = zero_acceptance(f, {"load_format": "dummy", "speculative_draft_load_format": "safetensors"})
    assert [(x.rule_id, x.severity) for x in found] == [("weights-random", "info"),
                                                        ("acceptance-zero-finite-logits", "info")]
    assert found[0].message.startswith("the target (--load-format dummy) was loaded with random values")
    assert "acceptance means nothing" in found[0].message
    assert found[1].message.startswith("expected with random weights: not one of 120 drafts")


def test_random_weights_keep_every_plumbing_finding():
    f = kimi(speculators_version="0.3.0")
    f["target"]["capture_aux_hidden_states"] = False
    found = zero_acceptance(f, {"load_format": "dummy"}, width=7168)
    assert [(x.rule_id, x.severity) for x in found][0] == ("fc-bypassed", "error")
    assert "weights-random" in [x.rule_id for x in found]
    assert "draft (--load-format dummy (the draft inherits it))" in found[1].message


def test_a_random_draft_differs_from_its_checkpoint_as_expected():
    f = llama()
    f["draft"]["weights"] = {"checked": 13, "matched": 0, "mismatched": ["model.fc.weight"],
                             "not_in_checkpoint": [], "nonfinite": []}
    args = {"speculative_draft_load_format": "dummy"}
    assert "draft-weights-not-loaded" in [x.rule_id for x in runtime_findings(None, observe(f))]
    assert [x.rule_id for x in runtime_findings(None, observe(f, server_args=args))] == ["weights-random"]
    row = next(r for r in spec_diff({"facts": f, "server_args": args}, {}) if r.key == "weights")
    assert row.state == OK and "differing from the checkpoint is expected" in row.note
    f["draft"]["weights"]["not_in_checkpoint"] = ["model.fc.weight"]  # a key the checkpoint lacks still counts
    assert "draft-weights-not-loaded" in [x.rule_id for x in runtime_findings(None, observe(f, server_args=args))]


# --- the seed's failure at full width ----------------------------------------------------------------

def test_kimi_aux_off_reads_7168_instead_of_21504():
    f = copy.deepcopy(kimi(speculators_version="0.3.0"))
    f["target"].update(capture_aux_hidden_states=False, layers_to_capture=[])
    [finding] = runtime_findings(None, observe(f, width=7168))
    assert finding.rule_id == "fc-bypassed"
    assert finding.message == ("the draft received 7168-wide features, 7168 instead of 21504 (3 aux "
                               "layers × 7168): the target captures no aux states "
                               "(capture_aux_hidden_states is false), and 7168 is its embed width, "
                               "so fc is silently skipped")
    summary = {"widths": {"draft.input": {"prefill": {"7168": 12}, "draft_extend": {"7168": 40}}}}
    rows = {r.key: r for r in spec_diff({"facts": f}, summary)}
    assert (rows["input_prefill"].trained, rows["input_prefill"].served) == ("21504", "7168 (12 samples)")
    assert rows["input_prefill"].state == MISMATCH and "7168 is the draft's embed width" in rows["input_prefill"].note
    assert rows["concat"].trained == "3 × 7168 = 21504"
