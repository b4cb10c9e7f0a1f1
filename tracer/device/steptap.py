"""The draft's top-k at positions 2.. of its chain, taken inside SGLang's draft-decode loop.

SGLang runs the draft-decode loop (``EagleDraftWorker.draft_forward``: ``speculative_num_steps - 1``
draft forwards, each followed by its argmax) as one CUDA-graph replay, and the logits of those steps
never leave the graph. So the tracer puts its reading into the loop itself: before SGLang captures its
graphs (the hook on ``EagleDraftWorker.init_cuda_graphs``), :class:`StepTap` wraps the draft runner's
``forward`` and the worker's ``draft_forward`` on the instances. Each draft-decode forward then also
writes the softmax top-k of its logits at the rows in a static row buffer into static result buffers:
a few device operations on static buffers, with no host sync and no Python decision that depends on
data, so a captured graph replays exactly what an eager run does. The draft hook fills the row buffer
with the sampled requests' rows before the draft (unused slots -1) and, after it, copies the results
into pinned memory without blocking (:meth:`StepTap.read`).

Costs: in every draft-decode graph replay, sampled or not, one gather of ``ROWS`` logits rows, a
softmax and a top-k per draft step (a few microseconds of GPU time; no host time); eager runs do that
work only when the hook has selected rows. More than ``ROWS`` sampled requests in one batch: the
others get no positions 2.. (counted as ``draft_tap_full`` drops).
"""

from __future__ import annotations

from typing import List, Optional

import torch

from draftscope_tracer.device.devicecopy import HostSlots, device_index
from draftscope_tracer.stats import ArrayBytes, Resolved, step_topk_lists

# Sampled requests per batch whose draft steps are read: 16 lost positions 2.. of 4,464 steps on the H200 at 64
# concurrent requests, every one sampled. Every draft-decode replay gathers this many logits rows (a few µs).
ROWS = 64
READS = 1024  # reads in flight (held until the relay thread reads them), in pinned slots allocated at install


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class StepTap:
    """Static buffers and the wrappers of one draft worker (chain drafting, more than one draft step)."""

    def __init__(self, worker, topk: int, guard):
        """``guard(probe, fn, *args)``: the tracer's guard (counts an exception, never raises)."""
        runner = worker.draft_runner
        self.steps = worker.speculative_num_steps - 1
        self.k = topk
        dev = torch.device(worker.device)
        self.rows = torch.full((ROWS,), -1, dtype=torch.int64, device=dev)
        # probs and ids in one buffer, read back with one copy (each copy costs host time)
        self._shape = shape = (self.steps, ROWS, topk)
        n = self.steps * ROWS * topk
        self._buf = torch.zeros(n * 12, dtype=torch.uint8, device=dev)
        self.probs, self.ids = _split(self._buf, shape)
        self.ids.fill_(-1)
        self.armed = False  # eager runs read only when the draft hook selected rows
        self._slots = HostSlots(n * 12, READS, dev)
        self._host = [self._slots.buffer(i)[:n * 12] for i in range(READS)]  # each slot's buffer, sliced once
        self._step = 0
        forward, draft_forward = runner.forward, worker.draft_forward

        def tapped_forward(forward_batch, *args, **kwargs):
            out = forward(forward_batch, *args, **kwargs)
            guard("draft_steps", self._after, forward_batch, out)
            return out

        def counted_draft_forward(forward_batch, *args, **kwargs):
            self._step = 0
            return draft_forward(forward_batch, *args, **kwargs)

        runner.forward, worker.draft_forward = tapped_forward, counted_draft_forward

    def _after(self, forward_batch, out) -> None:
        """After one draft forward: a draft-decode step (not a draft extend) is counted and, when rows are
        selected or a graph is being captured, read."""
        if forward_batch.forward_mode.is_decode():
            i, self._step = self._step, self._step + 1
            if i < self.steps and (self.armed or _capturing()):
                self._write(i, out.logits_output.next_token_logits)

    def _write(self, i: int, logits: torch.Tensor) -> None:
        """Top-k of step ``i``'s logits at the selected rows (device operations only: graph-capturable).
        Unused row slots hold 0 and ``read`` leaves them out. The rows are clamped to this batch: a graph
        replays for every batch of its size, armed or not, and the row buffer may still hold the rows of
        a larger batch (an index past the end is a device-side assert, which kills the server)."""
        k = min(self.k, logits.shape[-1])
        rows = self.rows.clamp(0, logits.shape[0] - 1)
        probs = torch.softmax(logits.index_select(0, rows).float(), dim=-1)
        torch.topk(probs, k, dim=-1, out=(self.probs[i, :, :k], self.ids[i, :, :k]))

    def select(self, rows: List[int]) -> int:
        """Rows of the next draft to read (at most ``ROWS``); how many were taken (0: no pinned slot was free
        for the row list)."""
        n = min(len(rows), ROWS)
        index = device_index(rows[:n] + [0] * (ROWS - n), self.rows.device)
        if index is None:
            return 0
        self.rows.copy_(index, non_blocking=True)
        self.armed = True
        return n

    def read(self, n: int) -> Optional["StepTopk"]:
        """The results of the draft just run for the first ``n`` selected rows, copied without blocking into a
        pinned slot; None when every slot is still unread."""
        self.armed = False
        slot = self._slots.reserve()
        if slot is None:
            return None
        return StepTopk(self._buf, self._shape, n, self._slots, slot, self._host[slot])


def _split(buf: torch.Tensor, shape: tuple) -> tuple:
    """``buf`` as float32 probs then int64 ids, each of ``shape`` (the probs' bytes are a multiple of 8: ROWS is)."""
    n = buf.numel() // 12
    return buf[:n * 4].view(torch.float32).view(shape), buf[n * 4:].view(torch.int64).view(shape)


class StepTopk:
    """Host copies of one draft's step top-k: ``result()[position - 2][row]`` = ``[(id, prob), ...]``
    best first (ties by id), for the first ``n`` rows. Pickles as the arrays' bytes (waits for the copy)."""

    def __init__(self, buf: torch.Tensor, shape: tuple, n: int, slots: HostSlots, slot: int, host: torch.Tensor):
        host.copy_(buf, non_blocking=True)
        self._host, self._shape = host, shape  # split on the reader's thread
        self.event = slots.record(slot)
        self._n, self._slots, self._slot = n, slots, slot
        self._value: Optional[list] = None

    def __reduce__(self):
        """Pickled as the arrays' bytes (decoded in the recorder process): waits for the copy first."""
        if self._value is not None:
            return Resolved, (self._value,)
        self._wait()
        data, split = self._host.numpy().tobytes(), self._host.numel() // 3
        arrays = [(data[:split], "float32", self._shape), (data[split:], "int64", self._shape)]
        self.release()
        return ArrayBytes, ("step_topk", arrays, self._n)

    def result(self) -> list:
        if self._value is None:
            self._wait()
            self._value = step_topk_lists([t.numpy() for t in _split(self._host, self._shape)], self._n)
            self.release()
        return self._value

    def _wait(self) -> None:
        if self._slot is None:
            raise RuntimeError("this step top-k was released without being read")
        if self.event is not None:
            self.event.synchronize()

    def release(self) -> None:
        """Give the slot back (after reading, or when the step is dropped). Safe to call twice."""
        if self._slot is not None:
            self._slots.release(self._slot)
            self._slot = None
