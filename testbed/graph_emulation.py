"""CUDA-graph **emulation** for the CPU test bed: makes SGLang's `EAGLEWorkerV2` take its graph branches.

On a GPU, `EagleDraftWorker._capture_cuda_graphs` builds `EAGLEDraftCudaGraphRunner` (the whole
draft-decode loop as one graph) and `EAGLEDraftExtendCudaGraphRunner` (the draft extend after verify);
the worker then calls their `execute` instead of `draft_runner.forward`. On a CPU SGLang builds
neither. With `DRAFTSCOPE_TESTBED_GRAPHS=emulate` in the server's environment,
`cpu_standins/sitecustomize.py` replaces that method with :func:`capture_cuda_graphs`, which installs
two stand-in runners with the same `can_run_graph` / `execute` interface, so SGLang's own code takes
its graph branches (`draft`: `cuda_graph_runner.execute`; `_draft_extend_for_decode`:
`cuda_graph_runner_for_draft_extend.execute`, and none of the eager bookkeeping around them):

* inputs are copied into static buffers allocated once, and the forward runs on views of them, as a
  replay reads the addresses it captured;
* the forward is the one SGLang captures (`EagleDraftWorker.draft_forward` for draft decode; the
  draft's `model.forward` with LAST capture and `select_index`, so that only the selected rows reach
  the lm_head, for draft extend), with the callables bound at capture: an attribute patched onto the
  draft runner later (as a tracer might) does not run in a replay, as in a real graph;
* outputs are copied into static buffers that the next replay overwrites, as graph outputs are.

Not emulated: the kernels run eagerly on the CPU (no capture, no graph memory pool), attention metadata
is planned by the backend's eager `init_forward_metadata`, batches are not padded to captured sizes,
and the target's verify graph is not emulated (the target verify runs eagerly). Test bed only.
"""

from __future__ import annotations

import contextlib
import copy
import logging

import torch

log = logging.getLogger("draftscope.testbed")
BANNER = "draftscope test bed: CUDA-graph emulation on (draft decode, draft extend)"


def capture_cuda_graphs(worker) -> None:
    """Stand-in for `EagleDraftWorker._capture_cuda_graphs` (SGLang builds the draft-decode runner only
    for more than one draft step)."""
    worker.cuda_graph_runner = DraftDecodeGraph(worker) if worker.speculative_num_steps > 1 else None
    worker.cuda_graph_runner_for_draft_extend = DraftExtendGraph(worker)
    log.warning(BANNER)


class _Static:
    """Static buffers of one stand-in graph. Each is allocated at its first use with room for
    ``max_bs`` requests (the rows per request never change) and only copied into afterwards."""

    def __init__(self, max_bs: int):
        self.max_bs = max_bs
        self.bufs: dict = {}

    def put(self, name: str, src, bs: int):
        """``src`` copied into buffer ``name``; the view of the rows it filled (None for None)."""
        if src is None:
            return None
        buf = self.bufs.get(name)
        if buf is None:
            buf = self.bufs[name] = torch.zeros((self.max_bs * (src.shape[0] // bs), *src.shape[1:]),
                                                dtype=src.dtype, device=src.device)
        view = buf[:src.shape[0]]
        view.copy_(src)
        return view


@contextlib.contextmanager
def _bound(obj, name: str, captured):
    """``obj.name`` is ``captured`` (the callable seen at capture) for the duration of a replay."""
    missing = object()
    before = obj.__dict__.get(name, missing)
    setattr(obj, name, captured)
    try:
        yield
    finally:
        if before is missing:
            obj.__dict__.pop(name, None)
        else:
            setattr(obj, name, before)


class _StandIn:
    """What both stand-in runners share: the worker, capacity (SGLang's request slots), static buffers."""

    def __init__(self, worker):
        self.worker = worker
        self.max_bs = worker.draft_runner.req_to_token_pool.size
        self.static = _Static(self.max_bs)
        self.replays = 0

    def _first_replay(self, what: str, bs: int) -> None:
        self.replays += 1
        if self.replays == 1:
            log.warning("draftscope test bed: first emulated %s graph replay (batch %d)", what, bs)


class DraftDecodeGraph(_StandIn):
    """Stand-in for `EAGLEDraftCudaGraphRunner`: the whole draft-decode loop from static buffers."""

    def __init__(self, worker):
        super().__init__(worker)
        self._runner_forward = worker.draft_runner.forward  # what a capture now would record
        self._draft_forward = worker.draft_forward

    def can_run_graph(self, forward_batch) -> bool:
        spec = forward_batch.spec_info
        if spec is not None and spec.num_tokens_per_req > 0 and spec.num_tokens_per_req != self.worker.topk:
            return False
        return forward_batch.batch_size <= self.max_bs

    def execute(self, forward_batch):
        bs, s, w = forward_batch.batch_size, self.static, self.worker
        fb = copy.copy(forward_batch)
        for name in ("seq_lens", "out_cache_loc", "positions", "req_pool_indices"):
            setattr(fb, name, s.put(name, getattr(forward_batch, name), bs))
        fb.spec_info = copy.copy(forward_batch.spec_info)
        for name in ("topk_p", "topk_index", "hidden_states"):
            setattr(fb.spec_info, name, s.put(name, getattr(forward_batch.spec_info, name), bs))
        w.draft_attn_backend.init_forward_metadata(fb)
        fb.mark_forward_metadata_ready()
        with _bound(w.draft_runner, "forward", self._runner_forward):
            out = self._draft_forward(fb)
        fb.positions.sub_(w.speculative_num_steps - 1)  # as the captured function leaves its buffer
        self._first_replay("draft decode", bs)
        return tuple(s.put(f"out{k}", t, bs) for k, t in enumerate(out))


class DraftExtendGraph(_StandIn):
    """Stand-in for `EAGLEDraftExtendCudaGraphRunner`: the draft extend after verify, lm_head on the
    selected rows only."""

    def __init__(self, worker):
        super().__init__(worker)
        self._model_forward = worker.draft_runner.model.forward

    def can_run_graph(self, forward_batch) -> bool:
        spec = forward_batch.spec_info
        width = self.worker.speculative_num_draft_tokens
        if spec is not None and spec.num_tokens_per_req > 0 and spec.num_tokens_per_req != width:
            return False
        return forward_batch.seq_lens.numel() <= self.max_bs

    def execute(self, forward_batch, select_index):
        from sglang.srt.layers.dp_attention import set_dp_buffer_len, set_is_extend_in_batch
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        bs, s, runner = forward_batch.batch_size, self.static, self.worker.draft_runner
        fb = copy.copy(forward_batch)
        for name in ("input_ids", "seq_lens", "out_cache_loc", "positions", "req_pool_indices", "extend_seq_lens"):
            setattr(fb, name, s.put(name, getattr(forward_batch, name), bs))
        fb.capture_hidden_mode = CaptureHiddenMode.LAST
        fb.spec_info = copy.copy(forward_batch.spec_info)
        for name in ("hidden_states", "num_correct_drafts", "num_accept_tokens"):
            setattr(fb.spec_info, name, s.put(name, getattr(forward_batch.spec_info, name), bs))
        fb.spec_info.select_index = s.put("select_index", select_index, bs)
        runner.attn_backend.init_forward_metadata(fb)
        fb.mark_forward_metadata_ready()
        with forward_context(ForwardContext(attn_backend=runner.attn_backend), forward_batch=fb):
            set_dp_buffer_len(None, fb.input_ids.shape[0], False, None)
            set_is_extend_in_batch(False)
            out = self._model_forward(fb.input_ids, fb.positions, fb)
        self._first_replay("draft extend", bs)
        return LogitsProcessorOutput(next_token_logits=s.put("logits", out.next_token_logits, bs),
                                     hidden_states=s.put("hidden", out.hidden_states, bs).clone())
