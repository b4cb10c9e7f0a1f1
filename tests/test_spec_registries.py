"""doctor's load prediction (``draft-arch-unsupported``) held to both engines' own code: the classes
SGLang 0.5.23's registry holds (the ``EntryClass`` of its installed ``models/*.py``, read as source) and
its config parser, and what vLLM 0.32 makes of each draft config (its own config parser and
``EAGLEConfig`` run in the vLLM venv, its ``_SPECULATIVE_DECODING_MODELS``)."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
from pathlib import Path

import pytest

from draftscope.spec import sglang, vllm
from testbed.vllm_server import vllm_python
from tests.spec_fixtures import tiny_draft_config

ARCHS = ["LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "LlamaForCausalLM", "Eagle3Speculator",
         "Qwen3ForCausalLM", "Eagle3Qwen3ForCausalLM", "DeepseekV3ForCausalLM", "Eagle3DeepseekV2ForCausalLM",
         "MistralForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLMEagle"]


def _configs() -> dict[str, dict]:
    """Draft configs by name: SGLang's layout under each architecture, speculators' layout per model type."""
    out = {f"arch-{a}": tiny_draft_config(architectures=[a]) for a in ARCHS}
    body = tiny_draft_config(ids=None)
    body.pop("architectures")
    for model_type in ("llama", "qwen3", "mistral"):
        out[f"speculators-{model_type}"] = {
            "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": {**body, "model_type": model_type}, "draft_vocab_size": 256,
            "eagle_aux_hidden_state_layer_ids": [1, 4, 7],
            "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"speculative_tokens": 3}],
                                   "verifier": {"name_or_path": "t"}}}
    return out


def _sglang_models() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("SGLang is not installed in this venv")
    return Path(spec.submodule_search_locations[0]) / "srt" / "models"


@functools.lru_cache(maxsize=1)
def _entry_classes(models: Path) -> frozenset[str]:
    """The class names every ``models/*.py`` lists as ``EntryClass`` (SGLang's registry)."""
    names: set[str] = set()
    for path in models.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
                values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                names |= {v.id for v in values if isinstance(v, ast.Name)}
    return frozenset(names)


def test_sglang_registry_holds_the_draft_classes():
    entries = _entry_classes(_sglang_models())
    assert sglang.EAGLE3_DRAFT_CLASSES <= entries
    assert {n for n in entries if "Eagle3" in n} == sglang.EAGLE3_DRAFT_CLASSES
    assert {"LlamaForCausalLM", "Qwen3ForCausalLM", "DeepseekV3ForCausalLM"} <= entries  # full target models


@pytest.mark.parametrize("name", list(_configs()))
def test_sglang_load_prediction(name, tmp_path):
    """SGLang builds an EAGLE-3 head exactly when transformers parses the config and the first class its
    registry knows is one of its EAGLE-3 draft classes."""
    from transformers import AutoConfig

    config = _configs()[name]
    (tmp_path / "config.json").write_text(json.dumps(config))
    entries = _entry_classes(_sglang_models())
    try:
        archs = AutoConfig.from_pretrained(tmp_path).architectures or []
    except ValueError as e:
        assert "model_type" in str(e)
        archs = None
    built = next((a for a in archs if a in entries), None) if archs is not None else None
    cls, why = sglang.draft_class(config)
    assert cls == (built if built in sglang.EAGLE3_DRAFT_CLASSES else None), (name, archs, built, why)
    assert cls is not None or why


VLLM_SCRIPT = r"""
import json, sys
from vllm.transformers_utils.config import HFConfigParser
from vllm.transformers_utils.configs.eagle import EAGLEConfig
from vllm.transformers_utils.configs.speculators import SpeculatorsConfig
from vllm.model_executor.models.registry import _SPECULATIVE_DECODING_MODELS
out = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        _, config = HFConfigParser().parse(path, trust_remote_code=False)
        if not isinstance(config, (EAGLEConfig, SpeculatorsConfig)):  # config/speculative.py does this
            config = EAGLEConfig(config, method="eagle3", model_type="eagle")
        archs = list(config.architectures or [])
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}"}
        continue
    found = next((_SPECULATIVE_DECODING_MODELS[a] for a in archs if a in _SPECULATIVE_DECODING_MODELS), None)
    out[name] = {"archs": archs, "entry": found}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def vllm_made(tmp_path_factory) -> dict:
    """What vLLM's own config code and registry make of each config (one vLLM import for all)."""
    try:
        python = vllm_python()
    except FileNotFoundError as e:
        pytest.skip(f"vLLM venv absent: {e}")
    root = tmp_path_factory.mktemp("vllm-configs")
    paths = {}
    for name, config in _configs().items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
        paths[name] = str(root / name)
    done = subprocess.run([str(python), "-c", VLLM_SCRIPT, json.dumps(paths)], capture_output=True, text=True,
                          timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, done.stderr[-3000:]
    return json.loads(line[len("RESULT"):])


def test_vllm_registry_holds_the_draft_classes(vllm_made):
    registry = (vllm_python().parent.parent.glob("lib/python3*/site-packages/vllm/model_executor/models/registry.py"))
    text = next(registry).read_text()
    tree = ast.parse(text)
    [node] = [n for n in tree.body if isinstance(n, ast.Assign)
              and any(getattr(t, "id", None) == "_SPECULATIVE_DECODING_MODELS" for t in n.targets)]
    models = ast.literal_eval(node.value)
    eagle3 = {name: cls for name, (module, cls) in models.items() if module.endswith("eagle3")}
    assert eagle3 == vllm.EAGLE3_REGISTRY


@pytest.mark.parametrize("name", list(_configs()))
def test_vllm_load_prediction(name, vllm_made):
    made = vllm_made[name]
    built = made.get("entry")
    expected = built[1] if built and built[0].endswith("eagle3") else None
    cls, why, _ = vllm.draft_class(_configs()[name])
    assert cls == expected, (name, made, why)
    assert cls is not None or why
