"""One vLLM engine step's token ids on CUDA, read back without waiting for the GPU.

On CUDA the rejection sampler's output (``sampled_token_ids [R, k + 1]``, ``-1`` where rejected), the drafts
the step verified (``SpecDecodeMetadata.draft_token_ids``: on the device only under async scheduling, where
the scheduler's ``scheduled_spec_decode_tokens`` hold ``-1`` placeholders) and the position of each recorded
verify's first row are copied without blocking into one pinned slot (``devicecopy.HostInts``) when the step's
hook runs. Which elements belong to which request comes from vLLM's CPU metadata alone (``step_layout``).

The copy is read on the hooks' thread once its event has completed (:meth:`Ledger.drain`, called by every
later hook: ``Event.query`` never waits), usually one engine step later: the sampled requests' totals are
counted then and their verify records queued for the recorder (an unsampled request is neither copied nor
counted: its totals are vLLM's, as on SGLang). The totals must be known on this thread: the scheduler's hook
compares them with vLLM's counters when a request ends, in the same process.

Async scheduling (vLLM's default on CUDA) schedules step ``t + 1`` before step ``t``'s output is read, so a
request that ends at step ``t`` also runs in step ``t + 1``, whose output vLLM discards. When the scheduler frees
a request (same process) it has counted its verify steps; the request's steps past that count are the discarded
ones, whether their copies were read by then or not (a tiny model's GPU may be a step ahead of the host): they
are neither counted nor recorded (:meth:`Ledger.freeing`, :meth:`Ledger.keeps`).
"""

from __future__ import annotations

from collections import deque
from functools import partial
from operator import le
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from draftscope_tracer.device.devicecopy import HostInts, device_index
from draftscope_tracer.engine.vllm.step_layout import Verify, built


# a step's positions up to its last verify's row are copied whole when that is at most this many (two CUDA calls
# fewer than gathering the verifies' rows: the index's copy to the device and the gather); a decode step of 256
# requests with 3 drafts each has 1,024
WHOLE_POSITIONS = 1024


class StepIds(NamedTuple):
    """One step's copies and what they mean: ``counted``: ``(batch index, rid, drafts)`` of every sampled request that
    verified drafts; ``verify``: those of them recorded this step (``step_layout.Verify``); ``done``: called with
    the resolved :class:`Resolved` once the copy has completed."""

    ints: HostInts
    width: int  # k + 1: the sampled ids per request
    drafts: bool  # whether the verifies' drafts were copied
    counted: List[Tuple[int, str, int]]
    verify: List[Verify]
    positions: bool  # whether the verifies' first positions were copied (after the drafts)
    done: Callable


class Resolved(NamedTuple):
    """A step's ids as plain ints: per counted request its kept ids (``-1`` left out), per recorded verify its
    drafted tokens and its first row's position."""

    kept: Dict[int, List[int]]  # batch index -> accepted drafts then the bonus token
    drafted: List[List[int]]  # per ``StepIds.verify`` entry
    positions: List[int]


def copy(sampled: torch.Tensor, draft_ids: Optional[torch.Tensor], positions: Optional[torch.Tensor],
         counted: List[Tuple[int, str, int]], verify: List[Verify]) -> Tuple[Optional[HostInts], bool, bool]:
    """(the pinned copy of a step's ids, whether it holds the drafts, whether it holds positions), never waiting:
    the ``counted`` requests' rows of ``sampled``, the ``verify`` entries' elements of ``draft_ids``, and
    ``positions`` at each one's first row (gathered on the device), joined on the device into one copy. The copy is
    None when no pinned slot was free."""
    W = int(sampled.shape[-1])
    parts = [(sampled.reshape(-1), [i * W + j for i, _, _ in counted for j in range(W)])]
    with_drafts = draft_ids is not None and draft_ids.numel() > 0
    if with_drafts:
        parts.append((draft_ids, [o for v in verify for o in range(v.draft_offset, v.draft_offset + v.drafts)]))
    with_positions = bool(verify) and positions is not None and positions.dim() == 1
    if with_positions:
        first = [v.first_row for v in verify]
        last = max(first) + 1  # vLLM's buffer holds max_num_tokens; the step's rows are its first ones
        if last <= WHOLE_POSITIONS:  # copied whole up to the last verify's row with the rest, read on the host
            parts.append((positions[:last], first))
        else:  # a step with a long prompt chunk: only the verifies' rows gathered on the device
            index = device_index(first, positions.device)
            if index is None:
                return None, False, False
            parts.append((positions.index_select(0, index), list(range(len(verify)))))
    ints = HostInts(_joined(parts))
    return (ints if ints.ok else None), with_drafts, with_positions


def _joined(parts: List[Tuple[torch.Tensor, List[int]]]) -> List[Tuple[torch.Tensor, List[int]]]:
    """``parts`` as one ``(tensor, index)`` pair when they are on one device (one ``cat`` there, widened to the widest
    dtype, then one copy to the host instead of one per part)."""
    if len(parts) < 2 or len({t.device for t, _ in parts}) > 1:
        return parts
    index, at = [], 0
    for t, i in parts:
        index += map(at.__add__, i)
        at += t.numel()
    return [(torch.cat([t for t, _ in parts]), index)]


_KEPT = partial(le, 0)  # a sampled id, not -1 (rejected): tested in C, not in a comprehension


def resolve(step: StepIds, values: List[int]) -> Resolved:
    """The flat ``HostInts`` values of ``step`` as per-request lists."""
    W, at = step.width, len(step.counted) * step.width
    kept = {i: list(filter(_KEPT, values[n * W:(n + 1) * W])) for n, (i, _, _) in enumerate(step.counted)}
    drafted = []
    for v in step.verify:
        d = v.drafts if step.drafts else 0
        drafted.append(values[at:at + d])
        at += d
    positions = values[at:] if step.positions else [None] * len(step.verify)
    return built(Resolved, (kept, drafted, positions))


class Ledger:
    """The steps whose copies are not read yet, oldest first (the hooks' thread only)."""

    def __init__(self):
        self._steps: deque = deque()
        self._kept: Dict[str, int] = {}  # rid being freed -> its verify steps vLLM counted
        self._freed: Dict[str, int] = {}  # rid freed -> steps added by then (forgotten once those are read)
        self._added = 0  # steps added so far
        self._read = 0  # steps read so far

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, step: StepIds) -> None:
        self._steps.append(step)
        self._added += 1

    def freeing(self, rid: str, verify_steps: int) -> None:
        """The scheduler is freeing ``rid`` after counting ``verify_steps`` of its verify steps: its later ones are
        vLLM's discarded steps (async scheduling)."""
        self._kept[rid] = verify_steps

    def freed(self, rid: str) -> None:
        """``rid``'s record is written: whatever of it is read from now on is left out."""
        self._kept.pop(rid, None)
        if self._steps:
            self._freed[rid] = self._added

    def limited(self) -> bool:
        """Whether some request is being freed or was freed with steps unread: else :meth:`keeps` is True."""
        return bool(self._kept or self._freed)

    def keeps(self, rid: str, ordinal: int) -> bool:
        """Whether ``rid``'s verify step number ``ordinal`` (0-based) counts: not after its record was written,
        nor past the verify steps vLLM counted for it."""
        return rid not in self._freed and ordinal < self._kept.get(rid, ordinal + 1)

    def drain(self, wait: bool = False) -> int:
        """Read every step whose copy has completed, oldest first (``wait``: all of them, waiting: at close
        only); each step's ``done`` gets its :class:`Resolved`. Returns the steps read."""
        n = 0
        while self._steps and (wait or self._steps[0].ints.ready()):
            step = self._steps.popleft()
            step.done(resolve(step, step.ints.result()))
            self._read += 1
            n += 1
        if self._freed:
            self._freed = {rid: at for rid, at in self._freed.items() if at > self._read}
        return n

    def release(self) -> None:
        """Give every unread step's slot back (the tracer is closing without reading them)."""
        while self._steps:
            self._steps.popleft().ints.release()
