"""Mechanical fixes (Finding.patch, draftscope.findings.fix): every one changes what triggered it.

Each case breaks a tiny draft the way a test-bed scenario (or a published checkpoint) does; the
test applies every patch doctor offers to a copy and diagnoses the copy with the fixed flags.
"""

from __future__ import annotations

import json

import pytest
import torch

from draftscope.findings.doctor import diagnose
from draftscope.findings.fix import FixError, apply_fixes
from draftscope.findings.static import FIXABLE
from draftscope.spec import parse_server_args, read_draft
from draftscope.spec.sglang import format_server_args
from tests.spec_fixtures import tiny_draft_config, tiny_target, tiny_weights, write_draft


def _absolute_d2t():
    w = tiny_weights()
    w["d2t"] = w["d2t"] + torch.arange(w["d2t"].numel())
    return w


def _speculators_layout():
    body = tiny_draft_config(ids=None)
    top = {k: body.pop(k) for k in ("draft_vocab_size", "target_hidden_size")}
    body.pop("architectures")
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "transformer_layer_config": body,
            "eagle_aux_hidden_state_layer_ids": [1, 4, 7], **top}


SPECFORGE_TRAINING = {"target_model_path": "t", "draft_model_config": "c.json", "ttt_length": 7}

# name -> (draft config, tensors, target kwargs, server args, rule the fix must clear); a server
# environment for the case, if any, in ENV.
CASES = {
    "aux-off": (tiny_draft_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 4, 6],
                                                "use_aux_hidden_state": False}),
                tiny_weights(), {}, "", "fc-bypassed"),
    "algo-eagle": (tiny_draft_config(), tiny_weights(), {}, "--speculative-algorithm EAGLE --tp 1",
                   "eagle-algorithm-with-eagle3-draft"),
    "weights-dropped": (tiny_draft_config(), tiny_weights(prefix="draft_model."), {}, "",
                        "draft-weights-not-loaded"),
    "d2t-absolute": (tiny_draft_config(), _absolute_d2t(), {}, "", "d2t-not-offsets"),
    "top-level-ids": (tiny_draft_config(ids=None, eagle_aux_hidden_state_layer_ids=[1, 4, 6]),
                      tiny_weights(), {}, "", "aux-ids-not-read"),
    "vocab-size-wrong": (tiny_draft_config(draft_vocab=200), tiny_weights(), {}, "",
                         "draft-vocab-lm-head-mismatch"),
    # SpecForge-trained (its training config says so) ids [2, 4, 5] on a DeepSeek target: SGLang's
    # first-id-is-1 rule reads them input-to and captures one layer shallower.
    "deepseek-shifted": (tiny_draft_config(ids=[2, 4, 5]), tiny_weights(),
                         {"arch": "DeepseekV3ForCausalLM"}, "", "captured-layers-differ"),
    "norm-weights-unflagged": (tiny_draft_config(), {**tiny_weights(), "input_norm.weight": torch.ones(384)},
                               {}, "", "eagle31-weights-without-flag"),
    "short-context": (tiny_draft_config(max_position_embeddings=64), tiny_weights(), {}, "",
                      "startup-refused"),
    "short-context-overridden": (tiny_draft_config(max_position_embeddings=64), tiny_weights(), {}, "",
                                 "draft-context-overridden"),
    # speculators' ids ([1, 4, 7] = hidden_states of the outputs of layers 0, 3, 6) in eagle_config: SGLang
    # adds one, never reaches 8, and feeds two states; [0, 3, 6] capture the trained layers.
    "speculators-ids": (tiny_draft_config(ids=[1, 4, 7], speculators_model_type="eagle3"), tiny_weights(), {}, "",
                        "aux-count-short"),
    # speculators' own layout: SGLang cannot parse it (no top-level model_type); converted, it serves.
    "speculators-layout": (_speculators_layout(), tiny_weights(key_style="layers.0"), {}, "", "draft-arch-unsupported"),
    # written for SGLang by doctor --fix ([0, 3, 6] in eagle_config, the trained layers recorded): vLLM reads
    # [0, 3, 6] as hidden_states[0, 3, 6]; [1, 4, 7] at the top level (read first by vLLM) capture them.
    "vllm-sglang-ids": (tiny_draft_config(ids=[0, 3, 6], speculators_model_type="eagle3",
                                          draftscope_trained_aux_layers=[0, 3, 6]), tiny_weights(), {}, "",
                        "captured-layers-differ"),
}
ENV = {"short-context-overridden": {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}}
ENGINE = {"vllm-sglang-ids": "vllm"}


def _case(tmp_path, name):
    config, tensors, target_kw, args, rule = CASES[name]
    tiny_target(tmp_path / "t", **target_kw)
    write_draft(tmp_path / "d", config, tensors)
    if name == "deepseek-shifted":
        (tmp_path / "d" / "training_config.json").write_text(json.dumps(SPECFORGE_TRAINING))
    return tmp_path / "d", tmp_path / "t", args, rule


def _inputs(draft, target, args):
    """What the rules read: the draft spec (config, keys, d2t check) and the server flags."""
    spec = read_draft(draft, target_layers=8)
    return (json.dumps(spec.config, sort_keys=True), sorted(spec.keys), spec.vocab_map, args)


@pytest.mark.parametrize("name", CASES)
def test_fix_changes_the_inputs_and_clears_the_finding(tmp_path, name):
    draft, target, args, rule = _case(tmp_path, name)
    before = (draft / "config.json").read_bytes(), (draft / "model.safetensors").read_bytes()
    env, engine = ENV.get(name), ENGINE.get(name, "sglang")
    _, findings = diagnose(draft, target, args, server_env=env, engine=engine)
    fixable = [f for f in findings if f.patch]
    assert rule in [f.rule_id for f in fixable], [f.rule_id for f in findings]
    assert {f.rule_id for f in fixable} <= FIXABLE
    result = apply_fixes(draft, tmp_path / "fixed", findings, parse_server_args(args))
    assert before == ((draft / "config.json").read_bytes(), (draft / "model.safetensors").read_bytes())
    fixed_args = format_server_args(result.server_args)
    assert _inputs(draft, target, args) != _inputs(result.out_dir, target, fixed_args)
    _, after = diagnose(result.out_dir, target, fixed_args, server_env=env, engine=engine)
    assert not [f for f in after if f.rule_id in {g.rule_id for g in fixable}], after
    assert not [f for f in after if f.severity == "error"], after


def test_every_fixable_rule_is_covered(tmp_path):
    covered = set()
    for name in CASES:
        draft, target, args, _ = _case(tmp_path / name, name)
        covered |= {f.rule_id for f in diagnose(draft, target, args, server_env=ENV.get(name),
                                                engine=ENGINE.get(name, "sglang"))[1] if f.patch}
    assert covered == FIXABLE


def test_fix_refuses_to_touch_the_input(tmp_path):
    draft, target, args, _ = _case(tmp_path, "aux-off")
    findings = diagnose(draft, target, args)[1]
    for bad in (draft, draft / "sub", tmp_path):
        with pytest.raises(FixError, match="overlaps the draft directory"):
            apply_fixes(draft, bad, findings)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FixError, match="not an empty directory"):
        apply_fixes(draft, tmp_path / "full", findings)
