"""Owned hook handles over SGLang's ``HookRegistry`` (which itself has no removal)."""

from __future__ import annotations

import pkgutil
from typing import Callable, List


class HookHandle:
    """One AROUND hook on ``target``; ``remove()`` makes it a pass-through and unpatches when it can."""

    def __init__(self, target: str, around: Callable):
        self.target = target
        self.active = True
        self._around = around

        def hook(original, *args, **kwargs):
            if not self.active:
                return original(*args, **kwargs)
            return around(original, *args, **kwargs)

        self.hook = hook

    def remove(self) -> None:
        """Idempotent. Restores the original attribute when our wrapper is the outermost one."""
        if not self.active:
            return
        self.active = False
        owner_path, attr = self.target.rsplit(".", 1)
        try:
            owner = pkgutil.resolve_name(owner_path)
            current = getattr(owner, attr)
            if self.hook in (c.cell_contents for c in (getattr(current, "__closure__", None) or ())):
                setattr(owner, attr, current.__wrapped__)
        except Exception:
            pass  # stays a pass-through


def unresolved(targets: List[str]) -> List[str]:
    """The targets among ``targets`` that cannot be resolved in this SGLang (empty: all fine)."""
    bad = []
    for target in targets:
        owner_path, attr = target.rsplit(".", 1)
        try:
            if not callable(getattr(pkgutil.resolve_name(owner_path), attr)):
                bad.append(target)
        except Exception:
            bad.append(target)
    return bad


def register(handles: List[HookHandle]) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for h in handles:
        HookRegistry.register(h.target, h.hook, HookType.AROUND)
