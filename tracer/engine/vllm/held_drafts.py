"""The draft's top-k a sampled request's next verify reads (``Requests.proposed``: rid -> (the summaries of one
step's draft positions, the request's row in them)): kept when the draft has run, taken by the request's next
verify record, given back to their ring when no record will read them. The requests drafted in one step share
that step's summaries. The runner's thread only.
"""

from __future__ import annotations

from typing import AbstractSet, Iterable

from draftscope_tracer.engine.vllm.requests import Requests
from draftscope_tracer.engine.vllm.step_layout import Verify


class HeldDrafts:
    """The draft's top-k held for each sampled request's next verify."""

    def __init__(self, requests: Requests):
        self.requests = requests

    def keep(self, ctx) -> None:
        """What this step drafted (``ctx``: ``step.StepContext``) is verified at each request's next step: its top-k
        kept until then."""
        if not ctx.draft_topk:
            return
        copies = tuple(ctx.draft_topk)
        for p in ctx.picks:
            self.forget(p.rid)
        self.requests.proposed.update({p.rid: (copies, j) for j, p in enumerate(ctx.picks)})

    def forget(self, rid: str) -> None:
        """``rid``'s draft top-k waiting for a verify goes back to its ring unless another request still waits on
        the same launch."""
        held = self.requests.proposed.pop(rid, None)
        if held is None or any(v[0] is held[0] for v in self.requests.proposed.values()):
            return
        for c in held[0]:
            c.release()

    @staticmethod
    def release(verify: Iterable[Verify], kept: AbstractSet[int] = frozenset()) -> None:
        """Give the draft top-k the ``verify`` entries took back to its ring, but for the summaries in ``kept`` (the
        ids of those a queued record reads)."""
        for v in verify:
            for c in (v.draft[0] if v.draft is not None else ()):
                if id(c) not in kept:
                    c.release()

