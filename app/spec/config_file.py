"""Load a ``config.json`` with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftscope.spec.errors import SpecError


def load_config(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; SpecError when missing, unreadable or not a JSON object."""
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise SpecError(path, "does not exist. Point at a Hugging Face model directory that has a "
                        "config.json.")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, f"cannot be read ({exc}).") from exc
    except json.JSONDecodeError as exc:
        raise SpecError(path, f"is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                        f"{exc.msg}). Fix the file.") from exc
    if not isinstance(data, dict):
        raise SpecError(path, "is not a JSON object.")
    return data


def rope_of(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE theta and scaling, from either the old keys or Transformers 5 ``rope_parameters``."""
    params = config.get("rope_parameters") or {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    scaling = config.get("rope_scaling")
    if scaling is None and params:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"} or None
        if scaling and scaling.get("rope_type") == "default":
            scaling = None
    return {"theta": theta, "scaling": scaling}


# sglang/srt/utils/hf_transformers/common.py::CONTEXT_LENGTH_KEYS, in SGLang's order of preference.
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")


def derived_context_length(config: dict[str, Any]) -> int:
    """The context length SGLang 0.5.23 derives from a (text) config: the first of
    CONTEXT_LENGTH_KEYS, times the rope scaling factor unless the scaling has
    original_max_position_embeddings or is llama3; 2048 when no key is set
    (``utils/hf_transformers/common.py::get_context_length``)."""
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    factor = scaling.get("factor", 1) if isinstance(scaling, dict) else 1
    if not isinstance(scaling, dict) or "original_max_position_embeddings" in scaling \
            or scaling.get("rope_type") == "llama3":
        factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        if config.get(key) is not None:
            return int(factor * config[key])
    return 2048
