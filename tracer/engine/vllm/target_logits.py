"""The target's logits at a step's sampled verify rows, for their top-k: vLLM's own (the sampler's input, held by
``plugin._around_target_logits``), read in place at those rows; a step that came without them (a runner whose
sampler hook did not run, or logits shaped otherwise than ``step_layout`` expects) has them computed again from the
hidden states by the model's ``compute_logits``, on those rows only."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch


def held(logits: Optional[torch.Tensor], logit_count: int) -> Optional[torch.Tensor]:
    """The step's logits when they have the ``logit_count`` rows ``step_layout`` expects, else None."""
    return logits if logits is not None and logits.dim() == 2 and logits.shape[0] == logit_count else None


def target_logits(runner, hidden: torch.Tensor, logits: Optional[torch.Tensor], rows: torch.Tensor,
                  logit_rows: Sequence[int]) -> Tuple[torch.Tensor, Sequence[int]]:
    """``(logits, their row of each verify row)``: the step's ``logits`` (:func:`held`) as they are, at
    ``logit_rows``; without them, ``compute_logits`` of ``hidden`` at ``rows`` (the same tokens), row i for
    ``rows[i]``."""
    if logits is not None:
        return logits, logit_rows
    return runner.model.compute_logits(hidden.index_select(0, rows)), range(len(logit_rows))
