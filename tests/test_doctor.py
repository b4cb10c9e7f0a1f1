"""`draftscope doctor`: exit codes, one line per finding, JSON, bad input, and the test-bed scenarios."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from draftscope.cli.app import app
from draftscope.findings import doctor
from testbed import scenarios
from tests.spec_fixtures import kimi_pair, tiny_draft_config, tiny_target, tiny_weights, write_draft


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = doctor.main([str(a) for a in args])
    return SimpleNamespace(exit_code=code, output=out.getvalue() + err.getvalue())


@pytest.fixture
def pair(tmp_path):
    tiny_target(tmp_path / "t")
    write_draft(tmp_path / "d", tiny_draft_config(), tiny_weights())
    return tmp_path / "d", tmp_path / "t"


def test_healthy_exit_0(pair):
    result = run(pair[0], "--target", pair[1])
    assert result.exit_code == 0, result.output
    assert "no findings" in result.output


def test_error_finding_exit_1_one_line(pair):
    result = run(pair[0], "--target", pair[1], "--server-args", "--speculative-algorithm EAGLE")
    assert result.exit_code == 1
    lines = [l for l in result.output.splitlines() if "eagle-algorithm-with-eagle3-draft" in l]
    assert len(lines) == 1 and "fix:" in lines[0] and "EAGLE3" in lines[0]


def test_json_output(pair):
    result = run(pair[0], "--target", pair[1], "--server-args", "--speculative-algorithm EAGLE", "--json")
    data = json.loads(result.output)
    assert result.exit_code == 1 and data["errors"] == 1
    assert data["findings"][0]["rule_id"] == "eagle-algorithm-with-eagle3-draft"
    assert data["summary"]["draft_input_width"] == 128


@pytest.mark.parametrize("breakage, needle", [
    (lambda d, t: (d / "model.safetensors").write_bytes(b"\x0f\x00\x00\x00\x00\x00\x00\x00{broken json}!!"),
     "model.safetensors has a corrupt safetensors header"),
    (lambda d, t: (d / "model.safetensors").unlink(), "holds no weights"),
    (lambda d, t: (d / "config.json").write_text("{"), "config.json is not valid JSON"),
    (lambda d, t: (d / "config.json").write_text('{"architectures": ["MysteryModel"], "hidden_size": 1}'),
     "not an EAGLE-3 draft"),
    (lambda d, t: (t / "config.json").unlink(), "config.json does not exist"),
    (lambda d, t: tiny_target(t, hidden=256), "This is not the draft's target"),
])
def test_bad_input_exit_2(pair, breakage, needle):
    breakage(*pair)
    result = run(pair[0], "--target", pair[1])
    assert result.exit_code == 2
    assert needle in " ".join(result.output.split()), result.output


def test_bad_input_json(pair):
    (pair[0] / "config.json").write_text("[1, 2")
    result = run(pair[0], "--target", pair[1], "--json")
    assert result.exit_code == 2 and json.loads(result.output)["error"]["path"].endswith("config.json")


SCENARIOS = {"aux-off": "fc-bypassed", "algo-eagle": "eagle-algorithm-with-eagle3-draft",
             "weights-dropped": "draft-weights-not-loaded", "d2t-absolute": "d2t-not-offsets",
             "last-layer-id": "aux-count-short", "top-level-ids": "aux-ids-not-read"}


@pytest.mark.parametrize("name", ["healthy", *SCENARIOS])
def test_testbed_scenarios(name):
    prepared = scenarios.prepare(name)
    result = run(prepared.draft_dir, "--target", prepared.target_dir, "--server-args", " ".join(prepared.server_args))
    if name == "healthy":
        assert result.exit_code == 0, result.output
        assert "error" not in result.output and "warning" not in result.output
        return
    assert result.exit_code == 1, result.output
    first = [l for l in result.output.splitlines() if l.startswith("error")][0]
    assert SCENARIOS[name] in first and "fix:" in first


def test_spec_printed_before_findings_kimi_pair(tmp_path):
    draft, target = kimi_pair(tmp_path)
    result = run(draft, "--target", target)
    lines = result.output.splitlines()
    assert lines[1].startswith("spec:")
    fc = next(i for i, l in enumerate(lines) if "3 × 7168 = 21504" in l)
    first_finding = next((i for i, l in enumerate(lines) if l.startswith(("error", "warning", "info"))),
                         len(lines))
    assert fc < first_finding
    data = json.loads(run(draft, "--target", target, "--json").output)
    assert {r["key"]: r for r in data["summary"]["spec"]}["fc_in"]["trained"].startswith("3 × 7168 = 21504")


def test_fix_prints_changes_flags_and_the_clean_copy(pair, tmp_path):
    draft, target = pair
    result = run(draft, "--target", target, "--server-args", "--speculative-algorithm EAGLE",
                 "--fix", tmp_path / "fixed")
    assert result.exit_code == 1  # the input's diagnosis
    out = " ".join(result.output.split())
    assert "changed eagle-algorithm-with-eagle3-draft: server flag --speculative-algorithm EAGLE3" in out
    assert f"serve with: --speculative-algorithm EAGLE3 --speculative-draft-model-path {tmp_path / 'fixed'}" in out
    assert "the fixed copy: no findings" in out
    assert (tmp_path / "fixed" / "sglang_flags.txt").is_file()
    again = run(draft, "--target", target, "--fix", tmp_path / "fixed")
    assert again.exit_code == 2 and "not an empty directory" in again.output


def test_through_the_cli_and_its_help(pair) -> None:
    result = CliRunner().invoke(app, ["doctor", str(pair[0]), "--target", str(pair[1]),
                                      "--server-args", "--speculative-algorithm EAGLE3"])
    assert result.exit_code == 0 and "no findings" in result.output, result.output
    assert "Diagnose a draft + target pair" in CliRunner().invoke(app, ["--help"]).output


def _speculators_layout(ids=(1, 4, 7)) -> dict:
    body = tiny_draft_config(ids=None)
    body.pop("architectures")
    top = {k: body.pop(k) for k in ("draft_vocab_size", "target_hidden_size")}
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
            "transformer_layer_config": body, "eagle_aux_hidden_state_layer_ids": list(ids), **top,
            "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"speculative_tokens": 3}],
                                   "verifier": {"name_or_path": "t", "architectures": ["LlamaForCausalLM"]}}}


# The outputs of layers 0, 3, 6 of the 8-layer target (hidden_states[1, 4, 7]) in each format's own
# convention: name -> (config, key style, {engine: (the error doctor gives or None, the ids its fix writes)}).
FORMATS = {
    "speculators-layout": (_speculators_layout(), "layers.0",
                           {"vllm": (None, None), "sglang": ("draft-arch-unsupported", [0, 3, 6])}),
    "speculators-keys": (tiny_draft_config(ids=[1, 4, 7], speculators_model_type="eagle3"), "midlayer",
                         {"vllm": (None, None), "sglang": ("aux-count-short", [0, 3, 6])}),
    "written-for-sglang": (tiny_draft_config(ids=[0, 3, 6], speculators_model_type="eagle3",
                                             draftscope_trained_aux_layers=[0, 3, 6]), "midlayer",
                           {"sglang": (None, None), "vllm": ("captured-layers-differ", [1, 4, 7])}),
    "eagle-layout": (tiny_draft_config(ids=[1, 4, 7], architectures=["LlamaForCausalLM"]), "midlayer",
                     {"vllm": (None, None), "sglang": ("draft-arch-unsupported", None)}),
    "specforge": (tiny_draft_config(ids=[0, 3, 6]), "midlayer",
                  {"sglang": (None, None), "vllm": (None, None)}),  # vLLM: aux-convention-ambiguous, info
}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_read_in_its_own_convention(tmp_path, name, engine):
    """Healthy where the engine feeds the trained layers (no warning, no error); otherwise the one error,
    whose fix and patch give the ids that capture them, where that engine reads them."""
    config, style, expected = FORMATS[name]
    tiny_target(tmp_path / "t")
    write_draft(tmp_path / "d", config, tiny_weights(key_style=style))
    rule, ids = expected[engine]
    data = json.loads(run(tmp_path / "d", "--target", tmp_path / "t", "--engine", engine, "--json").output)
    serious = [f for f in data["findings"] if f["severity"] != "info"]
    assert [f["rule_id"] for f in serious] == ([rule] if rule else []), data["findings"]
    if ids is not None:
        where = "eagle_config.eagle_aux_hidden_state_layer_ids" if engine == "sglang" \
            else "eagle_aux_hidden_state_layer_ids"
        assert f"{where} {ids}" in serious[0]["fix"] and "retrain" not in serious[0]["fix"], serious[0]
        assert {"op": "config_set", "path": where, "value": ids} in serious[0]["patch"]


def test_speculators_layout_with_specforge_training_config_reads_output_of(tmp_path):
    """The one case read as ids lifted from a SpecForge eagle_config: a SpecForge training config
    beside speculators' layout records SpecForge as the trainer."""
    tiny_target(tmp_path / "t")
    write_draft(tmp_path / "d", _speculators_layout(ids=(0, 3, 6)), tiny_weights(key_style="layers.0"))
    (tmp_path / "d" / "training_config.json").write_text(json.dumps(
        {"target_model_path": "t", "draft_model_config": "c.json", "ttt_length": 7}))
    data = json.loads(run(tmp_path / "d", "--target", tmp_path / "t", "--engine", "vllm", "--json").output)
    assert data["summary"]["trained_physical"] == [0, 3, 6]
    [differ] = [f for f in data["findings"] if f["severity"] == "error"]
    assert differ["rule_id"] == "captured-layers-differ" and "SpecForge" in differ["message"]
    assert "eagle_aux_hidden_state_layer_ids [1, 4, 7]" in differ["fix"]
