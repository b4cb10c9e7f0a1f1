"""Static rules: each fires on a real broken checkpoint and stays silent on the healthy one."""

from __future__ import annotations

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
     "captured-layers-differ"),
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
    (dict(config=tiny_draft_config(max_position_embeddings=1024)), "draft-max-position-short"),
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
