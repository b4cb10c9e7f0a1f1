"""The trainer's config beside the draft (or --training-config): read, compared, and used."""

from __future__ import annotations

import json

from draftscope.findings.doctor import diagnose, main
from tests.spec_fixtures import tiny_draft_config, tiny_target, tiny_weights, write_draft

SPECFORGE = ("target_model_path: testbed/target\ndraft_model_config: config.json\nttt_length: 3\n"
             "max_length: 4096\n")


def pair(tmp_path, ids=(0, 3, 6), **config):
    tiny_target(tmp_path / "t")
    write_draft(tmp_path / "d", tiny_draft_config(ids=ids, **config), tiny_weights())
    return tmp_path / "d", tmp_path / "t"


def test_disagreeing_aux_layers_beside_the_draft_are_an_error(tmp_path):
    draft, target = pair(tmp_path)
    (draft / "training_config.yaml").write_text(SPECFORGE + "aux_hidden_state_layer_ids: [0, 1, 2]\n")
    summary, findings = diagnose(draft, target)
    (f,) = findings
    assert (f.rule_id, f.severity) == ("training-config-disagrees", "error")
    assert "[0, 1, 2] (ids [0, 1, 2]) vs [0, 3, 6]" in f.message and "SGLang follows config.json" in f.message
    assert "eagle_config.eagle_aux_hidden_state_layer_ids [0, 1, 2]" in f.fix and f.patch == []
    assert summary["training_config"].endswith("training_config.yaml")
    assert {r["key"]: r for r in summary["spec"]}["trainer"]["trained"] == "SpecForge"


def test_agreeing_training_config_is_silent(tmp_path):
    draft, target = pair(tmp_path)
    (draft / "training_config.yaml").write_text(SPECFORGE + "aux_hidden_state_layer_ids: [0, 3, 6]\n")
    assert diagnose(draft, target)[1] == []


def test_widths_vocab_and_length_from_a_nested_draft_config(tmp_path, capsys):
    draft, target = pair(tmp_path)
    given = tmp_path / "train.json"
    given.write_text(json.dumps({"target_model_path": "x", "ttt_length": 7, "max_length": 1024,
                                 "draft_model_config": {"hidden_size": 256, "draft_vocab_size": 512}}))
    code = main([str(draft), "--target", str(target), "--training-config", str(given), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    (f,) = data["findings"]
    assert set(f["evidence"]["disagreements"]) == {"hidden_size", "draft_vocab_size",
                                                   "max_length / max_position_embeddings"}


def test_only_a_shorter_training_length_is_info(tmp_path):
    draft, target = pair(tmp_path)
    (draft / "training_config.json").write_text(json.dumps({"max_length": 512}))
    (f,) = diagnose(draft, target)[1]
    assert (f.rule_id, f.severity) == ("training-config-disagrees", "info")


def test_unreadable_training_config_exits_2(tmp_path, capsys):
    draft, target = pair(tmp_path)
    (draft / "training_config.yaml").write_text("a: [1, 2\n")
    code = main([str(draft), "--target", str(target)])
    assert code == 2 and "training_config.yaml is not a valid training config" in \
        " ".join(capsys.readouterr().err.split())
