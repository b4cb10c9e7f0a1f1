"""The summaries the vLLM step hooks' CUDA branch launches, through the device layer the SGLang tracer uses
(``device.summaries.Summaries``: one launch per summary into a pinned ring slot, its rows staged through a pinned
slot): the verify rows' (the aux hidden states' chunks, the target's top-k) and the draft's (what it received,
its ``fc`` output, its top-k at every draft position in one launch). Built at attach for the server's widths
(:meth:`prepare`), so no hook allocates pinned memory or compiles a kernel. The runner's thread only.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from draftscope_tracer.device import devicecopy
from draftscope_tracer.device.devicecopy import device_index
from draftscope_tracer.device.summaries import Summaries, capacity
from draftscope_tracer.engine.core import dtype_name
from draftscope_tracer.engine.vllm.step_layout import PREFILL_ROWS, draft_input_rows
from draftscope_tracer.engine.vllm.target_logits import held, target_logits
from draftscope_tracer.health import Health

PREPARED_REQUESTS = 64  # sampled requests per step the summary buffers are built for at attach (more: built late)


class CudaSummaries:
    """One tracer's summary launches on CUDA, and the widths they were built for."""

    def __init__(self, health: Health, topk: int):
        self.health = health
        self.summaries = Summaries(health, topk)
        self.hidden: Optional[int] = None  # the target's hidden size (one aux chunk)
        self.rows_cap: Optional[int] = None  # rows per launch the prepared Summarizers take
        self.num_spec = 1  # draft positions per step
        self._draft_rows: Optional[tuple] = None  # (key, views) of the draft logits' buffer (``_draft_buffer``)

    def prepare(self, device: torch.device, dtype: torch.dtype, hidden: int, aux: int, vocab: int,
                draft_hidden: Optional[int], num_spec: int, max_requests: int) -> dict:
        """At attach: the pinned slots, and each summary layout's buffers and compiled kernels (the verify rows
        with and without aux, the draft's input and ``fc`` output, the draft's logits); with what that reserved on
        the GPU."""
        before = devicecopy.reserved(device)
        devicecopy.prepare(device)
        requests = max(1, min(max_requests, PREPARED_REQUESTS))
        rows = self.rows_cap = capacity(requests * (num_spec + 1))
        width = aux * hidden if aux else hidden
        # (width, chunk, vocab, rows, dtype, logits dtype, gather); the target's and the draft's logits are the
        # model's dtype
        layouts = [(width, hidden, vocab, rows, dtype, dtype, False) if aux else
                   (vocab, vocab, vocab, rows, dtype, dtype, False),
                   (width, hidden, None, rows, dtype, None, False),
                   (vocab, vocab, vocab, capacity(requests * num_spec), dtype, dtype, False)]
        if draft_hidden:
            layouts.append((draft_hidden, draft_hidden, None, rows, dtype, None, False))
        self.hidden, self.num_spec = hidden, num_spec
        self.summaries.prepare(device, layouts)
        return {"prepared_rows": rows, "layouts": len(layouts),
                "reserved_bytes": devicecopy.reserved(device) - before}

    def target(self, runner, a: Dict[str, Any], rows: List[int], logits: Optional[torch.Tensor], logit_at: List[int],
               logit_count: int, joined: Optional[torch.Tensor] = None) -> tuple:
        """(summary, (chunk width, chunks, dtype), whether it read ``joined`` in place) of the verify ``rows``: the
        aux hidden states' chunks and the target's top-k there (the step's ``logits``, ``[logit_count, vocab]``,
        read in place at ``logit_at``: ``target_logits``). ``joined``: vLLM's own concatenation of the aux hidden
        states, row for row the target's (the drafter's input in its padded batch), read in place at ``rows`` when
        it is that; else the rows are gathered from each aux tensor and joined here."""
        hidden, aux = a["hidden_states"], a["aux_hidden_states"]
        logits = held(logits, logit_count)
        if aux and logits is not None and _joins(joined, aux, rows):
            H = int(aux[0].shape[-1])
            return (self.summaries.launch(joined, rows, chunk_width=H, logits=logits, logit_rows=logit_at),
                    (H, len(aux), dtype_name(aux[0])), True)
        index = device_index(rows, hidden.device)
        if index is None:
            self.health.drop("host_slots_full")
            return None, (None, 0, None), False
        logits, at = target_logits(runner, hidden, logits, index, logit_at)
        if not aux:  # the logits' own rows summarised
            return (self.summaries.launch(logits, at, chunk_width=int(logits.shape[-1]), logits=logits, stats=False),
                    (None, 0, None), False)
        joined = torch.cat([h.index_select(0, index) for h in aux], -1)
        H = int(aux[0].shape[-1])
        return (self.summaries.launch(joined, range(len(rows)), chunk_width=H, logits=logits, logit_rows=at),
                (H, len(aux), dtype_name(aux[0])), False)

    def draft_input(self, ctx, hidden: torch.Tensor, chunk: int) -> None:
        """The draft input's rows (:meth:`draft_input_rows`) of ``hidden`` summarised in chunks of ``chunk``."""
        ctx.p_in = self.summaries.launch(hidden, ctx.rows, chunk_width=chunk)

    def draft_input_rows(self, ctx, a: Dict[str, Any]) -> int:
        """The rows of what the draft receives for the sampled requests (``step_layout.draft_input_rows``; a
        prompt's rows cut so that a launch fits the Summarizer built at attach) into ``ctx`` (``step.StepContext``),
        with its width and dtype; the chunk width a summary of them takes."""
        hidden = a["target_hidden_states"]
        qsl = a["common_attn_metadata"].query_start_loc_cpu.tolist()  # a CPU tensor
        prompts = verify_rows = 0
        for p in ctx.picks:  # one loop, not a generator's frame per pick
            if p.phase == "prefill":
                prompts += 1
            else:
                verify_rows += qsl[p.index + 1] - qsl[p.index]
        per = PREFILL_ROWS if not prompts or self.rows_cap is None else \
            max(1, min(PREFILL_ROWS, (self.rows_cap - verify_rows) // prompts))
        for span in draft_input_rows(qsl, ctx.picks, per):
            ctx.groups.append(list(range(len(ctx.rows), len(ctx.rows) + len(span))))
            ctx.rows.extend(span)
        H = self.hidden or int(hidden.shape[-1])
        ctx.width, ctx.dtype = int(hidden.shape[-1]), dtype_name(hidden)
        return H if ctx.width % H == 0 else ctx.width

    def fc(self, ctx, out: torch.Tensor) -> None:
        """The draft's ``fc`` output at the draft input's rows."""
        ctx.p_fc = self.summaries.launch(out, ctx.rows, chunk_width=int(out.shape[-1]))
        ctx.fc_dtype = dtype_name(out)

    def draft_logits(self, ctx, logits: torch.Tensor) -> None:
        """The picks' rows of the draft's logits at one draft position, gathered on the device into one buffer of
        every position (:meth:`_draft_buffer`, position after position, in the first position's dtype: the summary
        reads bf16 as it is) for :meth:`draft_topk`; a position that could not be gathered leaves the step without
        the draft's top-k."""
        done = len(ctx.draft_topk or ())
        if ctx.draft_topk is None or not ctx.picks or done >= self.num_spec:
            return
        if ctx.draft_index is None:  # the picks' rows, worked out once per step
            rows = [p.index for p in ctx.picks]
            index = device_index(rows, logits.device)
            if index is None:
                self.health.drop("host_slots_full")
                ctx.draft_topk = None
                return
            ctx.draft_index = (index, max(rows))
        index, top = ctx.draft_index
        if top >= logits.shape[0]:
            return
        if ctx.draft_buf is None:
            ctx.draft_buf = self._draft_buffer(len(ctx.picks), logits)
        into = ctx.draft_buf[0][done]
        if logits.dtype == into.dtype:
            torch.index_select(logits, 0, index, out=into)
        else:  # a position in another dtype than the first: its rows converted on the way
            into.copy_(logits.index_select(0, index))
        ctx.draft_topk.append(into)

    def _draft_buffer(self, n: int, logits: torch.Tensor) -> tuple:
        """(per draft position its ``n`` rows, the first ``q + 1`` positions' rows joined) of one buffer kept from
        step to step while ``n`` and the logits' width, dtype and device stay (a step's summary reads it before the
        next step's gathers write it: both are queued on the runner's stream); the views made once."""
        key = (n, int(logits.shape[-1]), logits.dtype, logits.device)
        if self._draft_rows is None or self._draft_rows[0] != key:
            buf = torch.empty(self.num_spec * n, key[1], dtype=logits.dtype, device=logits.device)
            self._draft_rows = (key, ([buf[q * n:(q + 1) * n] for q in range(self.num_spec)],
                                      [buf[:(q + 1) * n] for q in range(self.num_spec)]))
        return self._draft_rows[1]

    def draft_topk(self, ctx):
        """One summary of the draft's top-k at every position gathered (``step_layout.draft_rows``); None when
        there is none (or it was dropped: counted)."""
        if not ctx.draft_topk:
            return None
        joined = ctx.draft_buf[1][len(ctx.draft_topk) - 1]
        return self.summaries.launch(joined, range(joined.shape[0]), chunk_width=int(joined.shape[-1]),
                                     logits=joined, stats=False)


def _joins(joined: Optional[torch.Tensor], aux: List[torch.Tensor], rows: List[int]) -> bool:
    """Whether ``joined`` is the aux hidden states side by side, with every one of ``rows``."""
    return (joined is not None and joined.dim() == 2 and joined.shape[-1] == len(aux) * aux[0].shape[-1]
            and joined.dtype == aux[0].dtype and joined.device == aux[0].device and joined.shape[0] > max(rows))
