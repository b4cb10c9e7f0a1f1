"""The tracer hooks' work on sampled decode iterations, on CUDA tensors at production widths.

``HooksPath`` drives the real ``Tracer`` methods the plugin's hooks call on one decode iteration of an
EAGLE-3 chain draft (the same order and arguments as ``plugin.py``): draft input and two draft-step
logits taps, the verify step (aux hidden states, target logits, token ids through ``HostInts``), the
draft extend (``fc`` recomputed on the sampled rows, the seed logits indexed on the device) and the
result processing's totals. SGLang's batch objects are plain namespaces holding device tensors shaped
as SGLang 0.5.23 hands them to the hooks (``accept_lens`` on the host by result processing, as there).
A thread plays the relay: every 100 ms it pickles the queued calls with the relay's own pickler
(which waits for and decodes their summaries).

Shapes: Kimi-K2.5 (hidden 7168, 3 aux layers in bf16, 163,840-vocab fp32 target logits, 32,000-vocab
draft, 4 draft tokens), one request in ``sample_every`` sampled. Needs torch (and Triton for the fast
summaries); used by ``bench/gpu_hooks.py`` and ``tests/gpu/test_hooks_path.py``.
"""

from __future__ import annotations

import collections
import io
import threading
import time
from types import SimpleNamespace
from typing import Dict, Optional

import torch

from tracer.config import TracerConfig
from tracer.relay import POLL_S, _Pickler
from tracer.runtime import Tracer

H, K, V, V_DRAFT, N = 7168, 3, 163_840, 32_000, 4


class _Mode:
    def is_idle(self) -> bool:
        return False

    def is_decode(self) -> bool:
        return True


class _Relay:
    """What the tracer's ``Relay`` thread does with the queued calls, without the recorder process: every
    ``POLL_S`` it pickles what is queued in one payload with the relay's own pickler (``Shared`` values
    once), which waits for and decodes each summary. Counts calls and keeps the first error."""

    def __init__(self):
        self.calls, self.error = 0, None
        self._queue: collections.deque = collections.deque()
        self._sent: set = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hooks-path-relay", daemon=True)
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
                    pickler = _Pickler(io.BytesIO(), self._sent)
                    pickler.dump(jobs)
                    self._sent |= pickler.new
                    self.calls += len(jobs)
                except Exception as exc:  # noqa: BLE001 - reported by drain()
                    self.error = self.error or f"{type(exc).__name__}: {exc}"
            if stopping:
                return

    def drain(self) -> None:
        self._stop.set()
        self._thread.join()


class HooksPath:
    """One batch of ``batch`` requests in decode; ``iteration()`` runs the hooks' work of one iteration."""

    def __init__(self, batch: int, sample_every: int = 16, sync_debug: bool = False, seed: int = 0):
        torch.manual_seed(seed)
        dev = torch.device("cuda")
        self.tracer = t = Tracer(TracerConfig(file="/dev/null", sample_rate=1 / sample_every,
                                              sync_debug=sync_debug), "0.5.23")
        t.recording, t.target_hidden, t.num_draft_tokens = True, H, N
        self.relay = t.writer = _Relay()
        reqs = [SimpleNamespace(rid=f"req-{i}") for i in range(batch)]
        t.live = {r.rid: 0 for r in reqs[::sample_every]}
        rows = batch * N
        self.worker = SimpleNamespace(
            topk=1, speculative_num_draft_tokens=N,
            hot_token_id=torch.randint(0, V, (V_DRAFT,), device=dev),
            draft_runner=SimpleNamespace(model=SimpleNamespace(model=SimpleNamespace(
                fc=torch.nn.Linear(K * H, H, bias=False, device=dev, dtype=torch.bfloat16),
                embed_tokens=SimpleNamespace(weight=torch.empty(V_DRAFT, H, device=dev, dtype=torch.bfloat16))))))
        self.batch = SimpleNamespace(
            reqs=reqs, forward_mode=_Mode(), seq_lens=torch.randint(16, 2048, (batch,), device=dev),
            spec_info=SimpleNamespace(hidden_states=torch.randn(batch, H, device=dev, dtype=torch.bfloat16)))
        self.verify_input = SimpleNamespace(draft_token_num=N, draft_token=torch.randint(0, V, (rows,), device=dev))
        accept = torch.randint(1, N + 1, (batch,), device=dev, dtype=torch.int32)
        self.result = SimpleNamespace(
            accept_lens=accept, next_token_ids=torch.randint(0, V, (rows,), device=dev),
            logits_output=SimpleNamespace(hidden_states=torch.randn(rows, K * H, device=dev, dtype=torch.bfloat16),
                                          next_token_logits=torch.randn(rows, V, device=dev) * 4))
        self.result_on_host = SimpleNamespace(accept_lens=accept.cpu(), forward_mode=_Mode())
        self.step_logits = [torch.randn(batch, V_DRAFT, device=dev) * 4 for _ in range(2)]
        self.extend_logits = torch.randn(rows, V_DRAFT, device=dev) * 4
        self.live_reqs = list(enumerate(reqs))

    def iteration(self, stages: Optional[Dict[str, float]] = None) -> None:
        """The tracer's work on one decode iteration, as the plugin's hooks call it; ``stages`` (if
        given) adds up the host seconds of each hook."""
        t, w, b = self.tracer, self.worker, self.batch
        clock = _Stages(stages)
        rows = t.guard("draft", t.on_draft_input, w, b)
        for logits in self.step_logits:
            t.guard("draft", t.on_draft_step_logits, w, rows, logits)
        clock("draft (input, 2 step logits)")
        t.guard("verify", t.on_verify, b, self.verify_input, self.result)
        clock("verify")
        done, upcoming = t.guard("draft_extend", t.draft_extend_rows, b) or ([], [])
        t.guard("draft_extend", t.on_draft_extend, w, b, self.result, self.extend_logits, done, upcoming)
        clock("draft_extend (fc recompute, seed logits)")
        t.guard("totals", t.count, b, self.result_on_host, self.live_reqs)
        clock("totals")

    def close(self) -> dict:
        """Wait for the relay to read every call; the tracer's errors and drops, the relay's calls."""
        self.relay.drain()
        h = self.tracer.health
        return {"errors": dict(h.errors), "last_error": dict(h.last_error), "drops": dict(h.drops),
                "relay_calls": self.relay.calls, "relay_error": self.relay.error}


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
