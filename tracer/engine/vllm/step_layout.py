"""Which rows of one vLLM engine step belong to which request, worked out on the host from the metadata vLLM
keeps on the CPU (the scheduler output's ``num_scheduled_tokens``, ``SpecDecodeMetadata.num_draft_tokens``, the
attention metadata's ``query_start_loc_cpu``): the CUDA branch of the step hooks never reads a device tensor to
find its rows.

Rows: request ``i`` of ``input_batch.req_ids`` owns the target's rows ``[start_i, start_i + n_i)`` (``n_i`` its
scheduled tokens; a verify's last ``d_i + 1`` are the verified token, then its ``d_i`` drafts), rows
``[logit_i, logit_i + d_i + 1)`` of the target's logits that vLLM's sampler reads (``logits_indices``: each
request's last ``d_i + 1`` rows, in batch order), and elements ``[offset_i, offset_i + d_i)`` of
``draft_token_ids`` (the drafts of every request, in batch order).
"""

from __future__ import annotations

from itertools import accumulate, repeat
from typing import List, NamedTuple, Optional, Sequence

PREFILL_ROWS = 32  # a sampled prompt's last rows summarised (as on SGLang)
built = tuple.__new__  # ``built(Pick, (...))``: a NamedTuple from its fields without a Python call (its ``__new__``)


class Pick(NamedTuple):
    """A sampled request in one engine step: its batch index, and the step it records."""

    index: int
    rid: str
    step: int
    phase: str  # "prefill" (no drafts verified this step) | "draft_extend" (after a verify)


class Verify(NamedTuple):
    """A sampled request's verify in one step, as the host knows it before the sampler's output is read."""

    index: int  # its batch index (its row of sampled_token_ids)
    rid: str
    step: int
    rows: List[int]  # its positions in the step's target copies (the verified token, then the drafts)
    first_row: int  # its first row in the target's input (the verified token's)
    draft_offset: int  # its first element of draft_token_ids
    drafts: int
    draft: Optional[tuple]  # the draft's top-k of the step before (one summary), and its rows there


class StepRows(NamedTuple):
    """Per request of the batch: ``(batch index, rid, first row, scheduled tokens, drafts, first draft, first row
    of the target's logits, the target's rows of its verify, the same rows of the target's logits)``."""

    index: int
    rid: str
    start: int
    tokens: int
    drafts: int
    draft_offset: int
    logit: int
    verified: range  # the verified token, then the drafts
    logits: range


def step_rows(req_ids: Sequence[str], num_scheduled_tokens: dict, num_draft_tokens: Optional[Sequence[int]],
              only: Optional[Sequence[int]] = None) -> List[StepRows]:
    """The requests of the batch (``only``: those batch indices, default all) with their target rows, logits rows
    and drafts' elements (host values only; each list taken in one pass, not request by request)."""
    tokens = list(map(num_scheduled_tokens.get, req_ids, repeat(0)))
    drafts = list(num_draft_tokens) if num_draft_tokens else [0] * len(req_ids)
    starts, offsets = [0, *accumulate(tokens)], [0, *accumulate(drafts)]
    return [built(StepRows, (i, req_ids[i], starts[i], tokens[i], drafts[i], offsets[i], i + offsets[i],
                             range(starts[i + 1] - drafts[i] - 1, starts[i + 1]),
                             range(i + offsets[i], i + offsets[i + 1] + 1)))  # d + 1 logits rows
            for i in (range(len(req_ids)) if only is None else only)]


def logit_rows(req_ids: Sequence[str], num_draft_tokens: Optional[Sequence[int]]) -> int:
    """Rows of the target's logits of a step (every request's ``d + 1``)."""
    return len(req_ids) + (sum(num_draft_tokens) if num_draft_tokens else 0)


def draft_input_rows(query_start_loc: Sequence[int], picks: Sequence[Pick],
                     prompt_rows: int = PREFILL_ROWS) -> List[range]:
    """Per pick, its rows of what the draft receives: a prompt's last ``prompt_rows``, a verify's every row (the
    verified token and the drafts: vLLM's padded drafter batch keeps the rejected ones)."""
    spans = []
    for p in picks:
        lo, hi = query_start_loc[p.index], query_start_loc[p.index + 1]
        if p.phase == "prefill":
            lo = max(lo, hi - prompt_rows)
        spans.append(range(lo, hi))
    return spans


def draft_rows(positions: int, picks: int) -> List[List[int]]:
    """Per pick, its rows in one summary of a step's draft logits (``positions`` draft positions of ``picks`` rows
    each, position after position): one per position."""
    return [list(range(j, positions * picks, picks)) for j in range(picks)]
