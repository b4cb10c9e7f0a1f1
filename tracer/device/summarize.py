"""Device-side summaries of one verify step, read back without stalling the GPU.

A :class:`Summarizer` turns the tensors of one verify step into a few hundred numbers **on the
device** and brings them to the host without blocking (written straight into pinned memory, or one copy):

* ``hidden [n, K*H]`` (any float dtype; bf16 in SGLang): for every selected row and every aux chunk
  of width ``H``: L2 norm, mean, std, absmax, NaN and Inf counts, computed in fp32;
* ``logits [m, V]`` (optional; fp32, bf16 or fp16, read in place and computed in fp32): top-k token ids
  and their softmax probabilities over the full row (two-stage top-k: per block of the row first, then
  over the blocks' candidates).

Rows are chosen by ``rows``, an int64 tensor on the tensors' device of fixed length ``max_rows``
(pad with ``-1``): its shape never depends on data, so a launch can be captured in a CUDA graph.
The logits are read at the same rows (``m == n``), or at rows of their own: ``logit_rows``, shaped like
``rows`` (``-1`` where it is), so that a step's logits need not be gathered or converted first.
Nothing on the launch path synchronises with the host (no ``.item()``, ``.tolist()``, ``.cpu()``).
A launch goes launch -> ring slot -> record: it takes a free slot of a ring of pinned host buffers as its
:class:`Pending`; the Triton kernel writes the results straight into the slot (the device addresses pinned memory
directly), the torch path and graph replays write one device buffer, which one ``non_blocking`` copy moves into
the slot; the work is marked on its stream (``Pending.issue``), and its reader records the CUDA event that marks
completion. :class:`Pending` is the handle: a background thread calls :meth:`Pending.result` (records that event
or shares a later one, waits on it, decodes plain Python numbers, frees the ring slot). When every slot is still unread, a launch is **dropped** (counted in
:attr:`Summarizer.drops`) instead of blocking. CPU tensors work the same way (no pinning, no
events), which is what the tests use.

On CUDA, when ``triton`` imports (it ships with SGLang), one Triton launch computes everything
(``summary_triton.py``). Otherwise, and after any Triton failure (counted in
:attr:`Summarizer.fallbacks`, never raised), a per-op torch path computes the same results
(``summary_torch.py``); ``backend="torch"`` forces it (:class:`SummaryPaths` chooses). ``summary_ring.py`` holds
the host ring, the :class:`Pending` handles and the decoding; ``summary_checks.py`` what a Summarizer accepts (its
arguments, each launch's inputs: metadata only, never data).

One thread launches (the scheduler's); any one other thread may read each ``Pending``. Launches
must be issued on the stream that produced the tensors (``torch.cuda.current_stream()``).

Usage::

    from draftscope_tracer.device.summarize import Summarizer

    summ = Summarizer(max_rows=16, width=3 * 7168, chunk_width=7168, vocab_size=163840,
                      device="cuda")                      # once, at attach time
    rows = torch.full((16,), -1, dtype=torch.int64, device="cuda")   # static, graph-safe
    rows[:8].copy_(sampled_rows_cpu, non_blocking=True)   # e.g. rows of 2 sampled requests x N=4

    pending = summ.summarize(logits_output.hidden_states, rows,
                             logits=logits_output.next_token_logits, tag=("rid-a", 17))
    if pending is not None:                               # None: ring full, counted in summ.drops
        queue.put(pending)

    # another thread (in the tracer: the relay, which pickles it for the recorder process)
    s = queue.get().result()                              # blocks only this thread
    s.tag                                                 # ("rid-a", 17)
    s.rows[0].row, s.rows[0].chunks[2].l2, s.rows[0].topk[0]   # 0, 381.2, (13, 0.91)
    s.sample(chunk=0, rows=[0, 1, 2, 3])   # -> SampleRecord statistics over those rows

For CUDA-graph taps, run one eager launch first (Triton compiles on first use), then capture
:meth:`Summarizer.compute` inside the graph and call
:meth:`Summarizer.publish` after each replay (it copies the device buffer out and marks the work for its reader).
``bench/gpu_summarize.py`` does this on a GPU and measures it; ``docs/benchmarks.md`` has the figures.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from draftscope_tracer.device.summary_checks import LaunchCheck, check_arguments
from draftscope_tracer.device.summary_ring import Layout, Outputs, Pending, Ring
from draftscope_tracer.device.summary_torch import TorchPath
from draftscope_tracer.device.summary_triton import TritonPath, triton

__all__ = ["Pending", "Summarizer"]


class Summarizer:
    """Preallocated device/host buffers and the summary kernels for one tensor layout.

    Args:
        max_rows: capacity ``R`` of ``rows``.
        width: width of ``hidden`` (``K * chunk_width``).
        chunk_width: aux chunk width ``H`` (default: ``width``, one chunk). Must divide ``width``.
        vocab_size: width ``V`` of ``logits``; ``None`` when no logits are summarised.
        topk: entries kept per logits row (8).
        ring_size: pinned host buffers in the ring (reads in flight before launches drop).
        block: block width of the two-stage top-k (default: chosen from ``vocab_size`` per path;
            the Triton path rounds it up to a power of two: the logits columns one program reads).
        device: device of the tensors that will be summarised.
        backend: ``"auto"`` (Triton kernels on CUDA when ``triton`` imports, else torch),
            ``"torch"`` (the per-op torch path), or ``"triton"`` (Triton kernels on any device;
            on CPU only under ``TRITON_INTERPRET=1``, which the tests use).
        direct: let the Triton kernel write each launch into its ring slot (no copy) where the device can
            address the pinned ring; ``False`` always computes into the device buffer and copies.

    Any failure in the Triton path is counted in :attr:`fallbacks` (reason in
    :attr:`fallback_error`) and the torch path computes that launch and every later one; it never
    raises. Run one launch eagerly before capturing a CUDA graph (Triton compiles on first use).
    """

    def __init__(self, *, max_rows: int, width: int, chunk_width: Optional[int] = None,
                 vocab_size: Optional[int] = None, topk: int = 8, ring_size: int = 4,
                 block: Optional[int] = None, device: torch.device | str = "cpu", backend: str = "auto",
                 gather: bool = False, direct: bool = True):
        chunk_width = width if chunk_width is None else chunk_width
        check_arguments(max_rows, width, chunk_width, vocab_size, topk, ring_size, backend, gather)
        self.device = torch.device(device)
        self.max_rows, self.width, self.chunk_width = max_rows, width, chunk_width
        self.num_chunks = width // chunk_width
        self.vocab_size, self.topk, self.gather = vocab_size, topk, gather
        layout = Layout(max_rows, self.num_chunks, vocab_size, topk, gather)
        self.nbytes = layout.nbytes
        self._dev_buf = torch.zeros(layout.nbytes, dtype=torch.uint8, device=self.device)
        self._dev = layout.outputs(self._dev_buf)
        self._ring = Ring(layout, ring_size, self.device, chunk_width, direct)
        self._check = LaunchCheck(max_rows=max_rows, width=width, vocab_size=vocab_size, device=self.device,
                                  gather=gather)
        self._paths = SummaryPaths(dict(max_rows=max_rows, num_chunks=self.num_chunks, chunk_width=chunk_width,
                                        vocab_size=vocab_size, topk=topk, block=block, device=self.device,
                                        gather=gather), backend)

    @property
    def backend(self) -> str:
        """The path launches take now: ``"triton"`` or ``"torch"``."""
        return "triton" if self._paths.triton is not None else "torch"

    @property
    def fallbacks(self) -> int:
        """Launches (and publish copies) the torch path took over because the Triton path failed."""
        return self._paths.fallbacks

    @property
    def fallback_error(self) -> Optional[str]:
        return self._paths.fallback_error

    @property
    def drops(self) -> int:
        """Launches refused because every ring slot was still unread."""
        return self._ring.drops

    @property
    def launches(self) -> int:
        """Launches issued so far."""
        return self._ring.launches

    @property
    def triton_tuning(self) -> dict:
        """Warps per program, group width and hidden slice of the Triton kernels (a dict the GPU bench tunes in
        place before the first launch; ``summary_triton.TritonPath``), and the stage clocks' buffer of a profile
        (``"stamps"``, of :attr:`triton_stamp_shape`)."""
        return self._paths.triton.tuning

    @property
    def triton_stamp_shape(self) -> tuple:
        """The shape of a stage-clocks buffer for ``triton_tuning["stamps"]`` (``bench/gpu_summary_stages.py``)."""
        return self._paths.triton.stamp_shape()

    @property
    def triton_block(self) -> Optional[int]:
        return self._paths.triton.block

    @property
    def device_buffer(self) -> torch.Tensor:
        """The raw result bytes on the device (``nbytes`` uint8), as :meth:`compute` leaves them."""
        return self._dev_buf

    @property
    def device_views(self) -> dict:
        """The device buffer's fields (name -> typed tensor: ``rows``, ``sums``, ``absmax``, ``topk_p``, ...)."""
        return self._dev.views

    def summarize(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor] = None,
                  tag: Any = None, ints: Optional[tuple] = None,
                  logit_rows: Optional[torch.Tensor] = None) -> Optional[Pending]:
        """Launch the summary of one step; returns a :class:`Pending`, or ``None`` if dropped.

        ``hidden [n, width]``; ``rows [max_rows]`` int64 row indices into ``hidden`` (and
        ``logits [n, vocab_size]``), ``-1`` for unused slots; or, with ``logit_rows [max_rows]`` (int64,
        ``-1`` where ``rows`` is), slot r's logits row is ``logit_rows[r]`` of ``logits [m, vocab_size]``.
        ``logits`` float32, bfloat16 or float16. ``tag`` is handed back unchanged in the ``Summary``. With
        ``gather``: ``ints = (draft tokens, target tokens, sequence lengths, accept lengths, N)`` of a verify step
        (tokens per node, the others per request, node ``i`` belonging to request ``i // N``), read at each
        selected row into ``Summary.ints``. Never synchronises with the host.
        """
        pending = self._ring.take(tag)
        if pending is None:
            return None
        try:
            into_slot = self._run(hidden, rows, logits, logit_rows, ints, pending.outputs)
        except BaseException:
            pending.release()
            raise
        return pending.issue(None if into_slot else self._dev_buf)

    def last_plan(self) -> Optional[Callable[[Outputs], None]]:
        """The last launch as a plan for :meth:`launch_plan`, when it went straight to its compiled Triton kernel
        (else None)."""
        triton_path = self._paths.triton
        return None if triton_path is None else triton_path.plan

    def launch_plan(self, plan: Callable[[Outputs], None], tag: Any = None) -> Optional[Pending]:
        """:meth:`summarize` again on the inputs of the launch that left ``plan`` (:meth:`last_plan`): the caller
        vouches that its tensors are at the same addresses with the same shapes, strides and dtypes, so nothing
        is checked or worked out again. A free ring slot, one kernel launch, an event; None when dropped."""
        pending = self._ring.take(tag)
        if pending is None:
            return None
        out = pending.outputs
        try:
            plan(self._dev if out is None else out)
        except BaseException:
            pending.release()
            raise
        return pending.issue(self._dev_buf if out is None else None)

    def publish(self, tag: Any = None) -> Optional[Pending]:
        """Copy the device buffer (as last written by :meth:`compute`) to a free ring slot: on CUDA by a Triton
        kernel where the ring is mapped, else (or after that kernel failed once, counted in :attr:`fallbacks`)
        one non-blocking copy."""
        pending = self._ring.take(tag)
        if pending is None:
            return None
        out = pending.outputs
        copied = out is not None and self._paths.copy(self._dev_buf, out)
        return pending.issue(None if copied else self._dev_buf)

    def compute(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor] = None,
                ints: Optional[tuple] = None, logit_rows: Optional[torch.Tensor] = None) -> None:
        """Write the summary into the device buffer only (capturable in a CUDA graph)."""
        self._run(hidden, rows, logits, logit_rows, ints, None)

    def outputs_with_topk(self, probs: torch.Tensor, ids: torch.Tensor) -> Outputs:
        """The device buffer's outputs, but the top-k into ``probs`` and ``ids`` (``[max_rows, topk]``, float32 and
        int64, contiguous, on this device): for :meth:`compute_into`."""
        dev = self._dev
        address = {"rows": dev.head[0], "sums": dev.head[1], "absmax": dev.head[2], "topk_p": probs.data_ptr(),
                   "topk_id": ids.data_ptr(), "ints": dev.ints}
        return Outputs({**dev.views, "topk_p": probs, "topk_id": ids}, address)

    def compute_into(self, out: Outputs, hidden: torch.Tensor, rows: torch.Tensor, logits: torch.Tensor,
                     logit_rows: Optional[torch.Tensor] = None) -> bool:
        """:meth:`compute`, its top-k into ``out`` (:meth:`outputs_with_topk`) by the Triton path: True; False when
        the torch path computed it instead, into the device buffer (capturable in a CUDA graph)."""
        return self._run(hidden, rows, logits, logit_rows, None, out)

    def _run(self, hidden, rows, logits, logit_rows, ints, slot: Optional[Outputs]) -> bool:
        """Compute one summary: into ``slot`` (a ring slot's outputs) when the Triton path takes it, True; else
        into the device buffer, False."""
        self._check(hidden, rows, logits, ints, logit_rows)
        return self._paths.run(hidden, rows, logits, logit_rows, ints, self._dev if slot is None else slot,
                               self._dev)


class SummaryPaths:
    """Which kernels compute a Summarizer's launch (``shape``: ``TritonPath``'s and ``TorchPath``'s arguments): the
    Triton path while it works (``backend``: see ``Summarizer``), else the per-op torch path. A Triton failure is
    counted (``fallbacks``, reason in ``fallback_error``), never raised: that launch and every later one go through
    torch."""

    def __init__(self, shape: dict, backend: str):
        use_triton = triton is not None and (backend == "triton"
                                             or (backend == "auto" and shape["device"].type == "cuda"))
        self._shape = shape
        self.triton: Optional[TritonPath] = TritonPath(**shape) if use_triton else None
        self.torch: Optional[TorchPath] = None if use_triton else TorchPath(**shape)
        self.fallbacks = 0  # launches the torch path computed because the Triton path could not
        self.fallback_error: Optional[str] = None
        self.copy_kernel = shape["device"].type == "cuda"  # Summarizer.publish copies out by a Triton kernel

    def run(self, hidden, rows, logits, logit_rows, ints, out: Outputs, device: Outputs) -> bool:
        """Compute one summary into ``out`` (a ring slot's outputs, or ``device``: the device buffer's) when the
        Triton path takes it; else the torch path writes ``device``. True when a ring slot holds the results (no
        copy needed), False when the device buffer does."""
        if self.triton is not None:
            try:
                if self.triton.run(hidden, rows, logits, out, ints, logit_rows):
                    return out is not device
                self.fallbacks += 1
                self.fallback_error = "inputs the Triton path does not take (hidden/logits rows or row indices " \
                                      "not contiguous, or ints not 1-D int32/int64)"
            except Exception as exc:  # noqa: BLE001 - never raise into the serving process
                self.fallbacks += 1
                self.fallback_error = f"{type(exc).__name__}: {exc}"
                self.triton = None
        if self.torch is None:
            self.torch = TorchPath(**self._shape)
        self.torch.run(hidden, rows, logits, device.views, ints, logit_rows)
        return False

    def copy(self, device_buf: torch.Tensor, out: Outputs) -> bool:
        """Copy the device buffer into a mapped ring slot by a Triton kernel (a copy engine's transfer of a few KB
        costs several µs on the stream); False when there is none, or after it failed once (counted)."""
        if self.triton is None or not self.copy_kernel:
            return False
        try:
            self.triton.copy(device_buf, out)
            return True
        except Exception as exc:  # noqa: BLE001 - never raise into the serving process
            self.fallbacks += 1
            self.fallback_error = f"{type(exc).__name__}: {exc}"
            self.copy_kernel = False
            return False
