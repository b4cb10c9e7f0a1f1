"""expect_sglang: SGLang 0.5.23's behaviour, and the source it cites, re-checked against the venv."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sglang
from draftscope.spec import expect_sglang, parse_server_args, read_draft, read_target
from draftscope.spec.sglang import CAPTURE_SHIFT, SRC
from tests.spec_fixtures import tiny_draft_config, tiny_target, tiny_weights, write_draft

SRT = Path(sglang.__file__).parent / "srt"


def _methods() -> dict[str, str]:
    """class name -> source of its set_eagle3_layers_to_capture, over sglang/srt/models."""
    found, first_base = {}, {}
    for path in (SRT / "models").glob("*.py"):
        text = path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "set_eagle3_layers_to_capture":
                        found[node.name] = ast.get_source_segment(text, item)
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                first_base.setdefault(node.name, bases[0] if bases else None)
    for cls in first_base:  # inherited through a first base defined in another module
        base = first_base[cls]
        while cls not in found and base is not None:
            if base in found:
                found[cls] = found[base]
            base = first_base.get(base)
    return found


def test_capture_shift_table_matches_installed_sglang():
    methods = _methods()
    for cls, rule in CAPTURE_SHIFT.items():
        if cls == "KimiK25ForConditionalGeneration":
            assert "language_model.set_eagle3_layers_to_capture" in methods[cls]
            continue
        src = methods[cls]
        assert "num_layers // 2" in src and "num_layers - 3" in src, cls  # the default ids
        assert ("layer_ids[0] == 1" in src) == (rule == "first1"), cls
        assert "val + 1" in src, cls


def test_cited_sources_exist():
    for key, cite in SRC.items():
        path, _, where = cite.partition("::")
        text = (SRT / path).read_text()
        func, _, note = where.partition(" ")
        assert f"def {func.split('.')[-1]}" in text, (key, cite)
        snippet = note.strip("()")
        if snippet and not snippet.startswith(("fc =", "fc only", "load_lm_head", "i in")):
            assert snippet in text, (key, snippet)


@pytest.fixture
def pair(tmp_path):
    def make(ids=(1, 4, 6), layers=8, arch="LlamaForCausalLM", **cfg):
        target = read_target(tiny_target(tmp_path / "t", layers=layers, arch=arch))
        write_draft(tmp_path / "d", tiny_draft_config(ids=ids, **cfg), tiny_weights())
        return read_draft(tmp_path / "d", target_layers=layers), target
    return make


def test_explicit_ids_plus_one(pair):
    exp = expect_sglang(*pair(), {})
    assert exp.layers_to_capture == [2, 5, 7] and exp.captured_physical == [1, 4, 6]
    assert exp.draft_input_width == 384 and exp.fc_runs and not exp.fc_shape_error
    assert exp.keys_ignored == [] and exp.params_missing == []


def test_last_layer_id_silently_dropped(pair):
    exp = expect_sglang(*pair(ids=(0, 1, 3), layers=4), {})
    assert exp.layers_to_capture == [1, 2, 4] and exp.dropped_layers == [4]
    assert exp.aux_count == 2 and exp.draft_input_width == 256 and exp.fc_shape_error


def test_default_when_ids_not_in_eagle_config(pair):
    exp = expect_sglang(*pair(ids=None, eagle_aux_hidden_state_layer_ids=[1, 4, 6]), {})
    assert exp.ids_passed is None and exp.layers_to_capture == [2, 4, 5]
    exp4 = expect_sglang(*pair(ids=None, layers=4), {})
    assert exp4.layers_to_capture == [2, 2, 1] and exp4.captured_layers == [1, 2]
    assert exp4.aux_count == 2 and exp4.fc_shape_error


def test_deepseek_shift_only_when_first_id_is_one(pair):
    spec, target = pair(ids=(2, 4, 6), arch="DeepseekV3ForCausalLM")
    assert expect_sglang(spec, target, {}).layers_to_capture == [2, 4, 6]
    spec, target = pair(ids=(1, 4, 6), arch="DeepseekV3ForCausalLM")
    assert expect_sglang(spec, target, {}).layers_to_capture == [2, 5, 7]


def test_eagle_algorithm_and_aux_off(pair):
    exp = expect_sglang(*pair(), parse_server_args("--speculative-algorithm EAGLE --tp 1"))
    assert not exp.aux_capture and exp.draft_input_width == 128 and exp.fc_runs is False
    assert exp.lm_head_source == "target" and not exp.d2t_used
    off = {"eagle_aux_hidden_state_layer_ids": [1, 4, 6], "use_aux_hidden_state": False}
    exp = expect_sglang(*pair(eagle_config=off), {})
    assert not exp.aux_capture and exp.fc_runs is False


def test_parse_server_args():
    assert parse_server_args("--speculative-algorithm=EAGLE3 --disable-cuda-graph --tp 2") == {
        "speculative_algorithm": "EAGLE3", "disable_cuda_graph": True, "tp": "2"}
