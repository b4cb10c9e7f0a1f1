"""The draft's top-k at every drafted position of its chain, or every node of its tree, taken inside SGLang's
draft-decode loop.

SGLang runs the draft-decode loop (``EagleDraftWorker.draft_forward``: ``speculative_num_steps - 1``
draft forwards, each followed by its top-k) as one CUDA-graph replay, and the logits of those steps
never leave the graph. So the tracer puts its reading into the loop itself: before SGLang captures its
graphs (the hook on ``EagleDraftWorker.init_cuda_graphs``), :class:`StepTap` wraps the draft runner's
``forward`` and the worker's ``draft_forward`` on the instances. Each draft-decode forward then also
writes the softmax top-k of its logits at the rows in a static row buffer into static result buffers:
a few device operations on static buffers, with no host sync and no Python decision that depends on
data, so a captured graph replays exactly what an eager run does. The draft hook fills the row buffer
with the sampled requests' rows before the draft (unused slots -1) and, after it, copies the results
into pinned memory without blocking (:meth:`StepTap.read`: by a small kernel where that memory is mapped for the
device, a few µs of host time; else by ``Tensor.copy_``).

Tree drafting (``--speculative-eagle-topk`` k > 1): each draft forward runs k branch rows per request
(row ``request * k + branch``), so a sampled request takes k rows; and ``draft_forward``'s return value
says which candidates became the verify's nodes (``top_scores_index``) and whose child each candidate is
(``parent_list``). The wrapped ``draft_forward`` copies both, at the sampled requests, into the same static
buffer (graph-capturable too), so one copy brings back every node's draft top-k and the tree's shape
(:func:`draftscope_tracer.transport.records.draft_tree` maps them to nodes).

Costs: every draft-decode graph replay, sampled or not, runs the tap's work for each draft step. On a GPU that
is the summary kernel over the row buffer, writing the step's buffers itself
(:class:`~draftscope_tracer.device.tap_topk.TapTopk`): unused slots hold -1, so a replay with nothing selected
costs one launch a step whose programs return at once, and the row buffer is
set back to -1 when nothing is selected (:meth:`StepTap.select` with no rows). Logits it was not compiled for,
and a CPU, take :func:`~draftscope_tracer.device.softmax_topk.softmax_topk` over the rows the graph's batch
holds instead (with fewer than 8 rows a two-stage top-k, 59 µs of GPU a replay on an H100 at vocabulary 163,840
and 1 row, selected or not). No host time; eager runs do that work only when the hook has selected rows. More
sampled requests in one batch than ``ROWS`` rows hold: the others get no positions 2.. (counted as
``draft_tap_full`` drops).
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from draftscope_tracer.device.devicecopy import HostSlots, device_index, mark_later, wait_later
from draftscope_tracer.device.softmax_topk import softmax_topk
from draftscope_tracer.device.summary_ring import mapped_address
from draftscope_tracer.device.summary_triton import WordCopy, triton
from draftscope_tracer.device.tap_topk import TapTopk, draft_vocab
from draftscope_tracer.stats import ArrayBytes, DraftSteps, Resolved, draft_steps

# Sampled requests per batch whose draft steps are read: 16 lost positions 2.. of 4,464 steps on the H200 at 64
# concurrent requests, every one sampled. Every draft-decode replay gathers this many logits rows (a few µs).
ROWS = 64
READS = 1024  # reads in flight (held until the relay thread reads them), in pinned slots allocated at install


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class StepTap:
    """Static buffers and the wrappers of one draft worker (more than one draft step; a chain or a tree)."""

    def __init__(self, worker, topk: int, guard):
        """``guard(probe, fn, *args)``: the tracer's guard (counts an exception, never raises)."""
        runner = worker.draft_runner
        self.steps = worker.speculative_num_steps - 1
        self.k = topk
        self.branches = worker.topk  # draft rows per request in each draft forward (1: a chain)
        self.requests = ROWS // self.branches  # sampled requests one draft can read
        dev = torch.device(worker.device)
        # the logits rows each draft forward reads, then (trees) the requests' rows of draft_forward's outputs
        self._select = torch.zeros(ROWS + self.requests, dtype=torch.int64, device=dev)
        self.rows, self.reqs = self._select[:ROWS], self._select[ROWS:]
        self.rows.fill_(-1)  # unused logits-row slots: the summary kernel skips them
        # a tree's per-request ints: its verify nodes' candidate indices (N - 1), then parent_list
        nodes = worker.speculative_num_draft_tokens - 1
        self._tree_width = nodes + self.branches * self.steps + 1 if self.branches > 1 else 0
        self._nodes = nodes
        # probs, ids and tree ints in one buffer, read back with one copy (each copy costs host time)
        self._shape = shape = (self.steps, ROWS, topk)
        self._tree_shape = (self.requests, self._tree_width)
        n, t = self.steps * ROWS * topk, self.requests * self._tree_width
        self._bytes = n * 12 + t * 8
        self._buf = torch.zeros(self._bytes, dtype=torch.uint8, device=dev)
        self.probs, self.ids, self.tree = _split(self._buf, shape, self._tree_shape)
        self.armed = False  # eager runs read only when the draft hook selected rows
        self._loaded: Optional[tuple] = None  # the requests' rows the row buffer holds
        # slots of a multiple of 16 bytes: each starts at the alignment the copy kernel was compiled for
        self._slots = HostSlots(-(-self._bytes // 16) * 16, READS, dev, events=False)  # each read marked for its reader
        self._host = [self._slots.buffer(i)[:self._bytes] for i in range(READS)]  # each slot's buffer, sliced once
        self._copy, self._base = _copy_kernel(self._buf, self._slots)  # (None, 0): reads by ``Tensor.copy_``
        self._topk = _tap_topk(self.rows, draft_vocab(runner), topk, self.step_outputs())  # None: softmax_topk
        self.ids.fill_(-1)  # (after the kernel's variants were compiled into step 0's buffers)
        self._step = 0
        forward, draft_forward = runner.forward, worker.draft_forward

        def tapped_forward(forward_batch, *args, **kwargs):
            out = forward(forward_batch, *args, **kwargs)
            guard("draft_steps", self._after, forward_batch, out)
            return out

        def counted_draft_forward(forward_batch, *args, **kwargs):
            self._step = 0
            out = draft_forward(forward_batch, *args, **kwargs)
            if self.branches > 1 and (self.armed or _capturing()):
                guard("draft_steps", self._write_tree, out)
            return out

        runner.forward, worker.draft_forward = tapped_forward, counted_draft_forward

    def _after(self, forward_batch, out) -> None:
        """After one draft forward: a draft-decode step (not a draft extend) is counted and, when rows are
        selected or a graph is being captured, read."""
        if forward_batch.forward_mode.is_decode():
            i, self._step = self._step, self._step + 1
            if i < self.steps and (self.armed or _capturing()):
                self._write(i, out.logits_output.next_token_logits)

    def step_outputs(self) -> list:
        """``(probs, ids)`` of each draft step: where its top-k goes (``[ROWS, k]`` each)."""
        return [(self.probs[i], self.ids[i]) for i in range(self.steps)]

    def _write(self, i: int, logits: torch.Tensor) -> None:
        """Softmax top-k of step ``i``'s logits at the selected rows (device operations only: graph-capturable).
        Unused row slots hold -1 and ``read`` leaves them out. The rows are clamped to this batch: a graph
        replays for every batch of its size, armed or not, and the row buffer may still hold the rows of
        a larger batch (an index past the end is a device-side assert, which kills the server)."""
        k, n = min(self.k, logits.shape[-1]), min(ROWS, logits.shape[0])  # a batch never selects more rows than it has
        if self._topk is not None and self._topk.takes(logits):  # the kernel clamps rows itself
            self._topk.write(logits, self.probs[i, :, :k], self.ids[i, :, :k])
            return
        rows = self.rows[:n].clamp(0, logits.shape[0] - 1)
        softmax_topk(logits.index_select(0, rows), k, out=(self.probs[i, :n, :k], self.ids[i, :n, :k]))

    def _write_tree(self, out) -> None:
        """A tree's ``top_scores_index`` and ``parent_list`` (``draft_forward``'s first two outputs) at the
        selected requests, clamped to the batch as in ``_write`` (graph-capturable)."""
        parents, chosen = out[0], out[1]
        reqs = self.reqs.clamp(0, chosen.shape[0] - 1)
        self.tree[:, :self._nodes] = chosen.index_select(0, reqs)
        self.tree[:, self._nodes:self._nodes + parents.shape[1]] = parents.index_select(0, reqs)

    def select(self, rows: List[int]) -> int:
        """Requests (their batch rows) of the next draft to read (at most ``requests``); how many were taken (0:
        no pinned slot was free for the row list). The row buffer keeps its rows from one draft to the next: a
        batch whose sampled rows have not changed costs no copy. No rows: the buffer goes back to -1 (unused),
        so that the graphs' replays read nothing, and the next draft is not read."""
        n, b = min(len(rows), self.requests), self.branches
        key = tuple(rows[:n])
        if key == self._loaded:
            self.armed = n > 0
            return n
        if b == 1:  # a chain: the logits rows are the requests' rows, and draft_forward's outputs are not read
            index, target = device_index(rows[:n] + [-1] * (ROWS - n), self.rows.device), self.rows
        else:
            logits_rows = [r * b + j for r in rows[:n] for j in range(b)]
            index = device_index(logits_rows + [-1] * (ROWS - len(logits_rows)) + rows[:n] + [0] * (self.requests - n),
                                 self._select.device)
            target = self._select
        if index is None:
            return 0
        target.copy_(index, non_blocking=True)
        self._loaded, self.armed = key, n > 0
        return n

    def read(self, n: int) -> Optional["StepTopk"]:
        """The results of the draft just run for the first ``n`` selected requests, copied without blocking
        into a pinned slot; None when every slot is still unread."""
        self.armed = False
        slot = self._slots.reserve()
        if slot is None:
            return None
        host = self._host[slot]
        if self._copy is not None:
            try:
                self._copy(host, self._base + slot * self._slots.nbytes)
            except Exception:  # noqa: BLE001 - never raise into the serving process: Tensor.copy_ from now on
                self._copy = None
        if self._copy is None:
            host.copy_(self._buf, non_blocking=True)
        return StepTopk(host, (self._shape, self._tree_shape, self.branches), n, self._slots, slot, self._buf.is_cuda)


def _tap_topk(rows: torch.Tensor, vocab: Optional[int], topk: int, into: list) -> Optional[TapTopk]:
    """The tap's top-k by the summary kernel (compiled here, at install) straight into ``into`` (each step's buffers),
    or None: off CUDA, without Triton, without the draft's vocabulary, or when it cannot be built (``softmax_topk``
    then takes every write)."""
    if not rows.is_cuda or triton is None or not vocab:
        return None
    try:
        return TapTopk(rows, vocab, topk, into=into)
    except Exception:  # noqa: BLE001 - the tap still reads, by softmax_topk
        return None


def _copy_kernel(buf: torch.Tensor, slots: HostSlots) -> tuple:
    """``(WordCopy of buf, the address through which kernels reach slots' memory)``: the tap's results into a pinned
    slot by a kernel, a few µs of host time a read where ``Tensor.copy_`` costs ~12 µs on a GPU server's host. Its
    kernel is compiled by a first copy into slot 0, at install (before SGLang captures its graphs). ``(None, 0)`` off
    CUDA, without Triton, where that memory is not mapped for the device, or when the first copy fails."""
    try:
        base = mapped_address(slots.memory) if buf.is_cuda and triton is not None else None
        if base is None:
            return None, 0
        copy = WordCopy(buf)
        copy(slots.buffer(0), base)
        return copy, base
    except Exception:  # noqa: BLE001 - the tap still reads, by Tensor.copy_
        return None, 0


def _split(buf: torch.Tensor, shape: tuple, tree_shape: tuple) -> tuple:
    """``buf`` as float32 probs and int64 ids, each of ``shape``, then int64 tree ints of ``tree_shape`` (the
    probs' bytes are a multiple of 8: ROWS is)."""
    n, t = shape[0] * shape[1] * shape[2], tree_shape[0] * tree_shape[1]
    return (buf[:n * 4].view(torch.float32).view(shape), buf[n * 4:n * 12].view(torch.int64).view(shape),
            buf[n * 12:n * 12 + t * 8].view(torch.int64).view(tree_shape))


class StepTopk:
    """Host copies of one draft's step top-k: ``result()`` is a :class:`~draftscope_tracer.stats.DraftSteps`
    (per draft step and row, ``[(id, prob), ...]`` best first, ties by id; a tree's ints per request) for the
    first ``n`` requests. Pickles as the arrays' bytes (waits for the copy)."""

    def __init__(self, host: torch.Tensor, layout: tuple, n: int, slots: HostSlots, slot: int, cuda: bool):
        """``host``: the slot's buffer, its copy just issued (``cuda``: on the current stream)."""
        self._host, self._layout = host, layout  # split on the reader's thread
        self._cuda = cuda
        if cuda:  # its reader records the event that marks the copy
            mark_later(self)
        self._n, self._slots, self._slot = n, slots, slot
        self._value: Optional[DraftSteps] = None

    def _arrays(self) -> list:
        """``[(bytes, numpy dtype, shape), ...]`` of probs, ids and tree ints."""
        shape, tree_shape, _ = self._layout
        data, n = self._host.numpy().tobytes(), shape[0] * shape[1] * shape[2]
        return [(data[:n * 4], "float32", shape), (data[n * 4:n * 12], "int64", shape),
                (data[n * 12:], "int64", tree_shape)]

    def __reduce__(self):
        """Pickled as the arrays' bytes (decoded in the recorder process): waits for the copy first."""
        if self._value is not None:
            return Resolved, (self._value,)
        self._wait()
        arrays = self._arrays()
        self.release(read=True)
        return ArrayBytes, ("draft_steps", arrays, (self._n, self._layout[2]))

    def result(self) -> DraftSteps:
        if self._value is None:
            self._wait()
            arrays = [np.frombuffer(d, dtype=t).reshape(s) for d, t, s in self._arrays()]
            self._value = draft_steps(arrays, (self._n, self._layout[2]))
            self.release(read=True)
        return self._value

    def _wait(self) -> None:
        if self._slot is None:
            raise RuntimeError("this step top-k was released without being read")
        if self._cuda:
            wait_later(self)

    def release(self, read: bool = False) -> None:
        """Give the slot back (after reading: ``read``, or when the step is dropped). Safe to call twice."""
        if self._slot is not None:
            self._slots.release(self._slot, read)
            self._slot = None
