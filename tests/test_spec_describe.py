"""The spec block (draftscope.spec.describe): the trained spec beside SGLang's, one row per fact."""

from __future__ import annotations

from draftscope.spec import expect_sglang, read_draft, read_target
from draftscope.spec.describe import describe_spec, render_text
from tests.spec_fixtures import kimi_pair, tiny_draft_config, tiny_target, tiny_weights, write_draft


def rows_for(draft, target_dir, server_args=None):
    target = read_target(target_dir)
    spec = read_draft(draft, target_layers=target.num_layers)
    return {r.key: r for r in describe_spec(spec, target, expect_sglang(spec, target, server_args))}


def test_kimi_pair_widths_and_both_readings(tmp_path):
    rows = rows_for(*kimi_pair(tmp_path))
    assert rows["fc_in"].trained.startswith("3 × 7168 = 21504")
    assert rows["fc_in"].predicted.startswith("3 × 7168 = 21504 fed") and not rows["fc_in"].mismatch
    assert rows["trainer"].trained == "unknown" and "not recorded" in rows["trainer"].note
    layers = rows["layers"]
    assert "[20, 40, 60] (output-of" in layers.trained and "[19, 39, 59] (input-to" in layers.trained
    # Right under speculators' convention, off by one under SpecForge's: not a mismatch, both verdicts.
    assert layers.predicted.startswith("[19, 39, 59]") and not layers.mismatch and layers.ambiguous
    assert ("under SpecForge's convention these ids mean hidden_states[21, 41, 61] and SGLang's "
            "DeepSeek path feeds hidden_states[20, 40, 60]: off by one") in layers.note
    assert "under speculators' they match" in layers.note
    assert not rows["aux_ids_engine"].mismatch and rows["aux_ids_engine"].ambiguous
    assert "? layers fed" in render_text(list(rows.values()))
    # SpecForge's reading needs the output of layer 60, the last one: no ids capture it.
    assert rows["aux_ids_engine"].trained.startswith("none can capture them")
    assert "[20, 40, 60] (input-to" in rows["aux_ids_engine"].trained


def test_healthy_pair_has_no_mismatch(tmp_path):
    tiny_target(tmp_path / "t")
    write_draft(tmp_path / "d", tiny_draft_config(), tiny_weights())
    rows = rows_for(tmp_path / "d", tmp_path / "t")
    assert [r.key for r in rows.values() if r.mismatch] == []
    assert rows["layers"].trained == "[1, 4, 6]" and rows["layers"].predicted == "[1, 4, 6] of 8"
    text = render_text(list(rows.values()))
    assert text.splitlines()[0].startswith("spec:") and "!" not in text.split("\n", 1)[1][:1]


def test_eagle_algorithm_marks_what_breaks(tmp_path):
    tiny_target(tmp_path / "t")
    write_draft(tmp_path / "d", tiny_draft_config(), tiny_weights())
    rows = rows_for(tmp_path / "d", tmp_path / "t", {"speculative_algorithm": "EAGLE"})
    assert {k for k, r in rows.items() if r.mismatch} == {"algorithm", "layers", "fc_in", "vocab"}
    assert "fc is skipped" in rows["fc_in"].predicted
