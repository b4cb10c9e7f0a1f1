"""What one engine's plugin holds in a process: its hook handles and its tracer (``core.TracerCore`` inside),
with ``detach`` and ``live``, the same for every engine."""

from __future__ import annotations

import os
from typing import Any, List, Optional

from draftscope_tracer.engine.hooks import HookHandle


class Attachment:
    """``handles``: the plugin's hooks, kept so each can be removed; ``tracer``: this process's tracer (an
    engine's tracer, with its ``core``), None until the plugin made one."""

    def __init__(self, forked: bool = False):
        """``forked``: the engine forks its serving processes from one where the plugin may have made a tracer
        (vLLM): a tracer is live only once attached, and only in the process that made it."""
        self.handles: List[HookHandle] = []
        self.tracer: Optional[Any] = None
        self.forked = forked

    def live(self) -> Optional[Any]:
        """The tracer, when its hooks should work (active; with ``forked``, also attached, in this process)."""
        t = self.tracer
        if t is None or not t.core.active:
            return None
        if self.forked and not (t.core.attached and t.core.pid == os.getpid()):
            return None
        return t

    def detach(self) -> None:
        """Remove every hook and flush; safe to call twice."""
        for h in self.handles:
            h.remove()
        if self.tracer is not None:
            self.tracer.core.close()
