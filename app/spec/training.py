"""The trainer's own config (SpecForge's arguments, a training YAML/JSON) saved beside a draft.

Read when it sits next to the draft under a known name or is given with ``--training-config``; its
settings are what the trainer actually used, so they are checked against the checkpoint's
config.json and settle which trainer (and layer-id convention) produced the draft.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftscope.spec.errors import SpecError

TRAINING_CONFIG_NAMES = ("training_config.yaml", "training_config.yml", "training_config.json")
# setting -> the keys trainers write it under (dashes read as underscores; nested mappings searched)
KEYS = {"aux_layer_ids": ("eagle_aux_hidden_state_layer_ids", "aux_hidden_state_layer_ids",
                          "aux_layer_ids", "aux_layers"),
        "target_hidden_size": ("target_hidden_size",),
        "hidden_size": ("hidden_size",),
        "vocab_size": ("vocab_size",),
        "draft_vocab_size": ("draft_vocab_size",),
        "max_length": ("max_length", "max_seq_length", "max_seq_len", "model_max_length")}


def find_training_config(directory: Path) -> Path | None:
    """The first of TRAINING_CONFIG_NAMES present in the draft directory."""
    return next((directory / n for n in TRAINING_CONFIG_NAMES if (directory / n).is_file()), None)


def read_training(path: str | Path) -> dict[str, Any]:
    """The training config as a mapping; a ``draft_model_config`` path beside it is read in."""
    path = Path(path)
    data = _load(path)
    ref = data.get("draft_model_config") or data.get("draft-model-config")
    if isinstance(ref, str) and (path.parent / ref).is_file():
        data = {**data, "draft_model_config": _load(path.parent / ref)}
    return data


def training_settings(training: dict[str, Any]) -> dict[str, Any]:
    """The settings draftscope compares (KEYS), each from its shallowest key; absent ones omitted."""
    flat: list[tuple[str, Any]] = []  # breadth first: a top-level key beats a nested one
    queue = [training]
    while queue:
        node = queue.pop(0)
        for key, value in node.items():
            if isinstance(value, dict):
                queue.append(value)
            elif value is not None:
                flat.append((str(key).replace("-", "_"), value))
    found = {}
    for setting, names in KEYS.items():
        value = next((v for k, v in flat if k in names), None)
        try:
            if setting == "aux_layer_ids" and isinstance(value, list):
                found[setting] = [int(i) for i in value]
            elif value is not None and setting != "aux_layer_ids":
                found[setting] = int(value)
        except (TypeError, ValueError):
            continue  # not a number: nothing to compare
    return found


def _load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(path, f"cannot be read ({exc.strerror or exc}).") from exc
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # yaml and json raise different types
        raise SpecError(path, f"is not a valid training config ({exc}).") from exc
    if not isinstance(data, dict):
        raise SpecError(path, "is not a mapping of training settings.")
    return data
