"""expect_vllm: vLLM 0.32's behaviour at the edges the served scenarios do not reach
(tests/test_vllm_scenarios.py serves the others), and the source it cites, re-checked against the
vLLM venv's files (read as text: importing vLLM takes seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftscope.findings import static_findings
from draftscope.spec import expect, read_draft, read_target
from draftscope.spec.vllm import SRC, TARGETS, ids_capturing
from testbed.vllm_server import vllm_python
from tests.spec_fixtures import tiny_draft_config, tiny_target, tiny_weights, write_draft


def vllm_source() -> Path:
    try:
        venv = vllm_python().parent.parent
    except FileNotFoundError as e:
        pytest.skip(f"vLLM test bed absent: {e}")
    return next(venv.glob("lib/python3*/site-packages/vllm"))


def test_cited_sources_exist():
    root = vllm_source()
    for key, cite in SRC.items():
        path, _, where = cite.partition("::")
        func = where.split(" ")[0].split(".")[-1]
        assert f"def {func}" in (root / path).read_text(), (key, cite)


def test_target_classes_capture_through_the_ids():
    """Every target class draftscope says vLLM captures ``hidden_states[id]`` for exists in vLLM's registry."""
    registry = (vllm_source() / "model_executor/models/registry.py").read_text()
    assert all(f'"{cls}"' in registry for cls in TARGETS), [c for c in TARGETS if f'"{c}"' not in registry]


def served(tmp_path, ids, weights=None, layers=8):
    target = read_target(tiny_target(tmp_path / "target", layers=layers))
    draft = write_draft(tmp_path / "draft", tiny_draft_config(ids=ids), weights or tiny_weights())
    spec = read_draft(draft, target_layers=target.num_layers)
    exp = expect("vllm", spec, target)
    return exp, static_findings(spec, target, exp)


def test_id_l_is_the_last_layers_output(tmp_path):
    """vLLM captures hidden_states[L] (after the last layer); SGLang never can: the ids that feed the
    output of layer 7 exist only on vLLM."""
    exp, _ = served(tmp_path, [1, 4, 8])
    assert exp.captured_physical == [0, 3, 7] and not exp.dropped_layers and exp.fc_runs
    target = read_target(tiny_target(tmp_path / "t2"))
    assert ids_capturing([0, 3, 7], target) == [1, 4, 8]
    assert ids_capturing([3, 0, 7], target) is None, "vLLM sorts the ids: this order cannot be fed"


@pytest.mark.parametrize("ids, dropped, count", [([1, 4, 9], [9], 2), ([1, 4, 4], [], 2)])
def test_ids_past_l_or_twice_are_short(tmp_path, ids, dropped, count):
    exp, found = served(tmp_path, ids)
    assert (exp.dropped_layers, exp.aux_count, exp.fc_shape_error) == (dropped, count, True)
    assert found[0].rule_id == "aux-count-short" and "vLLM" in found[0].message


def test_a_missing_parameter_loads_silently(tmp_path):
    """Eagle3LlamaForCausalLM.load_weights reports no loaded set, so vLLM checks none: a parameter no
    key fills stays uninitialised and the server starts."""
    weights = {k: v for k, v in tiny_weights().items() if k != "norm.weight"}
    exp, found = served(tmp_path, [1, 4, 6], weights)
    assert exp.load_error is None and exp.params_missing == ["model.norm.weight"]
    assert found[0].rule_id == "draft-weights-not-loaded" and "vLLM" in found[0].message
