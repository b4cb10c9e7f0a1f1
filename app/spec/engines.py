"""One entry per serving engine draftscope models: its expectations and how it reads aux ids.

``engine`` is ``"sglang"`` (0.5.23) or ``"vllm"`` (0.32); a run names its engine in its facts.
"""

from __future__ import annotations

from typing import Any

from draftscope.spec import sglang, vllm
from draftscope.spec.draft import DraftFeatureSpec
from draftscope.spec.expectations import Expectations, engine_label
from draftscope.spec.target import TargetSpec

SGLANG_PATH = {"plus1": "SGLang's Llama-family path", "first1": "SGLang's DeepSeek path"}


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
