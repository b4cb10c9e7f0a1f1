"""The tracer hooks' work on sampled decode iterations, on CUDA tensors at production widths.

``HooksPath`` runs one decode iteration of an EAGLE-3 chain draft through the plugin's own AROUND hooks
(``plugin.py``: draft, verify, draft extend, result processing) with the real ``Tracer``: whatever the
hooks do on a sampled iteration (the draft step tap's rows, its writes in the draft's two steps and
their read, the verify's summaries and token ids, the draft extend's ``fc`` recompute and draft seeds,
the totals) runs as in SGLang. SGLang's methods and batch objects are stand-ins holding device tensors
shaped as SGLang 0.5.23 hands them to the hooks (``accept_lens`` on the host at result processing, as
there); the tap is installed as the plugin's ``init_cuda_graphs`` hook does.
A thread plays the relay: every 100 ms it pickles the queued calls with the relay's own pickler
(which waits for and decodes their summaries).

Shapes: Kimi-K2.5 (hidden 7168, 3 aux layers in bf16, 163,840-vocab fp32 target logits, 32,000-vocab
draft, 4 draft tokens), one request in ``sample_every`` sampled. Needs torch (and Triton for the fast
summaries); used by ``bench/gpu_hooks.py`` and ``tests/gpu/test_hooks_path.py``.
"""

from __future__ import annotations

import collections
import io
import pickle
import threading
import time
from types import SimpleNamespace
from typing import Dict, Optional

import torch

from draftscope_tracer.engine.sglang import plugin
from draftscope_tracer.config import TracerConfig
from draftscope_tracer.transport.relay import POLL_S, _Pickler
from draftscope_tracer.engine.sglang.tracer import Tracer

H, K, V, V_DRAFT, N = 7168, 3, 163_840, 32_000, 4


class _Mode:
    def __init__(self, decode: bool = True):
        self.decode = decode

    def is_idle(self) -> bool:
        return False

    def is_decode(self) -> bool:
        return self.decode


class PathRelay:
    """What the tracer's ``Relay`` thread does with the queued calls, without the recorder process: every
    ``POLL_S`` it pickles what is queued in one payload with the relay's own pickler (``Shared`` values
    once), which waits for and decodes each summary. Counts calls and keeps the first error; with ``keep``
    it keeps the payloads too, and :meth:`records` runs them as the recorder does."""

    def __init__(self, name: str = "hooks-path-relay", keep: bool = False):
        self.calls, self.error, self.payloads, self.keep = 0, None, [], keep
        self._queue: collections.deque = collections.deque()
        self._sent: set = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, call) -> bool:
        self._queue.append(call)
        return True

    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(POLL_S)
            jobs = [self._queue.popleft() for _ in range(len(self._queue))]
            if jobs:
                try:
                    out = io.BytesIO()
                    pickler = _Pickler(out, self._sent)
                    pickler.dump(jobs)
                    self._sent |= pickler.new
                    if self.keep:
                        self.payloads.append(out.getvalue())
                    self.calls += len(jobs)
                except Exception as exc:  # noqa: BLE001 - reported by drain()
                    self.error = self.error or f"{type(exc).__name__}: {exc}"
            if stopping:
                return

    def drain(self) -> None:
        self._stop.set()
        self._thread.join()

    def close(self, tracer, engine_plugin) -> dict:
        """:meth:`drain`, then ``tracer`` detached from ``engine_plugin`` (the engine's plugin module): the
        tracer's errors and drops, the relay's calls."""
        self.drain()
        if engine_plugin.PLUGIN.tracer is tracer:
            engine_plugin.PLUGIN.tracer = None
        h = tracer.health
        return {"errors": dict(h.errors), "last_error": dict(h.last_error), "drops": dict(h.drops),
                "relay_calls": self.calls, "relay_error": self.error}

    def records(self) -> list:
        """``(probe, records)`` of every call relayed, in order (after :meth:`drain`; needs ``keep``)."""
        return [(call.probe, call()) for payload in self.payloads for call in pickle.loads(payload)]


class _Runner:
    """SGLang's draft model runner, as far as the hooks see it: ``model``, and ``forward`` (a method of the
    class, so that a tap set on the instance is undone by removing it)."""

    def __init__(self, model):
        self.model = model

    def forward(self, forward_batch):
        return forward_batch  # the stand-in batch carries the forward's output


class _ExtendGraph:
    """SGLang's draft-extend graph runner, as far as the hooks see it: ``execute`` returns the replay's output
    logits, one row per request (``EagleDraftExtendCudaGraphRunner.execute``)."""

    def __init__(self, logits):
        self.logits = logits

    def execute(self, forward_batch, select_index):
        return SimpleNamespace(next_token_logits=self.logits, hidden_states=None)


class HooksPath:
    """One batch of ``batch`` requests in decode; ``iteration()`` runs one decode iteration through the
    plugin's own AROUND hooks (``plugin.py``), each around a stand-in for SGLang's method that returns
    what SGLang's does (and calls ``draft_runner.forward`` where SGLang's eager path does)."""

    def __init__(self, batch: int, sample_every: int = 16, sync_debug: bool = False, seed: int = 0,
                 device: str = "cuda", graphs: bool = True):
        torch.manual_seed(seed)
        dev = torch.device(device)
        self.tracer = t = Tracer(TracerConfig(file="/dev/null", sample_rate=1 / sample_every,
                                              sync_debug=sync_debug), "0.5.23")
        t.recording, t.capture.target_hidden, t.num_draft_tokens = True, H, N
        self.relay = t.transport.writer = PathRelay()
        reqs = [SimpleNamespace(rid=f"req-{i}", is_retracted=False, finished_reason=None, finished=lambda: False)
                for i in range(batch)]
        t.sampled.live = {r.rid: 0 for r in reqs[::sample_every]}
        rows = batch * N
        bf16 = dict(device=dev, dtype=torch.bfloat16)
        head = torch.nn.Linear(H, V_DRAFT, bias=False, **bf16)
        self.model = model = SimpleNamespace(
            model=SimpleNamespace(fc=torch.nn.Linear(K * H, H, bias=False, **bf16), norm=torch.nn.RMSNorm(H, **bf16),
                                  embed_tokens=SimpleNamespace(weight=torch.empty(V_DRAFT, H, **bf16))),
            lm_head=head, logits_processor=SimpleNamespace(  # what SGLang's LogitsProcessor offers
                config=SimpleNamespace(vocab_size=V_DRAFT), do_tensor_parallel_all_gather=False, logit_scale=None,
                final_logit_softcapping=None, _compute_lm_head=lambda x, lm_head: torch.matmul(x, lm_head.weight.T)))
        # draft-decode steps 2..3, then the draft extend: stand-in forward batches carrying their output
        self._forwards = [SimpleNamespace(forward_mode=_Mode(decode=n == batch), logits_output=SimpleNamespace(
            next_token_logits=torch.randn(n, V_DRAFT, device=dev) * 4)) for n in (batch, batch, rows)]
        self.worker = SimpleNamespace(topk=1, speculative_num_draft_tokens=N, speculative_num_steps=N - 1,
                                      device=dev, hot_token_id=torch.randint(0, V, (V_DRAFT,), device=dev),
                                      draft_runner=_Runner(model), draft_forward=self._draft_forward,
                                      cuda_graph_runner_for_draft_extend=_ExtendGraph(
                                          torch.randn(batch, V_DRAFT, device=dev) * 4) if graphs else None)
        self.draft_input = SimpleNamespace(hidden_states=torch.randn(batch, H, **bf16))
        self.verify_input = SimpleNamespace(draft_token_num=N, draft_token=torch.randint(0, V, (rows,), device=dev))
        self.batch = SimpleNamespace(reqs=reqs, forward_mode=_Mode(), spec_info=self.draft_input,
                                     seq_lens=torch.randint(16, 2048, (batch,), device=dev))
        accept = torch.randint(1, N + 1, (batch,), device=dev, dtype=torch.int32)
        self.result = SimpleNamespace(
            accept_lens=accept, next_token_ids=torch.randint(0, V, (rows,), device=dev), next_draft_input=None,
            logits_output=SimpleNamespace(hidden_states=torch.randn(rows, K * H, **bf16),
                                          next_token_logits=torch.randn(rows, V, device=dev) * 4))
        self.next_draft_input = SimpleNamespace(hidden_states=torch.randn(batch, H, **bf16))
        self.result_on_host = SimpleNamespace(accept_lens=accept.cpu(), forward_mode=_Mode())
        plugin.PLUGIN.tracer = t
        plugin._around_graphs(lambda worker: None, self.worker)  # the step tap, as before SGLang's capture
        t.capture.prepare(device=dev, dtype=torch.bfloat16, hidden=H, aux=K, vocab=V, draft_vocab=V_DRAFT, draft_tokens=N,
                          max_requests=batch, hot=self.worker.hot_token_id, draft_model=model)  # as attach does
        self.graph = self._capture_draft() if graphs else None

    def _capture_draft(self) -> "torch.cuda.CUDAGraph":
        """The draft-decode loop as SGLang runs it with CUDA graphs on: captured once, the tap's writes
        with it (as SGLang's capture records them), then replayed by ``_draft``."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.worker.draft_forward(None)  # warm-up off the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.worker.draft_forward(None)
        return graph

    # stand-ins for SGLang's worker methods (what the AROUND hooks wrap)
    def _draft(self, worker, batch):
        if self.graph is not None:
            self.graph.replay()  # SGLang's draft-decode graph, the tap inside it
        else:
            worker.draft_forward(None)  # SGLang's eager draft-decode loop
        batch.spec_info = self.verify_input

    def _draft_forward(self, forward_batch):
        for step in self._forwards[:2]:  # the draft's steps 2..3
            self.worker.draft_runner.forward(step)

    def _verify(self, worker, batch):
        return self.result

    def _draft_extend(self, worker, batch, batch_result):
        if worker.cuda_graph_runner_for_draft_extend is not None:  # SGLang's graph path: its logits come back
            worker.cuda_graph_runner_for_draft_extend.execute(self._forwards[2], None)
        else:
            worker.draft_runner.forward(self._forwards[2])
        batch_result.next_draft_input = self.next_draft_input
        batch.spec_info = self.draft_input

    def _finish(self, scheduler, batch, result):
        return None

    def iteration(self, stages: Optional[Dict[str, float]] = None, traced: bool = True) -> None:
        """The hooks of one decode iteration, in SGLang's order; ``stages`` (if given) adds up the host
        seconds of each (with the stand-ins for SGLang's methods: the draft-decode graph's replay is the
        costliest). ``traced=False``: the same iteration with no tracer (each hook calls SGLang's method
        only), what the host spends without draftscope."""
        w, b = self.worker, self.batch
        clock = _Stages(stages)
        if not traced:
            plugin.PLUGIN.tracer = None
        try:
            plugin._around_draft(self._draft, w, b)
            clock("draft")
            plugin._around_verify(self._verify, w, b)
            clock("verify")
            plugin._around_draft_extend(self._draft_extend, w, b, self.result)
            clock("draft_extend")
            plugin._around_finish(self._finish, None, b, self.result_on_host)
            clock("result processing")
        finally:
            plugin.PLUGIN.tracer = self.tracer

    def close(self) -> dict:
        """Wait for the relay to read every call; the tracer's errors and drops, the relay's calls."""
        return self.relay.close(self.tracer, plugin)


class _Stages:
    def __init__(self, into: Optional[Dict[str, float]]):
        self.into, self.at = into, time.perf_counter() if into is not None else 0.0

    def __call__(self, name: str) -> None:
        if self.into is not None:
            now = time.perf_counter()
            self.into[name] = self.into.get(name, 0.0) + now - self.at
            self.at = now


def gpu_sleep_cycles_per_ms() -> float:
    """Clock cycles of ``torch.cuda._sleep`` per millisecond on this GPU (measured with events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return 50_000_000 / start.elapsed_time(end)
