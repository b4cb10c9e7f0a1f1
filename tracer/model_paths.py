"""Model paths recorded relative to a models root (``DRAFTSCOPE_MODELS_ROOT``), so that a run record
names ``./target`` or ``./drafts/eagle3-v2`` rather than the recording machine's folders (the ``./``
tells such a path from a hub id, ``org/name``). Without the
variable paths stay as SGLang or vLLM holds them: a dashboard on the same host reads the checkpoints
from them (static findings). A dashboard that reads the checkpoints of relative paths resolves them
against its own ``DRAFTSCOPE_MODELS_ROOT`` (``draftscope.spec.block.model_dir``)."""

from __future__ import annotations

import os
import re
from typing import Any, Optional


def relative_to_root(value: Any, root: Optional[str]) -> Any:
    """``value`` (a JSON-like run record) with every mention of ``root`` made relative: ``root/x``
    becomes ``./x`` and ``root`` itself ``.``, in values and keys, wherever they sit in a string (a path, a
    ``_name_or_path``, an error message). ``root`` None or empty: ``value`` unchanged."""
    if not root:
        return value
    base = os.path.normpath(os.path.abspath(root))
    pattern = re.compile(re.escape(base) + r"(?:/+|(?![^\s\"',;:)\]}]))")

    def text(s: str) -> str:
        return pattern.sub(lambda m: "./" if m.group(0).endswith("/") else ".", s) if base in s else s

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return text(v)
        if isinstance(v, dict):
            return {walk(k) if isinstance(k, str) else k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return v

    return walk(value)
