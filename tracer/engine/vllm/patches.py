"""Owned AROUND patches on engine classes that have no hook registry of their own (vLLM).

``install(handle)`` replaces ``owner.attr`` with a wrapper that calls ``handle.hook(original, ...)``;
``handle.remove()`` (``hooks.HookHandle``) restores the original when the wrapper is still the outermost
one, and otherwise leaves it a pass-through.
"""

from __future__ import annotations

import functools
import pkgutil

from draftscope_tracer.engine.hooks import HookHandle


def install(handle: HookHandle) -> None:
    owner_path, attr = handle.target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    original = getattr(owner, attr)
    hook = handle.hook

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return hook(original, *args, **kwargs)

    setattr(owner, attr, wrapper)
