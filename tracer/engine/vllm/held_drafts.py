"""The draft's top-k a sampled request's next verify reads (``Requests.proposed``: rid -> (its claim on the one
summary of a step's draft positions, the request's row there per position)): kept when the draft has run, taken by
the request's next verify record, given back when no record will read it. The requests drafted in one step share
that step's summary: each holds a :class:`Claim` on it, and the summary goes back to its ring only when every
claim on it is given back unread (a record that reads it keeps its bytes for the others). The runner's thread
keeps and takes claims; a record dropped in the relay gives its claim back there.
"""

from __future__ import annotations

import threading
from typing import Iterable, List

from draftscope_tracer.engine.vllm.requests import Requests
from draftscope_tracer.engine.vllm.step_layout import Verify, draft_rows


class _Launch:
    """One summary launch and how many claims on it are not given back yet."""

    __slots__ = ("pending", "claims", "lock")

    def __init__(self, pending, claims: int):
        self.pending, self.claims, self.lock = pending, claims, threading.Lock()


def _read(summary):
    """A claim unpickled is the summary it claimed (``Pending`` pickles as its bytes)."""
    return summary


class Claim:
    """One request's claim on a draft top-k launch: reads it (``result``, or pickled for the recorder) as the
    launch itself; :meth:`release` gives the claim back (the launch is freed with the last one). Twice is once."""

    __slots__ = ("_launch", "_given_back")

    def __init__(self, launch: _Launch):
        self._launch, self._given_back = launch, False

    def result(self):
        return self._launch.pending.result()

    def release(self) -> None:
        launch = self._launch
        with launch.lock:
            if self._given_back:
                return
            self._given_back = True
            launch.claims -= 1
            last = launch.claims == 0
        if last:
            launch.pending.release()

    def __reduce__(self):
        return _read, (self._launch.pending,)


def claims(pending, n: int) -> List[Claim]:
    """``n`` claims on one launch (``pending``): it is freed when the last is given back unread."""
    launch = _Launch(pending, n)
    return [Claim(launch) for _ in range(n)]


class HeldDrafts:
    """The draft's top-k held for each sampled request's next verify."""

    def __init__(self, requests: Requests):
        self.requests = requests

    def keep(self, ctx, summary, positions: int) -> None:
        """What this step drafted (``ctx``: ``step.StepContext``; ``summary``: the top-k of its ``positions`` draft
        positions, ``step_layout.draft_rows``) is verified at each pick's next step: a claim on it kept until then
        (a claim kept from an earlier step and not taken is given back)."""
        proposed = self.requests.proposed
        for p, rows, claim in zip(ctx.picks, draft_rows(positions, len(ctx.picks)), claims(summary, len(ctx.picks))):
            self.forget(p.rid)
            proposed[p.rid] = (claim, rows)

    def forget(self, rid: str) -> None:
        """``rid``'s claim on a draft top-k waiting for a verify is given back."""
        held = self.requests.proposed.pop(rid, None)
        if held is not None:
            held[0].release()

    @staticmethod
    def release(verify: Iterable[Verify]) -> None:
        """Give back the claims the ``verify`` entries took and no record will read."""
        for v in verify:
            if v.draft is not None:
                v.draft[0].release()
