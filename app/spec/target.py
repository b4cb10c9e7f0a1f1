"""The target model as the draft sees it: layers, hidden width, vocabulary, positions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftscope.spec.config_file import derived_context_length, load_config, rope_of
from draftscope.spec.errors import SpecError


@dataclass
class TargetSpec:
    """Normalised target config. For multimodal wrappers (Kimi-K2.5, Qwen2.5-VL) the numbers come
    from the nested ``text_config``; ``architecture`` stays the wrapper's, which is the class that
    SGLang instantiates."""

    path: str
    architecture: str
    model_type: str | None
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None
    rope: dict[str, Any] = field(default_factory=dict)
    text_config_nested: bool = False
    context_length: int = 2048  # what SGLang derives (config_file.derived_context_length)


def read_target(source: str | Path | dict[str, Any]) -> TargetSpec:
    """A TargetSpec from a model directory, a config.json path, or an already-loaded config dict."""
    if isinstance(source, dict):
        config, where = source, Path("<target config>")
    else:
        where = Path(source)
        config = load_config(where)
        where = where / "config.json" if where.is_dir() else where
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    body = text or config
    archs = config.get("architectures") or body.get("architectures") or []
    missing = [k for k in ("num_hidden_layers", "hidden_size", "vocab_size") if body.get(k) is None]
    if missing or not archs:
        missing += [] if archs else ["architectures"]
        raise SpecError(where, f"is not a target model config: it lacks {', '.join(missing)}"
                        f"{' (looked in text_config too)' if text else ''}. Pass the target model "
                        "directory (the one SGLang serves with --model-path).")
    return TargetSpec(path=str(where.parent if where.name == "config.json" else where),
                      architecture=archs[0], model_type=body.get("model_type"),
                      num_layers=int(body["num_hidden_layers"]), hidden_size=int(body["hidden_size"]),
                      vocab_size=int(body["vocab_size"]),
                      max_position_embeddings=body.get("max_position_embeddings"),
                      rope=rope_of(body), text_config_nested=text is not None,
                      context_length=derived_context_length(body))


def recorded_target(facts: dict[str, Any]) -> TargetSpec:
    """The target as the tracer's attach-time facts (``facts["target"]``) describe it: the fields
    the capture rules read, zero where the facts do not say."""
    return TargetSpec(path=facts.get("path") or "", architecture=facts.get("architecture") or "",
                      model_type=None, num_layers=int(facts.get("num_layers") or 0),
                      hidden_size=int(facts.get("hidden_size") or 0),
                      vocab_size=int(facts.get("vocab_size") or 0), max_position_embeddings=None)


def check_target_matches(spec: Any, target: TargetSpec) -> None:
    """SpecError when ``target`` is plainly not the model the draft ``spec`` was trained on: its
    hidden width differs from the width each aux state must have."""
    if spec.target_hidden_size != target.hidden_size:
        raise SpecError(Path(target.path) / "config.json",
                        f"has hidden_size {target.hidden_size}, but the draft at {spec.path} expects "
                        f"aux hidden states {spec.target_hidden_size} wide (target_hidden_size). "
                        "This is not the draft's target; pass the target model the draft was "
                        "trained for.")
