"""Each engine step's verifies on CUDA, from the step to its records. When the step runs: the sampler's kept ids,
the drafts verified and the sampled verifies' positions copied without blocking into one pinned slot
(``step_ids.copy``); the sampled verify rows summarised in the drafter's hook (on vLLM's own concatenation of the
aux hidden states) or, when it did not run, after ``propose``. Once that copy is read (``step_ids.Ledger``, usually a
step later): each sampled live request's verify counted in the tracer's totals, its record queued. A
request's end tells the ledger which of its steps still count (async scheduling's discarded step: ``step_ids``).
The runner's thread only.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Dict, List, Optional, Tuple

import torch

from draftscope_tracer.engine.vllm import step_ids
from draftscope_tracer.engine.vllm.cuda_summaries import CudaSummaries
from draftscope_tracer.engine.vllm.held_drafts import Claim, HeldDrafts, claims
from draftscope_tracer.engine.vllm.requests import Requests
from draftscope_tracer.engine.vllm.step_layout import Verify, built
from draftscope_tracer.health import Health
from draftscope_tracer.transport import vllm_records
from draftscope_tracer.transport.outbox import Transport


class Target:
    """A step's verify rows before and after their summary's launch (``VerifySteps.launch``): ``args`` for
    ``CudaSummaries.target`` until then."""

    __slots__ = ("args", "summary", "layout")

    def __init__(self, args: tuple):
        self.args, self.summary, self.layout = args, None, (None, 0, None)


class VerifySteps:
    """The steps whose ids are not read yet, and what each becomes once they are."""

    def __init__(self, requests: Requests, transport: Transport, health: Health, summaries: CudaSummaries,
                 drafts: HeldDrafts):
        self.requests, self.transport, self.health = requests, transport, health
        self.summaries, self.drafts = summaries, drafts
        self.ledger = step_ids.Ledger()

    def add(self, runner, a: Dict[str, Any], counted: List[Tuple[int, str, int]], verify: List[Verify],
            rows: List[int], logits: tuple, now: float) -> Optional["Target"]:
        """One step's ids copied, never waiting; its sampled verify ``rows`` to summarise (:meth:`launch`), or None.
        ``counted``: ``(batch index, rid, drafts)`` of every sampled request that verified drafts; ``verify``: those
        recorded this step; ``logits``: the step's target logits, the verify rows' rows there and the rows they have
        (``CudaSummaries.target``)."""
        sampled, spec = a["sampled_token_ids"], a["spec_decode_metadata"]
        positions = getattr(runner, "positions", None)
        ints, with_drafts, with_positions = step_ids.copy(sampled, spec.draft_token_ids, positions if isinstance(
            positions, torch.Tensor) else None, counted, verify)
        if ints is None:  # this step's totals and records are lost (counted): the totals will differ
            self.health.drop("host_slots_full", len(counted))
            self.drafts.release(verify)
            return None
        target = Target((runner, a, rows, *logits)) if verify else None
        done = partial(self._resolved, counted, verify, target, now)
        self.ledger.add(built(step_ids.StepIds, (ints, int(sampled.shape[-1]), with_drafts, counted, verify,
                                                 with_positions, done)))
        return target

    def launch(self, target: Optional["Target"], joined: Optional[torch.Tensor] = None,
               draft_rows: Optional[List[int]] = None, chunk: Optional[int] = None) -> Optional[Claim]:
        """Summarise ``target``'s verify rows, once (``CudaSummaries.target``; ``joined``: vLLM's concatenation of
        the aux hidden states, when the drafter's hook has it). ``draft_rows``: the draft input's rows of ``joined``
        (summarised in chunks of ``chunk``); when the launch read ``joined`` in place at exactly those rows (a
        decode step: the draft receives the verify rows), a claim on it for the draft input's record, the verify
        records holding the other (``held_drafts.claims``): one launch for both. Else None."""
        if target is None or target.args is None:
            return None
        rows = target.args[2]
        target.summary, target.layout, in_place = self.summaries.target(*target.args, joined=joined)
        target.args = None
        if not in_place or target.summary is None or target.layout[0] != chunk or rows != draft_rows:
            return None
        target.summary, draft = claims(target.summary, 2)
        return draft

    def _resolved(self, counted: list, verify: List[Verify], target: Optional["Target"], now: float,
                  res: step_ids.Resolved) -> None:
        """A step's ids are read: each sampled live request's verify counted, the recorded ones' records queued."""
        summary, layout = (target.summary, target.layout) if target is not None else (None, (None, 0, None))
        book, ledger, kept = self.requests, self.ledger, res.kept
        limited = ledger.limited()  # else every step counts (no request is being freed or was freed lately)
        counts = [(rid, accepted, d) for i, rid, d in counted if (accepted := kept.get(i))]
        if limited:
            counts = [c for c in counts if ledger.keeps(c[0], book.traced.get(c[0], (0,))[0])]
        book.count_traced(counts)
        steps, dropped = [], []
        for v, drafted, pos in zip(verify, res.drafted, res.positions):
            accepted = kept.get(v.index)
            if not accepted or (limited and not ledger.keeps(v.rid, v.step)):
                dropped.append(v)
                continue
            steps.append(built(vllm_records.VerifyStep, (v.rid, v.step, pos, drafted, accepted, v.rows, v.draft)))
        self.drafts.release(dropped)  # claims on a draft's top-k no record reads
        if not steps:
            if summary is not None:
                summary.release()
            return
        copies = [s.draft[0] for s in steps if s.draft is not None]
        self.transport.submit("verify", vllm_records.verify, steps, summary, now, *layout, pendings=(summary, *copies))

    def read(self) -> None:
        """Count and record every step whose copy has completed (never waits)."""
        self.ledger.drain()

    def ended(self, rids: List[str]) -> None:
        """``rids`` ended since the last step (told at the next step when the scheduler runs in another process):
        what of theirs is read from now on is left out; their totals reported."""
        for rid in rids:
            self.ledger.freed(rid)
            self.drafts.forget(rid)
        self.requests.report_traced(rids)

    def finishing(self, rid: str) -> None:
        """The scheduler frees ``rid`` (same process): the steps read by now count, up to the verify steps vLLM
        counted for it (later ones are async scheduling's discarded steps: ``step_ids``)."""
        self.ledger.freeing(rid, self.requests.counted.get(rid, (0,))[0])
        self.ledger.drain()
        self.ledger.freed(rid)
        self.drafts.forget(rid)

    def close(self) -> None:
        """Before the last totals are reported: read every step still in flight (waits: the tracer is closing)."""
        self.ledger.drain(wait=True)
