"""Static rules: each fires on a real broken checkpoint and stays silent on the healthy one."""

from __future__ import annotations

import json

import pytest
import torch

from draftscope.findings import static_findings
from draftscope.spec import expect_sglang, parse_server_args, read_draft, read_target
from tests.spec_fixtures import (published, published_draft, tiny_draft_config, tiny_target,
                                 tiny_weights, write_draft)

HOT = torch.arange(0, 512, 2)  # the healthy fixture's draft -> target ids


def diagnose(tmp_path, config=None, weights=None, server_args="", layers=8, **target):
    t = read_target(tiny_target(tmp_path / "t", layers=layers, **target))
    write_draft(tmp_path / "d", config or tiny_draft_config(), weights or tiny_weights())
    spec = read_draft(tmp_path / "d", target_layers=layers)
    return static_findings(spec, t, expect_sglang(spec, t, parse_server_args(server_args)))


def ids(findings):
    return [f.rule_id for f in findings]


def test_healthy_is_silent(tmp_path):
    assert diagnose(tmp_path) == []


@pytest.mark.parametrize("case, expected", [
    (dict(server_args="--speculative-algorithm EAGLE"), "eagle-algorithm-with-eagle3-draft"),
    (dict(config=tiny_draft_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 4, 6],
                                                 "use_aux_hidden_state": False})), "fc-bypassed"),
    (dict(config=tiny_draft_config(ids=(1, 4, 7))), "aux-count-short"),
    (dict(config=tiny_draft_config(ids=(1, 2, 3)), layers=4), "aux-count-short"),
    (dict(config=tiny_draft_config(ids=None, eagle_aux_hidden_state_layer_ids=[1, 4, 6])),
     "aux-ids-not-read"),
    (dict(config=tiny_draft_config(ids=None, eagle_aux_hidden_state_layer_ids=[0, 1, 2]), layers=4),
     "aux-ids-not-read"),
    (dict(config=tiny_draft_config(ids=(1, 4, 6)), arch="DeepseekV3ForCausalLM"), None),
    (dict(config=tiny_draft_config(ids=(2, 4, 6)), arch="DeepseekV3ForCausalLM"),
     "aux-convention-ambiguous"),  # no trainer named: SpecForge's and speculators' readings differ
    (dict(config=tiny_draft_config(ids=(2, 4, 6), speculators_version="0.3.0"),
          arch="DeepseekV3ForCausalLM"), None),  # speculators' ids: what SGLang's DeepSeek path reads
    (dict(config=tiny_draft_config(ids=(2, 4, 6), draftscope_trained_aux_layers=[2, 4, 6]),
          arch="DeepseekV3ForCausalLM"), "captured-layers-differ"),
    (dict(config=tiny_draft_config(ids=(1, 4)), weights=tiny_weights(k=3)), "aux-width-mismatch"),
    (dict(weights=tiny_weights(prefix="draft_model.")), "draft-weights-not-loaded"),
    (dict(weights={k: v for k, v in tiny_weights().items() if k != "lm_head.weight"}),
     "draft-weights-not-loaded"),
    (dict(weights={**tiny_weights(), "fc_norm_extra.weight": torch.ones(4)}), "checkpoint-keys-ignored"),
    (dict(weights=tiny_weights(d2t=HOT)), "d2t-not-offsets"),
    (dict(weights=tiny_weights(d2t=HOT + 600)), "d2t-not-offsets"),
    (dict(weights=tiny_weights(d2t=torch.zeros(256, dtype=torch.int64),
                               t2d=torch.arange(1024) < 256)), "d2t-identity-slice"),
    (dict(weights={k: v for k, v in tiny_weights().items() if k != "d2t"}), "d2t-missing"),
    (dict(weights=tiny_weights(t2d=torch.ones(1024, dtype=torch.bool))), "t2d-inconsistent"),
    (dict(config=tiny_draft_config(draft_vocab=200)), "draft-vocab-lm-head-mismatch"),
    (dict(config=tiny_draft_config(vocab=2048)), "target-vocab-mismatch"),
    (dict(config=tiny_draft_config(max_position_embeddings=1024)), "startup-refused"),
    (dict(server_args="--context-length 8192"), "startup-refused"),  # beyond the target's 4096
    (dict(server_args="--context-length 1024", config=tiny_draft_config(max_position_embeddings=1024)),
     None),  # capped to the draft's limit: SGLang starts
    (dict(config=tiny_draft_config(rope_theta=500000.0)), "rope-differs-from-target"),
    (dict(arch="SomeNewForCausalLM"), "capture-semantics-unknown"),
])
def test_rule_fires_first_on_its_root_cause(tmp_path, case, expected):
    found = diagnose(tmp_path, **case)
    if expected is None:
        assert found == []
        return
    assert found and found[0].rule_id == expected, ids(found)
    assert found[0].message and found[0].fix and "\n" not in found[0].message


def test_root_cause_suppresses_consequences(tmp_path):
    found = diagnose(tmp_path, config=tiny_draft_config(ids=None, eagle_aux_hidden_state_layer_ids=[0, 1, 2]),
                     layers=4)
    assert ids(found) == ["aux-ids-not-read"]
    assert "first request crashes" in found[0].message
    found = diagnose(tmp_path, weights=tiny_weights(d2t=HOT))
    assert ids(found) == ["d2t-not-offsets"] and "absolute" in found[0].message


def test_unsupported_speculators_draft(tmp_path):
    t = read_target(tiny_target(tmp_path / "t", layers=32, hidden=4096, vocab=128256))
    spec = read_draft(published_draft(tmp_path / "d", published("speculators_llama31_8b"), style="layers.0"),
                      target_layers=32)
    found = static_findings(spec, t, expect_sglang(spec, t, {}))
    assert ids(found)[0] == "draft-arch-unsupported" and "speculators" in found[0].message


def test_engine_rules_cite_sglang_source(tmp_path):
    for case in (dict(server_args="--speculative-algorithm EAGLE"),
                 dict(config=tiny_draft_config(ids=(1, 4, 7))),
                 dict(weights=tiny_weights(prefix="x."))):
        f = diagnose(tmp_path, **case)[0]
        assert "sglang_source" in f.evidence and ".py::" in str(f.evidence["sglang_source"])


def test_every_rule_is_documented():
    import re
    from pathlib import Path

    doc = Path(__file__).parent.parent / "docs" / "findings.md"
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", doc.read_text(), re.M))
    source = "".join(p.read_text() for p in (Path(__file__).parent.parent / "app" / "findings").glob("*.py"))
    used = set(re.findall(r'(?:Finding|_f)\(\s*"([a-z0-9-]+)"', source))
    assert used and used <= documented, used - documented


def _kimi(tmp_path, **extra):
    from tests.spec_fixtures import kimi_pair

    draft, target_dir = kimi_pair(tmp_path)
    if extra.get("training"):
        (draft / "training_config.yaml").write_text(extra["training"])
    if extra.get("config"):
        config = json.loads((draft / "config.json").read_text())
        config.update(extra["config"])
        (draft / "config.json").write_text(json.dumps(config))
    target = read_target(target_dir)
    spec = read_draft(draft, target_layers=target.num_layers)
    return static_findings(spec, target, expect_sglang(spec, target))


def test_kimi_ids_without_trainer_are_one_ambiguous_finding(tmp_path):
    (f,) = _kimi(tmp_path)
    # info: under speculators' convention (the seed's trainer) the ids are exactly right
    assert (f.rule_id, f.severity, f.patch) == ("aux-convention-ambiguous", "info", [])
    assert "hidden_states[20, 40, 60] (the output of layers [19, 39, 59])" in f.message
    assert ("under SpecForge's convention these ids mean hidden_states[21, 41, 61] and SGLang's "
            "DeepSeek path feeds hidden_states[20, 40, 60]: off by one") in f.message
    assert "under speculators' they match" in f.message
    # The SpecForge reading needs the last layer's output: the fix says no ids can, never [20, 40, 60].
    assert "no eagle_config ids can" in f.fix and "last decoder layer" in f.fix
    assert "[20, 40, 60]" not in f.fix


def test_kimi_specforge_training_config_settles_it(tmp_path):
    (f,) = _kimi(tmp_path, training="target_model_path: moonshotai/Kimi-K2.5\n"
                                     "draft_model_config: kimi-eagle3.json\nttt_length: 7\n")
    assert (f.rule_id, f.severity, f.patch) == ("captured-layers-differ", "error", [])
    assert "SpecForge" in f.message and "no eagle_config ids can" in f.fix


def test_kimi_speculators_metadata_settles_it(tmp_path):
    assert _kimi(tmp_path, config={"speculators_version": "0.3.0"}) == []


def test_context_override_variable_turns_the_refusal_into_a_warning(tmp_path):
    t = read_target(tiny_target(tmp_path / "t"))
    write_draft(tmp_path / "d", tiny_draft_config(max_position_embeddings=64), tiny_weights())
    spec = read_draft(tmp_path / "d", target_layers=8)
    (refused,) = static_findings(spec, t, expect_sglang(spec, t))
    assert refused.rule_id == "startup-refused"
    assert "Target model's context_length (4096) is greater than the derived context_length (64)" in refused.message
    exp = expect_sglang(spec, t, env={"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"})
    assert (exp.startup_error, exp.draft_max_position_override, exp.context_len) == (None, 4096, 4096)
    (warned,) = static_findings(spec, t, exp)
    assert (warned.rule_id, warned.severity) == ("draft-context-overridden", "warning")


def test_context_length_as_sglang_derives_it(tmp_path):
    from draftscope.spec.config_file import derived_context_length

    assert derived_context_length({}) == 2048
    assert derived_context_length({"seq_length": 100, "max_position_embeddings": 50}) == 100
    assert derived_context_length({"max_position_embeddings": 4096,
                                   "rope_scaling": {"type": "yarn", "factor": 4.0}}) == 16384
    assert derived_context_length({"max_position_embeddings": 4096, "rope_scaling": {
        "factor": 4.0, "original_max_position_embeddings": 1024}}) == 4096


@pytest.mark.parametrize("config, weights, arch_ok, expected", [
    ({"fc_norm": True}, {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}, True, []),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 4, 6], "norm_before_fc": True}},
     {"input_norm.weight"}, True, []),
    ({"norm_output": True}, set(), True, []),
    ({}, {"aux_norm_low.weight", "aux_norm_mid.weight", "aux_norm_high.weight"}, True,
     ["eagle31-weights-without-flag"]),
    ({}, {"input_norm.weight"}, True, ["eagle31-weights-without-flag"]),
    ({"fc_norm": True}, set(), True, ["eagle31-flag-without-weights"]),
])
def test_eagle31_flags_against_weights(tmp_path, config, weights, arch_ok, expected):
    hidden = 128
    shapes = {"input_norm.weight": torch.ones(3 * hidden)}
    extra = {k: shapes.get(k, torch.ones(hidden)) for k in weights}
    found = diagnose(tmp_path, config=tiny_draft_config(**config), weights={**tiny_weights(), **extra})
    assert ids(found) == expected


def test_mla_draft_ignores_norm_before_fc(tmp_path):
    from draftscope.spec.describe import describe_spec

    t = read_target(tiny_target(tmp_path / "t", hidden=7168, layers=61, vocab=163840,
                                arch="KimiK25ForConditionalGeneration"))
    config = published("kimi_k25_eagle3_mla")
    config.update(intermediate_size=18432, num_key_value_heads=8, norm_before_fc=True, fc_norm=True)
    spec = read_draft(published_draft(tmp_path / "d", config), target_layers=61)
    exp = expect_sglang(spec, t)
    found = [f for f in static_findings(spec, t, exp) if f.rule_id.startswith("eagle31")]
    assert [(f.rule_id, f.evidence["flag"]) for f in found] == [("eagle31-flag-ignored", "norm_before_fc"),
                                                              ("eagle31-flag-without-weights", "fc_norm")]
    assert "Eagle3DeepseekV2ForCausalLM has no norm_before_fc" in found[0].evidence["sglang_source"]
    row = {r.key: r for r in describe_spec(spec, t, exp)}["norms"]
    assert row.predicted == "norm_before_fc not applied, fc_norm applied" and row.mismatch
