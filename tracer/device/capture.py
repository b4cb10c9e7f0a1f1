"""What the hooks run on the device, and the buffers it needs: the summaries of sampled rows, the step tap
inside the draft-decode loop, the draft's ``hot_token_id`` read once. On a GPU everything is built for the
server's widths when the tracer attaches (:meth:`Capture.prepare`), so no hook allocates pinned memory or
compiles a kernel; the draft's recomputes (its logits at position 1, its ``fc``) are captured as CUDA graphs
there too (``graphed``). Imports the device layer only (``summaries``, ``steptap``, ``devicecopy``,
``graphed``, ``recompute``)."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from draftscope_tracer.device import devicecopy, graphed, recompute
from draftscope_tracer.device.devicecopy import later_list
from draftscope_tracer.health import Health
from draftscope_tracer.shared import Shared
from draftscope_tracer.device.steptap import StepTap
from draftscope_tracer.device.summaries import Summaries, capacity

PREPARED_REQUESTS = 64  # sampled requests per batch the summary buffers are built for at attach (more: built late)


class Capture:
    """The device side of one tracer: ``summaries`` (per tensor layout), ``step_tap`` (once installed),
    ``hot`` (the draft's id map, sent to the recorder once), ``target_hidden`` (the width of one aux chunk),
    ``seeds`` and ``fc`` (the draft's recomputes as CUDA graphs, when prepared on a GPU)."""

    def __init__(self, health: Health, topk: int, reduce: str):
        self.topk = topk
        self.summaries = Summaries(health, topk, reduce)
        self.step_tap: Optional[StepTap] = None
        self.hot: Optional[Shared] = None
        self.target_hidden: Optional[int] = None
        self.seeds: Optional[graphed.Graphed] = None
        self.fc: Optional[graphed.Graphed] = None
        self.prepared_rows: Optional[int] = None  # rows per launch the prepared Summarizers take (on a GPU)
        self.reserved_bytes: Optional[int] = None  # GPU memory the caching allocator reserved while preparing
        self.step_tap_reserved_bytes: Optional[int] = None  # ... while installing the step tap (before SGLang's capture)
        self.process_reserved_bytes: Optional[int] = None  # the allocator's reserved total, whole process, after attach
        self.extend_logits: Optional[torch.Tensor] = None  # the draft-extend graph's last output logits

    def watch_draft_extend(self, worker) -> None:
        """After SGLang captured the draft's graphs: each replay of the draft-extend graph leaves its output
        logits (one row per request: the draft's position 1 of the next step, full draft vocabulary) in
        ``extend_logits``, so the hook summarises them instead of recomputing the draft's ``lm_head``. Its
        eager path (a batch the graphs do not take) leaves nothing: the hook recomputes."""
        runner = getattr(worker, "cuda_graph_runner_for_draft_extend", None)
        execute = getattr(runner, "execute", None)
        if execute is None or getattr(execute, "draftscope_watch", False):
            return

        def watched(*args, **kwargs):
            out = execute(*args, **kwargs)
            self.extend_logits = getattr(out, "next_token_logits", None)
            return out

        watched.draftscope_watch = True
        runner.execute = watched

    def install_step_tap(self, worker, guard: Callable) -> None:
        """Before SGLang captures the draft's graphs: the tap that reads positions 2.. of a draft chain (the
        nodes below the first of a tree)."""
        if worker.speculative_num_steps > 1:
            before = devicecopy.reserved(worker.device)
            self.step_tap = StepTap(worker, self.topk, guard)
            self.step_tap_reserved_bytes = devicecopy.reserved(worker.device) - before

    def prepare(self, device: torch.device, dtype: torch.dtype, hidden: int, aux: int, vocab: int,
                draft_vocab: Optional[int], draft_tokens: int, max_requests: int, hot=None, draft_model=None) -> None:
        """At attach, on a GPU: the pinned slots, each summary layout's buffers and compiled kernels (verify
        with and without aux, fc output, draft logits), the draft's recomputes as CUDA graphs, and
        ``hot_token_id`` read once. A hook must never allocate pinned memory: that can wait for the GPU
        (``devicecopy``). What it reserves on the GPU (buffers, graph pools) is kept for the run's facts."""
        before = devicecopy.reserved(device)
        devicecopy.prepare(device)
        requests = min(max_requests, PREPARED_REQUESTS)
        rows = capacity(requests * draft_tokens)
        self.prepared_rows = rows
        # (width, chunk, vocab, rows, dtype, logits dtype, gather): the verify's (with aux, and with one layer's hidden
        # states when aux capture is off; its token ids gathered), the draft's features and fc output, the draft's
        # logits
        f32 = torch.float32
        layouts = [(aux * hidden, hidden, vocab, rows, dtype, f32, True),
                   (hidden, hidden, vocab, rows, dtype, f32, True),
                   (aux * hidden, hidden, None, rows, dtype, None, False),
                   (hidden, hidden, None, rows, dtype, None, False)]
        if draft_vocab:
            layouts.append((draft_vocab, draft_vocab, draft_vocab, capacity(requests), f32, f32, False))
        self.summaries.prepare(device, layouts)
        if draft_model is not None:
            self._capture_recomputes(draft_model, device, dtype, hidden, aux, requests, rows)
        if hot is not None:
            self.hot = Shared("hot_token_id", later_list(hot))
        self.reserved_bytes = devicecopy.reserved(device) - before
        self.process_reserved_bytes = devicecopy.reserved_now(device)

    def _capture_recomputes(self, model, device, dtype, hidden: int, aux: int, requests: int, rows: int) -> None:
        """The draft's logits at position 1 (one row per sampled request) and its ``fc`` (on the verify's rows)."""
        self.seeds = graphed.capture("draft logits", lambda x: recompute.logits(model, x), capacity(requests), hidden,
                                     dtype, device, self.topk, logits=True)
        self.fc = graphed.capture("fc", lambda x: recompute.fc(model, x), rows, aux * hidden, dtype, device,
                                  self.topk, logits=False)

    def describe(self) -> dict:
        """What was built on the device at attach (run facts: ``tracing.device``)."""
        return {"prepared_rows": self.prepared_rows, "layouts": len(self.summaries._by_shape),
                "reserved_bytes": self.reserved_bytes, "step_tap_reserved_bytes": self.step_tap_reserved_bytes,
                "process_reserved_bytes": self.process_reserved_bytes,
                "graphed_recomputes": [name for name, g in (("draft logits", self.seeds), ("fc", self.fc))
                                       if g is not None]}

    def hot_map(self, worker) -> bool:
        """Whether the draft's ids go through ``hot_token_id`` (read once; on a CPU, at first use)."""
        hot = getattr(worker, "hot_token_id", None)
        if hot is not None and self.hot is None:
            self.hot = Shared("hot_token_id", later_list(hot))  # read on the relay thread
        return hot is not None


def device_plan(scheduler, spec, safe: Callable) -> Optional[dict]:
    """:meth:`Capture.prepare`'s arguments for a server on a GPU (None on a CPU, or when a value is missing)."""
    runner = safe(lambda: scheduler.tp_worker.model_runner)
    if runner is None or spec is None or not torch.cuda.is_available() or not str(runner.device).startswith("cuda"):
        return None
    # the worker that owns the draft's runner: EAGLEWorkerV2 holds an EagleDraftWorker (its draft_worker)
    draft = next((w for w in (getattr(spec, "draft_worker", None), spec) if hasattr(w, "draft_runner")), spec)
    lm = getattr(runner.model, "language_model", runner.model)
    plan = {"device": torch.device("cuda", torch.cuda.current_device()), "dtype": safe(lambda: runner.model_config.dtype),
            "hidden": safe(lambda: runner.model_config.hidden_size), "vocab": safe(lambda: runner.model_config.vocab_size),
            "aux": len(getattr(getattr(lm, "model", None), "layers_to_capture", None) or ()) or 3,
            "draft_vocab": safe(lambda: draft.draft_runner.model.logits_processor.config.vocab_size),
            "draft_tokens": getattr(spec, "speculative_num_draft_tokens", None),
            "max_requests": getattr(scheduler, "max_running_requests", None), "hot": getattr(draft, "hot_token_id", None),
            # a server with CUDA graphs off gets none from the tracer either (its recomputes run eagerly)
            "draft_model": None if safe(lambda: scheduler.server_args.disable_cuda_graph) else
            safe(lambda: draft.draft_runner.model)}
    required = ("dtype", "hidden", "vocab", "draft_tokens", "max_requests")
    return plan if all(isinstance(plan[k], (int, torch.dtype)) for k in required) else None
