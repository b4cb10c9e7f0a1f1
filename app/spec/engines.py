"""One entry per serving engine draftscope models: its expectations and how it reads aux ids.

``engine`` is ``"sglang"`` (0.5.23) or ``"vllm"`` (0.32); a run names its engine in its facts.
"""

from __future__ import annotations

from typing import Any

from draftscope.spec import sglang, vllm
from draftscope.spec.draft import RECORDED_KEY, DraftFeatureSpec
from draftscope.spec.expectations import NAMES, Expectations, engine_label
from draftscope.spec.target import TargetSpec

SGLANG_PATH = {"plus1": "SGLang's Llama-family path", "first1": "SGLang's DeepSeek path"}
# Where a fix writes the ids for each engine: SGLang reads only eagle_config; vLLM reads the config's top
# level first (gpu_model_runner.py::_get_eagle3_aux_layers_from_config), so ids written there leave
# SGLang's eagle_config ids alone and one config can serve both engines.
IDS_PATH = {"sglang": "eagle_config.eagle_aux_hidden_state_layer_ids", "vllm": "eagle_aux_hidden_state_layer_ids"}
IDS_WHERE = {"sglang": "", "vllm": " at the config's top level, which vLLM reads before eagle_config"}


def expect(engine: str, spec: DraftFeatureSpec, target: TargetSpec, server_args: dict[str, Any] | None = None,
           env: dict[str, str] | None = None) -> Expectations:
    """What ``engine`` will do with this pair (``env``: the server's variables, read by SGLang only)."""
    if engine == "vllm":
        return vllm.expect_vllm(spec, target, server_args)
    return sglang.expect_sglang(spec, target, server_args, env)


def engine_of(facts: dict[str, Any] | None) -> str:
    """The engine a run's facts were recorded in (the vLLM tracer records ``vllm_version``)."""
    return "vllm" if (facts or {}).get("vllm_version") else "sglang"


def ids_capturing(physical: list[int], target: TargetSpec, engine: str = "sglang") -> list[int] | None:
    """The ids that make ``engine`` feed the output of exactly ``physical``; None when none can."""
    return (vllm.ids_capturing if engine == "vllm" else sglang.ids_capturing)(physical, target)


def ids_fix(engine: str, ids: list[int], physical: list[int]) -> str:
    """The one wording of a fix that writes ``ids`` (``ids_capturing(physical)``) for ``engine``: the
    finding's, the run page's and the compare note's."""
    return (f"write {IDS_PATH[engine]} {ids}{IDS_WHERE[engine]} ({NAMES[engine]} then captures the output of layers "
            f"{physical}, hidden_states{[p + 1 for p in physical]})")


def ids_patch(engine: str, ids: list[int], physical: list[int]) -> list[dict[str, Any]]:
    """``ids_fix`` as ``doctor --fix`` edits: the ids where ``engine`` reads them, and the trained
    layers recorded (``RECORDED_KEY``) so that neither engine re-reads the rewritten ids."""
    return [{"op": "config_set", "path": IDS_PATH[engine], "value": ids},
            {"op": "config_set", "path": RECORDED_KEY, "value": physical}]


def no_ids_fix(physical: list[int], target: TargetSpec, engine: str) -> str:
    """Why no ids make ``engine`` capture ``physical``: the retrain advice, only when none can."""
    last = target.num_layers - 1
    why = (f"the output of layer {last}, the last decoder layer, is never captured"
           if engine == "sglang" and last in physical else
           f"no id list makes {NAMES[engine]} capture exactly those on {target.architecture or 'this target'}")
    return (f"no {'eagle_config' if engine == 'sglang' else 'aux'} ids can ({why}): use a draft trained on layers {NAMES[engine]} can capture "
            "(retrain with those ids)")


def reading(ids: list[int] | None, target: TargetSpec, engine: str = "sglang") -> str | None:
    """How ``engine`` reads explicit ids on this target (output_of | input_to); None when unknown."""
    if engine == "vllm":
        return "input_to" if ids is not None and target.architecture in vllm.TARGETS else None
    return sglang.sglang_reading(ids, target)


def path(architecture: str | None, engine: str = "sglang") -> str:
    """How a verdict names the engine's capture for this target class."""
    if engine == "vllm":
        return engine_label("vllm")
    return SGLANG_PATH.get(sglang.CAPTURE_SHIFT.get(architecture or ""), "SGLang")


def draft_norms(engine: str) -> dict[str, dict[str, str]]:
    """Draft class -> the EAGLE-3.1 flags the engine applies there, with where."""
    return vllm.DRAFT_NORMS if engine == "vllm" else sglang.DRAFT_NORMS
